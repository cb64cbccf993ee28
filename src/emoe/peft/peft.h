// Parameter-efficient fine-tuning: LoRA, (IA)^3, MoV and MoLoRA adapters on a model's Linear
// layers, trainable-parameter selection, and PEFT-format adapter files.
#pragma once
#include <string>
#include <vector>

#include "emoe/models/model.h"

namespace emoe {

enum class PeftMethod { kNone, kLora, kIa3, kMov, kMolora };
std::string to_string(PeftMethod m);
PeftMethod parse_peft_method(const std::string& s);  // none, lora, ia3, mov, molora

struct PeftConfig {
  PeftMethod method = PeftMethod::kNone;
  // Linear modules to adapt, matched as suffixes of module names ("query", "self_attn.v_proj");
  // a "*" component matches any one name ("layer.*.output.dense").
  // Empty: the defaults for the architecture (default_targets).
  std::vector<std::string> targets;
  // (IA)^3 / MoV: the modules whose *input* is scaled (the FFN output projection); empty:
  // defaults. Other targets are scaled at their output.
  std::vector<std::string> feedforward_targets;
  int64_t r = 8;                // LoRA rank (MoLoRA default 4)
  double alpha = 16;            // LoRA alpha: updates are scaled by alpha / r
  double dropout = 0.1;         // LoRA dropout on the adapter input
  int64_t experts = 10;         // MoV / MoLoRA
  int64_t topk = 0;             // MoLoRA: 0 = soft merging of every expert
  double balance_weight = 0.0;  // MoLoRA top-k: Switch balance loss weight
  uint64_t seed = 0;            // adapter initialisation

  static PeftConfig for_method(PeftMethod m, const std::string& model_type);
};

// Defaults per architecture (SPEC §3.3): LoRA / MoLoRA: BERT query,value; GPT-2 c_attn;
// Llama q_proj,v_proj; T5 q,v. (IA)^3 / MoV: keys and values (BERT key,value; GPT-2 the k and v
// parts of c_attn; Llama k_proj,v_proj; T5 k,v) at their output, and the FFN intermediate (BERT
// output.dense, GPT-2 mlp.c_proj, Llama down_proj, T5 wo) at its input. T5's names are PEFT's
// own mapping: they also select the decoder's cross-attention (EncDecAttention). BERT's FFN output
// is spelled "layer.*.output.dense" so that attention.output.dense is not caught (PEFT's
// "output.dense" catches both). On GPT-2's fused c_attn, (IA)^3 / MoV scale only the k and v
// columns [d, 3d); q is left untouched (a PEFT file stores 1 there).
std::vector<std::string> default_targets(PeftMethod m, const std::string& model_type);
std::vector<std::string> default_feedforward_targets(PeftMethod m, const std::string& model_type);

// Attaches the adapters and returns the adapted module names. UsageError when a target matches
// no Linear of the model (listing the Linear names it has).
std::vector<std::string> apply_peft(PretrainedModelImpl& model, const PeftConfig& cfg);

// Freezes everything except the adapters, the task head (classifier/score, PEFT's SEQ_CLS
// modules_to_save) and any extra names given (e.g. MoE gates); with PeftMethod::kNone nothing
// is frozen. A pretrained lm_head, the MLM head and BERT's pooler stay frozen, as in PEFT. An
// `also_train` name matches keys that contain it as whole dotted components ("LayerNorm",
// "moe.gate"); UsageError without adapters.
void select_trainable(PretrainedModelImpl& model, const PeftConfig& cfg,
                      const std::vector<std::string>& also_train = {});

// Sum of the adapters' balance losses of the last forward (MoLoRA top-k), or undefined.
at::Tensor collect_peft_aux_loss(PretrainedModelImpl& model);

// LoRA only: folds B A into the base weights and removes the adapters.
void merge_lora(PretrainedModelImpl& model);

// Detaches every adapter (the base model again); returns how many there were.
int64_t remove_peft(PretrainedModelImpl& model);
// The module names that carry an adapter, in module order.
std::vector<std::string> adapted_modules(PretrainedModelImpl& model);

// PEFT's files: adapter_config.json + adapter_model.safetensors with PEFT's key names
// (base_model.model.<module>.lora_A.weight, ...). LoRA and (IA)^3 (the formats PEFT defines).
void save_peft_adapter(PretrainedModelImpl& model, const PeftConfig& cfg, const std::string& dir,
                       const std::string& base_model_path);
// Reads such a folder and attaches the adapter to `model` (as PEFT's from_pretrained does).
PeftConfig load_peft_adapter(PretrainedModelImpl& model, const std::string& dir);

}  // namespace emoe
