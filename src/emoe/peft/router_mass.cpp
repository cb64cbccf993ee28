// Router probability mass accumulation.
#include "emoe/peft/router_mass.h"

#include <torch/torch.h>

#include "emoe/models/recompute.h"

namespace emoe {

void RouterMass::add(const at::Tensor& p, bool training) {
  if (recomputing()) return;  // a checkpointed block's second run: counted the first time
  torch::NoGradGuard g;
  auto s = p.detach().reshape({-1, p.size(-1)}).sum(0).to(torch::kFloat);
  auto& acc = training ? train_ : eval_;
  acc = acc.defined() ? acc + s : s;
}

at::Tensor RouterMass::take(bool training, int64_t experts) {
  auto& acc = training ? train_ : eval_;
  auto out = acc.defined() ? acc : torch::zeros({experts}, torch::kFloat);
  acc = at::Tensor();
  return out;
}

}  // namespace emoe
