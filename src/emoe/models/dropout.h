// Dropout with a parallel, counter-based mask generator on CPU.
//
// ATen's CPU bernoulli_ draws one number at a time from a locked Mersenne Twister: on BERT-base
// it took about 8 % of a training step. Here one 64-bit seed is drawn from the default
// generator per call (so runs stay reproducible and resumable from a checkpointed generator
// state) and each element's keep/drop decision is a 32-bit hash of (seed, index), computed in
// parallel and in vector registers (float32 and bfloat16). Other devices use torch::dropout.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace emoe {

// x with each element zeroed with probability p and the rest scaled by 1/(1-p) when training;
// x itself otherwise. Differentiable in x.
at::Tensor dropout(const at::Tensor& x, double p, bool training);

// For kernels that fuse dropout into their own autograd (the fused LoRA linear): the seed one
// dropout() call draws from the default generator, and the mask it makes of that seed, applied
// to `in` and written to `out` (out += ... with accumulate). dropout(x, p, true) equals
// dropout_mask_into(x, out, seed, p, false) for the seed it drew. Contiguous float32 CPU tensors.
uint64_t draw_dropout_seed();
void dropout_mask_into(const at::Tensor& in, const at::Tensor& out, uint64_t seed, double p,
                       bool accumulate);

}  // namespace emoe
