// `emoe bench MODEL_DIR --methods dense,lora,...`: the efficiency table of the MoV paper for any
// model — parameters (total, trainable), GMACs per token (forward, training step), training-step
// and inference time, peak memory. Each method runs in a fresh process so that peak RSS is its own.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>
#include <sstream>

#include "commands.h"
#include "emoe/analysis/flops.h"
#include "emoe/core/error.h"
#include "emoe/core/runtime.h"
#include "emoe/core/subprocess.h"
#include "emoe/io/atomic_file.h"
#include "emoe/methods/model_folder.h"
#include "emoe/train/method.h"
#include "emoe/train/method_table.h"
#include "emoe/train/optim.h"

namespace emoe::cli {
namespace {
namespace fs = std::filesystem;

struct BenchArgs {
  std::string model_dir, single, json_out;
  std::vector<std::string> methods = {"dense", "lora", "ia3", "emoe", "gmoe", "mov", "molora"};
  int64_t batch = 8, seq = 128, steps = 5, experts = 0, topk = 0;
  RunFlags run;
};

int64_t bench_default_experts(int64_t d_ff) {
  int64_t best = 1;
  for (int64_t n = 1; n <= 16; ++n)
    if (d_ff % n == 0) best = n;
  return best;
}

// Every layer converted, so that the table shows the method's full effect.
RunConfig bench_config(const BenchArgs& a, const std::string& method, int64_t d_ff,
                       int64_t layers) {
  std::string m = method == "dense" ? "full" : method == "emoe-dispatched" ? "emoe" : method;
  std::vector<std::string> sets = {"model=" + a.model_dir, "task=sst2", "method=" + m};
  if (method != "dense" && method != "full") {
    const bool gmoe = method_info(m, "--methods").moe == "gmoe";
    int64_t n = a.experts ? a.experts : (gmoe ? 4 : bench_default_experts(d_ff));
    int64_t k = a.topk ? a.topk : (gmoe ? 2 : std::max<int64_t>(1, n / 4));
    sets.push_back("moe.experts=" + std::to_string(n));
    sets.push_back("moe.topk=" + std::to_string(k));
    std::vector<int64_t> all(layers);
    for (int64_t l = 0; l < layers; ++l) all[l] = l;
    sets.push_back(fmt::format("moe.layers=[{}]", fmt::join(all, ",")));
    sets.push_back("moe.kmeans={restarts: 1, max_iter: 20}");
  }
  if (method == "emoe-dispatched") sets.push_back("moe.execution=dispatched");
  auto cfg = load_run_config("", sets);
  cfg.moe.origin.clear();  // the MoE settings came from bench's flags (--experts, --topk)
  return cfg;
}

double bench_peak_rss_mb() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

// One method, measured in this process; prints one JSON line.
void bench_one(const BenchArgs& a) {
  auto rs = apply_run_flags(a.run);
  LoadOptions lo;
  lo.device = rs.device;
  lo.dtype = rs.dtype;
  lo.head = Head::kSequenceClassification;
  lo.num_labels = 2;
  lo.allow_new_head = true;
  auto model = load_any_model(a.model_dir, lo);
  const auto s = model->summary();
  auto cfg = bench_config(a, a.single, s.intermediate_size, s.num_layers);
  auto st = apply_method(*model, cfg, {});
  model->to(rs.device, rs.dtype);
  auto counts = count_parameters(*model);
  MethodCost cost;
  cost.name = a.single;
  cost.moe = !st.moe.empty();
  cost.moe_config = st.moe.config;
  cost.moe_layers = static_cast<int64_t>(st.moe.splits.size());
  cost.peft = st.peft;
  cost.trainable_body = st.peft.method == PeftMethod::kNone;
  auto flops = count_flops(model->summary(), cost, a.seq);

  torch::manual_seed(0);
  ModelInputs in;
  in.input_ids =
      torch::randint(5, std::min<int64_t>(s.vocab_size, 1000), {a.batch, a.seq}, torch::kLong)
          .to(rs.device);
  in.attention_mask = torch::ones({a.batch, a.seq}, torch::kLong).to(rs.device);
  in.labels = torch::randint(0, 2, {a.batch}, torch::kLong).to(rs.device);
  TrainOptions to;
  to.lr = 1e-5;
  Optimizer opt(*model, to);
  model->train();
  auto train_step = [&] {
    auto out = model->forward(in);
    auto loss = out.loss;
    if (auto aux = collect_aux_loss(*model); aux.defined()) loss = loss + aux;
    loss.backward();
    opt.step();
    opt.zero_grad();
    (void)loss.item<double>();
  };
  train_step();  // warm-up
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < a.steps; ++i) train_step();
  double train_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / a.steps;
  model->eval();
  double infer_s = 0;
  {
    torch::NoGradGuard g;
    model->forward(in);
    t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < a.steps; ++i) (void)model->forward(in).logits.sum().item<double>();
    infer_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / a.steps;
  }
  const double tokens = static_cast<double>(a.batch * a.seq);
  nlohmann::json j = {{"method", a.single},
                      {"parameters", counts.total},
                      {"trainable", counts.trainable},
                      {"forward_gmacs_per_token", flops.forward_total / 1e9},
                      {"train_gmacs_per_token", flops.train_total / 1e9},
                      {"train_step_ms", train_s * 1e3},
                      {"train_tokens_per_s", tokens / train_s},
                      {"inference_ms", infer_s * 1e3},
                      {"inference_tokens_per_s", tokens / infer_s},
                      {"peak_rss_mb", bench_peak_rss_mb()}};
  if (cost.moe)
    j["moe"] = {{"experts", cost.moe_config.experts},
                {"topk", cost.moe_config.topk},
                {"layers", cost.moe_layers},
                {"execution", to_string(cost.moe_config.execution)}};
  std::cout << "BENCH " << j.dump() << std::endl;
}

