// Text generation for decoder models: greedy, or sampling with temperature / top-k / top-p.
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
  int64_t top_k = 0;         // 0 -> off
  uint64_t seed = 0;
  std::vector<int64_t> eos_ids;  // a row that emits one of these is finished
  std::optional<int64_t> pad_id;  // emitted by finished rows (default: the first eos id)
  bool use_cache = true;
  // UsageError naming the flag for out-of-range values.
  void validate() const;
};

// input_ids [B, T] (left-padded when rows differ, with attention_mask [B, T]). Returns
// [B, T + n] with the prompt included; stops early once every row has finished.
// on_step(step, new_tokens[B]) is called after each generated position.
at::Tensor generate(PretrainedModelImpl& model, const at::Tensor& input_ids,
                    const at::Tensor& attention_mask, const GenerateOptions& options,
                    const std::function<void(int64_t, const at::Tensor&)>& on_step = {});

}  // namespace emoe
