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

// For kernels that fuse dropout into their own passes (the residual LayerNorm, the attention's
// softmax): one dropout() call's draw (its seed from the default generator, in the same place
// in the generator's sequence), and its mask applied to elements [first, first + n) of a
// contiguous tensor given as raw rows (in and out point at element `first`, and do not
// overlap): the bits dropout(x, p, true) gives there, bfloat16 (as bits) rounded once.
// With p <= 0 there is no draw (dropout() makes none then either): seed 0, p 0.
struct DropoutDraw {
  uint64_t seed = 0;
  double p = 0;
  // this draw where it drops anything, else null (what the fused kernels take)
  const DropoutDraw* if_any() const { return p > 0 ? this : nullptr; }
};
DropoutDraw draw_dropout(double p);
void dropout_row(const float* in, float* out, int64_t n, int64_t first, const DropoutDraw& d);
void dropout_row(const uint16_t* in, uint16_t* out, int64_t n, int64_t first, const DropoutDraw& d);

}  // namespace emoe
