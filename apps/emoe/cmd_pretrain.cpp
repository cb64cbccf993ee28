// `emoe pretrain --config pretrain.yaml [--set key=value ...]`: a fresh small model (BERT, RoBERTa,
// GPT-2, the Llama family or T5) trained on a text file, saved as a Hugging Face folder.
#include <iostream>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/train/pretrain.h"
#include "output_folder.h"

namespace emoe::cli {
namespace {

struct PretrainArgs {
  std::string config, output, corpus, device, dtype;
  std::vector<std::string> sets;
  int threads = -1;
};

void run_pretrain_cmd(const PretrainArgs& a) {
  auto sets = a.sets;
  if (!a.output.empty()) sets.push_back("output=" + a.output);
  if (!a.corpus.empty()) sets.push_back("corpus=" + a.corpus);
  if (!a.device.empty()) sets.push_back("device=" + a.device);
  if (!a.dtype.empty()) sets.push_back("dtype=" + a.dtype);
  if (a.threads >= 0) sets.push_back("threads=" + std::to_string(a.threads));
  auto cfg = load_pretrain_config(a.config, sets);
  NewOutputFolder out(cfg.output, a.output.empty() ? "output" : "-o");
  auto r = run_pretraining(cfg);
  out.keep();
  std::cout << fmt::format(
      "{}: {} ({} parameters, vocabulary {}), {} steps in {:.1f} s, loss {:.3f} -> {:.3f}{}\n",
      r.dir, cfg.init.empty() ? cfg.arch : cfg.init, r.parameters, r.vocab_size, r.steps, r.seconds,
      r.first_loss, r.final_loss,
      r.dev_loss < 0 ? "" : fmt::format(", dev loss {:.4f}", r.dev_loss));
}

}  // namespace

void register_pretrain(CLI::App& app) {
  auto a = std::make_shared<PretrainArgs>();
  auto* cmd = app.add_subcommand(
      "pretrain",
      "Pretrain a fresh BERT or RoBERTa (masked LM), GPT-2 or Llama-family model (causal LM) or "
      "T5 (span corruption) on a text file");
  cmd->add_option("--config,-c", a->config,
                  "YAML pretraining config (see configs/pretrain-*.yaml)");
  cmd->add_option("--set", a->sets, "Override a config key, e.g. --set steps=2000 (repeatable)");
  cmd->add_option("--corpus", a->corpus,
                  "Text file, one document per line (same as --set corpus=FILE)");
  cmd->add_option("-o,--output", a->output, "Output model folder (same as --set output=DIR)");
  cmd->add_option("--threads", a->threads, "Intra-op threads (default: one per core)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--device", a->device, "cpu, cuda or cuda:N (default: the config's, cpu)");
  cmd->add_option("--dtype", a->dtype, "float32 or bfloat16 (default: the config's, float32)");
  cmd->callback([a] { run_pretrain_cmd(*a); });
}

}  // namespace emoe::cli
