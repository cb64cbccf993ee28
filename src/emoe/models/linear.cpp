// Linear / Conv1D layer used by every architecture.
#include "emoe/models/linear.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "emoe/core/autocast_compat.h"
#include "emoe/models/matmul.h"
#include "emoe/models/small_gemm.h"

namespace emoe {

namespace {

// x W^T + b for a frozen W and b (PEFT, frozen layers): only the input's gradient is needed,
// g · W, so the input is not kept for the backward pass — autograd's linear would keep it for
// a weight gradient nobody asked for (24 MiB for a BERT-base FFN output at batch 16 x 128).
class FrozenLinearFn : public torch::autograd::Function<FrozenLinearFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias_or_empty) {
    RECORD_FUNCTION("emoe::frozen_linear", std::vector<c10::IValue>());
    ctx->save_for_backward({weight});  // a parameter: held by reference, nothing copied
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    const auto bias = bias_or_empty.numel() > 0 ? bias_or_empty : torch::Tensor();
    // under bf16 autocast, where emoe computes bfloat16 products (oneDNN's AVX-512 BF16 kernels
    // with each class's implementation measured, or in float32 on a CPU without AVX-512): on
    // gemm_out, as autocast's linear would compute them (no gradient mode in here); ATen's
    // linear would take oneDNN's first implementation on the weight as it is
    if (bf16_products_on_gemm_out()) {
      auto y = autocast_inference_linear(x, weight, bias);
      if (y.defined()) return y;
    }
    return torch::linear(x, weight, bias);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto weight = ctx->get_saved_variables()[0];
    const auto& g = grads[0];
    // under autocast the output (and so g) may be bfloat16 while the weight is float32
    const auto w = weight.scalar_type() == g.scalar_type() ? weight : weight.to(g.scalar_type());
    torch::Tensor gx;
    if (g.scalar_type() == at::kBFloat16 && g.device().is_cpu() && bf16_products_on_gemm_out()) {
      auto sizes = g.sizes().vec();
      sizes.back() = w.size(1);
      gx = torch::empty(sizes, g.options());
      gemm_out(gx.view({-1, w.size(1)}), g.reshape({-1, g.size(-1)}), w);
    } else {
      gx = torch::matmul(g, w);
    }
    const auto x_dtype = static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    return {gx.scalar_type() == x_dtype ? gx : gx.to(x_dtype), torch::Tensor(), torch::Tensor()};
  }
};

bool frozen_with_input_grad(const torch::Tensor& x, const torch::Tensor& w,
                            const torch::Tensor& b) {
  return torch::GradMode::is_enabled() && x.requires_grad() && !w.requires_grad() &&
         (!b.defined() || !b.requires_grad());
}

}  // namespace

LinearImpl::LinearImpl(const LinearOptions& options) : options_(options) {
  auto shape = options.transposed ? std::vector<int64_t>{options.in, options.out}
                                  : std::vector<int64_t>{options.out, options.in};
  weight = register_parameter("weight", torch::empty(shape));
  if (options.bias) bias = register_parameter("bias", torch::zeros({options.out}));
  reset_parameters(0.02);
}

void LinearImpl::reset_parameters(double std) {
  torch::NoGradGuard no_grad;
  weight.normal_(0.0, std);
  if (bias.defined()) bias.zero_();
}

namespace {

// Autocast's lower dtype for tensors on t's device, if autocast is on there and casts.
c10::optional<at::ScalarType> autocast_target(const torch::Tensor& t) {
  c10::optional<at::ScalarType> dtype;
  if (t.device().is_cpu() && emoe::autocast_enabled(at::kCPU))
    dtype = emoe::autocast_dtype(at::kCPU);
  if (t.device().is_cuda() && emoe::autocast_enabled(at::kCUDA))
    dtype = emoe::autocast_dtype(at::kCUDA);
  if (dtype && *dtype == at::kFloat) dtype.reset();
  return dtype;
}

// A weight that trains in this forward: autograd needs the weight itself.
bool trains_now(const torch::Tensor& t) {
  return t.defined() && t.requires_grad() && torch::GradMode::is_enabled();
}

}  // namespace

bool LinearImpl::CastCopy::made_from(const std::vector<torch::Tensor>& tensors,
                                     c10::ScalarType dtype) const {
  if (!weight.defined() || weight.scalar_type() != dtype || sources.size() != tensors.size())
    return false;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!sources[i].is_same(tensors[i]) || data[i] != tensors[i].data_ptr() ||
        versions[i] != static_cast<int64_t>(tensors[i]._version()))
      return false;
  return true;
}

