// `emoe analyze RUN_DIR`: usage heatmaps, train vs evaluation usage, split quality, summary.
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "emoe/analysis/report.h"

namespace emoe::cli {
namespace {

struct AnalyzeArgs {
  std::string run_dir, out;
};

void run_analyze(const AnalyzeArgs& a) {
  std::string out =
      a.out.empty() ? (std::filesystem::path(a.run_dir) / "analysis").string() : a.out;
  auto r = analyze_run(a.run_dir, out);
  std::cout << fmt::format("{}: {} figures and {}\n", out, r.figures.size(), r.summary);
  for (const auto& f : r.figures) std::cout << "  " << f << "\n";
}

}  // namespace

void register_analyze(CLI::App& app) {
  auto a = std::make_shared<AnalyzeArgs>();
  auto* cmd = app.add_subcommand("analyze", "Figures and a summary of a run's expert usage");
  cmd->add_option("RUN_DIR", a->run_dir, "A training run folder")->required();
  cmd->add_option("-o,--output", a->out, "Where to write (default: RUN_DIR/analysis)");
  cmd->callback([a] { run_analyze(*a); });
}

}  // namespace emoe::cli
