// `emoe analyze RUN_DIR`: usage heatmaps, train vs evaluation usage, dev vs out-of-domain
// selection, split quality, summary; `emoe analyze --coactivation MODEL_DIR`: the
// activation-clustering picture of one FFN layer.
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "emoe/analysis/coactivation.h"
#include "emoe/analysis/report.h"
#include "emoe/core/error.h"
#include "emoe/methods/model_folder.h"
#include "sample_text.h"

namespace emoe::cli {
namespace {

struct AnalyzeArgs {
  std::string run_dir, out, coactivation, sample;
  CoactivationOptions co;
};

void run_coactivation(const AnalyzeArgs& a) {
  EMOE_CHECK(!a.sample.empty(), UsageError,
             "analyze --coactivation: give --sample FILE (text lines the layer's neurons read)");
  const std::string out = a.out.empty() ? "coactivation" : a.out;
  auto model = load_any_model(a.coactivation);
  auto batches = read_sample_batches(a.sample, a.coactivation, a.co.max_tokens, 128);
  auto r = write_coactivation(*model, batches, a.co, out);
  std::cout << fmt::format(
      "{}: layer {}, {} tokens; mean firing correlation within / between experts: EMoE split "
      "{:.4f} / {:.4f}, random split {:.4f} / {:.4f}\n  {}\n  {}\n",
      out, a.co.layer, r.tokens, r.emoe.within, r.emoe.between, r.random.within, r.random.between,
      r.figure, r.markdown);
}

void run_analyze(const AnalyzeArgs& a) {
  if (!a.coactivation.empty()) {
    EMOE_CHECK(a.run_dir.empty(), UsageError,
               "analyze: give RUN_DIR or --coactivation MODEL_DIR, not both");
    return run_coactivation(a);
  }
  EMOE_CHECK(!a.run_dir.empty(), UsageError,
             "analyze: RUN_DIR is required (a training run folder), or --coactivation MODEL_DIR");
  std::string out =
      a.out.empty() ? (std::filesystem::path(a.run_dir) / "analysis").string() : a.out;
  auto r = analyze_run(a.run_dir, out);
  std::cout << fmt::format("{}: {} figures and {}\n", out, r.figures.size(), r.summary);
  for (const auto& f : r.figures) std::cout << "  " << f << "\n";
}

}  // namespace

void register_analyze(CLI::App& app) {
  auto a = std::make_shared<AnalyzeArgs>();
  auto* cmd = app.add_subcommand(
      "analyze", "Figures and a summary of a run's expert usage, or a layer's co-activation");
  cmd->add_option("RUN_DIR", a->run_dir, "A training run folder");
  cmd->add_option("-o,--output", a->out,
                  "Where to write (default: RUN_DIR/analysis; with --coactivation: coactivation)");
  cmd->add_option("--coactivation", a->coactivation,
                  "A model folder: the firing correlation of one FFN layer's neurons on --sample, "
                  "ordered by EMoE expert and by a random split (the paper's Figure 4)");
  cmd->add_option("--sample", a->sample, "With --coactivation: text lines to run the model on");
  cmd->add_option("--layer", a->co.layer, "With --coactivation: the FFN layer")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_option("--experts", a->co.experts, "With --coactivation: experts of the split")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--max-tokens", a->co.max_tokens, "With --coactivation: tokens of --sample read")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--seed", a->co.seed, "With --coactivation: seed of both splits")
      ->capture_default_str();
  cmd->callback([a] { run_analyze(*a); });
}

}  // namespace emoe::cli
