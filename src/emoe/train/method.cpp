// Applying a run's method to a model.
#include "emoe/train/method.h"

#include <filesystem>
#include <set>

#include "emoe/core/error.h"
#include "emoe/models/architecture.h"
#include "emoe/moe/gates.h"
#include "emoe/moe/prune.h"
#include "emoe/moe/usage.h"
#include "emoe/peft/targets.h"
#include "emoe/train/method_table.h"

namespace emoe {
namespace fs = std::filesystem;

namespace {

// train.trainable moe-layers | gates: only the converted layers (whole) or only their gates
// update, as the authors' --tune_moe_layers_only / --tune_gates_only; the task head and the
// adapters of a PEFT method train in every case; everything else (embeddings, the other layers,
// a pretrained LM head) is frozen.
// `origin` names what chose the scope in the messages ("train.trainable gates", "method
// emoe-learn+lora").
void restrict_trainable(PretrainedModelImpl& model, const std::string& scope,
                        const std::string& origin) {
  std::vector<std::string> prefixes;
  std::set<const c10::TensorImpl*> gates;
  const auto slots = model.ffn_slots();
  for (auto* plug : moe_plugs(model)) {
    prefixes.push_back(slots.at(static_cast<size_t>(plug->layer()))->layer_prefix() + ".");
    for (const auto& p : plug->gate()->parameters()) gates.insert(p.unsafeGetTensorImpl());
  }
  const auto adapters = adapter_parameters(model);
  const Architecture& arch = architecture_of(model.summary());
  int64_t trained = 0;
  for (auto& p : model.named_parameters(/*recurse=*/true)) {
    const std::string& k = p.key();
    const auto* impl = p.value().unsafeGetTensorImpl();
    bool in_scope = gates.count(impl) > 0;
    if (scope == "moe-layers")
      for (const auto& prefix : prefixes) in_scope = in_scope || k.rfind(prefix, 0) == 0;
    const bool head = model.is_head_key(k) && !arch.is_pretrained_head(k);
    const bool train = in_scope || head || adapters.count(impl) > 0;
    p.value().set_requires_grad(train);
    trained += train ? p.value().numel() : 0;
  }
  EMOE_CHECK(!gates.empty() || scope != "gates", UsageError,
             "{}: the converted layers have no gate parameters", origin);
  spdlog::info("{}: {} parameters train (the {} converted layers{}, the task head, any adapters)",
               origin, trained, prefixes.size(), scope == "gates" ? "' gates" : "");
}

}  // namespace

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
  // train.trainable "all": the method decides (GMoE+LoRA its converted layers, EMoE-learn+LoRA
  // its routers, besides the adapters and the head that select_trainable left trainable)
  const bool chosen = cfg.train.trainable != "all";
  const std::string& scope = chosen ? cfg.train.trainable : method_info(cfg.method).also_trains;
  if (!scope.empty())
    restrict_trainable(model, scope, chosen ? "train.trainable " + scope : "method " + cfg.method);
  return st;
}

}  // namespace emoe
