// Rank classification (T0's zero-shot protocol): each answer choice is scored by its
// log-likelihood under an encoder-decoder model given the source; the best-scoring choice is the
// prediction; accuracy per prompt template, and the median over templates as the task's metric.
#pragma once
#include <cstdint>
#include <vector>

#include "emoe/eval/evaluate.h"
#include "emoe/models/model.h"

namespace emoe {

struct RankExample {
  std::vector<int64_t> source;                // encoder ids
  std::vector<std::vector<int64_t>> choices;  // decoder label ids of each answer (with eos)
  int64_t label = 0;                          // the correct choice
  int64_t templ = 0;                          // which template made it
};

struct RankOptions {
  int64_t batch_size = 16;        // examples per encoder pass
  bool length_normalize = false;  // mean instead of sum of the choice's token log-probs
};

// The score of every choice of every example: one encoder pass per batch of examples, the
// choices as one batch of decoder label sequences. No grad; eval mode restored afterwards.
std::vector<std::vector<double>> rank_choice_scores(PretrainedModelImpl& model,
                                                    const std::vector<const RankExample*>& examples,
                                                    int64_t pad_id, const RankOptions& options);

struct RankResult {
  std::vector<double> template_accuracy;  // percent, per template
  double median_accuracy = 0;             // percent: the median over templates
  int64_t examples = 0;                   // all templates together
  double seconds = 0;
};

// Accuracy per template (examples with templ in [0, num_templates)) and their median; a
// data-parallel run scores the shard rank, rank + size, ... and sums the counts over ranks.
RankResult evaluate_rank_classification(PretrainedModelImpl& model,
                                        const std::vector<RankExample>& data, int64_t num_templates,
                                        int64_t pad_id, const RankOptions& options,
                                        const EvalShard& shard = {});

// The median (the mean of the two middle values for an even count); 0 for none.
double median_of(std::vector<double> values);

}  // namespace emoe