void LinearImpl::CastCopy::remember(const std::vector<torch::Tensor>& tensors) {
  sources = tensors;
  data.clear();
  versions.clear();
  for (const auto& t : tensors) {
    data.push_back(t.data_ptr());
    versions.push_back(static_cast<int64_t>(t._version()));
  }
}

void LinearImpl::CastCopy::clear() {
  weight = bias = torch::Tensor();
  sources.clear();
}

torch::Tensor LinearImpl::autocast_weight() {
  auto w = weight_out_in();
  if (trains_now(weight)) {
    cast_.clear();  // autocast's own cache takes over
    return w;
  }
  if (weight.scalar_type() != at::kFloat) return w;
  const auto dtype = autocast_target(weight);
  if (!dtype) return w;
  if (!cast_.made_from({weight}, *dtype)) {
    torch::NoGradGuard no_grad;
    cast_.weight = w.to(*dtype);  // strides preserved: a Conv1D weight's stays a transposed view
    cast_.remember({weight});
  }
  return cast_.weight;
}

torch::Tensor LinearImpl::base_forward(const torch::Tensor& x) {
  if (cast_.weight.defined() && trains_now(weight))
    cast_.clear();  // (autocast_weight's copy from inference)
  // a few rows without gradients (decoding): the small-product kernels, at the weights' bandwidth
  if (small_gemm_applies(x, weight, bias, options_.transposed))
    return small_gemm_linear(x, weight, bias, options_.transposed);
  // float32 on an AVX-512 CPU: oneDNN's kernels, keeping only what the gradients need
  if (onednn_matmul_enabled(x) || autocast_linear_applies(x, weight, bias))
    return emoe::linear(x, weight_out_in(), bias);
  const auto w = autocast_weight();               // [out, in]
  if (w.scalar_type() != weight.scalar_type()) {  // inference under autocast, on the cast copy
    auto y = autocast_inference_linear(x, w, bias);
    if (y.defined()) return y;
  }
  if (frozen_with_input_grad(x, weight, bias))
    return FrozenLinearFn::apply(x, w, bias.defined() ? bias : torch::empty({0}, weight.options()));
  // bfloat16 products computed in float32 (a CPU without AVX-512, matmul.h's Bf16Gemm): on
  // emoe's products (ATen's bfloat16 ones are scalar there)
  if (bf16_gemm() == Bf16Gemm::kFloat32 && w.scalar_type() == at::kBFloat16) {
    auto y = emoe::linear(x, w, bias);
    if (y.defined()) return y;
  }
  if (!options_.transposed) return torch::linear(x, w, bias);
  auto sizes = x.sizes().vec();
  auto x2 = x.reshape({-1, options_.in});
  auto y = bias.defined() ? torch::addmm(bias, x2, w.t()) : torch::mm(x2, w.t());
  sizes.back() = options_.out;
  return y.view(sizes);
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  if (adapter_) return adapter_->adapt(x, *this);
  return base_forward(x);
}

torch::Tensor LinearImpl::forward_activated(const torch::Tensor& x, Activation act) {
  const bool gelu = act == Activation::kGeluErf || act == Activation::kGeluTanh;
  const bool grad = torch::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() ||
                                                      (bias.defined() && bias.requires_grad()));
  // (in eval mode only: a checkpointed block's first, gradient-free training forward must give
  // the bits its recomputation with gradients gives)
  if (gelu && !adapter_ && !grad && !is_training()) {
    InferenceGeluEpilogue epilogue(act == Activation::kGeluTanh);
    auto y = base_forward(x);
    return epilogue.applied() ? y : activate(y, act);
  }
  return activate(forward(x), act);
}

torch::Tensor LinearImpl::weight_out_in() const {
  return options_.transposed ? weight.t() : weight;
}

