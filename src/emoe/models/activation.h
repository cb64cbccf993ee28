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
// A gated FFN's hidden activation act(gate) * up, with autograd. SiLU on the CPU runs in one fused
// pass each way (row_kernels.h: silu_mul) where the kernels apply — saving gate and up instead of
// also silu(gate), and rounding once — and elsewhere as activate(gate, a) * up.
at::Tensor activate_gated(const at::Tensor& gate, const at::Tensor& up, Activation a);

}  // namespace emoe
