// A frozen linear layer plus low-rank updates as one autograd node (see the header).
#include "emoe/models/low_rank_linear.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "emoe/core/autocast_compat.h"
#include "emoe/models/dropout.h"
#include "emoe/models/matmul.h"

namespace emoe {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class LowRankLinearFn : public torch::autograd::Function<LowRankLinearFn> {
 public:
  // inputs: x, weight, bias (empty: none), A_1..A_m, B_1..B_m, then the non-tensor arguments
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias_or_empty, at::TensorList as, at::TensorList bs,
                            std::vector<int64_t> offsets, std::vector<double> scalings,
                            std::vector<double> dropouts) {
    RECORD_FUNCTION("emoe::low_rank_linear", std::vector<c10::IValue>());
    const int64_t in = weight.size(1), out = weight.size(0), m = static_cast<int64_t>(as.size());
    // contiguous: a dropout mask numbers the elements in their logical order
    const auto x2 = x.reshape({-1, in}).contiguous();
    const int64_t rows = x2.size(0);
    auto y = at::empty({rows, out}, x.options());
    gemm_out(y, x2, weight.t(), bias_or_empty.numel() > 0 ? bias_or_empty : at::Tensor());
    std::vector<int64_t> seeds(m, 0);
    variable_list zs;
    at::Tensor dropped;  // one scratch buffer for every update's dropped input
    for (int64_t i = 0; i < m; ++i) {
      at::Tensor h = x2;
      if (dropouts[i] > 0) {
        seeds[i] = static_cast<int64_t>(draw_dropout_seed());
        if (!dropped.defined()) dropped = at::empty_like(x2);
        dropout_mask_into(x2, dropped, static_cast<uint64_t>(seeds[i]), dropouts[i],
                          /*accumulate=*/false);
        h = dropped;
      }
      auto z = at::empty({rows, as[i].size(0)}, x.options());
      gemm_out(z, h, as[i].t());
      z.mul_(scalings[i]);
      gemm_out(y.narrow(1, offsets[i], bs[i].size(0)), z, bs[i].t(), at::Tensor(),
               /*accumulate=*/true);
      zs.push_back(z);
    }
    // x for the A gradients (their dropped input is recomputed from the seed), the base weight
    // for x's gradient, each update's [tokens, r] product for its B gradient
    variable_list saved{x2, x.requires_grad() ? weight : at::Tensor()};
    saved.insert(saved.end(), as.begin(), as.end());
    saved.insert(saved.end(), bs.begin(), bs.end());
    saved.insert(saved.end(), zs.begin(), zs.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["shape"] = x.sizes().vec();
    ctx->saved_data["offsets"] = offsets;
    ctx->saved_data["scalings"] = scalings;
    ctx->saved_data["dropouts"] = dropouts;
    ctx->saved_data["seeds"] = seeds;
    auto shape = x.sizes().vec();
    shape.back() = out;
    return y.view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x2 = saved[0];
    const auto& weight = saved[1];
    const int64_t m = static_cast<int64_t>(saved.size() - 2) / 3;
    const auto offsets = ctx->saved_data["offsets"].toIntVector();
    const auto scalings = ctx->saved_data["scalings"].toDoubleVector();
    const auto dropouts = ctx->saved_data["dropouts"].toDoubleVector();
    const auto seeds = ctx->saved_data["seeds"].toIntVector();
    const int64_t rows = x2.size(0), in = x2.size(1);
    const auto g2 = grads[0].reshape({rows, -1});
    variable_list result(3 + 2 * m + 3);
    at::Tensor gx;
    if (ctx->needs_input_grad(0)) {
      gx = at::empty({rows, in}, g2.options());
      gemm_out(gx, g2, weight);
    }
    at::Tensor dropped, scratch;
    for (int64_t i = 0; i < m; ++i) {
      const auto& a = saved[2 + i];
      const auto& b = saved[2 + m + i];
      const auto& z = saved[2 + 2 * m + i];
      const auto gi = g2.narrow(1, offsets[i], b.size(0));
      const bool need_a = ctx->needs_input_grad(3 + i), need_b = ctx->needs_input_grad(3 + m + i);
      if (need_b) {  // gB = g_i^T (s · h A^T)
        auto gb = at::empty({b.size(0), b.size(1)}, g2.options());
        gemm_out(gb, gi.t(), z);
        result[3 + m + i] = gb;
      }
      if (!need_a && !gx.defined()) continue;
      auto gz = at::empty({rows, b.size(1)}, g2.options());  // s · g_i B: the gradient of h A^T
      gemm_out(gz, gi, b);
      gz.mul_(scalings[i]);
      const bool drop = dropouts[i] > 0;
      const auto seed = static_cast<uint64_t>(seeds[i]);
      if (need_a) {  // gA = gz^T h
        at::Tensor h = x2;
        if (drop) {
          if (!dropped.defined()) dropped = at::empty_like(x2);
          dropout_mask_into(x2, dropped, seed, dropouts[i], /*accumulate=*/false);
          h = dropped;
        }
        auto ga = at::empty({a.size(0), a.size(1)}, g2.options());
        gemm_out(ga, gz.t(), h);
        result[3 + i] = ga;
      }
      if (gx.defined()) {  // gx += mask ⊙ (gz A)
        if (!drop) {
          gemm_out(gx, gz, a, at::Tensor(), /*accumulate=*/true);
        } else {
          if (!scratch.defined()) scratch = at::empty({rows, in}, g2.options());
          gemm_out(scratch, gz, a);
          dropout_mask_into(scratch, gx, seed, dropouts[i], /*accumulate=*/true);
        }
      }
    }
    if (gx.defined()) result[0] = gx.view(ctx->saved_data["shape"].toIntVector());
    return result;
  }
};

bool plain_float_cpu(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 2;
}

}  // namespace

bool low_rank_linear_supported(const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, const std::vector<LowRankUpdate>& updates) {
  if (!x.defined() || !x.device().is_cpu() || x.scalar_type() != at::kFloat || x.dim() < 1 ||
      emoe::autocast_enabled(at::kCPU))
    return false;
  if (!plain_float_cpu(weight) || weight.requires_grad() || x.size(-1) != weight.size(1))
    return false;
  if (bias.defined() &&
      (bias.requires_grad() || bias.scalar_type() != at::kFloat || !bias.device().is_cpu() ||
       bias.dim() != 1 || bias.size(0) != weight.size(0)))
    return false;
  for (const auto& u : updates) {
    if (!plain_float_cpu(u.a) || !plain_float_cpu(u.b) || u.a.size(1) != weight.size(1) ||
        u.b.size(1) != u.a.size(0) || u.offset < 0 || u.offset + u.b.size(0) > weight.size(0) ||
        !(u.dropout >= 0 && u.dropout < 1))
      return false;
  }
  return true;
}

at::Tensor low_rank_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           const std::vector<LowRankUpdate>& updates) {
  TORCH_CHECK(low_rank_linear_supported(x, weight, bias, updates),
              "low_rank_linear: unsupported inputs (check low_rank_linear_supported first)");
  std::vector<at::Tensor> as, bs;
  std::vector<int64_t> offsets;
  std::vector<double> scalings, dropouts;
  for (const auto& u : updates) {
    as.push_back(u.a);
    bs.push_back(u.b);
    offsets.push_back(u.offset);
    scalings.push_back(u.scaling);
    dropouts.push_back(u.dropout);
  }
  return LowRankLinearFn::apply(x, weight, bias.defined() ? bias : at::empty({0}, weight.options()),
                                at::TensorList(as), at::TensorList(bs), offsets, scalings,
                                dropouts);
}

}  // namespace emoe
