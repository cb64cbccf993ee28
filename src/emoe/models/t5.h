// T5 v1.0 and v1.1 (Hugging Face T5Model / T5ForConditionalGeneration): an encoder-decoder.
#pragma once
#include <ATen/core/Tensor.h>

#include "emoe/io/hf_config.h"
#include "emoe/models/activation.h"
#include "emoe/models/architecture.h"
#include "emoe/models/model.h"

namespace emoe {

struct T5Config {
  int64_t vocab_size = 32128, d_model = 512, d_kv = 64, d_ff = 2048;
  int64_t num_layers = 6, num_decoder_layers = 6, num_heads = 8;
  int64_t relative_attention_num_buckets = 32, relative_attention_max_distance = 128;
  int64_t n_positions = 512;  // informational only: relative positions have no limit
  double dropout_rate = 0.1, layer_norm_epsilon = 1e-6, initializer_factor = 1.0;
  // feed_forward_proj "ACT" or "gated-ACT" (Hugging Face: "gated-gelu" means gelu_new).
  std::string feed_forward_proj = "relu";
  Activation act = Activation::kRelu;
  bool gated = false;
  bool tie_word_embeddings = true;  // v1.0: lm_head = shared, decoder output scaled by d_model^-0.5
  int64_t pad_token_id = 0, eos_token_id = 1;
  int64_t decoder_start_token_id = 0;  // default: pad_token_id, as every released T5

  int64_t inner_dim() const { return num_heads * d_kv; }
  static T5Config from_json(const JsonFields& j);
};

ModelPtr make_t5(const JsonFields& config, Head head);
Head t5_head_from_config(const JsonFields& config);

// Hugging Face's T5Attention._relative_position_bucket, the same integer and float32 operations.
at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, bool bidirectional,
                                       int64_t num_buckets, int64_t max_distance);

// Hugging Face's _shift_right: [start, labels[:, :-1]] with -100 replaced by pad.
at::Tensor t5_shift_right(const at::Tensor& labels, int64_t decoder_start_token_id,
                          int64_t pad_token_id);

// The family's traits (architecture.h), registered in architecture.cpp.
const Architecture& t5_architecture();

}  // namespace emoe
