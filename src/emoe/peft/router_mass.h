// Router probability mass per expert (MoV, MoLoRA), summed over the tokens seen since the last
// take, apart for training and evaluation: their "expert usage" record. Padding tokens are
// included (an adapter does not see the attention mask).
#pragma once
#include <ATen/core/Tensor.h>

namespace emoe {

class RouterMass {
 public:
  // p: [..., E] probabilities (detached here).
  void add(const at::Tensor& p, bool training);
  // [E] float on the device (zeros when nothing was seen); resets that phase.
  at::Tensor take(bool training, int64_t experts);

 private:
  at::Tensor train_, eval_;
};

}  // namespace emoe
