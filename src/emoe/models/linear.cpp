// Linear / Conv1D layer used by every architecture.
#include "emoe/models/linear.h"

#include <torch/torch.h>

namespace emoe {

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

torch::Tensor LinearImpl::base_forward(const torch::Tensor& x) {
  if (!options_.transposed) return torch::linear(x, weight, bias);
  auto sizes = x.sizes().vec();
  auto x2 = x.reshape({-1, options_.in});
  auto y = bias.defined() ? torch::addmm(bias, x2, weight) : torch::mm(x2, weight);
  sizes.back() = options_.out;
  return y.view(sizes);
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  if (adapter_) return adapter_->adapt(x, *this);
  return base_forward(x);
}

torch::Tensor LinearImpl::weight_out_in() const { return options_.transposed ? weight.t() : weight; }

std::vector<torch::Tensor> fused_linear(const std::vector<LinearImpl*>& layers, const torch::Tensor& x) {
  bool fusable = layers.size() > 1;
  for (auto* l : layers)
    fusable = fusable && !l->adapter() && !l->options().transposed &&
              l->bias.defined() == layers[0]->bias.defined();
  std::vector<torch::Tensor> out;
  if (!fusable) {
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
  auto y = torch::linear(x, torch::cat(weights, 0), biases.empty() ? torch::Tensor() : torch::cat(biases, 0));
  return y.split_with_sizes(sizes, -1);
}

void LinearImpl::set_adapter(std::shared_ptr<LinearAdapter> adapter) {
  if (adapter_) {
    for (const auto& child : adapter_->named_children()) unregister_module(child.key());
    for (const auto& p : adapter_->named_parameters(/*recurse=*/false)) parameters_.erase(p.key());
  }
  adapter_ = std::move(adapter);
  if (adapter_) {
    for (const auto& child : adapter_->named_children()) register_module(child.key(), child.value());
    for (const auto& p : adapter_->named_parameters(/*recurse=*/false))
      register_parameter(p.key(), p.value(), p.value().requires_grad());
  }
}

}  // namespace emoe
