// Expert usage over training: selections per expert of every routed MoE layer (router
// probability mass for MoV / MoLoRA), counted apart for training and for each evaluation set,
// snapshotted every `interval` steps and at each evaluation; saved as usage.json and usage.csv.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "emoe/models/model.h"

namespace emoe {

struct UsageSource {
  std::string name;  // "layer 8" (MoE) or the adapted module ("...attention.self.key")
  std::string kind;  // "selections" (top-k picks, padding excluded) or "router mass"
  int64_t experts = 0;
  int64_t layer = -1;  // transformer layer index
  // Takes (and resets) the counts of one phase: [experts] on the CPU as doubles.
  std::function<std::vector<double>(bool training)> take;
};

struct UsageSnapshot {
  int64_t step = 0;
  std::string phase;                        // "train", "dev", or an out-of-domain set's name
  std::vector<std::vector<double>> counts;  // [source][expert]
};

class UsageRecorder {
 public:
  UsageRecorder() = default;
  // Finds every routed MoE plug and every MoV / MoLoRA adapter of the model.
  explicit UsageRecorder(PretrainedModelImpl& model);
  bool empty() const { return sources_.empty(); }
  const std::vector<UsageSource>& sources() const { return sources_; }
  const std::vector<UsageSnapshot>& snapshots() const { return snapshots_; }

  // Records the counts accumulated in `training` mode since the last take, as `phase`.
  void snapshot(int64_t step, const std::string& phase, bool training);
  // Drops what was accumulated in that mode (e.g. before evaluating one set).
  void discard(bool training);
  // Data-parallel runs: sums a snapshot's counts over the processes (all of them call snapshot
  // at the same points), so that every process records the job's usage.
  void set_reduce(std::function<std::vector<double>(const std::vector<double>&)> reduce) {
    reduce_ = std::move(reduce);
  }

  nlohmann::json to_json() const;
  // Restores snapshots saved by to_json (resume); the sources must match.
  void restore(const nlohmann::json& j);
  // usage.json (everything) and usage.csv (step, phase, source, expert, count), atomically.
  void save(const std::string& run_dir) const;

  // Reads run_dir/usage.json for analysis (sources without take functions).
  static UsageRecorder load(const std::string& path);

 private:
  std::vector<UsageSource> sources_;
  std::vector<UsageSnapshot> snapshots_;
  std::function<std::vector<double>(const std::vector<double>&)> reduce_;
};

// Total counts per source over the snapshots whose phase is `phase` ("train", "dev", ...).
std::vector<std::vector<double>> usage_totals(const UsageRecorder& u, const std::string& phase);

}  // namespace emoe
