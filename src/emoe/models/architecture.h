// An architecture's facts, declared once in its model file and registered in architecture.cpp:
// everything code above models/ may know about a family, asked here instead of by its name.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "emoe/models/model.h"

namespace emoe {

class JsonFields;

// The adapter targets PEFT uses by default (SPEC §3.3), as module-name suffixes (target_matches).
struct PeftTargetDefaults {
  std::vector<std::string> lora;         // LoRA
  std::vector<std::string> molora;       // MoLoRA (empty: the LoRA targets)
  std::vector<std::string> scaling;      // (IA)^3 / MoV: keys, values and the FFN output
  std::vector<std::string> feedforward;  // those of `scaling` scaled at their input
  // PEFT 0.5's own feed-forward default, written to adapter_config.json when it applies
  std::vector<std::string> library_feedforward;
};

// A Linear that computes several projections at once (GPT-2's c_attn = q | k | v): its name and
// its parts in output order, equally wide.
struct FusedProjection {
  std::string module;
  std::vector<std::string> parts;
};

// How `emoe pretrain` trains the architecture from scratch.
enum class PretrainObjective { kMaskedLM, kCausalLM, kSpanCorruption };

// The sizes of a model to pretrain and the tokenizer's special ids (each template applies the
// defaults its family uses for the ids the tokenizer lacks).
struct PretrainShape {
  int64_t vocab_size = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, intermediate = 0;
  int64_t max_positions = 0;
  std::optional<int64_t> pad, bos, eos;
};

struct Architecture {
  std::string model_type;    // config.json's model_type
  std::string display_name;  // "BERT", "GPT-2", ...
  std::vector<std::string>
      class_prefixes;  // architectures[0] prefixes naming it without model_type
  bool encoder_decoder = false;
  // The FFN key matrix (EMoE's split clusters its rows) and whether the file stores it [in, out]
  std::string ffn_keys;
  bool conv1d_weights = false;  // Conv1D layout: PEFT's fan_in_fan_out
  PeftTargetDefaults peft;
  std::vector<FusedProjection> fused;
  // Pretrained head modules that PEFT leaves frozen (a new classifier trains)
  std::vector<std::string> pretrained_head_prefixes;
  // Sequence classification pools through a hidden x hidden dense layer (BERT's pooler)
  bool pooled_classifier = false;
  PretrainObjective pretrain_objective = PretrainObjective::kCausalLM;
  nlohmann::json (*pretrain_config)(const PretrainShape&) = nullptr;
  Head (*default_head)(const JsonFields&) = nullptr;
  ModelPtr (*make)(const JsonFields&, Head) = nullptr;

  bool is_pretrained_head(const std::string& module_key) const;
};

// Every registered architecture, in registration order.
const std::vector<const Architecture*>& architectures();
// "bert, gpt2, llama, t5" (or "bert, gpt2, llama or t5" with last_separator " or ").
std::string known_model_types(const std::string& last_separator = ", ");
// The architecture of a model_type, or nullptr.
const Architecture* find_architecture(const std::string& model_type);
// From config.json's model_type (or architectures[0]); InputError naming the field otherwise.
const Architecture& architecture_of(const JsonFields& config);
// The architecture of a built model.
const Architecture& architecture_of(const ModelSummary& summary);

}  // namespace emoe
