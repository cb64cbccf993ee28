// MoLoRA adapter: stacked LoRA experts, the float32 router, top-k masking and the Switch loss.
#include "emoe/peft/molora.h"

#include <torch/torch.h>

#include "emoe/core/error.h"
#include "emoe/models/dropout.h"
#include "emoe/models/matmul.h"
#include "emoe/moe/balance.h"

namespace emoe {

MoloraAdapter::MoloraAdapter(const LinearImpl& base, const MoloraOptions& options,
                             at::Generator& gen)
    : options_(options) {
  const auto& lo = base.options();
  const int64_t e = options.experts, r = options.r;
  EMOE_CHECK(r >= 1, UsageError, "peft.r: expected a rank >= 1, got {}", r);
  EMOE_CHECK(e >= 1, UsageError, "peft.experts: expected >= 1, got {}", e);
  EMOE_CHECK(options.topk >= 0 && options.topk <= e, UsageError,
             "peft.topk: expected 0 (soft merging) to experts = {}, got {}", e, options.topk);
  auto wopts = base.weight.options();
  auto a = torch::empty({e * r, lo.in}, torch::kFloat).normal_(0.0, 0.02, gen);
  auto router = torch::empty({e, lo.in}, torch::kFloat).normal_(0.0, 0.02, gen);
  molora_A = register_parameter("molora_A", a.to(wopts));
  molora_B = register_parameter("molora_B", torch::zeros({lo.out, e * r}, wopts));
  molora_router = register_parameter("molora_router", router.to(wopts));
}

torch::Tensor MoloraAdapter::adapt(const torch::Tensor& x, LinearImpl& base) {
  const int64_t e = options_.experts;
  const bool training = base.is_training();  // the adapter is not itself a child of the model
  auto y = base.base_forward(x);
  auto p =
      torch::softmax(emoe::linear(x.to(torch::kFloat), molora_router.to(torch::kFloat), {}), -1);
  auto w = p;
  aux_loss_ = torch::Tensor();
  if (options_.topk > 0) {
    auto idx = std::get<1>(p.topk(options_.topk, -1));
    w = p * torch::zeros_like(p).scatter(-1, idx, 1.0);
    if (training && options_.balance_weight > 0)
      aux_loss_ = switch_loss(p.reshape({-1, e}), idx.reshape({-1, options_.topk})) *
                  options_.balance_weight;
  }
  mass.add(w, training);
  auto h = options_.dropout > 0 && training ? emoe::dropout(x, options_.dropout, true) : x;
  auto ranks = emoe::linear(h, molora_A, {});  // [.., E·r]
  ranks = ranks * w.repeat_interleave(options_.r, -1).to(ranks.scalar_type());
  return y + emoe::linear(ranks, molora_B, {}) * scaling();
}

}  // namespace emoe
