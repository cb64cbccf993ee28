// Run analysis: usage heatmaps, phase comparison, split quality, balance summary.
#include "emoe/analysis/report.h"

#include <cmath>
#include <filesystem>
#include <sstream>

#include "emoe/analysis/domain_shift.h"
#include "emoe/analysis/plot.h"
#include "emoe/core/error.h"
#include "emoe/io/atomic_file.h"
#include "emoe/io/hf_config.h"
#include "emoe/moe/convert.h"
#include "emoe/moe/usage.h"

namespace emoe {
namespace fs = std::filesystem;

BalanceStats balance_stats(const std::vector<double>& counts) {
  BalanceStats b;
  double total = 0;
  for (double c : counts) total += c;
  const double n = static_cast<double>(counts.size());
  if (total <= 0 || counts.empty()) {
    for (size_t e = 0; e < counts.size(); ++e) b.unused.push_back(static_cast<int64_t>(e));
    return b;
  }
  double mean = total / n, var = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    double p = counts[e] / total;
    if (p > 0) b.entropy_bits -= p * std::log2(p);
    if (counts[e] == 0) b.unused.push_back(static_cast<int64_t>(e));
    var += (counts[e] - mean) * (counts[e] - mean);
  }
  b.entropy_ratio = n > 1 ? b.entropy_bits / std::log2(n) : 1.0;
  b.cv = std::sqrt(var / n) / mean;
  return b;
}

namespace {

std::string report_slug(const std::string& s) {
  std::string out;
  for (char ch : s) out += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  while (out.find("__") != std::string::npos) out.replace(out.find("__"), 2, "_");
  return out;
}

std::vector<double> report_share(const std::vector<double>& counts) {
  double total = 0;
  for (double c : counts) total += c;
  std::vector<double> out(counts.size(), 0.0);
  if (total > 0)
    for (size_t i = 0; i < counts.size(); ++i) out[i] = counts[i] / total;
  return out;
}

}  // namespace

