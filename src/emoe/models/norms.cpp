// LayerNorm and RMSNorm.
#include "emoe/models/norms.h"

#include <torch/torch.h>

namespace emoe {

LayerNormImpl::LayerNormImpl(int64_t dim, double eps) : dim_(dim), eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
  bias = register_parameter("bias", torch::zeros({dim}));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  // under bf16 autocast a bfloat16 input (e.g. a linear's output without a float32 residual, as
  // BERT's MLM head) is normalised in the weights' float32, as autocast's float32 ops
  if (x.scalar_type() != weight.scalar_type())
    return torch::layer_norm(x.to(weight.scalar_type()), {dim_}, weight, bias, eps_);
  return torch::layer_norm(x, {dim_}, weight, bias, eps_);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // statistics in float32 at least (float64 stays float64)
  auto h = x.scalar_type() == torch::kDouble ? x : x.to(torch::kFloat);
  auto var = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(var + eps_);
  return weight * h.to(x.scalar_type());
}

}  // namespace emoe
