// AdamW with parameter groups (decay / no decay; head and router learning rates) and the
// learning-rate schedules with warm-up.
#pragma once
#include <torch/optim/adamw.h>

#include <memory>
#include <string>
#include <vector>

#include "emoe/models/model.h"
#include "emoe/train/run_config.h"

namespace emoe {

// One group per (learning-rate multiplier, weight decay) among the trainable parameters:
// biases and norm weights get no decay; the task head and routers may have their own lr.
struct ParamGroupInfo {
  std::string name;  // "body", "body/no_decay", "head", "router", ...
  double base_lr = 0;
  int64_t numel = 0;
};

class Optimizer {
 public:
  Optimizer(PretrainedModelImpl& model, const TrainOptions& o);
  // (drops the bfloat16 copies of the parameters that step() wrote: bf16_shadow.h)
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  // Sets every group's lr to base_lr * factor.
  void set_lr_factor(double factor);
  double current_lr() const;  // lr of the first group
  // AdamW as torch::optim::AdamW computes it (decoupled decay first, bias-corrected moments),
  // on its state (checkpoints stay torch::save'able). Contiguous float32 CPU parameters take a
  // fused single-pass kernel; others the same formula in tensor operations.
  void step();
  // Drops the gradients (set to none: the next backward writes fresh ones without a fill pass).
  void zero_grad();
  torch::optim::AdamW& adamw() { return *adamw_; }
  const std::vector<ParamGroupInfo>& groups() const { return groups_; }
  // Every trainable parameter in group order (for clipping and checkpoints).
  std::vector<torch::Tensor> parameters() const;
  std::vector<std::string> parameter_names() const;

  // AdamW's state of trainable parameter p (one of parameters()): its step count and two
  // moments; step 0 and undefined moments when it has none yet. Sharded data parallel gathers it
  // for a checkpoint and drops what another rank owns.
  struct ParamState {
    int64_t step = 0;
    torch::Tensor exp_avg, exp_avg_sq;
  };
  ParamState state_of(const torch::Tensor& p);
  void set_state(const torch::Tensor& p, const ParamState& s);
  void drop_state(const torch::Tensor& p);
  // Bytes of AdamW state held (both moments of every parameter that has state).
  int64_t state_bytes();

 private:
  std::unique_ptr<torch::optim::AdamW> adamw_;
  std::vector<ParamGroupInfo> groups_;
  std::vector<std::string> names_;
};

// lr multiplier at optimiser step `step` (0-based) of `total`, as Hugging Face computes it:
// linear warm-up step/warmup, then linear decay to 0, cosine decay to 0, or constant.
double schedule_factor(Schedule kind, int64_t step, int64_t total, int64_t warmup);
// The same by the schedule's config name (parse_schedule: InputError for an unknown name).
double schedule_factor(const std::string& kind, int64_t step, int64_t total, int64_t warmup);

}  // namespace emoe