AnalysisOutput analyze_run(const std::string& run_dir, const std::string& out_dir) {
  const auto usage_path = (fs::path(run_dir) / "usage.json").string();
  EMOE_CHECK(fs::exists(usage_path), InputError,
             "{}: no usage.json (the run has no routed experts, or did not train yet)", run_dir);
  auto usage = UsageRecorder::load(usage_path);
  EMOE_CHECK(!usage.sources().empty(), InputError, "{}: usage.json lists no sources", usage_path);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  EMOE_CHECK(!ec, RuntimeError, "{}: cannot create: {}", out_dir, ec.message());
  AnalysisOutput out;
  const auto& sources = usage.sources();

  // phases in first-seen order: train, dev, out-of-domain sets
  std::vector<std::string> phases;
  for (const auto& s : usage.snapshots())
    if (std::find(phases.begin(), phases.end(), s.phase) == phases.end()) phases.push_back(s.phase);

  // 1. per source: selection share of each expert over the training snapshots
  for (size_t i = 0; i < sources.size(); ++i) {
    HeatmapSpec h;
    h.title = fmt::format("{}: expert {} share over training", sources[i].name,
                          sources[i].kind == "selections" ? "selection" : "router-mass");
    h.x_label = "training step";
    h.y_label = "expert";
    // each column: the steps since the previous one, drawn to scale on a step axis
    h.value_label = "share of the expert selections in those steps";
    for (int64_t e = 0; e < sources[i].experts; ++e) {
      h.values.emplace_back();
      h.row_labels.push_back(std::to_string(e));
    }
    for (const auto& snap : usage.snapshots()) {
      if (snap.phase != "train") continue;
      auto share = report_share(snap.counts[i]);
      for (int64_t e = 0; e < sources[i].experts; ++e) h.values[e].push_back(share[e]);
      h.column_labels.push_back(std::to_string(snap.step));
      h.column_ends.push_back(static_cast<double>(snap.step));
    }
    if (h.column_labels.empty()) continue;
    auto path = (fs::path(out_dir) / ("usage_" + report_slug(sources[i].name) + ".png")).string();
    write_heatmap_png(path, h);
    out.figures.push_back(path);
  }

  // 2. train vs evaluation vs out-of-domain: one panel per layer, experts x phases
  {
    std::vector<HeatmapSpec> panels;
    std::vector<std::vector<std::vector<double>>> totals;
    for (const auto& phase : phases) totals.push_back(usage_totals(usage, phase));
    for (size_t i = 0; i < sources.size(); ++i) {
      HeatmapSpec p;
      p.title = sources[i].name;
      p.x_label = "phase (training, then evaluation sets)";
      p.y_label = "expert";
      p.value_label = "share of the phase's selections";
      for (int64_t e = 0; e < sources[i].experts; ++e) {
        p.values.emplace_back(phases.size(), 0.0);
        p.row_labels.push_back(std::to_string(e));
      }
      for (size_t ph = 0; ph < phases.size(); ++ph) {
        auto share = report_share(totals[ph][i]);
        for (size_t e = 0; e < share.size(); ++e) p.values[e][ph] = share[e];
        p.column_labels.push_back(phases[ph]);
      }
      panels.push_back(p);
    }
    if (panels.size() > 6) panels.resize(6);  // MoV/MoLoRA may have dozens of modules
    auto path = (fs::path(out_dir) / "usage_phases.png").string();
    write_heatmap_panels_png(path, "expert usage by phase: training vs dev vs out-of-domain sets",
                             panels);
    out.figures.push_back(path);
  }

  // 3. in-domain (dev) vs out-of-domain selection shares and their total-variation distance
  const DomainShiftOutput shift = write_domain_shift(usage, out_dir);
  out.figures.insert(out.figures.end(), shift.figures.begin(), shift.figures.end());

  // 4. split quality
  MoeState moe;
  const auto moe_path = (fs::path(run_dir) / "moe.json").string();
  if (fs::exists(moe_path)) {
    moe = moe_state_from_json(JsonFields::from_file(moe_path));
    BarChartSpec b;
    b.title = fmt::format("split quality: inertia of the L2-normalised keys ({} experts)",
                          moe.config.experts);
    b.y_label = "inertia (lower is tighter)";
    BarSeries split{moe.config.split, {}}, rnd{"random split", {}};
    for (const auto& [l, r] : moe.splits) {
      if (r.method == "upcycle") continue;
      b.categories.push_back(fmt::format("layer {}", l));
      split.values.push_back(r.inertia);
      rnd.values.push_back(r.random_inertia);
    }
    if (!b.categories.empty()) {
      b.series = {split, rnd};
      auto path = (fs::path(out_dir) / "split_quality.png").string();
      write_bar_chart_png(path, b);
      out.figures.push_back(path);
    }
  }

  // 5. summary
  std::ostringstream md;
  md << "# Expert usage of " << run_dir << "\n\n";
  const auto results_path = (fs::path(run_dir) / "results.json").string();
  if (fs::exists(results_path)) {
    auto res = JsonFields::from_file(results_path).raw();
    md << fmt::format("Method `{}`, best epoch {}.", res.value("method", "?"),
                      res.value("best_epoch", -1));
    if (res.contains("best") && res["best"].is_object())
      for (auto& [set, v] : res["best"].items())
        for (auto& [m, x] : v["metrics"].items())
          md << fmt::format(" {} {} {:.2f};", set, m, x.get<double>());
    md << "\n\n";
  }
  if (!moe.empty()) {
    md << "## Split\n\n| layer | split | experts x size | inertia | random-split inertia "
          "|\n|---|---|---|---|---|\n";
    for (const auto& [l, r] : moe.splits) {
      if (r.cluster_sizes.empty())  // GMoE: copies of the whole FFN, nothing was clustered
        md << fmt::format("| {} | {} | {} copies of the FFN | - | - |\n", l, r.method,
                          moe.config.experts);
      else
        md << fmt::format("| {} | {} | {} x {} | {:.3f} | {:.3f} |\n", l, r.method,
                          moe.config.experts, r.cluster_sizes[0], r.inertia, r.random_inertia);
    }
    md << "\n";
  }
  md << "## Load balance\n\nEntropy of the selection distribution (bits; ratio to log2 N, 1 = "
        "uniform), "
        "coefficient of variation of the counts, and experts never selected.\n\n"
        "| source | kind | phase | entropy | ratio | CV | unused experts "
        "|\n|---|---|---|---|---|---|---|\n";
  for (const auto& phase : phases) {
    auto totals = usage_totals(usage, phase);
    for (size_t i = 0; i < sources.size(); ++i) {
      auto b = balance_stats(totals[i]);
      md << fmt::format(
          "| {} | {} | {} | {:.3f} | {:.3f} | {:.3f} | {} |\n", sources[i].name, sources[i].kind,
          phase, b.entropy_bits, b.entropy_ratio, b.cv,
          b.unused.empty() ? std::string("none") : fmt::format("{}", fmt::join(b.unused, " ")));
    }
  }
  if (!shift.markdown.empty()) md << "\n" << shift.markdown;
  md << "\n## Figures\n\n";
  for (const auto& f : out.figures)
    md << "![" << fs::path(f).stem().string() << "](" << fs::path(f).filename().string() << ")\n";
  out.summary = (fs::path(out_dir) / "summary.md").string();
  write_text_atomic(out.summary, md.str());
  return out;
}

}  // namespace emoe
