// Normalisation layers: LayerNorm (BERT, GPT-2) and RMSNorm (Llama, T5), with HF parameter names.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace emoe {

class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  // forward(dropout(a, dropout_p) + r) for a residual r (a post-norm block; dropout_p > 0 only
  // in training), in one pass each way where the row kernels apply (add_layer_norm_applies: the
  // dropout's mask made inside it, the same draw and bits as emoe::dropout's), else as written
  torch::Tensor forward_residual(const torch::Tensor& a, const torch::Tensor& r,
                                 double dropout_p = 0.0);
  torch::Tensor weight, bias;

 private:
  int64_t dim_;
  double eps_;
};
TORCH_MODULE(LayerNorm);

// Llama's RMSNorm: statistics in float32, result cast back, then scaled (HF LlamaRMSNorm).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// x + a, a pre-norm block's residual sum: through the row kernels where they apply (a float32
// stream plus a bfloat16 output under autocast; residual_add_applies), else as written. The
// gradient of each input is the incoming one (in a's dtype for a).
torch::Tensor residual_add(const torch::Tensor& x, const torch::Tensor& a);

}  // namespace emoe
