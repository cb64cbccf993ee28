// `emoe prune RUN_DIR [--keep M ...]`: keep each layer's M most-used experts (from the run's
// usage record) and evaluate, for M = N, N/2, ..., 1 — the "training -> pruning" ablation.
#include <filesystem>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/data/batching.h"
#include "emoe/eval/evaluate.h"
#include "emoe/io/atomic_file.h"
#include "emoe/methods/model_folder.h"
#include "emoe/moe/prune.h"
#include "emoe/train/run_config.h"
#include "emoe/train/run_data.h"

namespace emoe::cli {
namespace {
namespace fs = std::filesystem;

struct PruneArgs {
  std::string run_dir;
  std::vector<int64_t> keep;
  int64_t max_examples = 0;
  RunFlags run;
};

void run_prune(const PruneArgs& a) {
  auto rs = apply_run_flags(a.run);
  const fs::path run(a.run_dir);
  EMOE_CHECK(fs::is_directory(run), InputError,
             "{}: not a folder (prune takes the run folder of an MoE training run)", a.run_dir);
  const auto config = JsonFields::from_file((run / "config.json").string());
  EMOE_CHECK(!config.has("model_type"), InputError,
             "{}: is a model folder (config.json has a model_type); prune takes the run folder of "
             "an MoE training run (its config.json, usage.json and model_moe/)",
             a.run_dir);
  auto cfg = RunConfig::from_json(config.raw(), (run / "config.json").string());
  EMOE_CHECK(cfg.objective == ObjectiveKind::kClassification, UsageError,
             "{}: prune evaluates classification runs", a.run_dir);
  const auto model_dir = (run / "model_moe").string();
  EMOE_CHECK(fs::exists(model_dir), InputError,
             "{}: no model_moe/ (the run converted no layers, or ran with save_best=false)",
             a.run_dir);
  auto usage = UsageRecorder::load((run / "usage.json").string());
  LoadOptions lo;
  lo.device = rs.device;
  lo.dtype = rs.dtype;
  auto model = load_any_model(model_dir, lo);
  auto tok = load_tokenizer(model_dir);
  const auto& s = model->summary();
  const int64_t pad =
      tok->special().pad.value_or(s.pad_token_id.value_or(s.eos_token_id.value_or(0)));
  if (a.max_examples > 0) cfg.train.max_eval_examples = a.max_examples;
  auto data = load_run_data(cfg, /*train_split=*/false);
  const TaskSpec& task = data.task;
  struct Set {
    std::string name;
    std::vector<EncodedExample> data;
    std::vector<int64_t> prediction_labels;
  };
  std::vector<Set> sets;
  auto add = [&](const std::string& name, const Dataset& d) {
    sets.push_back({name, encode_dataset(d, *tok, cfg.train.max_length), d.prediction_labels});
  };
  add("dev", data.dev);
  for (const auto& [name, d] : data.ood) add(name, d);

  int64_t experts = 0;
  for (const auto& src : usage.sources())
    if (src.kind == "selections") experts = src.experts;
  auto keeps = a.keep.empty() ? halving_schedule(experts) : a.keep;
  std::ostringstream md;
  md << fmt::format("Training -> pruning: {} ({}, {} experts, k = {}), {} of each set\n\n",
                    a.run_dir, cfg.method, experts, cfg.moe.topk, task.main_metric);
  md << "| experts kept |";
  for (const auto& st : sets) md << " " << st.name << " |";
  md << "\n|---|";
  for (size_t i = 0; i < sets.size(); ++i) md << "---|";
  md << "\n";
  nlohmann::json rows = nlohmann::json::array();
  for (auto m : keeps) {
    apply_expert_pruning(*model, most_used_experts(usage, m));
    md << "| " << m << " |";
    nlohmann::json row = {{"keep", m}};
    for (const auto& st : sets) {
      auto r = evaluate_classifier(*model, st.data, task, cfg.train.eval_batch_size, pad,
                                   st.prediction_labels);
      md << fmt::format(" {:.2f} |", r.metrics[task.main_metric]);
      row[st.name] = r.metrics;
    }
    md << "\n";
    rows.push_back(row);
  }
  apply_expert_pruning(*model, {});
  std::cout << md.str();
  write_text_atomic((run / "prune.md").string(), md.str());
  write_text_atomic((run / "prune.json").string(), rows.dump(1) + "\n");
}

}  // namespace

void register_prune(CLI::App& app) {
  auto a = std::make_shared<PruneArgs>();
  auto* cmd = app.add_subcommand(
      "prune", "Keep the M most-used experts per layer and evaluate (M = N ... 1)");
  cmd->add_option("RUN_DIR", a->run_dir, "A training run folder of an MoE method")->required();
  add_list_option(cmd, "--keep", a->keep, "Experts to keep (default: N, N/2, ..., 1)");
  cmd->add_option("--max-examples", a->max_examples, "Evaluate at most N examples per set");
  add_run_flags(cmd, a->run);
  cmd->callback([a] { run_prune(*a); });
}

}  // namespace emoe::cli
