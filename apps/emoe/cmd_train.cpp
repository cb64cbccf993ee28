// `emoe train --config run.yaml [--set key=value ...] [--resume]`: one fine-tuning run.
#include <iostream>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/train/trainer.h"

namespace emoe::cli {
namespace {

struct TrainArgs {
  std::string config, output;
  std::vector<std::string> sets;
  bool resume = false;
};

void run_train(const TrainArgs& a) {
  auto sets = a.sets;
  if (!a.output.empty()) sets.push_back("output=" + a.output);
  RunConfig cfg = load_run_config(a.config, sets);
  auto r = run_training(cfg, a.resume);
  if (r.stopped_early) {
    std::cout << fmt::format("{}: stopped after {} steps; continue with --resume\n", r.run_dir,
                             cfg.train.stop_after_steps);
    return;
  }
  const auto& res = r.results;
  std::cout << fmt::format("{}: {} on {} ({}), best epoch {}\n", r.run_dir, cfg.method,
                           cfg.objective == "classification" ? cfg.task : "instructions",
                           cfg.model, res["best_epoch"].get<int64_t>());
  if (res["best"].is_object())
    for (auto& [set, v] : res["best"].items()) {
      std::vector<std::string> ms;
      for (auto& [m, x] : v["metrics"].items()) ms.push_back(fmt::format("{} {:.2f}", m, x.get<double>()));
      if (v.contains("loss") && !v["loss"].is_null()) ms.push_back(fmt::format("loss {:.4f}", v["loss"].get<double>()));
      std::cout << fmt::format("  {:<12} {}\n", set, fmt::join(ms, ", "));
    }
}

}  // namespace

void register_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "Fine-tune a model (full, LoRA, (IA)^3, MoV, MoLoRA, EMoE, GMoE, ...)");
  cmd->add_option("--config,-c", a->config, "YAML run config (see configs/)");
  cmd->add_option("--set", a->sets, "Override a config key, e.g. --set train.lr=3e-5 (repeatable)");
  cmd->add_option("-o,--output", a->output, "Run folder (same as --set output=DIR)");
  cmd->add_flag("--resume", a->resume, "Continue the run in the output folder from its last checkpoint");
  cmd->callback([a] { run_train(*a); });
}

}  // namespace emoe::cli
