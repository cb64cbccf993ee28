// Grouped GEMM for dispatched experts: rows of the input are sorted by expert, and each
// expert's contiguous segment of rows is multiplied by that expert's block of one shared weight
// matrix — without slicing, stacking or copying weights, in forward or backward.
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

namespace emoe {

// y[segment j] = x[segment j] · W_jᵀ (+ b_j), where segment j is `counts[j]` rows following
// segment j-1, and W_j is block j of `weight` along `block_dim` (counts.size() equal blocks):
//   block_dim 0: weight [E·s, in] → W_j = rows j·s..(j+1)·s  (y has s columns; bias [E·s])
//   block_dim 1: weight [out, E·s] → W_j = columns j·s..(j+1)·s (x has s columns; no bias)
// Differentiable in x, weight and bias; an expert without rows gets zero weight gradients.
at::Tensor segment_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                          const std::vector<int64_t>& counts, int64_t block_dim);

}  // namespace emoe
