// A Linear layer that also stores GPT-2's Conv1D layout, with one hook for PEFT adapters.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <vector>

#include "emoe/models/activation.h"
#include "emoe/models/low_rank_linear.h"

namespace emoe {

class LinearImpl;
class Routed;

// PEFT methods (LoRA, (IA)^3, MoV, MoLoRA) wrap a Linear's computation through this hook.
class LinearAdapter : public torch::nn::Module {
 public:
  // `base` is the frozen layer; implementations call base.base_forward(x) and add to it.
  virtual torch::Tensor adapt(const torch::Tensor& x, LinearImpl& base) = 0;
  // Adapters that are a low-rank update of the layer (LoRA) describe it here and return true;
  // fused_linear then folds the update into the layer's product (the offset is set by the caller).
  virtual bool low_rank_update(const LinearImpl& base, LowRankUpdate* update) const {
    return false;
  }
  // The method's name for messages ("LoRA", "(IA)^3", ...).
  virtual std::string kind() const { return "custom"; }
  // The adapter's routing (MoV, MoLoRA), or nullptr.
  virtual Routed* routed() { return nullptr; }
};

struct LinearOptions {
  int64_t in = 0;
  int64_t out = 0;
  bool bias = true;
  // Conv1D storage (GPT-2): weight is [in, out] in the checkpoint and in named_parameters().
  bool transposed = false;
};

class LinearImpl : public torch::nn::Module {
 public:
  explicit LinearImpl(const LinearOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  // act(forward(x)); for GELU in inference under CPU bf16 autocast (eval mode, nothing needs a
  // gradient, no adapter) with the activation computed in the product's epilogue (matmul.h's
  // InferenceGeluEpilogue), one pass over the output fewer
  torch::Tensor forward_activated(const torch::Tensor& x, Activation act);
  // x W^T + b, ignoring any adapter.
  torch::Tensor base_forward(const torch::Tensor& x);
  // The weight as [out, in] (a view for Conv1D storage; gradients flow through it).
  torch::Tensor weight_out_in() const;
  // weight_out_in(), or under autocast for a float32 weight that is frozen or used without
  // gradients (inference, evaluation) its copy in autocast's dtype, made once and kept while the
  // weight is unchanged (same storage, same version). Autocast caches only casts of weights that
  // train, and only within one autocast region: a frozen layer (LoRA, MoV) would otherwise cast
  // its weight on every forward and again in every backward pass, and inference every weight on
  // every call. A trainable weight's copy is dropped at its first forward with gradients
  // (autocast's own cache takes over), so training holds no second copy.
  torch::Tensor autocast_weight();
  // Whether autocast_weight() holds a copy now, and whether fused_linear holds its concatenation
  // here (tests).
  bool holds_cast() const { return cast_.weight.defined(); }
  bool holds_fused_cast() const { return fused_cast_.weight.defined(); }
  void reset_parameters(double std);  // normal(0, std) weight, zero bias (Hugging Face init)

  // Attaches (or with nullptr removes) the adapter. Its direct children and parameters are
  // registered on this layer, so keys read like PEFT's: `query.lora_A.weight`.
  void set_adapter(std::shared_ptr<LinearAdapter> adapter);
  const std::shared_ptr<LinearAdapter>& adapter() const { return adapter_; }

  const LinearOptions& options() const { return options_; }
  torch::Tensor weight;
  torch::Tensor bias;

 private:
  LinearOptions options_;
  std::shared_ptr<LinearAdapter> adapter_;
  // A cast copy (autocast's dtype) and what it was made from: the tensors (held, so that their
  // addresses are not reused), their storage and their versions at the time.
  struct CastCopy {
    torch::Tensor weight, bias;
    std::vector<torch::Tensor> sources;
    std::vector<const void*> data;
    std::vector<int64_t> versions;
    // whether it holds a copy in `dtype` of exactly these tensors, unchanged since
    bool made_from(const std::vector<torch::Tensor>& tensors, c10::ScalarType dtype) const;
    void remember(const std::vector<torch::Tensor>& tensors);
    void clear();
  };
  CastCopy cast_;  // autocast_weight()'s copy
  // fused_linear's concatenated weights (and biases) in autocast's dtype, held by the group's
  // first layer under the same rule
  friend std::vector<torch::Tensor> fused_linear(const std::vector<LinearImpl*>& layers,
                                                 const torch::Tensor& x);
  CastCopy fused_cast_;
};
TORCH_MODULE(Linear);

// The outputs of several Linear layers reading the same input (q, k, v): one GEMM over the
// concatenated weights when none carries an adapter (fewer, larger matrix multiplies), or when
// every adapter is a low-rank update of a frozen layer and low_rank_linear takes them (LoRA on
// q and v, float32 on CPU); else each layer's own forward. The results are views into one
// buffer in the fused case.
std::vector<torch::Tensor> fused_linear(const std::vector<LinearImpl*>& layers,
                                        const torch::Tensor& x);

}  // namespace emoe
