// objective seq2seq (T5): a multi-task mixture of templated GLUE tasks as text-to-text examples;
// the dev loss, rank classification of the training tasks' dev sets and zero-shot of held-out
// tasks, whose mean median accuracy (when there are held-out tasks) picks the best epoch.
#include <torch/torch.h>

#include <numeric>

#include "emoe/core/logging.h"
#include "emoe/data/mixture.h"
#include "emoe/eval/rank_classification.h"
#include "emoe/train/objective.h"

namespace emoe {

namespace {

// A task scored by rank classification over its templates.
struct RankSet {
  std::string name;  // the task
  bool heldout = false;
  std::vector<std::string> template_names;
  std::vector<RankExample> data;
};

RankSet make_rank_set(const std::string& task, bool heldout, const RunConfig& cfg,
                      const TextToTextEncoder& encoder) {
  const auto& tpls =
      task_templates(task, heldout ? "run config: heldout" : "run config: mixture.tasks");
  auto dev = load_labelled_glue(task, "dev", cfg.data_dir, cfg.train.max_eval_examples);
  RankSet rs;
  rs.name = task;
  rs.heldout = heldout;
  for (size_t t = 0; t < tpls.size(); ++t) {
    rs.template_names.push_back(tpls[t].name);
    std::vector<std::vector<int64_t>> choices;
    for (const auto& ch : tpls[t].choices) choices.push_back(encoder.target(ch));
    for (const auto& e : dev.examples) {
      RankExample r;
      r.source = encoder.source(tpls[t], e);
      r.choices = choices;
      r.label = std::llround(e.label);
      r.templ = static_cast<int64_t>(t);
      rs.data.push_back(std::move(r));
    }
  }
  return rs;
}

class Seq2SeqObjective : public Objective {
 public:
  using Objective::Objective;

  void load_data(const Tokenizer& tok) override {
    const TextToTextEncoder encoder(tok, cfg_.train.max_length, cfg_.train.max_target_length,
                                    cfg_.model);
    mixture_ = build_mixture(cfg_.mixture, encoder, cfg_.data_dir, cfg_.train.max_train_examples);
    train_ = std::move(mixture_.examples);
    for (const auto& task : cfg_.mixture.tasks) {  // the dev loss: first template, right answer
      const auto& first = task_templates(task, "run config: mixture.tasks").at(0);
      for (const auto& e :
           load_labelled_glue(task, "dev", cfg_.data_dir, cfg_.train.max_eval_examples).examples)
        dev_.push_back(encoder.labelled(first, e));
    }
    // rank classification: the training tasks' dev sets, then the held-out tasks (dev split)
    for (const auto& t : cfg_.mixture.tasks)
      ranked_.push_back(make_rank_set(t, false, cfg_, encoder));
    for (const auto& t : cfg_.heldout) ranked_.push_back(make_rank_set(t, true, cfg_, encoder));
    spdlog::info("seq2seq: {} dev-loss examples; rank classification on {}; held-out: {}",
                 dev_.size(), fmt::join(cfg_.mixture.tasks, ", "),
                 cfg_.heldout.empty() ? std::string("none")
                                      : fmt::format("{}", fmt::join(cfg_.heldout, ", ")));
  }

  void set_head(LoadOptions& options) const override { options.head = Head::kSeq2SeqLM; }

  Batch collate(const std::vector<const EncodedExample*>& examples, int64_t pad_id) const override {
    return collate_seq2seq(examples, pad_id);
  }

  // the loss is a mean over the target tokens
  double loss_count(const ModelInputs& in, size_t /*examples*/) const override {
    return (in.labels != -100).sum().item<double>();
  }
  bool decoder_reads_labels() const override { return true; }

  // an epoch is the mixture's draw list
  int64_t epoch_size() const override { return mixture_.epoch_size; }
  std::vector<int64_t> training_order(int64_t epoch) const override {
    return mixture_.epoch_order(cfg_.train.seed, epoch);
  }

