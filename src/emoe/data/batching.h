// Turning text examples into padded tensor batches, with a deterministic order per epoch.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "emoe/data/dataset.h"
#include "emoe/tokenizer/tokenizer.h"

namespace emoe {

struct EncodedExample {
  std::vector<int64_t> ids;
  std::vector<int64_t> type_ids;
  double label = 0;
  // Causal-LM examples (instruction tuning): per-token targets, -100 where no loss is taken.
  std::vector<int64_t> lm_labels;
  // Text-to-text examples (encoder-decoder models): the decoder's target ids (with eos).
  std::vector<int64_t> target_ids;
};

// Tokenises every example (pairs with the tokenizer's pair template), truncated to max_length.
std::vector<EncodedExample> encode_dataset(const Dataset& data, const Tokenizer& tok,
                                           int64_t max_length);

// Alpaca: prompt + response (+ eos), loss only on the response tokens; truncated to max_length.
std::vector<EncodedExample> encode_instructions(const std::vector<InstructionExample>& data,
                                                const Tokenizer& tok, int64_t max_length);

struct Batch {
  at::Tensor input_ids;       // [B, T] int64, right-padded with pad_id
  at::Tensor attention_mask;  // [B, T] int64
  at::Tensor token_type_ids;  // [B, T] int64
  at::Tensor labels;          // [B] int64 (classes), [B] float (regression), or [B, T] (LM)
};

// Pads to the longest example of the batch.
Batch collate(const std::vector<const EncodedExample*>& examples, int64_t pad_id, bool regression,
              bool lm);

// Text-to-text: input_ids/attention_mask from ids (the encoder's source), labels [B, L] from
// target_ids right-padded with -100 (the decoder input is the labels shifted right in the model).
Batch collate_seq2seq(const std::vector<const EncodedExample*>& examples, int64_t pad_id);

// The indices of a fixed subset of n of `total` examples (in subset order); the same for every run
// and tool (train, eval, prune), so that their numbers are computed on the same examples.
std::vector<int64_t> fixed_subset(int64_t total, int64_t n);
template <typename T>
void keep_fixed_subset(std::vector<T>& v, int64_t n) {
  if (n <= 0 || static_cast<int64_t>(v.size()) <= n) return;
  std::vector<T> out;
  out.reserve(n);
  for (auto i : fixed_subset(static_cast<int64_t>(v.size()), n)) out.push_back(v[i]);
  v = std::move(out);
}

// The example order of an epoch: a permutation that depends only on (seed, epoch), so a resumed
// run sees the same order.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle = true);

}  // namespace emoe
