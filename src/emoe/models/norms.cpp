// LayerNorm and RMSNorm.
#include "emoe/models/norms.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "emoe/models/dropout.h"
#include "emoe/models/row_kernels.h"

namespace emoe {

LayerNormImpl::LayerNormImpl(int64_t dim, double eps) : dim_(dim), eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
  bias = register_parameter("bias", torch::zeros({dim}));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  // under bf16 autocast a bfloat16 input (e.g. a linear's output without a float32 residual, as
  // BERT's MLM head) is normalised in the weights' float32, as autocast's float32 ops
  if (x.scalar_type() != weight.scalar_type())
    return torch::layer_norm(x.to(weight.scalar_type()), {dim_}, weight, bias, eps_);
  return torch::layer_norm(x, {dim_}, weight, bias, eps_);
}

namespace {

// LayerNorm(a + r) through the row kernels, keeping s = a + r and two floats per row for the
// backward pass (what layer_norm keeps of its input), instead of the add's output, its mixed-dtype
// copies under autocast and layer_norm's separate passes each way. With dropout_p > 0, a is
// dropped first inside the same pass (one dropout() call's draw: the seed is kept, not a mask).
class AddLayerNormFn : public torch::autograd::Function<AddLayerNormFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a,
                            const at::Tensor& r, const at::Tensor& weight, const at::Tensor& bias,
                            double eps, double dropout_p) {
    RECORD_FUNCTION("emoe::add_layer_norm", std::vector<c10::IValue>());
    const bool grad =
        a.requires_grad() || r.requires_grad() || weight.requires_grad() || bias.requires_grad();
    const DropoutDraw draw = draw_dropout(dropout_p);
    auto out = add_layer_norm_forward(a, r, weight, bias, eps, grad, draw.if_any());
    if (grad) {
      ctx->save_for_backward({out[1], out[2], out[3], weight});
      ctx->saved_data["a_dtype"] = static_cast<int64_t>(a.scalar_type());
      ctx->saved_data["seed"] = static_cast<int64_t>(draw.seed);
      ctx->saved_data["p"] = draw.p;
    }
    return out[0];
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_FUNCTION("emoe::add_layer_norm_backward", std::vector<c10::IValue>());
    const auto s = ctx->get_saved_variables();
    const auto a_dtype = static_cast<at::ScalarType>(ctx->saved_data["a_dtype"].toInt());
    const DropoutDraw draw{static_cast<uint64_t>(ctx->saved_data["seed"].toInt()),
                           ctx->saved_data["p"].toDouble()};
    auto g = add_layer_norm_backward(s[0], s[1], s[2], s[3], grads[0], a_dtype, draw.if_any());
    return {g[0], g[1], g[2], g[3], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

torch::Tensor LayerNormImpl::forward_residual(const torch::Tensor& a, const torch::Tensor& r,
                                              double dropout_p) {
  if (add_layer_norm_applies(a, r, weight, bias))
    return AddLayerNormFn::apply(a, r, weight, bias, eps_, dropout_p);
  return forward(emoe::dropout(a, dropout_p, dropout_p > 0) + r);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

namespace {

// RMSNorm of float32 rows in one pass each way (row_kernels.h), keeping x and one rstd per row for
// the backward pass instead of x, x^2's statistics and the normalised copy
class RmsNormFn : public torch::autograd::Function<RmsNormFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, double eps) {
    RECORD_FUNCTION("emoe::rms_norm", std::vector<c10::IValue>());
    auto [y, rstd] = rms_norm_forward(x, weight, eps);
    ctx->save_for_backward({x, weight, rstd});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_FUNCTION("emoe::rms_norm_backward", std::vector<c10::IValue>());
    const auto s = ctx->get_saved_variables();
    auto [dx, dw] = rms_norm_backward(s[0], s[1], s[2], grads[0]);
    return {dx, dw, at::Tensor()};
  }
};

}  // namespace

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  if (rms_norm_applies(x, weight)) return RmsNormFn::apply(x, weight, eps_);
  // bfloat16 without gradients (decoding a bfloat16 model): one pass instead of seven ops
  if (!(at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad())) &&
      rms_norm_bf16_applies(x, weight)) {
    RECORD_FUNCTION("emoe::rms_norm", std::vector<c10::IValue>());
    return rms_norm_forward(x, weight, eps_).first;
  }
  // statistics in float32 at least (float64 stays float64)
  auto h = x.scalar_type() == torch::kDouble ? x : x.to(torch::kFloat);
  auto var = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(var + eps_);
  return weight * h.to(x.scalar_type());
}

namespace {

class ResidualAddFn : public torch::autograd::Function<ResidualAddFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& a) {
    RECORD_FUNCTION("emoe::residual_add", std::vector<c10::IValue>());
    ctx->saved_data["a_dtype"] = static_cast<int64_t>(a.scalar_type());
    return residual_add_forward(x, a);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["a_dtype"].toInt());
    return {grads[0], grads[0].to(dtype)};
  }
};

}  // namespace

torch::Tensor residual_add(const torch::Tensor& x, const torch::Tensor& a) {
  if (residual_add_applies(x, a)) return ResidualAddFn::apply(x, a);
  return x + a;
}

}  // namespace emoe
