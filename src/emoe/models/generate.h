// Text generation: decoder models and encoder-decoder models (T5), greedy or sampling with
// temperature / top-k / top-p.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <vector>

#include "emoe/models/model.h"

namespace emoe {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  // 0 -> greedy (argmax)
  double top_p = 1.0;
  int64_t top_k = 0;  // 0 -> off
  uint64_t seed = 0;
  std::vector<int64_t> eos_ids;   // a row that emits one of these is finished
  std::optional<int64_t> pad_id;  // emitted by finished rows (default: the first eos id)
  // Encoder-decoder models: the decoder's first token (default: the model's
  // decoder_start_token_id).
  std::optional<int64_t> decoder_start_id;
  bool use_cache = true;
  // Beam search (encoder-decoder models, greedy scores only), Hugging Face's BeamSearchScorer:
  // hypotheses scored by sum of log-probabilities / length^length_penalty; early_stopping false
  // stops a row when no open beam can beat its worst kept hypothesis, true at num_beams of them.
  int64_t num_beams = 1;
  double length_penalty = 1.0;
  bool early_stopping = false;
  // UsageError naming the flag for out-of-range values.
  void validate() const;
};

// input_ids [B, T] (left-padded when rows differ, with attention_mask [B, T]). Returns
// [B, T + n] with the prompt included; stops early once every row has finished.
// on_step(step, new_tokens[B]) is called after each generated position.
at::Tensor generate(PretrainedModelImpl& model, const at::Tensor& input_ids,
                    const at::Tensor& attention_mask, const GenerateOptions& options,
                    const std::function<void(int64_t, const at::Tensor&)>& on_step = {});

// Encoder-decoder models (T5): the encoder runs once; the decoder starts from
// decoder_start_token_id and runs one token at a time with cached self-attention keys/values and
// cross-attention keys/values computed once. input_ids [B, S] (padded rows marked by
// attention_mask [B, S]). Returns [B, 1 + n] starting with the start token, finished rows padded
// with pad_id, as Hugging Face's generate(); stops early once every row has finished. With
// num_beams > 1: beam search, returning the best hypothesis per row (on_step is not called).
at::Tensor generate_seq2seq(PretrainedModelImpl& model, const at::Tensor& input_ids,
                            const at::Tensor& attention_mask, const GenerateOptions& options,
                            const std::function<void(int64_t, const at::Tensor&)>& on_step = {});

}  // namespace emoe
