// The causal-LM head and its loss in row chunks (see the header).
#include "emoe/models/lm_loss.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>

#include "emoe/core/autocast_compat.h"
#include "emoe/core/bf16_shadow.h"
#include "emoe/models/matmul.h"
#include "emoe/models/row_kernels.h"

namespace emoe {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

}  // namespace

// rows of logits computed at once: about 32 MiB of them in their dtype, a multiple of 64 rows
// where that leaves at least 64 (oneDNN's AMX products ran a 262-row chunk of the 32000-word
// head at 980 GFLOP/s and a 256-row one at 1810: row tails cost that much)
int64_t lm_loss_chunk_rows(int64_t rows, int64_t vocab, int64_t element_size) {
  int64_t chunk = (int64_t{32} << 20) / std::max<int64_t>(vocab * element_size, 1);
  if (chunk >= 128) chunk -= chunk % 64;
  return std::clamp<int64_t>(chunk, 1, std::max<int64_t>(rows, 1));
}

namespace {

class ChunkedLmLossFn : public torch::autograd::Function<ChunkedLmLossFn> {
 public:
  // h [N, H], weight [V, H], target [N] (-100: ignored); products in `compute_code` (h's dtype, or
  // autocast's lower precision: then the logits are rounded to it, as autocast's linear layer
  // leaves them, and the softmax and the gradients' sums run in h's dtype)
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight,
                            const at::Tensor& target, bool need_h, bool need_w, int64_t chunk_rows,
                            int64_t compute_code) {
    RECORD_FUNCTION("emoe::chunked_lm_loss", std::vector<c10::IValue>());
    c10::impl::ExcludeDispatchKeyGuard no_autocast(
        c10::DispatchKeySet({c10::DispatchKey::AutocastCPU, c10::DispatchKey::AutocastCUDA}));
    const auto compute = static_cast<at::ScalarType>(compute_code);
    const bool lower = compute != h.scalar_type();
    // the products' operands; with bfloat16 products computed in float32 (matmul.h's Bf16Gemm:
    // a CPU without AVX-512) widened back to float32 once here, not by every chunk's product
    const bool widen = lower && compute == at::kBFloat16 && h.device().is_cpu() &&
                       bf16_gemm() == Bf16Gemm::kFloat32;
    auto rounded = [&](const at::Tensor& t) {
      return widen ? t.to(compute).to(at::kFloat) : t.to(compute);
    };
    const auto hp = lower ? rounded(h) : h;
    // the weight: the optimiser's bfloat16 copy where current (bf16_shadow.h; rounding the
    // Llama-style model's 32000 x 512 head afresh took ~5 ms of each step)
    const auto wp = !lower                               ? weight
                    : compute == at::kBFloat16 && !widen ? bf16_cast(weight)
                                                         : rounded(weight);
    const int64_t n = h.size(0), vocab = weight.size(0);
    const auto valid = target != -100;
    const auto count = valid.sum().to(h.scalar_type());  // 0: the mean is NaN, as cross_entropy's
    const auto safe_target = target.clamp_min(0).unsqueeze(1);
    at::Tensor gh = need_h ? at::empty_like(h) : at::Tensor();
    at::Tensor gw = need_w ? at::empty({vocab, h.size(1)}, h.options()) : at::Tensor();
    auto loss_sum = at::zeros({}, h.options());
    // the row kernels (float32 sums, in place in the products' dtype) where they apply: per row,
    // the loss and the gradient's scale w = 1/count on kept rows, 0 on ignored ones
    bool rows_kernel =
        h.scalar_type() == at::kFloat && h.device().is_cpu() && !row_kernels_isa().empty();
    at::Tensor row_scale, row_loss, flat_target;
    if (rows_kernel) {
      row_scale = valid.to(at::kFloat) / count.to(at::kFloat);
      row_loss = at::empty({n}, h.options().dtype(at::kFloat));
      flat_target = safe_target.squeeze(1).contiguous();
    }
    // (the kernels keep one buffer of the products' dtype; ATen's ops a float32 one beside it)
    const int64_t chunk =
        chunk_rows > 0 ? chunk_rows
                       : lm_loss_chunk_rows(n, vocab, rows_kernel ? c10::elementSize(compute) : 4);
    // low: a chunk's logits / gradient in the compute dtype; gh_part, gw_part: its products there
    at::Tensor logits, low, gh_part, gw_part;
    for (int64_t r0 = 0; r0 < n; r0 += chunk) {
      const int64_t c = std::min(chunk, n - r0);
      const bool grad = need_h || need_w;
      if (rows_kernel) {
        if (!logits.defined() || logits.size(0) != c)
          logits = at::empty({c, vocab}, h.options().dtype(compute));
        gemm_out(logits, hp.narrow(0, r0, c), wp.t());
        if (softmax_xent_rows(logits, flat_target.narrow(0, r0, c),
                              grad ? row_scale.narrow(0, r0, c) : at::Tensor(),
                              row_loss.narrow(0, r0, c))) {
          if (!grad) continue;
          // the gradient's products: bfloat16 operands summed into float32 (no rounding between)
          if (need_h) gemm_out(gh.narrow(0, r0, c), logits, wp);
          if (need_w) gemm_out(gw, logits.t(), hp.narrow(0, r0, c), at::Tensor(), r0 > 0);
          continue;
        }
        TORCH_CHECK(r0 == 0, "chunked_lm_loss: the row kernels stopped applying mid-way");
        rows_kernel = false;  // (a CPU without the kernels' instruction set): ATen's ops
        logits = at::Tensor();
      }
      if (!logits.defined() || logits.size(0) != c) {
        logits = at::empty({c, vocab}, h.options());
        if (lower) low = at::empty({c, vocab}, h.options().dtype(compute));
        if (lower && need_h) gh_part = at::empty({c, h.size(1)}, hp.options().dtype(compute));
      }
      const auto hc = h.narrow(0, r0, c);
      const auto vc = valid.narrow(0, r0, c);
      const auto tc = safe_target.narrow(0, r0, c);
      if (lower) {
        gemm_out(low, hp.narrow(0, r0, c), wp.t());
        logits.copy_(low);
      } else {
        gemm_out(logits, hc, weight.t());
      }
      // log Σ exp in place, in four passes over the chunk: max; exp(x - max); Σ; then the
      // gradient's scaling (logsumexp and a separate softmax would take twice as many)
      const auto picked = logits.gather(1, tc);
      const auto mx = at::amax(logits, 1, /*keepdim=*/true);
      logits.sub_(mx).exp_();
      const auto sum = logits.sum(1, /*keepdim=*/true);
      // Σ over the kept rows of log Σ exp(logits) - logits[target]
      loss_sum.add_(((mx + sum.log() - picked).squeeze(1) * vc).sum());
      if (!grad) continue;
      // d mean / d logits = (softmax - onehot(target)) · w, w = 1/count on kept rows, 0 on ignored
      const auto w = (vc.to(logits.scalar_type()) / count).unsqueeze(1);
      auto& p = logits.mul_(w / sum);
      p.scatter_add_(1, tc, -w);
      if (lower) {
        // the chunk's gradient products in the compute dtype; the weight's summed over chunks
        // in h's dtype (rounding each chunk's part once, as one product over all rows would)
        low.copy_(p);
        if (need_h) {
          gemm_out(gh_part, low, wp);
          gh.narrow(0, r0, c).copy_(gh_part);
        }
        if (need_w) {
          if (!gw_part.defined())
            gw_part = at::empty({vocab, h.size(1)}, hp.options().dtype(compute));
          gemm_out(gw_part, low.t(), hp.narrow(0, r0, c));
          r0 == 0 ? gw.copy_(gw_part) : gw.add_(gw_part);
        }
        continue;
      }
      if (need_h) gemm_out(gh.narrow(0, r0, c), p, weight);
      if (need_w) gemm_out(gw, p.t(), hc, at::Tensor(), /*accumulate=*/r0 > 0);
    }
    if (rows_kernel) loss_sum = (row_loss * valid).sum().to(h.scalar_type());
    ctx->save_for_backward({gh, gw});
    return loss_sum / count;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    // the loss is a scalar: its gradient scales the ones computed in the forward pass (no copy
    // when it is 1, as when the loss itself is backpropagated)
    const auto& go = grads[0];
    const bool one = go.device().is_cpu() && go.item<double>() == 1.0;
    auto scale = [&](const at::Tensor& g) { return !g.defined() || one ? g : g * go; };
    return {scale(saved[0]), scale(saved[1]), at::Tensor(), at::Tensor(),
            at::Tensor(),    at::Tensor(),    at::Tensor()};
  }
};

