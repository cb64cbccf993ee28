// Load-balancing losses for routed experts: GShard/tutel importance+load, Switch, router z-loss.
#pragma once
#include <ATen/core/Tensor.h>

namespace emoe {

// Squared coefficient of variation: var (unbiased) / (mean^2 + 1e-10), as tutel computes it.
at::Tensor cv_squared(const at::Tensor& x);

// ½(CV²(importance) + CV²(load)). importance_e = Σ_tokens softmax(clean)_e. load_e =
// Σ_tokens P(clean_e + noise > threshold), noise ~ N(0, sigma), threshold = the k-th best noisy
// logit of the token. tutel_quirk reproduces tutel, which subtracts that logit threshold from the
// softmax probabilities instead of from the logits.
at::Tensor importance_load_loss(const at::Tensor& clean_logits, const at::Tensor& noisy_logits,
                                const at::Tensor& topk_idx, double sigma, bool tutel_quirk);

// Switch Transformer: E · Σ_e f_e · P_e, f_e = share of the T·k selections that chose e,
// P_e = mean router probability of e.
at::Tensor switch_loss(const at::Tensor& probs, const at::Tensor& topk_idx);

// Router z-loss: mean over tokens of logsumexp(logits)^2.
at::Tensor z_loss(const at::Tensor& logits);

}  // namespace emoe
