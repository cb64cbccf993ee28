// The data sets of a classification run: a GLUE task (with its out-of-domain sets) or the
// user's own files (RunConfig::dataset), with the same subsets for train, eval and prune.
#pragma once
#include <string>
#include <vector>

#include "emoe/data/dataset.h"
#include "emoe/train/run_config.h"

namespace emoe {

struct RunData {
  TaskSpec task;
  Dataset train, dev;
  std::vector<std::pair<std::string, Dataset>> ood;
};

// train_split = false skips reading the training set (evaluation tools).
RunData load_run_data(const RunConfig& cfg, bool train_split = true);
TaskSpec run_task(const RunConfig& cfg);

}  // namespace emoe