  nlohmann::json evaluate(EvalContext& e) const override {
    nlohmann::json sets = nlohmann::json::object();
    sets["dev"] = e.measure("dev", [&] {
      return eval_record(
          evaluate_seq2seq_loss(e.model, dev_, cfg_.train.eval_batch_size, e.pad_id, e.shard));
    });
    std::vector<double> heldout;
    for (const auto& r : ranked_) {
      sets[r.name] = e.measure(r.name, [&] { return rank_record(e, r, heldout); });
    }
    if (!heldout.empty()) {
      const double mean = std::accumulate(heldout.begin(), heldout.end(), 0.0) /
                          static_cast<double>(heldout.size());
      sets["heldout"] = {{"metrics", {{"mean_median_accuracy", mean}}}, {"tasks", cfg_.heldout}};
    }
    return sets;
  }

  double main_score(const nlohmann::json& sets) const override {
    if (sets.contains("heldout"))
      return sets["heldout"]["metrics"]["mean_median_accuracy"].get<double>();
    return -sets["dev"]["loss"].get<double>();
  }
  std::string main_metric() const override {
    return cfg_.heldout.empty() ? "dev_loss" : "heldout_mean_median_accuracy";
  }

  int64_t target_length() const override { return cfg_.train.max_target_length; }

  void add_results(nlohmann::json& res, const nlohmann::json& best_sets) const override {
    res["cost"]["target_len"] = target_length();
    nlohmann::json mix = nlohmann::json::object();
    for (size_t t = 0; t < cfg_.mixture.tasks.size(); ++t)
      mix[cfg_.mixture.tasks[t]] = {{"rate", mixture_.rates[t]},
                                    {"examples", mixture_.sizes[t]},
                                    {"templates", mixture_.templates[t]}};
    res["mixture"] = {{"rate", cfg_.mixture.rate},
                      {"cap", cfg_.mixture.cap},
                      {"tasks", mix},
                      {"epoch_size", mixture_.epoch_size}};
    res["heldout"] = cfg_.heldout;
    if (best_sets.is_object() && best_sets.contains("heldout"))
      res["heldout_mean_median_accuracy"] = best_sets["heldout"]["metrics"]["mean_median_accuracy"];
    if (best_sets.is_object() && best_sets.contains("dev"))
      res["dev_loss"] = best_sets["dev"]["loss"];
    const auto total = res["parameters"]["total"].get<int64_t>();
    const auto trainable = res["parameters"]["trainable"].get<int64_t>();
    res["parameters"]["trainable_percent"] =
        100.0 * static_cast<double>(trainable) / static_cast<double>(std::max<int64_t>(1, total));
  }

 private:
  // One task's rank-classification record; a held-out task's median accuracy joins `heldout`.
  nlohmann::json rank_record(EvalContext& e, const RankSet& r, std::vector<double>& heldout) const {
    RankOptions ro;
    ro.batch_size = std::max<int64_t>(1, cfg_.train.eval_batch_size / 4);
    ro.length_normalize = cfg_.rank_score == "mean";
    auto res = evaluate_rank_classification(
        e.model, r.data, static_cast<int64_t>(r.template_names.size()), e.pad_id, ro, e.shard);
    nlohmann::json metrics = {{"median_accuracy", res.median_accuracy}};
    for (size_t t = 0; t < r.template_names.size(); ++t)
      metrics["accuracy/" + r.template_names[t]] = res.template_accuracy[t];
    if (r.heldout) heldout.push_back(res.median_accuracy);
    return {{"metrics", metrics},
            {"heldout", r.heldout},
            {"examples", res.examples},
            {"seconds", res.seconds}};
  }

  MixturePool mixture_;              // its examples moved to train_
  std::vector<EncodedExample> dev_;  // the dev loss
  std::vector<RankSet> ranked_;      // training tasks' dev sets, then held-out tasks
};

}  // namespace

std::unique_ptr<Objective> make_seq2seq_objective(const RunConfig& cfg) {
  return std::make_unique<Seq2SeqObjective>(cfg);
}

}  // namespace emoe
