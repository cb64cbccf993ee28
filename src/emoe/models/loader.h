// Building models from config.json, strict weight loading, and saving Hugging Face folders.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "emoe/io/hf_config.h"
#include "emoe/io/safetensors.h"
#include "emoe/models/model.h"

namespace emoe {

struct LoadOptions {
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType dtype = c10::kFloat;
  std::optional<Head> head;           // default: the head config.json's architectures names
  std::optional<int64_t> num_labels;  // overrides config.json (sequence classification)
  // Missing head weights are initialised instead of reported (fine-tuning a new task head);
  // weights of another head in the file are then dropped.
  bool allow_new_head = false;
};

// The head Hugging Face would build from config.json's `architectures`.
Head default_head(const JsonFields& config);
// A randomly initialised model of config.json's architecture (Hugging Face's init).
ModelPtr create_model(const JsonFields& config, Head head,
                      std::optional<int64_t> num_labels = std::nullopt);

// Copies every tensor of `ckpt` into `model`. Strict: one InputError lists every missing,
// unexpected and wrong-shaped tensor, e.g. "x.weight: expected [8, 4], got [4, 8]".
void load_weights(PretrainedModelImpl& model, const CheckpointReader& ckpt, bool allow_new_head);

// config.json + weights from a Hugging Face model folder. `prepare`, when given, runs on the
// freshly built model before its weights are loaded (e.g. to attach MoE plugs whose weights the
// checkpoint holds).
ModelPtr load_model(const std::string& dir, const LoadOptions& options = {},
                    const std::function<void(PretrainedModelImpl&)>& prepare = {});

// The model's tensors under the keys Hugging Face writes (tied weights once).
std::vector<std::pair<std::string, torch::Tensor>> model_state(PretrainedModelImpl& model);

// Writes config.json and the weights (model.safetensors, or shards of at most max_shard_bytes with
// model.safetensors.index.json when the weights exceed it; 0: one file) into the existing folder
// `dir`, each file atomically. Returns the weights files' names.
std::vector<std::string> write_model_files(PretrainedModelImpl& model, const std::string& dir,
                                           const std::map<std::string, std::string>& metadata,
                                           uint64_t max_shard_bytes = 0);

// write_model_files into `dir` (created if needed), then removes weights files of an earlier
// save that the new one does not use (a stale model.safetensors beside a new index, old shards).
// Whole model folders are written with save_any_model (methods/model_folder.h), which replaces
// the folder at once.
void save_model(PretrainedModelImpl& model, const std::string& dir,
                const std::map<std::string, std::string>& metadata = {},
                uint64_t max_shard_bytes = 0);

// Parameter counts: all, and those with requires_grad.
struct ParameterCount {
  int64_t total = 0, trainable = 0;
};
ParameterCount count_parameters(torch::nn::Module& module);

}  // namespace emoe
