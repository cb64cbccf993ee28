// Llama (Hugging Face LlamaModel / LlamaForCausalLM / LlamaForSequenceClassification).
#pragma once
#include "emoe/io/hf_config.h"
#include "emoe/models/architecture.h"
#include "emoe/models/model.h"

namespace emoe {

struct LlamaConfig {
  int64_t vocab_size = 32000, hidden_size = 4096, intermediate_size = 11008;
  int64_t num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 32;
  int64_t max_position_embeddings = 2048;
  std::string hidden_act = "silu";
  double rms_norm_eps = 1e-6, rope_theta = 10000.0, rope_linear_factor = 1.0;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false, attention_bias = false;
  std::optional<int64_t> bos_token_id, eos_token_id, pad_token_id;
  int64_t num_labels = 2;
  std::string problem_type;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  static LlamaConfig from_json(const JsonFields& j);
};

ModelPtr make_llama(const JsonFields& config, Head head);
Head llama_head_from_config(const JsonFields& config);

// The family's traits (architecture.h), registered in architecture.cpp.
const Architecture& llama_architecture();

}  // namespace emoe
