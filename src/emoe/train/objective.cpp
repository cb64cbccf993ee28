// The parts every objective shares, and the strategy of each ObjectiveKind.
#include "emoe/train/objective.h"

#include <torch/torch.h>

#include "emoe/core/error.h"

namespace emoe {

nlohmann::json eval_record(const EvalOutput& o) {
  return {
      {"metrics", o.metrics}, {"loss", o.loss}, {"examples", o.examples}, {"seconds", o.seconds}};
}

std::vector<int64_t> Objective::training_order(int64_t epoch) const {
  return epoch_order(static_cast<int64_t>(train_.size()), cfg_.train.seed, epoch, true);
}

std::vector<ModelInputs> Objective::sample_inputs(int64_t max_tokens, int64_t pad_id) const {
  std::vector<ModelInputs> out;
  int64_t tokens = 0;
  for (size_t b = 0; b < train_.size() && tokens < max_tokens; b += 16) {
    std::vector<const EncodedExample*> ex;
    for (size_t i = b; i < std::min(train_.size(), b + 16); ++i) ex.push_back(&train_[i]);
    auto batch = collate(ex, pad_id);
    ModelInputs in;
    in.input_ids = batch.input_ids;
    in.attention_mask = batch.attention_mask;
    in.token_type_ids = batch.token_type_ids;
    if (decoder_reads_labels()) in.labels = batch.labels;  // the decoder's input
    tokens += batch.attention_mask.sum().item<int64_t>();
    out.push_back(in);
  }
  return out;
}

std::unique_ptr<Objective> make_objective(const RunConfig& cfg) {
  switch (cfg.objective) {
    case ObjectiveKind::kClassification:
      return make_classification_objective(cfg);
    case ObjectiveKind::kInstruction:
      return make_instruction_objective(cfg);
    case ObjectiveKind::kSeq2Seq:
      return make_seq2seq_objective(cfg);
  }
  EMOE_THROW(UsageError, "objective {} has no strategy", static_cast<int>(cfg.objective));
}

}  // namespace emoe
