// LoRA: a frozen Linear plus the low-rank update (alpha/r) B A dropout(x), with PEFT's names.
#pragma once
#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "emoe/models/linear.h"

namespace emoe {

// A child module holding one weight, so that keys read like PEFT's `query.lora_A.weight`.
class AdapterWeightImpl : public torch::nn::Module {
 public:
  explicit AdapterWeightImpl(torch::Tensor w) {
    weight = register_parameter("weight", std::move(w));
  }
  torch::Tensor weight;
};
TORCH_MODULE(AdapterWeight);

struct LoraOptions {
  int64_t r = 8;
  double alpha = 16;
  double dropout = 0.0;  // on the adapter input, in training only
};

class LoraAdapter : public LinearAdapter {
 public:
  // A [r, in] kaiming-uniform(a=√5) drawn from `gen` (torch.nn.Linear's init, as PEFT keeps it),
  // B [out, r] zeros; both on the base layer's device and dtype. Conv1D layers (GPT-2) get the
  // same shapes: only the merge needs to know the storage layout.
  LoraAdapter(const LinearImpl& base, const LoraOptions& options, at::Generator& gen);

  torch::Tensor adapt(const torch::Tensor& x, LinearImpl& base) override;
  std::string kind() const override { return "LoRA"; }
  bool low_rank_update(const LinearImpl& base, LowRankUpdate* update) const override;
  // (alpha/r) B A as [out, in], computed in float32.
  torch::Tensor delta_weight() const;
  double scaling() const { return options_.alpha / static_cast<double>(options_.r); }
  const LoraOptions& options() const { return options_; }

  AdapterWeight lora_a{nullptr};  // registered as "lora_A"
  AdapterWeight lora_b{nullptr};  // registered as "lora_B"

 private:
  LoraOptions options_;
};

}  // namespace emoe
