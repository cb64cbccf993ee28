// What a training run does differently per objective (classification, instruction tuning,
// text-to-text): its data, batches, loss weighting, evaluation and the score of the best epoch.
// The training loop (trainer.cpp) is the same for all of them.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "emoe/data/batching.h"
#include "emoe/eval/evaluate.h"
#include "emoe/models/loader.h"
#include "emoe/models/model.h"
#include "emoe/moe/usage.h"
#include "emoe/tokenizer/tokenizer.h"
#include "emoe/train/run_config.h"

namespace emoe {

// What an objective's evaluation works with.
struct EvalContext {
  PretrainedModelImpl& model;
  const Tokenizer& tok;
  int64_t pad_id = 0;
  EvalShard shard;
  UsageRecorder& usage;
  int64_t step = 0;

  // One set's record from `evaluate`, with the expert usage of that set recorded apart as `name`.
  template <typename Evaluate>
  nlohmann::json measure(const std::string& name, Evaluate&& evaluate) {
    usage.discard(false);
    nlohmann::json record = evaluate();
    usage.snapshot(step, name, false);
    return record;
  }
};

// A loss evaluation's record: {"metrics", "loss", "examples", "seconds"}.
nlohmann::json eval_record(const EvalOutput& o);

class Objective {
 public:
  explicit Objective(const RunConfig& cfg) : cfg_(cfg) {}
  virtual ~Objective() = default;

  // Reads and encodes the training pool and the evaluation sets, and logs what it read.
  virtual void load_data(const Tokenizer& tok) = 0;
  // The head the model is loaded with.
  virtual void set_head(LoadOptions& options) const = 0;
  // Pads training examples into one batch.
  virtual Batch collate(const std::vector<const EncodedExample*>& examples,
                        int64_t pad_id) const = 0;
  // What a batch's loss is the mean of (examples, or target tokens): each rank's share of the
  // global mean in a data-parallel job.
  virtual double loss_count(const ModelInputs& in, size_t examples) const = 0;
  // The model's decoder reads the labels (shifted right): sample inputs carry them.
  virtual bool decoder_reads_labels() const { return false; }
  // The examples of one epoch and their order (indices into train()): every example once by
  // default, shuffled per (seed, epoch).
  virtual int64_t epoch_size() const { return static_cast<int64_t>(train_.size()); }
  virtual std::vector<int64_t> training_order(int64_t epoch) const;
  // Every evaluation set of the current model: {set name: record}.
  virtual nlohmann::json evaluate(EvalContext& e) const = 0;
  // The number that picks the best epoch (higher is better), and its name in results.json.
  virtual double main_score(const nlohmann::json& sets) const = 0;
  virtual std::string main_metric() const = 0;
  // Decoder tokens per example in the cost estimate (0: no decoder).
  virtual int64_t target_length() const { return 0; }
  // The objective's own entries of results.json (best_sets: the best epoch's evaluation).
  virtual void add_results(nlohmann::json& /*results*/, const nlohmann::json& /*best_sets*/) const {
  }

  const std::vector<EncodedExample>& train() const { return train_; }
  // The first training batches as model inputs, until `max_tokens` (the sample text of the
  // co-activation split and MoEfication's router).
  std::vector<ModelInputs> sample_inputs(int64_t max_tokens, int64_t pad_id) const;

 protected:
  const RunConfig& cfg_;
  std::vector<EncodedExample> train_;
};

// The strategy of cfg.objective; it keeps a reference to cfg.
std::unique_ptr<Objective> make_objective(const RunConfig& cfg);
std::unique_ptr<Objective> make_classification_objective(const RunConfig& cfg);
std::unique_ptr<Objective> make_instruction_objective(const RunConfig& cfg);
std::unique_ptr<Objective> make_seq2seq_objective(const RunConfig& cfg);

}  // namespace emoe
