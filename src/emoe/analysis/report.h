// `emoe analyze`: figures and a markdown summary of a run's expert usage and split quality.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace emoe {

struct BalanceStats {
  double entropy_bits = 0;      // of the selection distribution
  double entropy_ratio = 0;     // entropy / log2(N): 1 = perfectly balanced
  double cv = 0;                // coefficient of variation of the counts
  std::vector<int64_t> unused;  // experts never selected
};
BalanceStats balance_stats(const std::vector<double>& counts);

struct AnalysisOutput {
  std::vector<std::string> figures;  // PNG paths written
  std::string summary;               // path of summary.md
};

// Reads RUN_DIR/{usage.json, moe.json, results.json, config.json} and writes into out_dir:
// usage_<source>.png (selection share per expert over training), usage_phases.png (train vs dev
// vs out-of-domain, per layer), id_vs_ood.{png,md,csv} and id_vs_ood_tv.png (dev vs each
// out-of-domain set: share differences and total-variation distance, analysis/domain_shift.h),
// split_quality.png (inertia of the split vs a random split) and summary.md (load balance per
// layer: entropy, CV, unused experts; the dev vs out-of-domain table).
AnalysisOutput analyze_run(const std::string& run_dir, const std::string& out_dir);

}  // namespace emoe
