// MoLoRA: a router-weighted soft (or top-k) mixture of E LoRA experts on one Linear.
#pragma once
#include <ATen/core/Generator.h>

#include "emoe/models/linear.h"
#include "emoe/models/routed.h"
#include "emoe/peft/router_mass.h"

namespace emoe {

struct MoloraOptions {
  int64_t r = 4;
  double alpha = 16;
  double dropout = 0.0;  // on the experts' input, in training only
  int64_t experts = 10;
  int64_t topk = 0;             // 0: every expert, weighted by its probability
  double balance_weight = 0.0;  // Switch balance loss weight (top-k, training)
};

// y = base(x) + (alpha/r) Σ_e p_e B_e A_e dropout(x), p = softmax(router x) in float32. The
// experts are stacked so the update is two matmuls: molora_A [E·r, in] (expert e owns rows
// [e·r, (e+1)·r)), then the rank activations weighted by p repeated r times, then
// molora_B [out, E·r]. A_e ~ N(0, 0.02²), B_e = 0; the router molora_router [E, in] (a Linear
// without bias) ~ N(0, 0.02²) like MoV's. Top-k: the probabilities of the other experts are set
// to 0 (not renormalised), and in training balance_weight · E Σ_e f_e P_e (Switch) is kept.
class MoloraAdapter : public LinearAdapter, public Routed {
 public:
  MoloraAdapter(const LinearImpl& base, const MoloraOptions& options, at::Generator& gen);
  torch::Tensor adapt(const torch::Tensor& x, LinearImpl& base) override;
  std::string kind() const override { return "MoLoRA"; }
  Routed* routed() override { return this; }

  // Routed
  int64_t num_experts() const override { return options_.experts; }
  int64_t top_k() const override { return options_.topk; }
  std::string usage_kind() const override { return "router mass"; }
  at::Tensor take_usage(bool training) override { return mass.take(training, options_.experts); }

  double scaling() const { return options_.alpha / static_cast<double>(options_.r); }
  const MoloraOptions& options() const { return options_; }
  // Weighted balance loss of the last training forward (top-k with a weight > 0), or undefined.
  at::Tensor aux_loss() const override { return aux_loss_; }
  void replace_aux_loss(const at::Tensor& loss) override { aux_loss_ = loss; }

  torch::Tensor molora_A, molora_B, molora_router;
  RouterMass mass;  // router probability mass (after top-k masking)

 private:
  MoloraOptions options_;
  torch::Tensor aux_loss_;
};

}  // namespace emoe
