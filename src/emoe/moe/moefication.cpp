// MoEfication router training.
#include "emoe/moe/moefication.h"

#include <torch/torch.h>

#include "emoe/core/error.h"

namespace emoe {

at::Tensor moefication_expert_scores(const at::Tensor& inputs, const at::Tensor& w_in,
                                     int64_t experts) {
  namespace F = torch::nn::functional;
  auto x = F::normalize(inputs.to(torch::kFloat), F::NormalizeFuncOptions().dim(-1));
  auto acts = torch::relu(torch::matmul(x, w_in.to(x.device(), torch::kFloat).t()));
  return acts.view({acts.size(0), experts, acts.size(1) / experts}).sum(-1);
}

namespace {

// The reference's held-out measure: per token with any activation, the share of its expert
// scores that the router's top 20 % of experts cover; the mean over tokens.
double held_out_coverage(GateImpl& gate, FfnSlot& slot, const at::Tensor& x,
                         const at::Tensor& scores) {
  const int64_t e = scores.size(1);
  const int64_t top = std::max<int64_t>(1, e / 5);
  auto pred = gate.logits(x, slot).to(torch::kFloat);
  auto picked = scores.gather(1, std::get<1>(pred.topk(top, 1))).sum(1);
  auto total = scores.sum(1);
  auto any = total > 0;
  if (!any.any().item<bool>()) return 0.0;
  return (picked.masked_select(any) / total.masked_select(any)).mean().item<double>();
}

}  // namespace

RouterTrainResult train_moefication_router(ExpertFfnImpl& plug, FfnSlot& slot,
                                           const at::Tensor& inputs, const RouterTrainOptions& o) {
  EMOE_CHECK(inputs.size(0) > 0, InputError,
             "MoEfication: no sample tokens to train the router on");
  auto gate = plug.gate();
  auto params = gate->parameters();
  torch::optim::Adam opt(params, torch::optim::AdamOptions(o.lr));
  const int64_t n = inputs.size(0);
  auto dev = params[0].device();
  auto dtype = params[0].scalar_type();
  const int64_t experts = plug.num_experts();
  auto x_all = inputs.to(dev, dtype);
  at::Tensor scores_all;
  {
    torch::NoGradGuard g;
    scores_all = moefication_expert_scores(x_all, slot.ffn_view().w_in.detach(), experts);
  }
  // the first 90 % train, the last 10 % choose the epoch (all of it when too few to split)
  const int64_t held = n >= 10 ? n - n / 10 * 9 : 0;
  const int64_t n_train = n - held;
  auto x_train = x_all.narrow(0, 0, n_train), s_train = scores_all.narrow(0, 0, n_train);
  auto x_held = held ? x_all.narrow(0, n_train, held) : x_train;
  auto s_held = held ? scores_all.narrow(0, n_train, held) : s_train;
  at::Generator gen = at::detail::createCPUGenerator(o.seed);
  RouterTrainResult r;
  r.held_out = held;
  r.coverage = -1;
  std::vector<at::Tensor> best;
  const bool was_training = gate->is_training();
  for (int64_t epoch = 1; epoch <= o.epochs; ++epoch) {
    gate->train();
    auto order = torch::randperm(n_train, gen, torch::kLong).to(dev);
    for (int64_t b = 0; b < n_train; b += o.batch) {
      auto idx = order.narrow(0, b, std::min(o.batch, n_train - b));
      auto target = s_train.index_select(0, idx);
      target = target / target.max().clamp_min(1e-12);  // the reference's scores /= scores.max()
      auto logits = gate->logits(x_train.index_select(0, idx), slot).to(torch::kFloat);
      auto loss = torch::binary_cross_entropy_with_logits(logits, target);
      opt.zero_grad();
      loss.backward();
      opt.step();
      r.loss = loss.item<double>();
    }
    gate->eval();
    torch::NoGradGuard g;
    const double cov = held_out_coverage(*gate, slot, x_held, s_held);
    if (cov > r.coverage) {
      r.coverage = cov;
      r.best_epoch = epoch;
      best.clear();
      for (auto& p : params) best.push_back(p.detach().clone());
    }
  }
  {
    torch::NoGradGuard g;
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(best[i]);
  }
  gate->train(was_training);
  return r;
}

}  // namespace emoe
