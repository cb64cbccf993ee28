// The fine-tuning methods in one table.
#include "emoe/train/method_table.h"

#include <fmt/format.h>

#include "emoe/core/error.h"

namespace emoe {

const std::vector<MethodInfo>& method_table() {
  using P = PeftMethod;
  static const std::vector<MethodInfo> table = {
      {"full", "", P::kNone, "", "plain fine-tuning"},
      {"lora", "", P::kLora, "",
       "rank-r A, B on the targets (BERT query/value, GPT-2 c_attn, Llama q/v_proj)"},
      {"ia3", "", P::kIa3, "", "scaling vectors on keys, values and the FFN intermediate"},
      {"mov", "", P::kMov, "", "a soft mixture of (IA)^3 vectors with a router per module"},
      {"molora", "", P::kMolora, "", "a soft (or top-k) mixture of LoRA experts with a router"},
      {"emoe", "emoe", P::kNone, "", "EMoE: the FFN split into experts routed by avg-k"},
      {"emoe+lora", "emoe", P::kLora, "",
       "EMoE + LoRA; the experts stay frozen and avg-k has no parameters (the authors' "
       "--tune_gates_only --one_score)"},
      {"emoe-learn", "emoe-learn", P::kNone, "",
       "the authors' EMoE-learn: the cosine router, randomly initialised"},
      {"emoe-learn+lora", "emoe-learn", P::kLora, "gates",
       "EMoE-learn + LoRA; the routers train with the adapters, the experts stay frozen (the "
       "authors' --tune_gates_only)"},
      {"emoe-learn-init", "emoe-learn-init", P::kNone, "",
       "the rebuttal's EMoE-learn-init: a linear gate started at the experts' mean keys"},
      {"gmoe", "gmoe", P::kNone, "", "GMoE: upcycled expert copies with a cosine router"},
      {"gmoe+lora", "gmoe", P::kLora, "moe-layers",
       "GMoE + LoRA; the converted layers train whole with the adapters (the authors' "
       "--tune_moe_layers_only)"},
      {"moefication", "moefication", P::kNone, "", "MoEfication: split experts, an MLP router"},
  };
  return table;
}

std::vector<std::string> method_names() {
  std::vector<std::string> names;
  for (const auto& m : method_table()) names.push_back(m.name);
  return names;
}

const MethodInfo* find_method(const std::string& name) {
  for (const auto& m : method_table())
    if (m.name == name) return &m;
  return nullptr;
}

const MethodInfo& method_info(const std::string& name, const std::string& where) {
  const MethodInfo* m = find_method(name);
  EMOE_CHECK(m, InputError, "{}: expected one of {}, got '{}'", where,
             fmt::join(method_names(), ", "), name);
  return *m;
}

}  // namespace emoe