void run_bench(const BenchArgs& a) {
  if (!a.single.empty()) return bench_one(a);
  std::vector<std::string> methods;
  for (const auto& m : a.methods)
    if (!m.empty()) methods.push_back(m);
  EMOE_CHECK(!methods.empty(), UsageError, "--methods: expected a list like dense,lora,emoe");
  // dense (= full), emoe-dispatched (EMoE through the dispatched path) and every training method
  // that needs no data sample (MoEfication's router learns from activations)
  static const std::set<std::string> known = [] {
    std::set<std::string> k = {"dense", "emoe-dispatched"};
    for (const auto& m : method_table())
      if (m.moe != "moefication") k.insert(m.name);
    return k;
  }();
  for (const auto& m : methods)
    EMOE_CHECK(known.count(m), UsageError, "--methods: unknown method '{}' (known: {})", m,
               fmt::join(known, ", "));
  // bad input is refused here, once, before any method is measured in its own process (a child's
  // error came back as exit 1 with a second line before)
  apply_run_flags(a.run);
  if (!a.json_out.empty()) {
    const auto parent = fs::absolute(a.json_out).parent_path();
    EMOE_CHECK(fs::is_directory(parent), UsageError, "--json {}: the folder {} does not exist",
               a.json_out, parent.string());
  }
  {
    auto model = load_any_model(a.model_dir);
    const ModelSummary s = model->summary();
    for (const auto& m : methods) {
      auto cfg = bench_config(a, m, s.intermediate_size, s.num_layers);
      if (cfg.uses_moe()) cfg.moe.validate(s.ffn_layers(), s.intermediate_size);
    }
  }
  const std::string self = self_executable();
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& m : methods) {
    std::string cmd = fmt::format(
        "{} -q bench {} --single {} --batch {} --seq {} --steps {} --experts {} --topk {} "
        "--threads {} --device {} --dtype {}",
        shell_quote(self), shell_quote(a.model_dir), shell_quote(m), a.batch, a.seq, a.steps,
        a.experts, a.topk, a.run.threads, shell_quote(a.run.device), shell_quote(a.run.dtype));
    rows.push_back(run_and_read_json_line(cmd, "BENCH ", "bench: measuring " + m));
    spdlog::info("bench: {} done", m);
  }
  double dense_train = 0;
  for (const auto& r : rows)
    if (r["method"] == "dense" || r["method"] == "full")
      dense_train = r["train_step_ms"].get<double>();
  std::cout << fmt::format("{}: batch {} x {} tokens, {} timed steps\n\n", a.model_dir, a.batch,
                           a.seq, a.steps)
            << "| method | parameters | trainable | trainable % | fwd GMACs/token | train "
               "GMACs/token | train step (ms) | vs dense | train tokens/s | inference (ms) | "
               "inference tokens/s | peak RSS (MB) |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    double step = r["train_step_ms"].get<double>();
    std::cout << fmt::format(
        "| {} | {} | {} | {:.3f} | {:.4g} | {:.4g} | {:.1f} | {} | {:.0f} | {:.1f} | {:.0f} | "
        "{:.0f} |\n",
        r["method"].get<std::string>(), r["parameters"].get<int64_t>(),
        r["trainable"].get<int64_t>(),
        100.0 * r["trainable"].get<double>() / r["parameters"].get<double>(),
        r["forward_gmacs_per_token"].get<double>(), r["train_gmacs_per_token"].get<double>(), step,
        dense_train > 0 ? fmt::format("{:.2f}", step / dense_train) : "-",
        r["train_tokens_per_s"].get<double>(), r["inference_ms"].get<double>(),
        r["inference_tokens_per_s"].get<double>(), r["peak_rss_mb"].get<double>());
  }
  if (!a.json_out.empty()) write_text_atomic(a.json_out, rows.dump(1) + "\n");
}

}  // namespace

void register_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand("bench",
                                 "Efficiency table: parameters, FLOPs, time and memory per method");
  cmd->add_option("MODEL_DIR", a->model_dir, "Model folder")->required();
  add_list_option(cmd, "--methods", a->methods,
                  "Methods: dense, emoe-dispatched, or a training method but moefication (emoe "
                  "train --fields lists them)")
      ->capture_default_str();
  cmd->add_option("--batch", a->batch, "Sequences per batch")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--seq", a->seq, "Tokens per sequence")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--steps", a->steps, "Timed steps (after one warm-up)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--experts", a->experts,
                  "MoE experts (default: the largest divisor of d_ff <= 16; GMoE 4)");
  cmd->add_option("--topk", a->topk, "MoE k (default: N/4; GMoE 2)");
  cmd->add_option("--json", a->json_out, "Also write the rows as JSON to this file");
  // internal: how bench measures each method in its own process; not listed in --help
  cmd->add_option("--single", a->single, "Measure one method in this process")->group("");
  add_run_flags(cmd, a->run);
  cmd->callback([a] { run_bench(*a); });
}

}  // namespace emoe::cli