std::vector<torch::Tensor> fused_linear(const std::vector<LinearImpl*>& layers,
                                        const torch::Tensor& x) {
  // decoding (a few rows, no gradients): each layer's small product reads its own weight once,
  // where the fused product would first copy every weight into one
  if (!layers.empty() && !layers[0]->adapter() &&
      small_gemm_applies(x, layers[0]->weight, layers[0]->bias, layers[0]->options().transposed)) {
    std::vector<torch::Tensor> weights, biases;
    bool group = true;
    for (auto* l : layers) {
      group = group && !l->adapter() &&
              l->options().transposed == layers[0]->options().transposed &&
              l->bias.defined() == layers[0]->bias.defined() &&
              l->options().in == layers[0]->options().in &&
              small_gemm_applies(x, l->weight, l->bias, l->options().transposed);
      weights.push_back(l->weight);
      biases.push_back(l->bias);
    }
    if (group) return small_gemm_group(x, weights, biases, layers[0]->options().transposed);
    std::vector<torch::Tensor> out;
    for (auto* l : layers) out.push_back(l->forward(x));
    return out;
  }
  bool fusable = layers.size() > 1;
  std::vector<LowRankUpdate> updates;
  int64_t column = 0;
  for (auto* l : layers) {
    fusable = fusable && !l->options().transposed && l->bias.defined() == layers[0]->bias.defined();
    if (fusable && l->adapter()) {
      LowRankUpdate u;
      fusable = l->adapter()->low_rank_update(*l, &u);
      u.offset = column;
      updates.push_back(u);
    }
    column += l->options().out;
  }
  std::vector<torch::Tensor> out;
  bool frozen = true;
  for (auto* l : layers)
    frozen =
        frozen && !l->weight.requires_grad() && !(l->bias.defined() && l->bias.requires_grad());
  if (!fusable ||
      (!updates.empty() && !frozen)) {  // (updates on a trainable layer: its own forward)
    for (auto* l : layers) out.push_back(l->forward(x));
    return out;
  }
  std::vector<torch::Tensor> weights, biases;
  std::vector<int64_t> sizes;
  for (auto* l : layers) {
    weights.push_back(l->weight);
    if (l->bias.defined()) biases.push_back(l->bias);
    sizes.push_back(l->options().out);
  }
  if (!updates.empty()) {
    // the input's device and dtype first (no concatenation for nothing), then the whole layer
    if (low_rank_linear_supported(x, layers[0]->weight, layers[0]->bias, {})) {
      at::Tensor w, b;
      {
        torch::NoGradGuard
            no_grad;  // every layer is frozen (above): no graph for the concatenation
        w = torch::cat(weights, 0);
        if (!biases.empty()) b = torch::cat(biases, 0);
      }
      if (low_rank_linear_supported(x, w, b, updates))
        return low_rank_linear(x, w, b, updates).split_with_sizes(sizes, -1);
    }
    for (auto* l : layers) out.push_back(l->forward(x));
    return out;
  }
  // under autocast without training weights (inference, evaluation, frozen layers): the
  // concatenation in autocast's dtype, made once and kept by the first layer while every weight
  // and bias is unchanged
  auto* first = layers[0];
  bool trains = false;
  for (const auto& t : weights) trains = trains || trains_now(t);
  for (const auto& t : biases) trains = trains || trains_now(t);
  const auto dtype = autocast_target(weights[0]);
  bool cacheable = !trains && dtype.has_value();
  for (const auto& t : weights) cacheable = cacheable && t.scalar_type() == at::kFloat;
  if (!cacheable) {
    first->fused_cast_.clear();
    // training every weight under CPU bf16 autocast: each product on its own weight (no
    // concatenation; matmul.h's autocast_linear_group)
    bool group = weights.size() <= 3;
    for (size_t i = 0; i < weights.size() && group; ++i)
      group = autocast_linear_applies(x, weights[i], biases.empty() ? at::Tensor() : biases[i]);
    if (group) return autocast_linear_group(x, weights, biases);
    auto y = emoe::linear(x, torch::cat(weights, 0),
                          biases.empty() ? torch::Tensor() : torch::cat(biases, 0));
    return y.split_with_sizes(sizes, -1);
  }
  std::vector<torch::Tensor> sources = weights;
  sources.insert(sources.end(), biases.begin(), biases.end());
  auto& copy = first->fused_cast_;
  if (!copy.made_from(sources, *dtype)) {
    torch::NoGradGuard no_grad;
    copy.weight = torch::cat(weights, 0).to(*dtype);
    copy.bias = biases.empty() ? torch::Tensor() : torch::cat(biases, 0).to(*dtype);
    copy.remember(sources);
  }
  auto y = autocast_inference_linear(x, copy.weight, copy.bias);
  if (!y.defined()) y = torch::linear(x, copy.weight, copy.bias);
  return y.split_with_sizes(sizes, -1);
}

void LinearImpl::set_adapter(std::shared_ptr<LinearAdapter> adapter) {
  if (adapter_) {
    for (const auto& child : adapter_->named_children()) unregister_module(child.key());
    for (const auto& p : adapter_->named_parameters(/*recurse=*/false)) parameters_.erase(p.key());
  }
  adapter_ = std::move(adapter);
  if (adapter_) {
    for (const auto& child : adapter_->named_children())
      register_module(child.key(), child.value());
    for (const auto& p : adapter_->named_parameters(/*recurse=*/false))
      register_parameter(p.key(), p.value(), p.value().requires_grad());
  }
}

}  // namespace emoe
