// The registry of architectures: adding a family is its model file and one line here.
#include "emoe/models/architecture.h"

#include "emoe/core/error.h"
#include "emoe/io/hf_config.h"
#include "emoe/models/bert.h"
#include "emoe/models/gpt2.h"
#include "emoe/models/llama.h"
#include "emoe/models/t5.h"

namespace emoe {

bool Architecture::is_pretrained_head(const std::string& module_key) const {
  for (const auto& p : pretrained_head_prefixes)
    if (module_key.rfind(p, 0) == 0) return true;
  return false;
}

const std::vector<const Architecture*>& architectures() {
  static const std::vector<const Architecture*> all = {
      &bert_architecture(),  &gpt2_architecture(),    &llama_architecture(),
      &t5_architecture(),    &mistral_architecture(), &qwen2_architecture(),
      &qwen3_architecture(), &roberta_architecture()};
  return all;
}

std::string known_model_types(const std::string& last_separator) {
  const auto& all = architectures();
  std::string out;
  for (size_t i = 0; i < all.size(); ++i)
    out += (i == 0 ? "" : i + 1 == all.size() ? last_separator : ", ") + all[i]->model_type;
  return out;
}

const Architecture* find_architecture(const std::string& model_type) {
  for (const auto* a : architectures())
    if (a->model_type == model_type) return a;
  return nullptr;
}

const Architecture& architecture_of(const JsonFields& config) {
  std::string type = config.get_string("model_type", "");
  if (type.empty()) {
    const std::string cls = first_architecture(config);
    for (const auto* a : architectures())
      for (const auto& prefix : a->class_prefixes)
        if (!cls.empty() && cls.rfind(prefix, 0) == 0) return *a;
  }
  if (const auto* a = find_architecture(type)) return *a;
  config.fail("model_type", fmt::format("expected one of {}, got '{}'", known_model_types(), type));
}

const Architecture& architecture_of(const ModelSummary& summary) {
  const auto* a = find_architecture(summary.model_type);
  EMOE_CHECK(a != nullptr, RuntimeError, "model type '{}' is not registered (known: {})",
             summary.model_type, known_model_types());
  return *a;
}

}  // namespace emoe
