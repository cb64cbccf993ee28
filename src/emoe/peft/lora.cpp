// LoRA adapter: initialisation as PEFT does it, the forward update, and the merged delta.
#include "emoe/peft/lora.h"

#include <torch/torch.h>

#include <cmath>

#include "emoe/core/error.h"
#include "emoe/models/dropout.h"
#include "emoe/models/matmul.h"

namespace emoe {

LoraAdapter::LoraAdapter(const LinearImpl& base, const LoraOptions& options, at::Generator& gen)
    : options_(options) {
  const auto& lo = base.options();
  EMOE_CHECK(options.r >= 1, UsageError, "peft.r: expected a rank >= 1, got {}", options.r);
  // kaiming_uniform_(a=√5) on [r, in]: gain √(2/(1+5)), bound gain·√(3/fan_in) = 1/√in
  const double bound = 1.0 / std::sqrt(static_cast<double>(lo.in));
  auto a = torch::empty({options.r, lo.in}, torch::kFloat).uniform_(-bound, bound, gen);
  auto wopts = base.weight.options();
  lora_a = register_module("lora_A", AdapterWeight(a.to(wopts)));
  lora_b = register_module("lora_B", AdapterWeight(torch::zeros({lo.out, options.r}, wopts)));
}

bool LoraAdapter::low_rank_update(const LinearImpl& base, LowRankUpdate* update) const {
  update->a = lora_a->weight;
  update->b = lora_b->weight;
  update->offset = 0;
  update->scaling = scaling();
  // the layer's train/eval flag counts (the adapter is not a child of the model)
  update->dropout = base.is_training() ? options_.dropout : 0.0;
  return true;
}

torch::Tensor LoraAdapter::adapt(const torch::Tensor& x, LinearImpl& base) {
  // float32 on CPU with a frozen base (low_rank_linear_supported checks both): the layer and its
  // update as one node (low_rank_linear.h)
  LowRankUpdate u;
  low_rank_update(base, &u);
  const auto w = base.weight_out_in();  // a view of the weight: the same requires_grad
  if (low_rank_linear_supported(x, w, base.bias, {u})) return low_rank_linear(x, w, base.bias, {u});
  auto y = base.base_forward(x);
  // The adapter itself is not a child of the model (only its parts are), so the layer's
  // train/eval flag is the one that counts.
  auto h =
      options_.dropout > 0 && base.is_training() ? emoe::dropout(x, options_.dropout, true) : x;
  // y + (h A^T · scaling) B^T as one addmm: the scaling on the rank-r product, and the update
  // added by the GEMM itself (two passes over the [tokens, out] output fewer)
  auto z = emoe::linear(h, lora_a->weight, at::Tensor()) * scaling();
  // bfloat16 products computed in float32 (a CPU without AVX-512, matmul.h's Bf16Gemm): on
  // emoe's products, the update rounded before it is added (ATen's bfloat16 addmm is scalar there)
  if (bf16_gemm() == Bf16Gemm::kFloat32 && z.scalar_type() == at::kBFloat16 && z.device().is_cpu())
    return y + emoe::linear(z, lora_b->weight, at::Tensor());
  auto y2 = y.reshape({-1, y.size(-1)});
  return torch::addmm(y2, z.reshape({-1, z.size(-1)}), lora_b->weight.t()).view(y.sizes());
}

torch::Tensor LoraAdapter::delta_weight() const {
  return torch::mm(lora_b->weight.to(torch::kFloat), lora_a->weight.to(torch::kFloat)) * scaling();
}

}  // namespace emoe
