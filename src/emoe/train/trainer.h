// `emoe train`: data, model, method (MoE conversion, PEFT), AdamW with schedules, evaluation each
// epoch with best-epoch selection, early stopping, checkpoints and resume, and the run folder.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "emoe/dist/communicator.h"
#include "emoe/train/run_config.h"

namespace emoe {

struct TrainResult {
  std::string run_dir;
  bool stopped_early = false;  // train.stop_after_steps ended the run (it can be resumed)
  nlohmann::json results;      // what results.json holds
};

// Runs (or with resume = true, continues) one training run. The run folder gets:
// config.json (resolved), metrics.jsonl, checkpoints/, results.json, model/ (the best model,
// recomposed / merged to dense when possible) and adapter/ (PEFT format, LoRA and (IA)^3).
// With dist.world_size > 1 the process is one rank of a data-parallel job (c10d): the global
// batch train.batch_size is split across the ranks, gradients are averaged, and rank 0 alone
// writes the run folder (every rank resumes from it).
TrainResult run_training(const RunConfig& cfg, bool resume, const DistOptions& dist = {});

}  // namespace emoe
