// Activation functions.
#include "emoe/models/activation.h"

#include <torch/torch.h>

#include "emoe/core/error.h"

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

at::Tensor activate(const at::Tensor& x, Activation a) {
  switch (a) {
    case Activation::kGeluErf:
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

}  // namespace emoe
