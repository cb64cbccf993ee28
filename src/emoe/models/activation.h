// Activation functions by their Hugging Face names (hidden_act / activation_function).
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

namespace emoe {

enum class Activation { kGeluErf, kGeluTanh, kSilu, kRelu };

// "gelu" -> erf GELU, "gelu_new"/"gelu_pytorch_tanh" -> tanh GELU, "silu"/"swish", "relu".
// Throws InputError naming `where` (e.g. "config.json: field 'hidden_act'") otherwise.
Activation parse_activation(const std::string& name, const std::string& where);
std::string activation_name(Activation a);
at::Tensor activate(const at::Tensor& x, Activation a);

}  // namespace emoe
