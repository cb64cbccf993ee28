// Model folders with their attachments: moe.json (MoE conversion), peft.json (adapters) and the
// tokenizer files, loaded and saved together. The command line loads and saves models only here.
#pragma once
#include <string>

#include "emoe/models/loader.h"
#include "emoe/moe/convert.h"
#include "emoe/peft/peft.h"

namespace emoe {

nlohmann::json peft_config_to_json(const PeftConfig& c);
PeftConfig peft_config_from_json(const JsonFields& j);

// Loads a folder written by emoe or Hugging Face: dense, converted (moe.json) and/or with
// adapters (peft.json), whose weights are all in model.safetensors.
ModelPtr load_any_model(const std::string& dir, const LoadOptions& options = {},
                        MoeState* moe = nullptr, PeftConfig* peft = nullptr);

// Writes config.json + the weights (+ moe.json, peft.json when attached) + tokenizer files as one
// folder, atomically (write_folder_atomic): a failure leaves `dir` as it was, and a save replaces
// every weights file, moe.json and peft.json of an earlier one (files of other names are kept;
// tokenizer files too unless tokenizer_dir is given). max_shard_bytes > 0: the weights are split
// into Hugging Face shards of at most that size (model-0000i-of-0000n.safetensors + index).
void save_any_model(PretrainedModelImpl& model, const MoeState& moe, const PeftConfig& peft,
                    const std::string& dir, const std::string& tokenizer_dir,
                    uint64_t max_shard_bytes = 0);

// save_any_model without adapters: the model (config.json, weights with plug weights), moe.json,
// and the tokenizer files of `tokenizer_dir` when given.
void save_moe_model(PretrainedModelImpl& model, const MoeState& state, const std::string& dir,
                    const std::string& tokenizer_dir = "", uint64_t max_shard_bytes = 0);

// Copies tokenizer files (vocab, merges, tokenizer.model/json, configs) from one folder to another.
void copy_tokenizer_files(const std::string& from, const std::string& to);

// Whether a converted model can be recomposed to the dense architecture (GMoE's upcycled copies
// cannot: they are no longer one FFN).
bool recomposable(const MoeState& moe);

// The best model of a finished run as its deliverables in run_dir: model/ (LoRA merged and the
// experts recomposed to the dense architecture when export_dense and possible), model_moe/ (the
// MoE form as trained, when the method converted layers) and adapter/ (PEFT format, LoRA and
// (IA)^3). base_model: the folder the run started from (tokenizer files, the adapter's base).
// max_shard_bytes: as save_any_model's.
void export_run_model(PretrainedModelImpl& model, MoeState moe, PeftConfig peft,
                      const std::string& run_dir, const std::string& base_model, bool export_dense,
                      uint64_t max_shard_bytes = 0);

}  // namespace emoe
