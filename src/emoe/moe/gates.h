// Gates: avg-k (tied to the current keys, no parameters), learned linear, GMoE cosine, MoEfication
// MLP.
#pragma once
#include <torch/nn/module.h>

#include <memory>

#include "emoe/models/ffn_slot.h"
#include "emoe/moe/moe_config.h"

namespace emoe {

class GateImpl : public torch::nn::Module {
 public:
  // Gate logits [n, E] for tokens x [n, d].
  virtual torch::Tensor logits(const torch::Tensor& x, FfnSlot& slot) = 0;
};

// Mean of each expert's current, un-normalised keys: [E, d] (gradients flow to the keys).
torch::Tensor expert_key_means(const FfnView& view, int64_t experts);
// The same over any key matrix [d_ff, d] in expert order (e.g. the L2-normalised keys).
torch::Tensor expert_key_means(const torch::Tensor& keys, int64_t experts);

// EMoE: score_e(x) = x · mean_{i in e} k_i, recomputed from the current W1 at every call.
class AvgKGateImpl : public GateImpl {
 public:
  // detach_keys (tutel parity): the gate is a copy of the current keys, as the authors' gate held
  // as its own frozen weight and refreshed from them, so routing losses send no gradient to W1.
  explicit AvgKGateImpl(int64_t experts, bool detach_keys = false)
      : experts_(experts), detach_keys_(detach_keys) {}
  torch::Tensor logits(const torch::Tensor& x, FfnSlot& slot) override;

 private:
  int64_t experts_;
  bool detach_keys_;
};

// EMoE-learn: a learned E x d matrix, no bias (initialised to avg-k or N(0, 0.02)).
class LinearGateImpl : public GateImpl {
 public:
  LinearGateImpl(int64_t d, int64_t experts);
  torch::Tensor logits(const torch::Tensor& x, FfnSlot& slot) override;
  torch::Tensor weight;
};

// GMoE's cosine router: project x to `dim` dims, cosine to E learned embeddings (N(0, 0.01)),
// times a learned temperature exp(min(t, ln 100)), t0 = ln 2.
class CosineGateImpl : public GateImpl {
 public:
  CosineGateImpl(int64_t d, int64_t experts, int64_t dim);
  torch::Tensor logits(const torch::Tensor& x, FfnSlot& slot) override;
  torch::nn::Linear cosine_projector{nullptr};
  torch::Tensor sim_matrix, temperature;
};

// MoEfication's router, as the reference's: x / |x| -> Linear(d, E) (the expert centres at start)
// -> tanh -> Linear(E, E) (identity at start), no biases.
class MlpGateImpl : public GateImpl {
 public:
  MlpGateImpl(int64_t d, int64_t experts);
  torch::Tensor logits(const torch::Tensor& x, FfnSlot& slot) override;
  torch::nn::Linear in_proj{nullptr}, out_proj{nullptr};
};

// Builds the gate a config asks for (initialised from the slot where the config says so).
std::shared_ptr<GateImpl> make_gate(const MoeConfig& cfg, FfnSlot& slot);

}  // namespace emoe
