// `emoe eval MODEL_DIR --task T [--ood SET ...]` or `emoe eval MODEL_DIR -c RUN.yaml`: evaluate
// a sequence classifier on dev and out-of-domain sets (a GLUE task, or a run config's own files).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/data/batching.h"
#include "emoe/data/dataset.h"
#include "emoe/eval/evaluate.h"
#include "emoe/methods/model_folder.h"
#include "emoe/models/routed.h"
#include "emoe/train/run_data.h"

namespace emoe::cli {
namespace {

struct EvalArgs {
  std::string model_dir, task, config, split = "dev", data_dir = "../shared/data";
  std::vector<std::string> ood;
  int64_t max_examples = 0, batch_size = 64, max_length = 128;
  bool json = false, dense = false;
  bool max_length_given = false, max_examples_given = false, data_dir_given = false;
  RunFlags run;
};

// train.max_length of the run whose model/ (or model_moe/) this is: the run folder's config.json
// beside it; nothing when the folder is not a run's.
std::optional<int64_t> run_max_length(const std::string& model_dir) {
  namespace fs = std::filesystem;
  fs::path dir = fs::absolute(model_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  std::ifstream in((dir.parent_path() / "config.json").string());
  if (!in) return std::nullopt;
  try {
    const auto j = nlohmann::json::parse(in);
    if (j.is_object() && j.contains("method") && j.contains("train") && j["train"].is_object() &&
        j["train"].contains("max_length") && j["train"]["max_length"].is_number_integer())
      return j["train"]["max_length"].get<int64_t>();
  } catch (const nlohmann::json::exception&) {
  }
  return std::nullopt;
}

// The task and its sets: a GLUE task's split and out-of-domain sets, or a run config's task or
// `dataset:` files (dev and out-of-domain sets, the run's own subsets and max_length).
struct EvalData {
  TaskSpec task;
  std::vector<std::pair<std::string, Dataset>> sets;
  int64_t max_length = 128, max_examples = 0;
};

EvalData eval_data(const EvalArgs& a) {
  EvalData d;
  d.max_length = a.max_length;
  d.max_examples = a.max_examples;
  if (!a.config.empty()) {
    std::vector<std::string> overrides;
    if (a.data_dir_given) overrides.push_back("data_dir=" + a.data_dir);
    RunConfig cfg = load_run_config(a.config, overrides);
    EMOE_CHECK(cfg.objective == ObjectiveKind::kClassification, UsageError,
               "-c {}: objective {}: eval evaluates classification runs (objective "
               "classification)",
               a.config, to_string(cfg.objective));
    if (!a.ood.empty()) cfg.ood = a.ood;
    if (a.max_examples_given) cfg.train.max_eval_examples = a.max_examples;
    if (!a.max_length_given) d.max_length = cfg.train.max_length;
    auto data = load_run_data(cfg, /*train_split=*/false);  // the subsets the run evaluated
    d.task = data.task;
    d.sets.emplace_back("dev", std::move(data.dev));
    for (auto& [name, set] : data.ood) d.sets.emplace_back(name, std::move(set));
    d.max_examples = 0;
    return d;
  }
  EMOE_CHECK(!a.task.empty(), UsageError, "eval: give --task T or -c RUN.yaml");
  if (!a.max_length_given) {
    if (auto run = run_max_length(a.model_dir)) {
      d.max_length = *run;
      spdlog::info("max_length {} from the run's config.json (--max-length to change it)", *run);
    }
  }
  d.task = glue_task(a.task);
  d.sets.emplace_back(a.split, load_glue(a.task, a.split, a.data_dir));
  auto ood = a.ood;
  if (ood.size() == 1 && ood[0] == "all") ood = ood_set_names(a.task);
  for (const auto& name : ood) d.sets.emplace_back(name, load_ood(a.task, name, a.data_dir));
  return d;
}

void run_eval(const EvalArgs& a) {
  auto rs = apply_run_flags(a.run);
  EvalData data = eval_data(a);  // bad data or config before the model is loaded
  const TaskSpec& task = data.task;
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
  auto& sets = data.sets;
  nlohmann::json out = nlohmann::json::object();
  if (!a.json) {
    std::cout << "| set | examples | " << fmt::format("{}", fmt::join(task.metrics, " | "))
              << " |\n|---|---|";
    for (size_t i = 0; i < task.metrics.size(); ++i) std::cout << "---|";
    std::cout << "\n";
  }
  for (auto& [name, d] : sets) {
    keep_fixed_subset(d.examples, data.max_examples);  // the subset `emoe train` evaluates
    auto enc = encode_dataset(d, *tok, data.max_length);
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
  auto* task = cmd->add_option(
      "--task", a->task, "GLUE task: cola, sst2, mrpc, qqp, stsb, mnli, mnli-mm, qnli, rte, wnli");
  cmd->add_option("-c,--config", a->config,
                  "A run config (YAML, or a run's config.json): its task or dataset: files, dev "
                  "and out-of-domain sets, max_eval_examples and max_length")
      ->excludes(task);
  cmd->add_option("--split", a->split, "Split of the task")->capture_default_str();
  add_list_option(cmd, "--ood", a->ood, "Out-of-domain sets, or all");
  cmd->add_option("--data-dir", a->data_dir, "Folder with glue/ and ood/")->capture_default_str();
  cmd->add_option("--max-examples", a->max_examples, "Evaluate at most N examples per set")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  cmd->add_option("--batch-size", a->batch_size, "Batch size")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--max-length", a->max_length,
                  "Truncate inputs to N tokens (default: the run's train.max_length for a run's "
                  "model folder or with -c, else 128)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_flag("--dense", a->dense,
                "Run a converted model's FFNs dense (the MoE -> dense ablation)");
  cmd->add_flag("--json", a->json, "Print JSON");
  add_run_flags(cmd, a->run);
  cmd->callback([a, cmd] {
    a->max_length_given = cmd->count("--max-length") > 0;
    a->max_examples_given = cmd->count("--max-examples") > 0;
    a->data_dir_given = cmd->count("--data-dir") > 0;
    run_eval(*a);
  });
}

}  // namespace emoe::cli
