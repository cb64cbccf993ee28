// `emoe pretrain`: a fresh BERT (masked LM), GPT-2 or Llama (causal LM) of a given size trained
// on a text file, saved as a Hugging Face folder with its tokenizer (a WordPiece vocabulary
// trained on the corpus, or a given tokenizer).
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace emoe {

struct PretrainConfig {
  std::string arch = "bert";  // bert | gpt2 | llama
  int64_t hidden = 128, layers = 4, heads = 4, kv_heads = 0, intermediate = 512;
  int64_t max_positions = 128;
  std::string corpus;               // text file, one document per line
  std::string tokenizer = "train";  // "train": a WordPiece vocabulary (BERT); or a tokenizer folder
  int64_t vocab_size = 4000;
  double lr = 1e-3, warmup_ratio = 0.05, weight_decay = 0.01, mask_prob = 0.15;
  int64_t batch_size = 64, steps = 500, max_length = 64, log_every = 50;
  uint64_t seed = 0;
  std::string output = "runs/pretrained";
  std::string device = "cpu", dtype = "float32";
  int threads = 0;

  nlohmann::json to_json() const;
  static PretrainConfig from_json(const nlohmann::json& j, const std::string& where);
  void validate() const;
};

// YAML/JSON file + key=value overrides, as `emoe train`.
PretrainConfig load_pretrain_config(const std::string& path, const std::vector<std::string>& overrides);

struct PretrainResult {
  std::string dir;
  double first_loss = 0, final_loss = 0;  // mean over the first / last log window
  int64_t steps = 0, parameters = 0, vocab_size = 0;
  double seconds = 0;
};

PretrainResult run_pretraining(const PretrainConfig& cfg);

}  // namespace emoe
