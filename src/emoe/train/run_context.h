// One training run's context: what the training loop works with, made before it (threads and
// ranks, the resume check, tokenizer, the objective's data, the model with its method, the run
// folder), and results.json made after it.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "emoe/dist/communicator.h"
#include "emoe/dist/grad_sync.h"
#include "emoe/dist/param_shards.h"
#include "emoe/eval/evaluate.h"
#include "emoe/io/folder_lock.h"
#include "emoe/models/model.h"
#include "emoe/moe/convert.h"
#include "emoe/peft/peft.h"
#include "emoe/tokenizer/tokenizer.h"
#include "emoe/train/checkpoint.h"
#include "emoe/train/objective.h"
#include "emoe/train/optim.h"
#include "emoe/train/run_config.h"

namespace emoe {

// Everything one run works with.
struct TrainContext {
  RunConfig cfg;
  std::string dir;
  c10::Device device = c10::Device(c10::kCPU);
  std::unique_ptr<Tokenizer> tok;
  int64_t pad_id = 0;
  std::unique_ptr<Objective> objective;  // refers to cfg
  ModelPtr model;
  MoeState moe;
  PeftConfig peft;
  std::unique_ptr<Communicator> comm;  // data-parallel runs only
  std::unique_ptr<FolderLock> lock;    // the run folder, held by the main rank while it runs
  bool main_rank() const { return comm == nullptr || comm->rank() == 0; }
  EvalShard shard() const {
    EvalShard s;
    if (comm == nullptr) return s;
    s.rank = comm->rank(), s.size = comm->size();
    Communicator* cm = comm.get();
    s.all_gather = [cm](const std::vector<double>& v) { return cm->all_gather(v); };
    return s;
  }
};

// Threads and, with dist.world_size > 1, this process's place in the data-parallel job.
void start_train_process(TrainContext& c, const DistOptions& dist);
// A run folder with checkpoints is continued only with --resume, and only with its own config;
// an existing folder is locked first (one run per folder).
void check_resume(TrainContext& c, bool resume);
// Data-parallel runs: rank 0's weights broadcast to every rank, and the sync that averages the
// gradients over the ranks; nullptr otherwise.
std::unique_ptr<GradientSync> start_gradient_sync(TrainContext& c, Optimizer& opt);
// train.sharding full: each transformer block's parameters (trainable ones owned as `sync` owns
// them, frozen ones balanced by size) kept by their owner alone and gathered around each use (so
// `sync` leaves them to their owners after the step); the hooks are installed on the model. Null
// at the other levels.
std::unique_ptr<ParameterShards> start_parameter_shards(TrainContext& c, Optimizer& opt,
                                                        GradientSync& sync);
// Tokenizer, objective data and model (with the method applied), then the run folder with
// config.json: bad input is reported before the folder is written, and leaves nothing behind.
void prepare_run(TrainContext& c);

// How many batches and optimiser steps the run takes.
struct StepPlan {
  int64_t n = 0;  // examples per epoch
  int64_t batches_per_epoch = 0, steps_per_epoch = 0, total_steps = 0, epochs = 0, warmup = 0;
};
StepPlan plan_steps(const TrainOptions& o, int64_t n);

// A converted model's best weights evaluated in both forms (null: not evaluated apart).
struct RunForms {
  bool recomposed = false;  // model/ holds the experts recomposed to the dense architecture
  nlohmann::json routed;    // null: the epochs' own evaluations were routed
  nlohmann::json dense;     // every routed layer computing its whole FFN (the dense override)
};

// What results.json holds: the best epoch's evaluation (from st.history), the run's numbers, its
// analytic cost and the objective's own entries; for a converted model recomposed into model/,
// "best_routed" and "best_dense" apart, and "model_computes" / "model_moe_computes" saying which
// form each folder holds.
nlohmann::json run_results(TrainContext& c, const TrainState& st, const RunForms& forms = {});

}  // namespace emoe
