// Usage-based expert pruning.
#include "emoe/moe/prune.h"

#include <torch/torch.h>

#include <numeric>

#include "emoe/core/error.h"
#include "emoe/models/routed.h"

namespace emoe {

std::vector<std::vector<int64_t>> most_used_experts(const UsageRecorder& usage, int64_t keep) {
  auto totals = usage_totals(usage, "train");
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i < usage.sources().size(); ++i) {
    if (usage.sources()[i].kind != "selections") continue;
    const auto& c = totals[i];
    EMOE_CHECK(keep >= 1 && keep <= static_cast<int64_t>(c.size()), UsageError,
               "--keep: expected 1..{} experts, got {}", c.size(), keep);
    std::vector<int64_t> order(c.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return c[a] > c[b]; });
    order.resize(keep);
    std::sort(order.begin(), order.end());
    out.push_back(order);
  }
  EMOE_CHECK(!out.empty(), InputError, "the usage record has no MoE layers to prune");
  return out;
}

void apply_expert_pruning(PretrainedModelImpl& model,
                          const std::vector<std::vector<int64_t>>& keep) {
  std::vector<Routed*> layers;
  for (const auto& m : routed_ffn_plugs(model))
    if (m.routed->supports_expert_mask()) layers.push_back(m.routed);
  EMOE_CHECK(keep.empty() || keep.size() == layers.size(), InputError,
             "pruning lists {} layers, the model has {} MoE layers", keep.size(), layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    if (keep.empty()) {
      layers[i]->set_allowed_experts({});
      continue;
    }
    auto mask = torch::zeros({layers[i]->num_experts()}, torch::kBool);
    for (auto e : keep[i]) mask[e] = true;
    layers[i]->set_allowed_experts(mask);
  }
}

std::vector<int64_t> halving_schedule(int64_t experts) {
  std::vector<int64_t> out;
  for (int64_t m = experts; m >= 1; m /= 2) out.push_back(m);
  if (out.back() != 1) out.push_back(1);
  return out;
}

}  // namespace emoe
