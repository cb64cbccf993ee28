// Turning a loaded model into a run's method: MoE conversion (and usage-based pruning), PEFT
// adapters, and the trainable-parameter selection. Shared by `emoe train` and `emoe bench`.
#pragma once
#include <vector>

#include "emoe/moe/convert.h"
#include "emoe/peft/peft.h"
#include "emoe/train/run_config.h"

namespace emoe {

struct MethodState {
  MoeState moe;
  PeftConfig peft;
};

// `sample` feeds the co-activation split / MoEfication router (may be empty otherwise).
MethodState apply_method(PretrainedModelImpl& model, const RunConfig& cfg,
                         const std::vector<ModelInputs>& sample);

}  // namespace emoe
