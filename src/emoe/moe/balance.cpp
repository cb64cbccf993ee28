// Load-balancing losses.
#include "emoe/moe/balance.h"

#include <torch/torch.h>

#include <cmath>

namespace emoe {

at::Tensor cv_squared(const at::Tensor& x) {
  auto xf = x.to(torch::kFloat);
  if (xf.numel() < 2) return torch::zeros({}, xf.options());
  return xf.var(/*unbiased=*/true) / (xf.mean().pow(2) + 1e-10);
}

at::Tensor importance_load_loss(const at::Tensor& clean_logits, const at::Tensor& noisy_logits,
                                const at::Tensor& topk_idx, double sigma, bool tutel_quirk) {
  auto clean = clean_logits.to(torch::kFloat);
  auto probs = clean.softmax(-1);
  auto importance = probs.sum(0);
  const int64_t k = topk_idx.size(1);
  auto threshold = noisy_logits.to(torch::kFloat).gather(1, topk_idx.narrow(1, k - 1, 1));
  auto diff = (tutel_quirk ? probs : clean) - threshold;
  auto p = 0.5 * (1.0 + torch::erf(diff / (sigma * std::sqrt(2.0))));
  auto load = p.sum(0);
  return 0.5 * (cv_squared(importance) + cv_squared(load));
}

at::Tensor switch_loss(const at::Tensor& probs, const at::Tensor& topk_idx) {
  const int64_t e = probs.size(1);
  auto counts =
      torch::zeros({e}, probs.options().dtype(torch::kFloat))
          .index_add_(0, topk_idx.reshape({-1}),
                      torch::ones({topk_idx.numel()}, probs.options().dtype(torch::kFloat)));
  auto f = counts / static_cast<double>(topk_idx.numel());
  auto p = probs.to(torch::kFloat).mean(0);
  return static_cast<double>(e) * (f * p).sum();
}

at::Tensor z_loss(const at::Tensor& logits) {
  return logits.to(torch::kFloat).logsumexp(-1).pow(2).mean();
}

}  // namespace emoe
