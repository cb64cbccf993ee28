// Dropout with a parallel, counter-based mask generator on CPU.
//
// ATen's CPU bernoulli_ draws one number at a time from a locked Mersenne Twister: on BERT-base
// it took about 8 % of a training step. Here one 64-bit seed is drawn from the default
// generator per call (so runs stay reproducible and resumable from a checkpointed generator
// state) and each element's keep/drop decision is a 32-bit hash of (seed, index), computed in
// parallel and in vector registers (float32 and bfloat16). Other devices use torch::dropout.
#pragma once
#include <ATen/core/Tensor.h>

namespace emoe {

// x with each element zeroed with probability p and the rest scaled by 1/(1-p) when training;
// x itself otherwise. Differentiable in x.
at::Tensor dropout(const at::Tensor& x, double p, bool training);

}  // namespace emoe
