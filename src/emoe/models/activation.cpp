// Activation functions.
#include "emoe/models/activation.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "emoe/core/error.h"
#include "emoe/models/row_kernels.h"

namespace emoe {

Activation parse_activation(const std::string& name, const std::string& where) {
  if (name == "gelu") return Activation::kGeluErf;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast")
    return Activation::kGeluTanh;
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "relu") return Activation::kRelu;
  EMOE_THROW(InputError, "{}: expected gelu, gelu_new, silu or relu, got '{}'", where, name);
}

std::string activation_name(Activation a) {
  switch (a) {
    case Activation::kGeluErf:
      return "gelu";
    case Activation::kGeluTanh:
      return "gelu_new";
    case Activation::kSilu:
      return "silu";
    case Activation::kRelu:
      return "relu";
  }
  return "?";
}

namespace {

class GeluErfFn : public torch::autograd::Function<GeluErfFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    RECORD_FUNCTION("emoe::gelu", std::vector<c10::IValue>());
    ctx->save_for_backward({x});
    return gelu_erf_forward(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_FUNCTION("emoe::gelu_backward", std::vector<c10::IValue>());
    return {gelu_erf_backward(ctx->get_saved_variables()[0], grads[0])};
  }
};

}  // namespace

at::Tensor activate(const at::Tensor& x, Activation a) {
  switch (a) {
    case Activation::kGeluErf:
      if (gelu_erf_applies(x)) return GeluErfFn::apply(x);
      return torch::gelu(x);
    case Activation::kGeluTanh:
      return torch::gelu(x, "tanh");
    case Activation::kSilu:
      return torch::silu(x);
    case Activation::kRelu:
      return torch::relu(x);
  }
  return x;
}

namespace {

class SiluMulFn : public torch::autograd::Function<SiluMulFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate,
                            const at::Tensor& up) {
    RECORD_FUNCTION("emoe::silu_mul", std::vector<c10::IValue>());
    ctx->save_for_backward({gate, up});
    return silu_mul_forward(gate, up);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_FUNCTION("emoe::silu_mul_backward", std::vector<c10::IValue>());
    const auto saved = ctx->get_saved_variables();
    auto [dg, du] = silu_mul_backward(saved[0], saved[1], grads[0]);
    return {dg, du};
  }
};

}  // namespace

at::Tensor activate_gated(const at::Tensor& gate, const at::Tensor& up, Activation a) {
  if (a == Activation::kSilu && silu_mul_applies(gate, up)) return SiluMulFn::apply(gate, up);
  return activate(gate, a) * up;
}

}  // namespace emoe
