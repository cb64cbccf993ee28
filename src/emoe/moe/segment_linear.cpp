// Grouped GEMM over expert segments, as one autograd function.
#include "emoe/moe/segment_linear.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "emoe/core/error.h"
#include "emoe/models/matmul.h"

namespace emoe {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class SegmentLinearFn : public torch::autograd::Function<SegmentLinearFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias_or_empty,
                               std::vector<int64_t> counts, int64_t block_dim) {
    RECORD_FUNCTION("emoe::segment_linear", std::vector<c10::IValue>());
    const torch::Tensor bias = bias_or_empty.numel() > 0 ? bias_or_empty : torch::Tensor();
    const int64_t e = static_cast<int64_t>(counts.size());
    const int64_t s = weight.size(block_dim) / e;
    const int64_t out_features = block_dim == 0 ? s : weight.size(0);
    auto xc = x.contiguous();
    // under autocast the inputs may differ in dtype: compute in the weight's
    if (xc.scalar_type() != weight.scalar_type()) xc = xc.to(weight.scalar_type());
    auto y = torch::empty({xc.size(0), out_features}, xc.options());
    int64_t off = 0;
    for (int64_t j = 0; j < e; ++j) {
      const int64_t c = counts[j];
      if (c == 0) continue;
      auto wj = weight.narrow(block_dim, j * s, s);
      auto yj = y.narrow(0, off, c);
      emoe::gemm_out(yj, xc.narrow(0, off, c), wj.t(),
                     bias.defined() ? bias.narrow(0, j * s, s) : at::Tensor(),
                     /*accumulate=*/false, /*shapes_vary=*/true);
      off += c;
    }
    ctx->save_for_backward({xc, weight});
    ctx->saved_data["counts"] = c10::IValue(counts);
    ctx->saved_data["block_dim"] = block_dim;
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& weight = saved[1];
    const auto counts = ctx->saved_data["counts"].toIntVector();
    const int64_t block_dim = ctx->saved_data["block_dim"].toInt();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const auto x_dtype = static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const int64_t e = static_cast<int64_t>(counts.size());
    const int64_t s = weight.size(block_dim) / e;
    auto gy = grads[0].contiguous();
    if (gy.scalar_type() != weight.scalar_type()) gy = gy.to(weight.scalar_type());
    auto gx = torch::empty_like(x);
    auto gw = torch::empty_like(weight);
    auto gb = has_bias ? torch::empty({weight.size(0)}, weight.options()) : torch::Tensor();
    int64_t off = 0;
    for (int64_t j = 0; j < e; ++j) {
      const int64_t c = counts[j];
      auto gwj = gw.narrow(block_dim, j * s, s);
      if (c == 0) {
        gwj.zero_();
        if (has_bias) gb.narrow(0, j * s, s).zero_();
        continue;
      }
      auto wj = weight.narrow(block_dim, j * s, s);
      auto gyj = gy.narrow(0, off, c);
      auto xj = x.narrow(0, off, c);
      auto gxj = gx.narrow(0, off, c);
      emoe::gemm_out(gxj, gyj, wj, {}, false, true);      // [c, out] · [out, in]
      emoe::gemm_out(gwj, gyj.t(), xj, {}, false, true);  // [out, c] · [c, in]
      if (has_bias) {
        auto gbj = gb.narrow(0, j * s, s);
        at::sum_out(gbj, gyj, {0});
      }
      off += c;
    }
    if (gx.scalar_type() != x_dtype) gx = gx.to(x_dtype);
    return {gx, gw, gb, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

at::Tensor segment_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                          const std::vector<int64_t>& counts, int64_t block_dim) {
  EMOE_CHECK(block_dim == 0 || block_dim == 1, UsageError,
             "segment_linear: block_dim must be 0 or 1");
  EMOE_CHECK(!counts.empty() && weight.size(block_dim) % static_cast<int64_t>(counts.size()) == 0,
             UsageError, "segment_linear: {} experts do not divide {} weight rows/columns",
             counts.size(), weight.size(block_dim));
  int64_t rows = 0;
  for (auto c : counts) rows += c;
  EMOE_CHECK(rows == x.size(0), UsageError, "segment_linear: segments cover {} rows, input has {}",
             rows, x.size(0));
  EMOE_CHECK(block_dim == 0 || !bias.defined(), UsageError,
             "segment_linear: bias only with block_dim 0");
  // autograd functions take no undefined tensors: "no bias" travels as an empty one
  return SegmentLinearFn::apply(
      x, weight, bias.defined() ? bias : torch::empty({0}, weight.options()), counts, block_dim);
}

}  // namespace emoe
