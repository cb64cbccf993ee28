// `emoe eval MODEL_DIR --task T [--ood SET ...]`: evaluate a sequence classifier on dev and
// out-of-domain sets.
#include <iostream>
#include <limits>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/data/batching.h"
#include "emoe/data/dataset.h"
#include "emoe/eval/evaluate.h"
#include "emoe/methods/model_folder.h"
#include "emoe/models/routed.h"

namespace emoe::cli {
namespace {

struct EvalArgs {
  std::string model_dir, task, split = "dev", data_dir = "../shared/data";
  std::vector<std::string> ood;
  int64_t max_examples = 0, batch_size = 64, max_length = 128;
  bool json = false, dense = false;
  RunFlags run;
};

void run_eval(const EvalArgs& a) {
  auto rs = apply_run_flags(a.run);
  TaskSpec task = glue_task(a.task);
  LoadOptions lo;
  lo.device = rs.device;
  lo.dtype = rs.dtype;
  lo.head = Head::kSequenceClassification;
  lo.num_labels = task.num_labels();
  auto model = load_any_model(a.model_dir, lo);
  if (a.dense) set_routed_dense_override(*model, true);
  auto tok = load_tokenizer(a.model_dir);
  const auto& s = model->summary();
  const int64_t pad =
      tok->special().pad.value_or(s.pad_token_id.value_or(s.eos_token_id.value_or(0)));
  std::vector<std::pair<std::string, Dataset>> sets;
  sets.emplace_back(a.split, load_glue(a.task, a.split, a.data_dir));
  auto ood = a.ood;
  if (ood.size() == 1 && ood[0] == "all") ood = ood_set_names(a.task);
  for (const auto& name : ood) sets.emplace_back(name, load_ood(a.task, name, a.data_dir));
  nlohmann::json out = nlohmann::json::object();
  if (!a.json) {
    std::cout << "| set | examples | " << fmt::format("{}", fmt::join(task.metrics, " | "))
              << " |\n|---|---|";
    for (size_t i = 0; i < task.metrics.size(); ++i) std::cout << "---|";
    std::cout << "\n";
  }
  for (auto& [name, d] : sets) {
    keep_fixed_subset(d.examples, a.max_examples);  // the subset `emoe train` evaluates
    auto enc = encode_dataset(d, *tok, a.max_length);
    auto r = evaluate_classifier(*model, enc, task, a.batch_size, pad, d.prediction_labels);
    out[name] = {{"metrics", r.metrics}, {"loss", r.loss}, {"examples", r.examples}};
    if (!a.json) {
      std::vector<std::string> vals;
      for (const auto& m : task.metrics) vals.push_back(fmt::format("{:.2f}", r.metrics[m]));
      std::cout << fmt::format("| {} | {} | {} |\n", name, r.examples, fmt::join(vals, " | "));
    }
  }
  if (a.json) std::cout << out.dump(2) << "\n";
}

}  // namespace

void register_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  auto* cmd =
      app.add_subcommand("eval", "Evaluate a sequence classifier on a task and out-of-domain sets");
  cmd->add_option("MODEL_DIR", a->model_dir, "Model folder (e.g. a run's model/)")->required();
  cmd->add_option("--task", a->task,
                  "GLUE task: cola, sst2, mrpc, qqp, stsb, mnli, mnli-mm, qnli, rte, wnli")
      ->required();
  cmd->add_option("--split", a->split, "Split of the task")->capture_default_str();
  cmd->add_option("--ood", a->ood, "Out-of-domain sets (or 'all')");
  cmd->add_option("--data-dir", a->data_dir, "Folder with glue/ and ood/")->capture_default_str();
  cmd->add_option("--max-examples", a->max_examples, "Evaluate at most N examples per set")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  cmd->add_option("--batch-size", a->batch_size, "Batch size")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--max-length", a->max_length, "Truncate inputs to N tokens")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_flag("--dense", a->dense,
                "Run a converted model's FFNs dense (the MoE -> dense ablation)");
  cmd->add_flag("--json", a->json, "Print JSON");
  add_run_flags(cmd, a->run);
  cmd->callback([a] { run_eval(*a); });
}

}  // namespace emoe::cli
