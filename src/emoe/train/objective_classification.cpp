// objective classification: a GLUE task or the user's own files, a sequence-classification head,
// and the task's metrics on dev and the out-of-domain sets (its main metric picks the best epoch).
#include <torch/torch.h>

#include "emoe/core/logging.h"
#include "emoe/train/objective.h"
#include "emoe/train/run_data.h"

namespace emoe {

namespace {

struct ClassifierEvalSet {
  std::string name;  // "dev" or the out-of-domain set's name
  std::vector<EncodedExample> data;
  std::vector<int64_t> prediction_labels;  // see evaluate_classifier
};

class ClassificationObjective : public Objective {
 public:
  using Objective::Objective;

  void load_data(const Tokenizer& tok) override {
    const int64_t max_len = cfg_.train.max_length;
    auto data = load_run_data(cfg_);
    task_ = data.task;
    train_ = encode_dataset(data.train, tok, max_len);
    evals_.push_back({"dev", encode_dataset(data.dev, tok, max_len), data.dev.prediction_labels});
    std::vector<std::string> names;
    for (const auto& [name, d] : data.ood) {
      evals_.push_back({name, encode_dataset(d, tok, max_len), d.prediction_labels});
      names.push_back(name);
    }
    spdlog::info("task {}: {} training examples, dev {}, out-of-domain: {}", cfg_.task,
                 train_.size(), evals_[0].data.size(),
                 names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", ")));
  }

  void set_head(LoadOptions& options) const override {
    options.head = Head::kSequenceClassification;
    options.num_labels = task_.num_labels();
  }

  Batch collate(const std::vector<const EncodedExample*>& examples, int64_t pad_id) const override {
    return emoe::collate(examples, pad_id, task_.regression, false);
  }

  double loss_count(const ModelInputs& /*in*/, size_t examples) const override {
    return static_cast<double>(examples);
  }

  nlohmann::json evaluate(EvalContext& e) const override {
    nlohmann::json sets = nlohmann::json::object();
    for (const auto& s : evals_)
      sets[s.name] = e.measure(s.name, [&] {
        return eval_record(evaluate_classifier(e.model, s.data, task_, cfg_.train.eval_batch_size,
                                               e.pad_id, s.prediction_labels, e.shard));
      });
    return sets;
  }

  double main_score(const nlohmann::json& sets) const override {
    return sets["dev"]["metrics"][task_.main_metric].get<double>();
  }
  std::string main_metric() const override { return task_.main_metric; }

 private:
  TaskSpec task_;
  std::vector<ClassifierEvalSet> evals_;  // dev first
};

}  // namespace

std::unique_ptr<Objective> make_classification_objective(const RunConfig& cfg) {
  return std::make_unique<ClassificationObjective>(cfg);
}

}  // namespace emoe
