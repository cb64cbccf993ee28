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

// Writes config.json + model.safetensors (+ moe.json, peft.json when attached) + tokenizer files.
void save_any_model(PretrainedModelImpl& model, const MoeState& moe, const PeftConfig& peft,
                    const std::string& dir, const std::string& tokenizer_dir);

// Writes the model (config.json, model.safetensors with plug weights) and moe.json, and copies
// the tokenizer files of `tokenizer_dir` when given.
void save_moe_model(PretrainedModelImpl& model, const MoeState& state, const std::string& dir,
                    const std::string& tokenizer_dir = "");

// Copies tokenizer files (vocab, merges, tokenizer.model/json, configs) from one folder to another.
void copy_tokenizer_files(const std::string& from, const std::string& to);

}  // namespace emoe
