// `emoe pretrain`: a fresh BERT (masked LM), GPT-2 or Llama (causal LM) or T5 (span corruption)
// of a given size trained on a text file, saved as a Hugging Face folder with its tokenizer (a
// WordPiece vocabulary trained on the corpus, or a given tokenizer).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace emoe {

struct PretrainConfig {
  std::string arch = "bert";  // any registered model_type (models/architecture.h)
  int64_t hidden = 128, layers = 4, heads = 4, kv_heads = 0, intermediate = 512;
  int64_t max_positions = 128;
  std::string corpus;               // text file, one document per line
  std::string tokenizer = "train";  // "train": a WordPiece vocabulary (BERT); or a tokenizer folder
  int64_t vocab_size = 4000;
  // mask_prob: BERT's masking rate, and T5's noise density (the share of tokens corrupted)
  double lr = 1e-3, warmup_ratio = 0.05, weight_decay = 0.01, mask_prob = 0.15;
  // T5: "span-corruption" (needs <extra_id_N> sentinels: a SentencePiece tokenizer is saved as
  // T5Tokenizer with 100 of them) or "autoencoder" (the decoder rewrites the input)
  std::string t5_objective = "span-corruption";
  double mean_span_length = 3.0;
  int64_t batch_size = 64, steps = 500, max_length = 64, log_every = 50;
  uint64_t seed = 0;
  std::string output = "runs/pretrained";
  std::string device = "cpu", dtype = "float32";
  // fp32 | bf16-mixed: the matrix products in bfloat16 under autocast, weights and AdamW float32
  std::string precision = "fp32";
  // activation checkpointing of every block (models/recompute.h), as train.gradient_checkpointing
  bool gradient_checkpointing = false;
  int threads = 0;
  // Held-out text (one document per line): its loss is measured with the same objective every
  // dev_every steps (0: at the end only) and at the end, over the first max_dev_sequences
  // sequences, masked / corrupted once with a fixed seed that does not depend on `seed`, so the
  // figure is comparable between runs and between models that share a tokenizer.
  std::string dev_corpus;
  int64_t dev_every = 0, max_dev_sequences = 2000;
  // A model folder to continue pretraining from (its config.json sets the shape; the size keys
  // are ignored; tokenizer "train" means its own tokenizer). With steps 0 nothing is trained: the
  // dev loss of `init` is measured and logged, and no model is written.
  std::string init;

  nlohmann::json to_json() const;
  static PretrainConfig from_json(const nlohmann::json& j, const std::string& where);
  void validate() const;
};

// YAML/JSON file + key=value overrides, as `emoe train`.
PretrainConfig load_pretrain_config(const std::string& path,
                                    const std::vector<std::string>& overrides);

struct PretrainResult {
  std::string dir;
  double first_loss = 0, final_loss = 0;  // mean over the first / last log window
  double dev_loss = -1;                   // at the end, per labelled token (-1: no dev_corpus)
  int64_t steps = 0, parameters = 0, vocab_size = 0;
  double seconds = 0;
};

PretrainResult run_pretraining(const PretrainConfig& cfg);

// T5's span corruption (Raffel et al. 2020, §3.1.4; its random_spans_noise_mask) of `ids` (text
// tokens, no eos): round(n · density) tokens (at least 1, at most n - 1) in
// round(noise / mean_span) spans (at least 1, at most sentinels.size()), the noise and the kept
// tokens each cut into that many non-empty runs at uniformly drawn points, kept run first. The
// inputs keep the kept runs with sentinel i in place of noise span i; the targets are sentinel i
// followed by span i's tokens, for each span; both end with eos.
struct SpanCorruption {
  std::vector<int64_t> inputs, targets;
};
SpanCorruption span_corrupt(const std::vector<int64_t>& ids, double density, double mean_span,
                            const std::vector<int64_t>& sentinels, int64_t eos,
                            std::mt19937_64& rng);

}  // namespace emoe
