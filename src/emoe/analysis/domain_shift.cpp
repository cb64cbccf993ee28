// In-domain vs out-of-domain expert selection shares and their total-variation distance.
#include "emoe/analysis/domain_shift.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "emoe/analysis/plot.h"
#include "emoe/core/error.h"
#include "emoe/io/atomic_file.h"

namespace emoe {
namespace fs = std::filesystem;

std::vector<double> usage_shares(const std::vector<double>& counts) {
  const double total = std::accumulate(counts.begin(), counts.end(), 0.0);
  std::vector<double> out(counts.size(), 0.0);
  if (total > 0)
    for (size_t i = 0; i < counts.size(); ++i) out[i] = counts[i] / total;
  return out;
}

double total_variation(const std::vector<double>& p_counts, const std::vector<double>& q_counts) {
  EMOE_CHECK(p_counts.size() == q_counts.size(), InputError,
             "total variation: expected two count vectors over the same experts, got {} and {}",
             p_counts.size(), q_counts.size());
  const double p_total = std::accumulate(p_counts.begin(), p_counts.end(), 0.0);
  const double q_total = std::accumulate(q_counts.begin(), q_counts.end(), 0.0);
  if (p_total <= 0 || q_total <= 0) return 0.0;
  double sum = 0;
  for (size_t e = 0; e < p_counts.size(); ++e)
    sum += std::fabs(p_counts[e] / p_total - q_counts[e] / q_total);
  return 0.5 * sum;
}

std::vector<DomainShift> domain_shifts(const UsageRecorder& usage, const std::string& in_phase) {
  std::vector<std::string> ood;  // first-seen order, as the run evaluated them
  bool has_in = false;
  for (const auto& s : usage.snapshots()) {
    if (s.phase == in_phase) has_in = true;
    if (s.phase == "train" || s.phase == in_phase) continue;
    if (std::find(ood.begin(), ood.end(), s.phase) == ood.end()) ood.push_back(s.phase);
  }
  std::vector<DomainShift> out;
  if (!has_in) return out;
  const auto in_totals = usage_totals(usage, in_phase);
  const auto& sources = usage.sources();
  for (size_t i = 0; i < sources.size(); ++i)
    for (const auto& set : ood) {
      const auto set_totals = usage_totals(usage, set);
      DomainShift d;
      d.source = sources[i].name;
      d.ood = set;
      d.in_share = usage_shares(in_totals[i]);
      d.ood_share = usage_shares(set_totals[i]);
      d.tv = total_variation(in_totals[i], set_totals[i]);
      out.push_back(std::move(d));
    }
  return out;
}

namespace {

std::string shift_slug(const std::string& s) {
  std::string out;
  for (char ch : s) out += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return out;
}

// The experts whose share moved most, largest first: "e12 0.031 -> 0.058".
std::string largest_moves(const DomainShift& d, size_t n) {
  std::vector<size_t> order(d.in_share.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::fabs(d.ood_share[a] - d.in_share[a]) > std::fabs(d.ood_share[b] - d.in_share[b]);
  });
  std::vector<std::string> parts;
  for (size_t k = 0; k < std::min(n, order.size()); ++k)
    parts.push_back(fmt::format("expert {} {:.3f} → {:.3f}", order[k], d.in_share[order[k]],
                                d.ood_share[order[k]]));
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace

DomainShiftOutput write_domain_shift(const UsageRecorder& usage, const std::string& out_dir) {
  DomainShiftOutput out;
  const auto shifts = domain_shifts(usage);
  if (shifts.empty()) return out;
  std::vector<std::string> sources, sets;
  for (const auto& d : shifts) {
    if (std::find(sources.begin(), sources.end(), d.source) == sources.end())
      sources.push_back(d.source);
    if (std::find(sets.begin(), sets.end(), d.ood) == sets.end()) sets.push_back(d.ood);
  }
  auto at = [&](size_t src, size_t set) -> const DomainShift& {
    return shifts[src * sets.size() + set];
  };

  std::string csv = "source,set,expert,dev_share,set_share\n";
  for (const auto& d : shifts)
    for (size_t e = 0; e < d.in_share.size(); ++e)
      csv += fmt::format("{},{},{},{:.6f},{:.6f}\n", d.source, d.ood, e, d.in_share[e],
                         d.ood_share[e]);
  write_text_atomic((fs::path(out_dir) / "id_vs_ood.csv").string(), csv);

  std::string md =
      "## In-domain vs out-of-domain expert selection\n\n"
      "Each expert's share of a layer's selections on the dev set and on each out-of-domain set "
      "(counts summed over the run's evaluations), and the total-variation distance between the "
      "two distributions, TV = ½ Σ |dev share − set share| (0: the same experts in the same "
      "proportions, 1: disjoint experts). Per expert: `id_vs_ood.csv`.\n\n"
      "| layer | out-of-domain set | TV distance | largest moves (dev → set) "
      "|\n|---|---|---|---|\n";
  for (const auto& d : shifts)
    md += fmt::format("| {} | {} | {:.4f} | {} |\n", d.source, d.ood, d.tv, largest_moves(d, 3));
  md += "\n| layer | mean TV over the sets |\n|---|---|\n";
  for (size_t s = 0; s < sources.size(); ++s) {
    double sum = 0;
    for (size_t k = 0; k < sets.size(); ++k) sum += at(s, k).tv;
    md += fmt::format("| {} | {:.4f} |\n", sources[s], sum / static_cast<double>(sets.size()));
  }
  md += "\n![share differences](id_vs_ood.png)\n\n![TV per layer](id_vs_ood_tv.png)\n";
  write_text_atomic((fs::path(out_dir) / "id_vs_ood.md").string(), md.substr(1));  // "# ..."
  out.markdown = md;

  std::vector<HeatmapSpec> panels;
  for (size_t s = 0; s < sources.size() && panels.size() < 6; ++s) {
    HeatmapSpec p;
    p.title = sources[s];
    p.x_label = "out-of-domain set (TV distance to dev)";
    p.y_label = "expert";
    p.value_label = "set share - dev share";
    p.diverging = true;
    const size_t experts = at(s, 0).in_share.size();
    for (size_t e = 0; e < experts; ++e) {
      p.values.emplace_back(sets.size(), 0.0);
      p.row_labels.push_back(std::to_string(e));
    }
    for (size_t k = 0; k < sets.size(); ++k) {
      const auto& d = at(s, k);
      for (size_t e = 0; e < experts; ++e) p.values[e][k] = d.ood_share[e] - d.in_share[e];
      p.column_labels.push_back(fmt::format("{} ({:.2f})", shift_slug(d.ood), d.tv));
    }
    panels.push_back(std::move(p));
  }
  const auto heat = (fs::path(out_dir) / "id_vs_ood.png").string();
  write_heatmap_panels_png(heat, "expert selection share: each out-of-domain set minus the dev set",
                           panels);
  out.figures.push_back(heat);

  BarChartSpec b;
  b.title = "total-variation distance of expert selection, dev vs out-of-domain";
  b.y_label = "TV distance";
  b.categories = sources;
  for (size_t k = 0; k < sets.size(); ++k) {
    BarSeries series{sets[k], {}};
    for (size_t s = 0; s < sources.size(); ++s) series.values.push_back(at(s, k).tv);
    b.series.push_back(std::move(series));
  }
  const auto bars = (fs::path(out_dir) / "id_vs_ood_tv.png").string();
  write_bar_chart_png(bars, b);
  out.figures.push_back(bars);
  return out;
}

}  // namespace emoe
