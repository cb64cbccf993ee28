// A frozen linear layer plus low-rank updates (LoRA) as one autograd node.
//
// y = x W^T + b + Σ_i s_i · dropout_i(x) A_i^T B_i^T, each update adding to its own block of
// output columns (q and v of a fused q/k/v projection). Composed of separate operations the
// same layer costs a copy of y for the update's addmm, a sum of the input gradients of each
// branch, a dropout output kept for the backward pass and OpenBLAS products for the rank-r
// matrices; here the updates are accumulated into y by the product itself, their input gradients
// into x's by theirs (through the recomputed dropout mask), and only x and the [tokens, r]
// products are kept. Measured on BERT-base LoRA (q, v) at batch 16 x 128: see docs/performance.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace emoe {

struct LowRankUpdate {
  at::Tensor a;        // [r, in]
  at::Tensor b;        // [cols, r]
  int64_t offset = 0;  // the first output column it adds to
  double scaling = 1;  // s
  double dropout = 0;  // on the update's input; 0 when not training
};

// Whether low_rank_linear takes these: float32 CPU tensors, no autocast, a base weight and bias
// that need no gradient, updates inside the output. Callers compose the layer from separate
// operations otherwise (other devices and dtypes, a trainable base).
bool low_rank_linear_supported(const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, const std::vector<LowRankUpdate>& updates);

// x [..., in], weight [out, in] in any layout, bias [out] or undefined. Differentiable in x and
// in every a and b; dropout masks are those emoe::dropout draws, in the order of `updates`.
at::Tensor low_rank_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           const std::vector<LowRankUpdate>& updates);

}  // namespace emoe
