// `emoe convert`: split chosen FFN layers into experts and write a loadable MoE model folder.
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/io/safetensors.h"
#include "emoe/methods/model_folder.h"
#include "emoe/moe/convert.h"
#include "output_folder.h"
#include "sample_text.h"

namespace emoe::cli {
namespace {

struct ConvertArgs {
  std::string model_dir, out, method = "emoe", split = "balanced-kmeans", gate, gate_init;
  std::string execution, balance, sample, max_shard_size;
  std::vector<std::string> layers;
  int64_t experts = 0, topk = 0, restarts = 10, max_iter = 1000, sample_tokens = 4096;
  uint64_t seed = 0;
  bool tutel = false;
  RunFlags run;
};

void run_convert(const ConvertArgs& a) {
  auto rs = apply_run_flags(a.run);
  namespace fs = std::filesystem;
  const uint64_t max_shard =
      a.max_shard_size.empty() ? 0 : parse_byte_size(a.max_shard_size, "--max-shard-size");
  EMOE_CHECK(fs::absolute(a.out) != fs::absolute(a.model_dir), UsageError,
             "-o {}: the output folder must differ from the model folder", a.out);
  NewOutputFolder out(a.out, "-o");  // refused before the work when it holds files already
  LoadOptions lo;
  lo.device = rs.device;
  MoeState existing;
  auto model = load_any_model(a.model_dir, lo, &existing);
  EMOE_CHECK(existing.empty(), UsageError, "{}: already converted ({}); export it to dense first",
             a.model_dir, to_string(existing.config.method));
  const auto& s = model->summary();
  MoeConfig cfg = MoeConfig::for_method_name(a.method);
  if (a.experts) cfg.experts = a.experts;
  if (a.topk)
    cfg.topk = a.topk;
  else if (a.experts && cfg.method != MoeMethod::kGmoe)
    cfg.topk = std::max<int64_t>(1, cfg.experts / 4);
  cfg.layers = parse_layer_list(fmt::format("{}", fmt::join(a.layers, ",")), s.ffn_layers(),
                                s.num_decoder_layers);
  cfg.split = a.split;
  cfg.seed = a.seed;
  cfg.kmeans.restarts = a.restarts;
  cfg.kmeans.max_iter = a.max_iter;
  if (!a.gate.empty()) cfg.gate = parse_gate_kind(a.gate);
  if (!a.gate_init.empty()) cfg.gate_init = a.gate_init;
  if (!a.execution.empty()) cfg.execution = parse_execution(a.execution);
  if (a.tutel) cfg.enable_tutel_parity();
  if (!a.balance.empty()) cfg.balance = parse_balance_loss(a.balance);
  cfg.sample_tokens = a.sample_tokens;
  cfg.validate(s.ffn_layers(), s.intermediate_size);
  std::vector<ModelInputs> sample;
  if (!a.sample.empty())
    sample = read_sample_batches(a.sample, a.model_dir, cfg.sample_tokens, 128);

  auto state = convert_to_moe(*model, cfg, sample);
  state.source = a.model_dir;
  model->to(stored_float_dtype(a.model_dir));  // split in float32, stored as the source was
  save_moe_model(*model, state, a.out, a.model_dir, max_shard);
  out.keep();

  std::cout << fmt::format("{} -> {}: {} with N = {}, k = {} on layers {}\n", a.model_dir, a.out,
                           to_string(cfg.method), cfg.experts, cfg.topk,
                           fmt::join(cfg.layers, ","));
  std::cout << "| layer | split | experts x size | inertia | random-split inertia | time (s) |\n"
               "|---|---|---|---|---|---|\n";
  for (const auto& [l, r] : state.splits) {
    if (r.method == "upcycle") {
      std::cout << fmt::format("| {} | upcycle | {} x {} (copies) | - | - | - |\n", l, cfg.experts,
                               s.intermediate_size);
      continue;
    }
    double rnd = r.random_inertia;
    bool uniform = std::all_of(r.cluster_sizes.begin(), r.cluster_sizes.end(),
                               [&](int64_t c) { return c == r.cluster_sizes[0]; });
    std::string sizes = uniform ? fmt::format("{} x {}", cfg.experts, r.cluster_sizes[0])
                                : fmt::format("{}", fmt::join(r.cluster_sizes, " "));
    std::cout << fmt::format("| {} | {} | {} | {:.4f} | {:.4f} | {:.2f} |\n", l, r.method, sizes,
                             r.inertia, rnd, r.seconds);
  }
}

}  // namespace

void register_convert(CLI::App& app) {
  auto a = std::make_shared<ConvertArgs>();
  auto* cmd =
      app.add_subcommand("convert", "Turn a dense model's FFN layers into a Mixture-of-Experts");
  cmd->add_option("MODEL_DIR", a->model_dir, "Dense model folder")->required();
  cmd->add_option("-o,--output", a->out, "Output folder (config, safetensors, moe.json, tokenizer)")
      ->required();
  cmd->add_option("--method", a->method, "emoe, emoe-learn, emoe-learn-init, gmoe or moefication")
      ->capture_default_str();
  cmd->add_option("--experts,-N", a->experts, "Experts per layer (default: 64; GMoE 8)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--topk,-k", a->topk, "Experts per token (default: N/4; GMoE 2)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  add_list_option(cmd, "--layers", a->layers,
                  "Layers, e.g. 8,10 or 8-11 or all (default: every other of the last four)");
  cmd->add_option("--split", a->split, "balanced-kmeans, random, contiguous or coactivation")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed of the split")
      ->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--restarts", a->restarts, "Balanced k-means restarts")->capture_default_str();
  cmd->add_option("--max-iter", a->max_iter, "Balanced k-means iterations per restart")
      ->capture_default_str();
  cmd->add_option("--gate", a->gate, "avgk (emoe), linear or cosine (emoe-learn, gmoe)");
  cmd->add_option("--gate-init", a->gate_init,
                  "Learned linear gate init: avgk or random (default: the method's)")
      ->capture_default_str();
  cmd->add_option("--execution", a->execution, "masked or dispatched");
  cmd->add_option("--balance-loss", a->balance, "none, importance-load, switch or zloss");
  cmd->add_flag("--tutel", a->tutel,
                "The authors' tutel-based settings (noise, capacity 1.5, aux loss, dropout)");
  cmd->add_option("--sample", a->sample,
                  "Text file for the coactivation split / MoEfication router");
  cmd->add_option("--sample-tokens", a->sample_tokens, "Tokens of sample text to use")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  cmd->add_option("--max-shard-size", a->max_shard_size,
                  "Split the weights into Hugging Face shards of at most this size (500MB, 2GB, "
                  "or bytes) with model.safetensors.index.json");
  add_run_flags(cmd, a->run);
  cmd->callback([a] { run_convert(*a); });
}

}  // namespace emoe::cli
