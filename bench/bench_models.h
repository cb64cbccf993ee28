// The benchmarks' model shapes (random weights): BERT-base and a Llama-style decoder.
#pragma once
#include <nlohmann/json.hpp>

namespace emoe::bench {

// BERT-base: 12 layers, hidden 768, FFN 3072, vocabulary 30522.
inline nlohmann::json bert_base_config() {
  return {{"model_type", "bert"},      {"architectures", {"BertForSequenceClassification"}},
          {"vocab_size", 30522},       {"hidden_size", 768},
          {"num_hidden_layers", 12},   {"num_attention_heads", 12},
          {"intermediate_size", 3072}, {"max_position_embeddings", 512},
          {"type_vocab_size", 2},      {"hidden_act", "gelu"},
          {"pad_token_id", 0}};
}

// A Llama-style decoder: 8 layers, hidden 512, 8 heads, FFN 1376, vocabulary 32000 (58 M
// parameters, untied LM head).
inline nlohmann::json llama_style_config() {
  return {{"model_type", "llama"},
          {"architectures", {"LlamaForCausalLM"}},
          {"vocab_size", 32000},
          {"hidden_size", 512},
          {"num_hidden_layers", 8},
          {"num_attention_heads", 8},
          {"num_key_value_heads", 8},
          {"intermediate_size", 1376},
          {"max_position_embeddings", 2048},
          {"hidden_act", "silu"},
          {"rms_norm_eps", 1e-5},
          {"bos_token_id", 1},
          {"eos_token_id", 2},
          {"tie_word_embeddings", false}};
}

}  // namespace emoe::bench
