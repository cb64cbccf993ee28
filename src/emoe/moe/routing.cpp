// Top-k routing with tutel-compatible capacity and balance losses.
#include "emoe/moe/routing.h"

#include <torch/torch.h>

#include "emoe/moe/balance.h"

namespace emoe {

namespace {

// Slot location of each (token, choice) within its expert, tutel-style: choices are filled in
// order (all first choices, then all second choices, ...), tokens in priority order.
at::Tensor capacity_locations(const at::Tensor& experts, const at::Tensor& priority, int64_t e) {
  const int64_t n = experts.size(0), k = experts.size(1);
  auto order = priority.defined() ? priority.argsort(0, /*descending=*/true)
                                  : torch::arange(n, experts.options());
  auto inverse = torch::empty_like(order).scatter_(0, order, torch::arange(n, order.options()));
  auto base = torch::zeros({1, e}, experts.options());
  std::vector<at::Tensor> locs;
  for (int64_t j = 0; j < k; ++j) {
    auto onehot = torch::one_hot(experts.select(1, j).index_select(0, order), e);  // [n, E] sorted
    auto loc = (onehot.cumsum(0) - 1 + base) * onehot;
    auto loc_tok = loc.sum(1).index_select(0, inverse);  // back to token order
    locs.push_back(loc_tok);
    base = base + onehot.sum(0, true);
  }
  return torch::stack(locs, 1);  // [n, k]
}

}  // namespace

Routing route_tokens(const at::Tensor& logits, const MoeConfig& cfg, bool training) {
  const int64_t n = logits.size(0), e = logits.size(1), k = cfg.topk;
  auto clean = logits.to(torch::kFloat);
  auto noisy = clean;
  if (training && cfg.gate_noise > 0)
    noisy = clean + torch::randn_like(clean) * (cfg.gate_noise / static_cast<double>(e));
  auto ranked = cfg.softmax_before_topk ? noisy.softmax(-1) : noisy;
  auto top = ranked.topk(k, -1);
  Routing r;
  r.experts = std::get<1>(top);
  if (cfg.weighted) {
    auto probs = noisy.softmax(-1).gather(1, r.experts);
    r.weights = probs / probs.sum(-1, true).clamp_min(std::numeric_limits<float>::epsilon());
  } else {
    r.weights = torch::ones({n, k}, clean.options());
  }
  if (cfg.capacity_factor > 0 && n > 0) {
    const int64_t per =
        static_cast<int64_t>(cfg.capacity_factor * static_cast<double>((n + e - 1) / e));
    const int64_t capacity = k * per;
    auto priority = cfg.batch_prioritized ? std::get<0>(ranked.max(-1)) : at::Tensor();
    auto loc = capacity_locations(r.experts, priority, e);
    r.weights = r.weights * (loc < capacity).to(r.weights.scalar_type());
  }
  if (training && cfg.balance != BalanceLoss::kNone && n > 0) {
    at::Tensor loss;
    switch (cfg.balance) {
      case BalanceLoss::kImportanceLoad: {
        double sigma = (cfg.gate_noise > 0 ? cfg.gate_noise : 1.0) / static_cast<double>(e);
        loss = importance_load_loss(clean, noisy, r.experts, sigma, cfg.tutel);
        break;
      }
      case BalanceLoss::kSwitch:
        loss = switch_loss(clean.softmax(-1), r.experts);
        break;
      case BalanceLoss::kZLoss:
        loss = z_loss(clean);
        break;
      case BalanceLoss::kNone:
        break;
    }
    r.aux_loss = loss * cfg.balance_weight;
  }
  return r;
}

at::Tensor expert_counts(const Routing& r, int64_t experts) {
  auto kept = (r.weights != 0).to(torch::kLong).reshape({-1});
  return torch::zeros({experts}, r.experts.options()).index_add_(0, r.experts.reshape({-1}), kept);
}

}  // namespace emoe
