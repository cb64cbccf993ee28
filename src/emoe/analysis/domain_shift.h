// In-domain vs out-of-domain expert selection: per routed layer, each expert's share of the
// selections on the dev set and on each out-of-domain set, and the total-variation distance
// between the two distributions (`emoe analyze`: id_vs_ood.{md,csv,png}, id_vs_ood_tv.png).
#pragma once
#include <string>
#include <vector>

#include "emoe/moe/usage.h"

namespace emoe {

// counts / their sum (all zeros when nothing was counted).
std::vector<double> usage_shares(const std::vector<double>& counts);

// 0.5 * sum_e |p_e - q_e| of the two count vectors normalised to shares: 0 when the experts are
// chosen in the same proportions, 1 when the two sets use disjoint experts. InputError when the
// lengths differ; 0 when either side counted nothing (no evidence of a difference).
double total_variation(const std::vector<double>& p_counts, const std::vector<double>& q_counts);

struct DomainShift {
  std::string source;                       // "layer 8"
  std::string ood;                          // the out-of-domain set (its usage phase)
  std::vector<double> in_share, ood_share;  // per expert
  double tv = 0;
};

// One row per (source, out-of-domain set): every phase except "train" and `in_phase` is an
// out-of-domain set. Counts are summed over the run's evaluations of each set.
std::vector<DomainShift> domain_shifts(const UsageRecorder& usage,
                                       const std::string& in_phase = "dev");

struct DomainShiftOutput {
  std::vector<std::string> figures;  // PNG paths
  std::string markdown;              // the section summary.md embeds (also id_vs_ood.md)
};

// Writes id_vs_ood.csv (source, set, expert, dev share, set share), id_vs_ood.md (TV per layer
// and set, the experts whose share moved most), id_vs_ood.png (set share - dev share, one panel
// per layer, at most 6) and id_vs_ood_tv.png (TV per layer, one bar per set). Writes nothing and
// returns an empty output when the run evaluated no out-of-domain set or has no dev usage.
DomainShiftOutput write_domain_shift(const UsageRecorder& usage, const std::string& out_dir);

}  // namespace emoe
