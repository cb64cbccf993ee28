// Model folders with their attachments: moe.json (MoE conversion) and peft.json (adapters),
// loaded and saved together, and the exports of a finished run.
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

}  // namespace emoe
