// Top-k routing with tutel-compatible capacity and balance losses.
#include "emoe/moe/routing.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

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

std::tuple<at::Tensor, at::Tensor> top_k_rows(const at::Tensor& x, int64_t k) {
  if (x.device().type() != at::kCPU || x.scalar_type() != at::kFloat || x.dim() != 2 ||
      !x.is_contiguous() || k < 0 || k > x.size(1))
    return x.topk(k, -1);
  const int64_t n = x.size(0), e = x.size(1);
  auto values = at::empty({n, k}, x.options());
  auto indices = at::empty({n, k}, x.options().dtype(at::kLong));
  const float* src = x.data_ptr<float>();
  float* vo = values.data_ptr<float>();
  int64_t* io = indices.data_ptr<int64_t>();
  // a before b: the larger value (NaN the largest), then the lower index
  auto before = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    const bool an = std::isnan(a.first), bn = std::isnan(b.first);
    if (an != bn) return an;
    if (!an && a.first != b.first) return a.first > b.first;
    return a.second < b.second;
  };
  at::parallel_for(0, n, std::max<int64_t>(1, 4096 / std::max<int64_t>(e, 1)),
                   [&](int64_t r0, int64_t r1) {
                     std::vector<std::pair<float, int64_t>> row(static_cast<size_t>(e));
                     for (int64_t r = r0; r < r1; ++r) {
                       for (int64_t j = 0; j < e; ++j) row[j] = {src[r * e + j], j};
                       std::partial_sort(row.begin(), row.begin() + k, row.end(), before);
                       for (int64_t i = 0; i < k; ++i) {
                         vo[r * k + i] = row[i].first;
                         io[r * k + i] = row[i].second;
                       }
                     }
                   });
  return {values, indices};
}

Routing route_tokens(const at::Tensor& logits, const MoeConfig& cfg, bool training) {
  const int64_t n = logits.size(0), e = logits.size(1), k = cfg.topk;
  auto clean = logits.to(torch::kFloat);
  auto noisy = clean;
  if (training && cfg.gate_noise > 0)
    noisy = clean + torch::randn_like(clean) * (cfg.gate_noise / static_cast<double>(e));
  auto ranked = cfg.softmax_before_topk ? noisy.softmax(-1) : noisy;
  auto top = top_k_rows(ranked, k);
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
