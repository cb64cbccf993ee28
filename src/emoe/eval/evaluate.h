// Evaluation loops: sequence classification metrics over an encoded set; LM loss; MMLU scoring.
#pragma once
#include <c10/core/Device.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "emoe/data/batching.h"
#include "emoe/data/dataset.h"
#include "emoe/models/model.h"
#include "emoe/tokenizer/tokenizer.h"

namespace emoe {

struct EvalOutput {
  std::map<std::string, double> metrics;  // percent
  double loss = 0;
  int64_t examples = 0;
  double seconds = 0;
};

// Which part of an evaluation set this process scores (data-parallel runs): examples
// rank, rank + size, ...; all_gather returns every rank's values, so that the metrics are those
// of the whole set on every rank. The default scores everything.
struct EvalShard {
  int rank = 0, size = 1;
  std::function<std::vector<std::vector<double>>(const std::vector<double>&)> all_gather;
};

// Runs the classifier over `data` in batches (no grad, eval mode restored afterwards).
// prediction_labels, when given, maps a predicted class to the set's label id (a 3-way MNLI
// model scored on a 2-way set: {0, 1, 1}).
EvalOutput evaluate_classifier(PretrainedModelImpl& model, const std::vector<EncodedExample>& data,
                               const TaskSpec& task, int64_t batch_size, int64_t pad_id,
                               const std::vector<int64_t>& prediction_labels = {},
                               const EvalShard& shard = {});

// Mean per-token loss of a causal LM over LM examples (lm_labels), and its perplexity.
EvalOutput evaluate_lm_loss(PretrainedModelImpl& model, const std::vector<EncodedExample>& data,
                            int64_t batch_size, int64_t pad_id, const EvalShard& shard = {});

// Mean per-token loss of an encoder-decoder model over text-to-text examples (target_ids).
EvalOutput evaluate_seq2seq_loss(PretrainedModelImpl& model,
                                 const std::vector<EncodedExample>& data, int64_t batch_size,
                                 int64_t pad_id, const EvalShard& shard = {});

// Multiple choice by the likelihood of the answer letter: `next_logits(ids)` returns the logits
// [V] of the token after `ids`; the choice whose letter token scores highest wins.
int64_t pick_choice(const at::Tensor& next_logits, const std::vector<int64_t>& letter_tokens);
// Ids of " A", " B", " C", " D" (the last piece of each) for this tokenizer.
std::vector<int64_t> answer_letter_tokens(const Tokenizer& tok);

struct MultipleChoiceResult {
  double accuracy = 0;  // percent
  int64_t questions = 0;
  std::map<std::string, double> per_subject;  // percent
};
// MMLU: k-shot prompts (shots from `dev` of the same subject), prompts longer than max_length
// keep their last max_length tokens.
MultipleChoiceResult evaluate_multiple_choice(
    const std::function<at::Tensor(const std::vector<int64_t>&)>& next_logits, const Tokenizer& tok,
    const std::vector<MultipleChoiceExample>& questions,
    const std::vector<MultipleChoiceExample>& dev, int64_t shots, int64_t max_length);
// The same with a causal LM model.
MultipleChoiceResult evaluate_mmlu(PretrainedModelImpl& model, const Tokenizer& tok,
                                   const std::vector<MultipleChoiceExample>& questions,
                                   const std::vector<MultipleChoiceExample>& dev, int64_t shots,
                                   int64_t max_length);

}  // namespace emoe
