// `emoe demo`: the whole story in a few minutes with nothing but the repository. Makes a
// two-domain review data set, pretrains a small BERT on it, fine-tunes dense (full), LoRA and EMoE
// on the in-domain split, evaluates in and out of domain, prints a comparison table, and writes
// the expert-usage figures and a markdown report. With a model, a task and a data folder it runs
// the same comparison on them instead (no data making, no pretraining).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace emoe {

struct DemoOptions {
  std::string output = "runs/demo";
  std::vector<std::string> methods = {"full", "lora", "emoe"};
  uint64_t seed = 0;
  bool quick = false;  // a much smaller configuration (tests): seconds, not minutes
  // The user's own comparison: a Hugging Face model folder, a GLUE task and the data folder.
  std::string model, task, data_dir;
  int64_t max_train_examples = 2000;  // user variant
  int64_t pretrain_steps = 0;         // 0: the default for the configuration
  std::string device = "cpu", dtype = "float32";
  int threads = 0;
};

struct DemoRow {
  std::string method;
  int64_t trainable = 0, total = 0;
  double in_domain = 0, out_of_domain = 0;  // main metric at the best epoch (OOD: mean over sets)
  std::string metric;
  int64_t best_epoch = 0;
  double train_seconds = 0;
};

struct DemoResult {
  std::vector<DemoRow> rows;
  std::string table;   // markdown
  std::string report;  // path of report.md
  std::vector<std::string> figures;
  double seconds = 0;
};

DemoResult run_demo(const DemoOptions& options);

}  // namespace emoe
