// `emoe train --config run.yaml [--set key=value ...] [--resume]`: one fine-tuning run.
#include <iostream>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/dist/launch.h"
#include "emoe/train/config_fields.h"
#include "emoe/train/trainer.h"

namespace emoe::cli {
namespace {

struct TrainArgs {
  std::string config, output, precision, sharding;
  std::vector<std::string> sets;
  bool resume = false;
  bool fields = false;
  // data parallel (torchrun conventions; flags override the environment variables)
  int nproc = 1, rank = -1, world_size = -1, local_rank = -1, master_port = -1;
  std::string master_addr;
  double dist_timeout = -1;
  RunConfigFlags run_flags;
};

// The torchrun variables, then the flags given on top.
DistOptions dist_options(const TrainArgs& a) {
  DistOptions d = DistOptions::from_env();
  if (a.world_size > 0)
    d.world_size = a.world_size, d.local_world_size = std::min(d.local_world_size, a.world_size);
  if (a.rank >= 0) d.rank = a.rank, d.local_rank = a.local_rank >= 0 ? a.local_rank : d.local_rank;
  if (a.local_rank >= 0) d.local_rank = a.local_rank;
  if (!a.master_addr.empty()) d.master_addr = a.master_addr;
  if (a.master_port > 0) d.master_port = a.master_port;
  if (a.dist_timeout > 0) d.timeout_s = a.dist_timeout;
  EMOE_CHECK(d.rank < d.world_size, UsageError, "--rank: expected < world size {}, got {}",
             d.world_size, d.rank);
  return d;
}

void run_train(const TrainArgs& a) {
  if (a.fields) {  // the reference of every key (docs/config.md is this output)
    std::cout << config_fields_markdown();
    return;
  }
  auto sets = a.sets;
  if (!a.output.empty()) sets.push_back("output=" + a.output);
  if (!a.precision.empty()) sets.push_back("train.precision=" + a.precision);
  if (!a.sharding.empty()) sets.push_back("train.sharding=" + a.sharding);
  a.run_flags.append_sets(sets);
  RunConfig cfg = load_run_config(a.config, sets);
  const bool worker = std::getenv("WORLD_SIZE") != nullptr || a.world_size > 0;
  if (a.nproc > 1 && !worker) {
    cfg.validate();  // a bad config fails here once, not in every worker
    LaunchOptions lo;
    lo.nproc = a.nproc;
    if (!a.master_addr.empty()) lo.master_addr = a.master_addr;
    if (a.master_port > 0) lo.master_port = a.master_port;
    if (a.dist_timeout > 0) lo.timeout_s = a.dist_timeout;
    auto res = launch_local_workers(lo, own_command_line());
    if (res.code == 2) throw InputError(res.message);
    if (res.code != 0) throw RuntimeError(res.message);
    return;
  }
  const DistOptions dist = dist_options(a);
  auto r = run_training(cfg, a.resume, dist);
  if (dist.rank != 0) return;  // rank 0 reports
  if (r.stopped_early) {
    std::cout << fmt::format("{}: stopped after {} steps; continue with --resume\n", r.run_dir,
                             cfg.train.stop_after_steps);
    return;
  }
  const auto& res = r.results;
  std::string trained_on = "instructions";
  if (cfg.objective == ObjectiveKind::kClassification) trained_on = cfg.task;
  if (cfg.objective == ObjectiveKind::kSeq2Seq) trained_on = "a text-to-text mixture";
  std::cout << fmt::format("{}: {} on {} ({}), best epoch {}\n", r.run_dir, cfg.method, trained_on,
                           cfg.model, res["best_epoch"].get<int64_t>());
  if (res["best"].is_object())
    for (auto& [set, v] : res["best"].items()) {
      std::vector<std::string> ms;
      for (auto& [m, x] : v["metrics"].items())
        ms.push_back(fmt::format("{} {:.2f}", m, x.get<double>()));
      if (v.contains("loss") && !v["loss"].is_null())
        ms.push_back(fmt::format("loss {:.4f}", v["loss"].get<double>()));
      std::cout << fmt::format("  {:<12} {}\n", set, fmt::join(ms, ", "));
    }
}

}  // namespace

void register_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand(
      "train", "Fine-tune a model (full, LoRA, (IA)^3, MoV, MoLoRA, EMoE, GMoE, ...)");
  cmd->add_option("--config,-c", a->config, "YAML run config (see configs/)");
  cmd->add_option("--set", a->sets, "Override a config key, e.g. --set train.lr=3e-5 (repeatable)");
  cmd->add_option("-o,--output", a->output, "Run folder (same as --set output=DIR)");
  cmd->add_option("--precision", a->precision,
                  "fp32 or bf16-mixed (same as --set train.precision=...)")
      ->check(CLI::IsMember({"fp32", "bf16-mixed"}));
  cmd->add_option("--nproc", a->nproc, "Data parallel: start N worker processes on this machine")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--sharding", a->sharding,
                  "Data parallel: none, optimizer (ZeRO 1), gradients (ZeRO 2) or full (ZeRO 3: "
                  "each transformer block's weights gathered around its use) (same as --set "
                  "train.sharding=...)")
      ->check(CLI::IsMember({"none", "optimizer", "gradients", "full"}));
  cmd->add_option("--rank", a->rank, "This process's rank in a multi-machine job (or $RANK)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--world-size", a->world_size, "Processes in the whole job (or $WORLD_SIZE)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--local-rank", a->local_rank, "Rank on this machine (or $LOCAL_RANK)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--master-addr", a->master_addr,
                  "Rank 0's address for the rendezvous (or $MASTER_ADDR; 127.0.0.1)");
  cmd->add_option("--master-port", a->master_port,
                  "Rendezvous port (or $MASTER_PORT; 29500, or a free one with --nproc)")
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--dist-timeout", a->dist_timeout,
                  "Seconds a collective may wait before the job fails (or $EMOE_DIST_TIMEOUT; 300)")
      ->check(CLI::PositiveNumber);
  a->run_flags.add_to(cmd);
  cmd->add_flag("--resume", a->resume,
                "Continue the run in the output folder from its last checkpoint");
  cmd->add_flag("--fields", a->fields,
                "Print every run-config key with its type, default, range and meaning "
                "(docs/config.md), and exit");
  cmd->callback([a] { run_train(*a); });
}

}  // namespace emoe::cli
