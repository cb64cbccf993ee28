// MoE FFN plugs: the shared routed base (usage, losses, padding), EMoE-style expert slices, GMoE
// copies.
#pragma once
#include <torch/nn/module.h>

#include <memory>

#include "emoe/models/ffn_slot.h"
#include "emoe/models/routed.h"
#include "emoe/moe/gates.h"
#include "emoe/moe/moe_config.h"
#include "emoe/moe/routing.h"

namespace emoe {

// Routes the real (non-padding) tokens of a slot to their top-k experts (under `tutel`, every
// position, as tutel does). Subclasses compute the experts; this class keeps expert-usage counts
// and the last balance loss.
class RoutedFfnImpl : public FfnPlug, public Routed {
 public:
  RoutedFfnImpl(const MoeConfig& cfg, int64_t layer) : cfg_(cfg), layer_(layer) {}
  torch::Tensor run(const torch::Tensor& x, const torch::Tensor& token_mask,
                    FfnSlot& slot) override;
  Routed* routed() override { return this; }

  // Routed
  int64_t num_experts() const override { return cfg_.experts; }
  int64_t top_k() const override { return cfg_.topk; }
  std::string usage_kind() const override { return "selections"; }
  at::Tensor aux_loss() const override { return aux_loss_; }
  void replace_aux_loss(const at::Tensor& loss) override { aux_loss_ = loss; }
  bool supports_expert_mask() const override { return true; }
  bool supports_dense_override() const override { return true; }

  const MoeConfig& config() const { return cfg_; }
  MoeConfig& mutable_config() { return cfg_; }
  int64_t layer() const { return layer_; }
  const std::shared_ptr<GateImpl>& gate() const { return gate_; }

  // Balance loss of the last training forward (weighted), or undefined.
  const torch::Tensor& last_aux_loss() const { return aux_loss_; }
  // Selections per expert since the last take, counted apart for training and evaluation
  // ([E] int64 on the model's device; padding tokens are counted only under `tutel`).
  torch::Tensor take_usage(bool training) override;
  // Compute the dense FFN instead of routing (the "MoE -> dense at test time" ablation).
  void set_dense_override(bool on) override { dense_override_ = on; }
  // Only these experts may be selected ([E] bool; undefined = all): expert pruning. With fewer
  // allowed experts than k, each token uses all of them.
  void set_allowed_experts(const torch::Tensor& allowed) override { allowed_ = allowed; }
  const torch::Tensor& allowed_experts() const { return allowed_; }

  // Expert outputs for real tokens x [n, d] (including the output bias).
  virtual torch::Tensor compute(const torch::Tensor& x, const Routing& r, FfnSlot& slot) = 0;

 protected:
  void set_gate(std::shared_ptr<GateImpl> gate);
  MoeConfig cfg_;
  int64_t layer_;
  std::shared_ptr<GateImpl> gate_;
  torch::Tensor aux_loss_, train_counts_, eval_counts_, allowed_;
  bool dense_override_ = false;
};

// EMoE, EMoE-learn and MoEfication: expert e is neurons [e*s, (e+1)*s) of the slot's own FFN
// (no copies). Masked: compute every neuron, zero the unselected experts. Dispatched: run each
// expert's slice on its tokens only, all experts in one autograd function (expert_ffn.h).
class ExpertFfnImpl : public RoutedFfnImpl {
 public:
  ExpertFfnImpl(const MoeConfig& cfg, FfnSlot& slot);
  torch::Tensor compute(const torch::Tensor& x, const Routing& r, FfnSlot& slot) override;
  std::string bypasses_linear(bool input_side) const override;
  torch::Tensor compute_masked(const torch::Tensor& x, const Routing& r, FfnSlot& slot);
  torch::Tensor compute_dispatched(const torch::Tensor& x, const Routing& r, FfnSlot& slot);
};

// GMoE upcycling: N full copies of the FFN (expert 0 is the slot's own FFN, experts 1..N-1 are
// stored here as stacked tensors), a learned router, outputs weighted by router probability.
class UpcycledFfnImpl : public RoutedFfnImpl {
 public:
  UpcycledFfnImpl(const MoeConfig& cfg, FfnSlot& slot);
  torch::Tensor compute(const torch::Tensor& x, const Routing& r, FfnSlot& slot) override;
  std::string bypasses_linear(bool input_side) const override {
    (void)input_side;
    return "GMoE experts 1..N-1 are copies that do not go through this layer";
  }
  // Expert e's FFN on tokens x (e = 0 is the slot's own FFN).
  torch::Tensor expert_forward(int64_t e, const torch::Tensor& x, FfnSlot& slot);
  torch::Tensor w_in, b_in, w_up, w_out, b_out;  // [N-1, ...] copies
};

// Plain FFN math on explicit weights (w_in [d_ff, d], w_out [d, d_ff]).
torch::Tensor ffn_math(const torch::Tensor& x, const torch::Tensor& w_in, const torch::Tensor& b_in,
                       const torch::Tensor& w_up, const torch::Tensor& w_out,
                       const torch::Tensor& b_out, Activation act, double preact_dropout,
                       bool training);

}  // namespace emoe
