// Applying a run's method to a model.
#include "emoe/train/method.h"

#include <filesystem>

#include "emoe/core/error.h"
#include "emoe/moe/prune.h"
#include "emoe/moe/usage.h"

namespace emoe {
namespace fs = std::filesystem;

MethodState apply_method(PretrainedModelImpl& model, const RunConfig& cfg,
                         const std::vector<ModelInputs>& sample) {
  MethodState st;
  if (cfg.uses_moe()) {
    st.moe = convert_to_moe(model, cfg.moe, sample);
    st.moe.source = cfg.model;
    if (!cfg.prune_from.empty()) {
      // pruning -> training: the experts the earlier run used most, on the same split
      const fs::path from(cfg.prune_from);
      auto earlier = moe_state_from_json(JsonFields::from_file((from / "moe.json").string()));
      for (const auto& [l, split] : st.moe.splits)
        EMOE_CHECK(earlier.splits.count(l) && earlier.splits.at(l).permutation == split.permutation,
                   UsageError,
                   "prune_from {}: layer {} was split differently there; use the same moe settings "
                   "and seed",
                   cfg.prune_from, l);
      auto usage = UsageRecorder::load((from / "usage.json").string());
      auto keep = most_used_experts(usage, cfg.prune_keep);
      apply_expert_pruning(model, keep);
      size_t i = 0;
      for (auto& [l, split] : st.moe.splits) split.allowed = keep.at(i++);
      spdlog::info("pruned to the {} most-used experts per layer of {}", cfg.prune_keep,
                   cfg.prune_from);
    }
  }
  st.peft = cfg.peft;
  if (st.peft.method != PeftMethod::kNone) {
    st.peft.seed = cfg.train.seed;
    apply_peft(model, st.peft);
    select_trainable(model, st.peft);
  }
  return st;
}

}  // namespace emoe