// the products' dtype: autocast's where it is on for the tensors' device, else theirs
at::ScalarType lm_loss_compute_dtype(const at::Tensor& hidden) {
  if (hidden.device().is_cpu() && emoe::autocast_enabled(at::kCPU))
    return emoe::autocast_dtype(at::kCPU);
  if (hidden.device().is_cuda() && emoe::autocast_enabled(at::kCUDA))
    return emoe::autocast_dtype(at::kCUDA);
  return hidden.scalar_type();
}

}  // namespace

bool chunked_lm_loss_supported(const at::Tensor& hidden, const at::Tensor& weight) {
  // float32 (or float64, without autocast) hidden states and weight: the softmax and the sums run
  // in their dtype, as cross_entropy's do under autocast
  if (!(hidden.defined() && weight.defined() && hidden.dim() >= 2 && weight.dim() == 2 &&
        hidden.size(-1) == weight.size(1) && hidden.scalar_type() == weight.scalar_type() &&
        hidden.device() == weight.device()))
    return false;
  const auto compute = lm_loss_compute_dtype(hidden);
  return hidden.scalar_type() == at::kFloat ||
         (hidden.scalar_type() == at::kDouble && compute == at::kDouble);
}

at::Tensor chunked_causal_lm_loss(const at::Tensor& hidden, const at::Tensor& weight,
                                  const at::Tensor& labels, int64_t chunk_rows) {
  TORCH_CHECK(chunked_lm_loss_supported(hidden, weight),
              "chunked_causal_lm_loss: unsupported inputs");
  const int64_t t = hidden.size(1);
  // position t predicts label t + 1
  const auto h = hidden.narrow(1, 0, t - 1).reshape({-1, hidden.size(-1)});
  const auto target = labels.narrow(1, 1, t - 1).reshape({-1}).to(hidden.device(), at::kLong);
  const bool grad = at::GradMode::is_enabled();
  return ChunkedLmLossFn::apply(h, weight, target, grad && h.requires_grad(),
                                grad && weight.requires_grad(), chunk_rows,
                                static_cast<int64_t>(lm_loss_compute_dtype(hidden)));
}

}  // namespace emoe
