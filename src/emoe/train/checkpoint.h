// Training checkpoints: complete (model, optimiser, schedule position, RNG, data position,
// best-so-far) and atomic (a new step folder, then the `latest` pointer, then old ones removed).
#pragma once
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "emoe/models/model.h"
#include "emoe/train/optim.h"

namespace emoe {

struct TrainState {
  int64_t step = 0;            // optimiser steps done
  int64_t epoch = 0;           // the epoch in progress (0-based)
  int64_t batch_in_epoch = 0;  // micro-batches of that epoch already consumed
  double best_metric = -std::numeric_limits<double>::infinity();
  int64_t best_epoch = -1;
  int64_t evals_without_gain = 0;
  int64_t skipped_steps = 0;  // optimiser steps skipped for a non-finite loss or gradient
  int64_t metrics_bytes = 0;  // size of metrics.jsonl when the checkpoint was taken
  double train_seconds = 0;
  nlohmann::json history = nlohmann::json::array();  // one record per evaluation
  nlohmann::json usage;  // the expert-usage snapshots so far (UsageRecorder::to_json)
  nlohmann::json to_json() const;
  static TrainState from_json(const nlohmann::json& j, const std::string& where);
};

// Writes run_dir/checkpoints/step-NNNNNNN/ and points run_dir/checkpoints/latest at it.
void save_checkpoint(const std::string& run_dir, PretrainedModelImpl& model, Optimizer& opt,
                     const TrainState& state);
// Restores the latest checkpoint of run_dir; false when there is none.
bool load_checkpoint(const std::string& run_dir, PretrainedModelImpl& model, Optimizer& opt,
                     TrainState& state);
// The folder `latest` points at, or "" when there is none. `latest` must name a step-N folder
// inside run_dir/checkpoints (never a path out of the run folder).
std::string latest_checkpoint(const std::string& run_dir);

// The name of the first parameter holding a NaN or an infinity, or "" when all are finite.
std::string first_nonfinite_parameter(PretrainedModelImpl& model);
// Refuses (RuntimeError naming `target` and the tensor) to save weights that are not finite.
void require_finite_weights(PretrainedModelImpl& model, const std::string& target);

}  // namespace emoe
