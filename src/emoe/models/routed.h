// One interface for everything routed — MoE FFN plugs, MoV and MoLoRA adapters — so that training,
// evaluation, usage recording and pruning never ask which class routes.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace emoe {

class PretrainedModelImpl;

class Routed {
 public:
  virtual ~Routed() = default;
  virtual int64_t num_experts() const = 0;
  // Experts each token uses; 0: a soft mixture of all of them.
  virtual int64_t top_k() const = 0;
  // What take_usage counts: "selections" (top-k picks, padding excluded) or "router mass".
  virtual std::string usage_kind() const = 0;
  // The usage counted in one mode since the last take ([E] on the model's device); resets it.
  virtual at::Tensor take_usage(bool training) = 0;
  // The weighted auxiliary (balance) loss of the last training forward, or undefined.
  virtual at::Tensor aux_loss() const = 0;
  // Replaces it (activation checkpointing hands out a differentiable copy of the block's
  // balance losses in their place: recompute.h).
  virtual void replace_aux_loss(const at::Tensor& loss) = 0;
  // Pruning and the "MoE -> dense" ablation, where the module supports them.
  virtual bool supports_expert_mask() const { return false; }
  // Only these experts may be selected ([E] bool; undefined = all).
  virtual void set_allowed_experts(const at::Tensor& allowed) { (void)allowed; }
  virtual bool supports_dense_override() const { return false; }
  // Compute the dense module instead of routing.
  virtual void set_dense_override(bool on) { (void)on; }
};

struct NamedRouted {
  std::string name;    // "layer 8" for an FFN plug, the adapted module's name for an adapter
  int64_t layer = -1;  // the FFN slot's layer index (what MoE layer lists count); -1: none
  bool ffn = false;    // an FFN plug (else an adapter on a Linear)
  Routed* routed = nullptr;
};

// The FFN plugs in slot order, then the adapters in module order.
std::vector<NamedRouted> routed_modules(PretrainedModelImpl& model);
// Only the FFN plugs (the MoE layers), in slot order.
std::vector<NamedRouted> routed_ffn_plugs(PretrainedModelImpl& model);
// The sum of every routed module's auxiliary loss of the last forward, or undefined.
at::Tensor routed_aux_loss(PretrainedModelImpl& model);
// Sets the dense override on every module that supports it; returns how many.
int64_t set_routed_dense_override(PretrainedModelImpl& model, bool on);

}  // namespace emoe
