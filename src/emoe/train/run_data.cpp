// Loading a classification run's data sets.
#include "emoe/train/run_data.h"

#include "emoe/core/error.h"
#include "emoe/data/batching.h"
#include "emoe/eval/metrics.h"

namespace emoe {

TaskSpec run_task(const RunConfig& cfg) {
  if (cfg.dataset.empty()) return glue_task(cfg.task);
  TaskSpec t;
  t.name = cfg.task;
  t.regression = cfg.dataset.regression;
  t.labels = cfg.dataset.labels;
  t.metrics = cfg.dataset.metrics;
  // several metrics: their mean selects (compute_metrics adds it), as for GLUE's MRPC and STS-B
  t.main_metric = t.metrics.size() > 1 ? kMeanMetric : t.metrics.front();
  return t;
}

RunData load_run_data(const RunConfig& cfg, bool train_split) {
  RunData d;
  d.task = run_task(cfg);
  const int64_t n_eval = cfg.train.max_eval_examples;
  if (cfg.dataset.empty()) {
    if (train_split) d.train = load_glue(cfg.task, "train", cfg.data_dir);
    d.dev = load_glue(cfg.task, "dev", cfg.data_dir);
    std::vector<std::string> ood = cfg.ood;
    if (ood.size() == 1 && ood[0] == "all") ood = ood_set_names(cfg.task);
    for (const auto& name : ood) d.ood.emplace_back(name, load_ood(cfg.task, name, cfg.data_dir));
  } else {
    auto table = [&](const std::string& path) {
      TableSpec s;
      s.path = path;
      s.text_cols = cfg.dataset.text_cols;
      s.label_col = cfg.dataset.label_col;
      return load_table(s, d.task);
    };
    if (train_split) d.train = table(cfg.dataset.train);
    d.dev = table(cfg.dataset.dev);
    for (const auto& [name, file] : cfg.dataset.ood) d.ood.emplace_back(name, table(file));
  }
  keep_fixed_subset(d.train.examples, cfg.train.max_train_examples);
  keep_fixed_subset(d.dev.examples, n_eval);
  for (auto& [name, set] : d.ood) keep_fixed_subset(set.examples, n_eval);
  return d;
}

}  // namespace emoe
