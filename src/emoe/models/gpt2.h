// GPT-2 (Hugging Face GPT2Model / GPT2LMHeadModel / GPT2ForSequenceClassification).
#pragma once
#include "emoe/io/hf_config.h"
#include "emoe/models/architecture.h"
#include "emoe/models/model.h"

namespace emoe {

struct Gpt2Config {
  int64_t vocab_size = 50257, n_embd = 768, n_layer = 12, n_head = 12, n_positions = 1024;
  int64_t n_inner = 0;  // 0 -> 4 * n_embd
  std::string activation_function = "gelu_new";
  double layer_norm_epsilon = 1e-5, embd_pdrop = 0.1, attn_pdrop = 0.1, resid_pdrop = 0.1;
  double summary_first_dropout = 0.1, initializer_range = 0.02;
  bool scale_attn_weights = true, scale_attn_by_inverse_layer_idx = false;
  bool tie_word_embeddings = true;
  std::optional<int64_t> bos_token_id, eos_token_id, pad_token_id;
  int64_t num_labels = 2;
  std::string problem_type;

  static Gpt2Config from_json(const JsonFields& j);
};

ModelPtr make_gpt2(const JsonFields& config, Head head);
Head gpt2_head_from_config(const JsonFields& config);

// The family's traits (architecture.h), registered in architecture.cpp.
const Architecture& gpt2_architecture();

}  // namespace emoe
