// MoEfication router training.
#include "emoe/moe/moefication.h"

#include <torch/torch.h>

#include "emoe/core/error.h"

namespace emoe {

at::Tensor expert_activation_share(const at::Tensor& hidden, int64_t experts, bool gated) {
  auto h = hidden.to(torch::kFloat);
  auto pos = gated ? h.abs() : torch::relu(h);
  auto per = pos.view({h.size(0), experts, h.size(1) / experts}).sum(-1);
  return per / per.sum(-1, true).clamp_min(1e-12);
}

double train_moefication_router(ExpertFfnImpl& plug, FfnSlot& slot, const at::Tensor& inputs,
                                const at::Tensor& targets, const RouterTrainOptions& o) {
  EMOE_CHECK(inputs.size(0) > 0, InputError,
             "MoEfication: no sample tokens to train the router on");
  auto gate = plug.gate();
  torch::optim::Adam opt(gate->parameters(), torch::optim::AdamOptions(o.lr));
  auto gen_seed = static_cast<int64_t>(o.seed);
  torch::manual_seed(gen_seed);
  const int64_t n = inputs.size(0);
  auto dev = gate->parameters()[0].device();
  auto dtype = gate->parameters()[0].scalar_type();
  auto x_all = inputs.to(dev, dtype);
  auto t_all = targets.to(dev, torch::kFloat);
  double last = 0;
  const bool was_training = gate->is_training();
  gate->train();
  for (int64_t step = 0; step < o.steps; ++step) {
    auto idx = torch::randint(n, {std::min(o.batch, n)},
                              torch::TensorOptions().dtype(torch::kLong).device(dev));
    auto logits = gate->logits(x_all.index_select(0, idx), slot).to(torch::kFloat);
    auto loss = torch::binary_cross_entropy_with_logits(logits, t_all.index_select(0, idx));
    opt.zero_grad();
    loss.backward();
    opt.step();
    last = loss.item<double>();
  }
  gate->train(was_training);
  return last;
}

}  // namespace emoe
