// Gate implementations.
#include "emoe/moe/gates.h"

#include <torch/torch.h>

#include <cmath>

#include "emoe/models/matmul.h"

namespace emoe {

torch::Tensor expert_key_means(const torch::Tensor& keys, int64_t experts) {
  return keys.reshape({experts, keys.size(0) / experts, keys.size(1)}).mean(1);
}

torch::Tensor expert_key_means(const FfnView& view, int64_t experts) {
  return expert_key_means(view.w_in, experts);
}

torch::Tensor AvgKGateImpl::logits(const torch::Tensor& x, FfnSlot& slot) {
  auto keys = expert_key_means(slot.ffn_view(), experts_);
  return emoe::linear(x, detach_keys_ ? keys.detach() : keys, {});
}

LinearGateImpl::LinearGateImpl(int64_t d, int64_t experts) {
  weight = register_parameter("weight", torch::randn({experts, d}) * 0.02);
}

torch::Tensor LinearGateImpl::logits(const torch::Tensor& x, FfnSlot&) {
  return emoe::linear(x, weight, {});
}

CosineGateImpl::CosineGateImpl(int64_t d, int64_t experts, int64_t dim) {
  cosine_projector = register_module("cosine_projector", torch::nn::Linear(d, dim));
  sim_matrix = register_parameter("sim_matrix", torch::randn({dim, experts}) * 0.01);
  temperature = register_parameter("temperature", torch::full({1}, std::log(2.0)));
}

torch::Tensor CosineGateImpl::logits(const torch::Tensor& x, FfnSlot&) {
  namespace F = torch::nn::functional;
  auto p = F::normalize(cosine_projector(x), F::NormalizeFuncOptions().dim(1));
  auto s = F::normalize(sim_matrix, F::NormalizeFuncOptions().dim(0));
  auto scale = torch::clamp_max(temperature, std::log(100.0)).exp();
  return emoe::linear(p, s.t(), {}) * scale;
}

MlpGateImpl::MlpGateImpl(int64_t d, int64_t experts) {
  using torch::nn::LinearOptions;
  in_proj = register_module("in_proj", torch::nn::Linear(LinearOptions(d, experts).bias(false)));
  out_proj =
      register_module("out_proj", torch::nn::Linear(LinearOptions(experts, experts).bias(false)));
  torch::NoGradGuard g;
  out_proj->weight.copy_(torch::eye(experts));
}

torch::Tensor MlpGateImpl::logits(const torch::Tensor& x, FfnSlot&) {
  namespace F = torch::nn::functional;
  return out_proj(torch::tanh(in_proj(F::normalize(x, F::NormalizeFuncOptions().dim(-1)))));
}

std::shared_ptr<GateImpl> make_gate(const MoeConfig& cfg, FfnSlot& slot) {
  auto view = slot.ffn_view();
  const int64_t d = view.d_model(), e = cfg.experts;
  torch::NoGradGuard g;
  switch (cfg.gate) {
    case GateKind::kAvgK:
      return std::make_shared<AvgKGateImpl>(e, cfg.tutel);
    case GateKind::kLinear: {
      auto gate = std::make_shared<LinearGateImpl>(d, e);
      if (cfg.gate_init == "avgk" && cfg.method != MoeMethod::kGmoe)
        gate->weight.copy_(expert_key_means(view, e));
      return gate;
    }
    case GateKind::kCosine:
      return std::make_shared<CosineGateImpl>(d, e, cfg.cosine_dim);
    case GateKind::kMlp: {
      auto gate = std::make_shared<MlpGateImpl>(d, e);
      // the expert centres: the mean of each expert's L2-normalised keys (the reference's)
      namespace F = torch::nn::functional;
      gate->in_proj->weight.copy_(expert_key_means(
          F::normalize(view.w_in.detach().to(torch::kFloat), F::NormalizeFuncOptions().dim(1)), e));
      return gate;
    }
  }
  return nullptr;
}

}  // namespace emoe
