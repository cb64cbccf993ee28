// The Llama family (Hugging Face LlamaModel / ...ForCausalLM / ...ForSequenceClassification) and
// its close relatives, each a small delta on the same modules: Mistral (sliding-window attention),
// Qwen2 (bias on q/k/v), Qwen3 (per-head q/k RMSNorm before RoPE, explicit head_dim), and Llama 3's
// RoPE scaling.
#pragma once
#include "emoe/io/hf_config.h"
#include "emoe/models/architecture.h"
#include "emoe/models/model.h"

namespace emoe {

enum class LlamaFamily { kLlama, kMistral, kQwen2, kQwen3 };

struct LlamaConfig {
  LlamaFamily family = LlamaFamily::kLlama;
  int64_t vocab_size = 32000, hidden_size = 4096, intermediate_size = 11008;
  int64_t num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 32;
  int64_t max_position_embeddings = 2048;
  std::string hidden_act = "silu";
  double rms_norm_eps = 1e-6, rope_theta = 10000.0, rope_linear_factor = 1.0;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  bool qkv_bias = false, o_bias = false;  // Llama attention_bias: all four; Qwen2: q, k, v
  bool qk_norm = false;                   // Qwen3: RMSNorm over each head of q and k before RoPE
  int64_t explicit_head_dim = 0;          // config.json's head_dim; 0: hidden_size / heads
  // RoPE scaling (rope_scaling): "default", "linear" (positions / factor), "dynamic" (NTK base
  // growth past max_position_embeddings) or "llama3" (per-frequency, Llama 3.1)
  enum class Rope { kDefault, kLinear, kDynamic, kLlama3 };
  Rope rope_type = Rope::kDefault;
  double rope_factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
  // Sliding-window attention (Mistral; Qwen2 with use_sliding_window from max_window_layers on)
  std::optional<int64_t> sliding_window;
  int64_t first_window_layer = 0;
  std::optional<int64_t> bos_token_id, eos_token_id, pad_token_id;
  int64_t num_labels = 2;
  std::string problem_type;

  int64_t head_dim() const {
    return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_attention_heads;
  }
  static LlamaConfig from_json(const JsonFields& j, LlamaFamily family = LlamaFamily::kLlama);
  // RoPE's inverse frequencies for a forward whose largest position is max_position (dynamic
  // scaling depends on it), float32 [head_dim / 2] on `device`.
  at::Tensor inv_freq(int64_t max_position, const at::Device& device) const;
};

ModelPtr make_llama(const JsonFields& config, Head head);
Head llama_head_from_config(const JsonFields& config);

// The families' traits (architecture.h), registered in architecture.cpp.
const Architecture& llama_architecture();
const Architecture& mistral_architecture();
const Architecture& qwen2_architecture();
const Architecture& qwen3_architecture();

}  // namespace emoe
