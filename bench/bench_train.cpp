// Benchmark: training-step and inference throughput of emoe's methods on two model shapes with
// random weights — BERT-base (12 layers, hidden 768, FFN 3072, batch 16 x 128, sequence
// classification) and a Llama-style decoder (8 layers, hidden 512, FFN 1376, vocab 32000,
// batch 8 x 256, causal LM) — with model-FLOP utilisation against the GEMM peak measured in the
// same run, and the peak memory of each method (each measured in a fresh process).
//
// Usage: kUsage below (bench_train --help).
#include <iostream>
#include <set>
#include <sstream>

#include "bench_common.h"
#include "bench_models.h"
#include "emoe/analysis/flops.h"
#include "emoe/core/bf16_shadow.h"
#include "emoe/core/cpu_info.h"
#include "emoe/core/error.h"
#include "emoe/core/logging.h"
#include "emoe/core/runtime.h"
#include "emoe/core/subprocess.h"
#include "emoe/io/atomic_file.h"
#include "emoe/models/loader.h"
#include "emoe/moe/convert.h"
#include "emoe/moe/expert_ffn.h"
#include "emoe/moe/kernel_choices.h"
#include "emoe/train/method.h"
#include "emoe/train/method_table.h"
#include "emoe/train/optim.h"
#include "emoe/train/precision.h"
#include "torch/csrc/autograd/profiler_legacy.h"

namespace {

constexpr const char* kUsage =
    "bench_train [--models bert-base,llama-style] [--methods full,lora,...] [--steps N]\n"
    "            [--warmup W] [--precision fp32|bf16|both] [--batch B --seq T] [--layers L]\n"
    "            [--device cpu|cuda] [--json FILE] [--markdown FILE] [--peak-seconds S]\n"
    "bench_train --single MODEL METHOD PRECISION [--profile trace.json]\n"
    "            [--profile-inference trace.json] [--gemm-ab] [--pack-ab] [--checkpoint-ab]\n"
    "            [--shadow-ab]\n"
    "            (and the flags above)\n"
    "  --peak-seconds S: per shape and path of the measured GEMM peak (default 0.4; below 0.1\n"
    "    only a 512-cube, for the quick check).\n"
    "  --batch/--seq/--layers shrink the shapes (for a quick check; 0, the default: the issue's).\n"
    "  --warmup W untimed steps come first (default 3); the JSON lists every step's time.\n"
    "  --single: one measurement in this process; --profile also writes one training step's\n"
    "    autograd profile (scripts/profile_summary.py), --profile-inference one inference\n"
    "    forward's. --gemm-ab (with --single): alternates training steps with oneDNN's\n"
    "    implementation of each product chosen by measurement (the default) and oneDNN's own\n"
    "    first choice everywhere (EMOE_GEMM=onednn), and reports the ratio measured/default.\n"
    "    --shadow-ab (with --single): alternates bf16 training steps with the optimiser's\n"
    "    bfloat16 copies of the weights (the default) and without (every forward rounds the\n"
    "    float32 weights afresh; EMOE_BF16_SHADOW=off), each timed step after an untimed one of\n"
    "    its setting; reports the ratio with/without.\n"
    "    --pack-ab (with --single): alternates training steps, and inference forwards, with\n"
    "    second operands packed where measured faster (the default) and never packed\n"
    "    (EMOE_PACK_B=never: the same implementations on them as they are); reports both\n"
    "    ratios, measured/never.\n"
    "    --checkpoint-ab (with --single): alternates training steps with every block\n"
    "    checkpointed (train.gradient_checkpointing) and plain ones; reports the time ratio and\n"
    "    each way's peak tensor memory.\n"
    "  EMOE_KERNELS=FILE (a run's kernels.json): every row's process pins that record's timed\n"
    "    kernel choices first, as the emoe command does (runs then compare on the same kernels).\n";

using emoe::bench::seconds_since;
using emoe::bench::split_list;

struct Args {
  std::string models = "bert-base,llama-style";
  std::string methods = "full,lora,emoe,emoe-dispatched,gmoe,mov";
  std::string precision = "fp32";
  std::string device = "cpu";
  std::string json_out, markdown_out, single_model, single_method, single_precision, profile,
      profile_inference;
  bool gemm_ab = false;
  bool pack_ab = false;
  bool shadow_ab = false;
  bool checkpoint_ab = false;
  int64_t steps = 3, warmup = 3, batch = 0, seq = 0, layers = 0;
  double peak_seconds = 0.4;  // per shape and path of the measured peak (< 0.1: one small cube)
};

struct Shape {
  nlohmann::json config;
  emoe::Head head;
  int64_t batch, seq, experts, topk;
};

Shape model_shape(const std::string& name, const Args& a) {
  Shape s;
  if (name == "bert-base") {
    s.config = emoe::bench::bert_base_config();
    s.head = emoe::Head::kSequenceClassification;
    s.batch = 16, s.seq = 128, s.experts = 64, s.topk = 16;
  } else if (name == "llama-style") {
    s.config = emoe::bench::llama_style_config();
    s.head = emoe::Head::kCausalLM;
    s.batch = 8, s.seq = 256, s.experts = 32, s.topk = 8;
  } else {
    EMOE_THROW(UsageError, "--models: unknown model '{}' (known: bert-base, llama-style)", name);
  }
  if (a.batch > 0) s.batch = a.batch;
  if (a.seq > 0) s.seq = a.seq;
  if (a.layers > 0) s.config["num_hidden_layers"] = a.layers;
  return s;
}

// The run configuration of a method, every layer converted for the EMoE variants (the worst
// case for the masked path and the stretch goal for the dispatched one); GMoE with its own
// defaults (8 experts, top-2, every other layer among the last four).
emoe::RunConfig method_config(const std::string& method, const Shape& s, int64_t layers) {
  std::string m = method == "emoe-dispatched" ? "emoe" : method;
  std::vector<std::string> sets = {"model=(random)", "task=sst2", "method=" + m};
  if (emoe::method_info(m, "--methods").is_emoe()) {
    sets.push_back(fmt::format("moe.experts={}", s.experts));
    sets.push_back(fmt::format("moe.topk={}", s.topk));
    std::vector<int64_t> all(layers);
    for (int64_t l = 0; l < layers; ++l) all[l] = l;
    sets.push_back(fmt::format("moe.layers=[{}]", fmt::join(all, ",")));
    sets.push_back("moe.kmeans={restarts: 1, max_iter: 20}");
    sets.push_back(std::string("moe.execution=") +
                   (method == "emoe-dispatched" ? "dispatched" : "masked"));
  }
  return emoe::load_run_config("", sets);
}

// One (model, method, precision) measured in this process; prints one "BENCH {json}" line.
void measure_one(const Args& a) {
  const auto dev = emoe::parse_device(a.device);
  const Shape s = model_shape(a.single_model, a);
  auto& tensor_memory = emoe::bench::TensorMemory::instance();
  tensor_memory.install();
  torch::manual_seed(0);
  auto t_setup = std::chrono::steady_clock::now();
  auto model = emoe::create_model(
      emoe::JsonFields(s.config, a.single_model), s.head,
      s.head == emoe::Head::kSequenceClassification ? std::optional<int64_t>(2) : std::nullopt);
  const auto summary = model->summary();
  auto cfg = method_config(a.single_method, s, summary.num_layers);
  auto st = emoe::apply_method(*model, cfg, {});
  model->to(dev);
  const double setup_s = seconds_since(t_setup);
  auto counts = emoe::count_parameters(*model);

  emoe::MethodCost cost;
  cost.name = a.single_method;
  cost.moe = !st.moe.empty();
  cost.moe_config = st.moe.config;
  cost.moe_layers = static_cast<int64_t>(st.moe.splits.size());
  cost.peft = st.peft;
  cost.trainable_body = st.peft.method == emoe::PeftMethod::kNone;
  auto flops = emoe::count_flops(summary, cost, s.seq);

  emoe::ModelInputs in;
  in.input_ids = torch::randint(5, summary.vocab_size, {s.batch, s.seq}, torch::kLong).to(dev);
  in.attention_mask = torch::ones({s.batch, s.seq}, torch::kLong).to(dev);
  in.output_logits = false;  // as the trainer: the loss only
  in.labels = s.head == emoe::Head::kCausalLM
                  ? in.input_ids
                  : torch::randint(0, 2, {s.batch}, torch::kLong).to(dev);
  emoe::TrainOptions to;
  to.lr = 1e-5;
  emoe::Optimizer opt(*model, to);
  emoe::Precision precision = emoe::parse_precision(a.single_precision);
  model->train();
  double loss_value = 0;
  auto train_step = [&] {
    torch::Tensor loss;
    {
      emoe::PrecisionScope scope(precision, dev);
      auto out = model->forward(in);
      loss = out.loss;
      if (auto aux = emoe::collect_aux_loss(*model); aux.defined()) loss = loss + aux;
    }
    loss.backward();
    opt.step();
    opt.zero_grad();
    loss_value = loss.item<double>();
  };
  if (!a.profile.empty()) {
    // warm steps until one touches no fresh memory (at most 8): the heap and the optimizer
    // state reach their steady state after a few. The profiler's own allocations can still move
    // the heap's blocks (a BERT-base bf16 step under it page-faulted the 94 MB embedding
    // gradient afresh, 190 ms of "fill_" that no unprofiled step pays), so the profiled step is
    // repeated, up to 4 times, until it too runs without page faults; the count is reported.
    int warm = 0;
    for (int64_t faults = -1; faults != 0 && warm < 8; ++warm) {
      const int64_t f0 = emoe::bench::minor_page_faults();
      train_step();
      faults = emoe::bench::minor_page_faults() - f0;
    }
    int64_t faults = -1;
    int tries = 0;
    while (faults != 0 && tries < 4) {
      ++tries;
      const int64_t f0 = emoe::bench::minor_page_faults();
      {
        torch::autograd::profiler::RecordProfile guard(a.profile);
        train_step();
      }
      faults = emoe::bench::minor_page_faults() - f0;
    }
    std::cerr << fmt::format(
        "profile of one training step written to {} (after {} warm steps and {} profiled; {} "
        "page faults in the one kept)\n",
        a.profile, warm, tries, faults);
  }
  // warm-up steps, untimed in the average but reported: the first step allocates the optimizer
  // state, and the next one or two still page-fault memory the heap has not yet handed out
  std::vector<double> step_times;
  std::vector<int64_t> step_faults;  // minor page faults (fresh memory touched) per step
  auto timed_step = [&] {
    const int64_t f0 = emoe::bench::minor_page_faults();
    auto t0 = std::chrono::steady_clock::now();
    train_step();
    step_times.push_back(seconds_since(t0));
    step_faults.push_back(emoe::bench::minor_page_faults() - f0);
  };
  for (int64_t i = 0; i < a.warmup; ++i) timed_step();
  // the fp32 peak in this process: the best of several shapes and both paths (ATen's mm and
  // emoe's own product, what the model's layers use), before and after the steps
  auto fp32_peak = [&] { return emoe::bench::measured_peak(torch::kFloat, dev, a.peak_seconds); };
  const auto gemm_before = fp32_peak();
  tensor_memory.reset_peak(dev);
  double train_s = 0;
  for (int64_t i = 0; i < a.steps; ++i) {
    timed_step();
    train_s += step_times.back() / static_cast<double>(a.steps);
  }
  const double train_peak = emoe::bench::peak_rss_mib();
  const double train_peak_tensors = tensor_memory.peak_mib(dev);
  // MoE methods: the same model with every plug computing its dense FFN, alternated step by
  // step with the MoE form, so that the ratio is measured under the same machine load.
  double moe_over_dense = 0;
  auto plugs = emoe::moe_plugs(*model);
  if (!plugs.empty()) {
    // one untimed dense step first: its products' shapes are new to this process, and the first
    // sight of a shape times oneDNN's implementations (and creates primitives), which once
    // counted in the dense time made the ratio flattering (BERT-base bf16 0.68 against 0.95
    // measured against the full row on an AMX Xeon)
    for (auto* p : plugs) p->set_dense_override(true);
    train_step();
    double t_moe = 0, t_dense = 0;
    for (int64_t i = 0; i < a.steps; ++i)
      for (bool dense : {true, false}) {
        for (auto* p : plugs) p->set_dense_override(dense);
        auto t0 = std::chrono::steady_clock::now();
        train_step();
        (dense ? t_dense : t_moe) += seconds_since(t0);
      }
    for (auto* p : plugs) p->set_dense_override(false);
    moe_over_dense = t_moe / t_dense;
  }
  // --gemm-ab, --pack-ab: `run` once with use(false) (creating that setting's primitives: the
  // cache keys carry the settings), then a.steps times each way, alternated; the time with
  // use(true) over the time with use(false)
  auto alternate = [&](const std::function<void(bool)>& use, const std::function<void()>& run) {
    use(false);
    run();
    double t_true = 0, t_false = 0;
    for (int64_t i = 0; i < a.steps; ++i)
      for (bool on : {false, true}) {
        use(on);
        auto t0 = std::chrono::steady_clock::now();
        run();
        (on ? t_true : t_false) += seconds_since(t0);
      }
    return t_true / t_false;
  };
  // --gemm-ab: the same steps with oneDNN's first implementation of every product, alternated
  // with the measured choices
  double gemm_measured_over_default = 0;
  if (a.gemm_ab) {
    const auto before = emoe::set_float32_gemm(emoe::Float32Gemm::kOneDnn);  // (the setting)
    gemm_measured_over_default = alternate(
        [](bool measured) {
          emoe::set_float32_gemm(measured ? emoe::Float32Gemm::kMeasured
                                          : emoe::Float32Gemm::kOneDnn);
        },
        train_step);
    emoe::set_float32_gemm(before);
  }
  // --pack-ab: the same steps with no second operand packed (PackB::kNever; each class keeps the
  // implementation measured above, on b as it is), alternated with the measured choices; then
  // the same for inference forwards
  double pack_train_ratio = 0, pack_infer_ratio = 0;
  const auto pack_before = emoe::pack_b();
  auto use_packing = [](bool packed) {
    emoe::set_pack_b(packed ? emoe::PackB::kMeasured : emoe::PackB::kNever);
  };
  auto infer_forward = [&] {
    torch::NoGradGuard g;
    emoe::PrecisionScope scope(precision, dev);
    (void)model->forward(in).logits.sum().item<double>();
  };
  if (a.pack_ab) {
    pack_train_ratio = alternate(use_packing, train_step);
    emoe::set_pack_b(pack_before);
  }
  // --shadow-ab: steps with the optimiser's bfloat16 copies of the weights (core/bf16_shadow.h)
  // and without; each timed step follows an untimed one of its setting, so that the copies it
  // reads were written by the step before it
  double shadow_ratio = 0;
  if (a.shadow_ab) {
    const bool shadows_before = emoe::bf16_shadows_enabled();
    double t_on = 0, t_off = 0;
    for (int64_t i = 0; i < a.steps; ++i)
      for (bool on : {false, true}) {
        emoe::set_bf16_shadows_enabled(on);
        train_step();
        auto t0 = std::chrono::steady_clock::now();
        train_step();
        (on ? t_on : t_off) += seconds_since(t0);
      }
    emoe::set_bf16_shadows_enabled(shadows_before);
    shadow_ratio = t_on / t_off;
  }
  // --checkpoint-ab: steps with every block checkpointed (train.gradient_checkpointing),
  // alternated with plain ones; the time ratio and each way's peak tensor memory
  double ckpt_ratio = 0, ckpt_peak = 0, plain_peak = 0;
  if (a.checkpoint_ab) {
    auto use = [&](bool on) { model->set_gradient_checkpointing(on); };
    auto measured_step = [&] {
      tensor_memory.reset_peak(dev);
      train_step();
      const bool on = model->gradient_checkpointing();
      double& peak = on ? ckpt_peak : plain_peak;
      peak = std::max(peak, tensor_memory.peak_mib(dev));
    };
    ckpt_ratio = alternate(use, measured_step);
    use(false);
    std::cerr << fmt::format(
        "gradient checkpointing: step {:.3f}x the plain step; peak tensor memory {:.0f} MiB "
        "(plain {:.0f} MiB, {:.2f}x)\n",
        ckpt_ratio, ckpt_peak, plain_peak, ckpt_peak / plain_peak);
  }
  model->eval();
  double infer_s = 0;
  {
    in.output_logits = true;
    infer_s = emoe::bench::time_per_call(infer_forward, static_cast<int>(a.steps), 0.0);
  }
  if (a.pack_ab) {
    pack_infer_ratio = alternate(use_packing, infer_forward);
    emoe::set_pack_b(pack_before);
  }
  if (!a.profile_inference.empty()) {
    infer_forward();  // warm
    {
      torch::autograd::profiler::RecordProfile guard(a.profile_inference);
      infer_forward();
    }
    std::cerr << "profile of one inference forward written to " << a.profile_inference << "\n";
  }
  const auto gemm_after = fp32_peak();
  const double tokens = static_cast<double>(s.batch * s.seq);
  const auto& fp32_best = gemm_before.gflops >= gemm_after.gflops ? gemm_before : gemm_after;
  nlohmann::json j = {{"fp32_peak_gflops", fp32_best.gflops},
                      {"fp32_peak_where", fp32_best.where},
                      {"moe_step_over_dense_step", moe_over_dense},
                      {"model", a.single_model},
                      {"method", a.single_method},
                      {"precision", a.single_precision},
                      {"batch", s.batch},
                      {"seq", s.seq},
                      {"parameters", counts.total},
                      {"trainable", counts.trainable},
                      {"train_flops_per_token", 2.0 * flops.train_total},
                      {"forward_flops_per_token", 2.0 * flops.forward_total},
                      {"setup_s", setup_s},
                      {"train_step_s", train_s},
                      {"warmup_steps", a.warmup},
                      {"step_times_s", step_times},
                      {"step_page_faults", step_faults},
                      {"train_tokens_per_s", tokens / train_s},
                      {"inference_s", infer_s},
                      {"inference_tokens_per_s", tokens / infer_s},
                      {"train_peak_rss_mib", train_peak},
                      {"train_peak_tensor_mib", train_peak_tensors},
                      {"loss", loss_value},
                      {"onednn_implementations", emoe::onednn_implementation_choices()}};
  if (a.gemm_ab) j["gemm_measured_step_over_default_step"] = gemm_measured_over_default;
  if (a.shadow_ab) j["bf16_copies_step_over_fresh_casts_step"] = shadow_ratio;
  if (a.checkpoint_ab) {
    j["checkpointed_step_over_plain_step"] = ckpt_ratio;
    j["checkpointed_peak_tensor_mib"] = ckpt_peak;
    j["plain_peak_tensor_mib"] = plain_peak;
  }
  if (a.pack_ab) {
    j["packed_step_over_unpacked_step"] = pack_train_ratio;
    j["packed_inference_over_unpacked_inference"] = pack_infer_ratio;
  }
  if (cost.moe)
    j["moe"] = {{"experts", cost.moe_config.experts},
                {"topk", cost.moe_config.topk},
                {"layers", cost.moe_layers},
                {"execution", emoe::to_string(cost.moe_config.execution)},
                {"expert_paths", emoe::expert_path_reports()}};
  std::cout << "BENCH " << j.dump() << std::endl;
}

nlohmann::json run_child(const Args& a, const std::string& model, const std::string& method,
                         const std::string& precision) {
  std::string cmd = fmt::format(
      "{} --single {} {} {} --steps {} --warmup {} --batch {} --seq {} --layers {} --device {} "
      "--peak-seconds {}",
      emoe::shell_quote(emoe::self_executable()), model, method, precision, a.steps, a.warmup,
      a.batch, a.seq, a.layers, a.device, a.peak_seconds);
  return emoe::run_and_read_json_line(
      cmd, "BENCH ", fmt::format("bench_train: measuring {} {} {}", model, method, precision));
}

std::string fmt_ratio(double x) {
  return fmt::format("{:.2f}", x);
}

int run(const Args& a) {
  const auto dev = emoe::parse_device(a.device);
  const int threads = emoe::configure_threads(0);
  std::cerr << "measuring the GEMM peak (several shapes, ATen and emoe, float32 and bfloat16)...\n";
  const auto best32 = emoe::bench::measured_peak(torch::kFloat, dev, a.peak_seconds);
  const auto best16 = emoe::bench::measured_peak(torch::kBFloat16, dev, a.peak_seconds);
  const double peak32 = best32.gflops, peak16 = best16.gflops;
  const emoe::CpuInfo cpu = emoe::read_cpu_info();
  const emoe::TheoreticalPeak isa_peak = emoe::theoretical_peak(cpu);
  std::vector<std::string> precisions = a.precision == "both"
                                            ? std::vector<std::string>{"fp32", "bf16"}
                                            : std::vector<std::string>{a.precision};
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& model : split_list(a.models)) {
    model_shape(model, a);  // unknown names fail before any measuring
    for (const auto& precision : precisions)
      for (const auto& method : split_list(a.methods)) {
        std::cerr << fmt::format("{} {} {}...", model, method, precision) << std::flush;
        auto r = run_child(a, model, method, precision);
        std::cerr << fmt::format(" {:.0f} tokens/s\n", r["train_tokens_per_s"].get<double>());
        rows.push_back(r);
      }
  }
  std::ostringstream md;
  md << fmt::format("CPU: {} ({} logical cores; {}), {} threads, {}\n\n",
                    cpu.model.empty() ? "unknown" : cpu.model, cpu.cores, cpu.isa_text(), threads,
                    a.device)
     << fmt::format(
            "Measured GEMM peak (the best of 4 shapes x ATen's mm and emoe's own product, {}): "
            "float32 {:.1f} GFLOP/s ({}), bfloat16 {:.1f} GFLOP/s ({}). MFU of fp32 rows uses the "
            "peak measured in that row's own process, before and after its steps; an MFU marked * "
            "ran faster than every product measured and is shown as 100 %.\n\n",
            emoe::matmul_backend_name(), peak32, best32.where, peak16, best16.where)
     << (cpu.mhz > 0 ? fmt::format("Instruction-set peak (an upper bound: cores x {:.0f} MHz x "
                                   "FLOP/cycle): float32 {:.0f} GFLOP/s ({}), bfloat16 {:.0f} "
                                   "GFLOP/s ({}).\n\n",
                                   cpu.mhz, isa_peak.fp32_gflops, isa_peak.fp32_basis,
                                   isa_peak.bf16_gflops, isa_peak.bf16_basis) +
                           (peak32 > isa_peak.fp32_gflops || peak16 > isa_peak.bf16_gflops
                                ? "A measured peak above it means the cores ran faster than "
                                  "the clock read (turbo): MFU stays against the measured "
                                  "peak.\n\n"
                                : std::string())
                     : std::string())

     << "| model | method | precision | params (M) | trainable (M) | train step (s) | vs full | "
        "MoE step / dense step | train tokens/s | MFU | inference tokens/s | peak tensor memory "
        "(MiB) | vs full | "
        "peak RSS (MiB) | vs full |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    double full_step = 0, full_mem = 0, full_tensors = 0;
    for (const auto& f : rows)
      if (f["model"] == r["model"] && f["method"] == "full" && f["precision"] == r["precision"]) {
        full_step = f["train_step_s"].get<double>();
        full_mem = f["train_peak_rss_mib"].get<double>();
        full_tensors = f["train_peak_tensor_mib"].get<double>();
      }
    const double step = r["train_step_s"].get<double>(),
                 mem = r["train_peak_rss_mib"].get<double>();
    const double tensors = r["train_peak_tensor_mib"].get<double>();
    // fp32: against the peak the measuring process itself saw (the machine's load varies)
    const double peak = r["precision"] == "bf16" ? peak16 : r["fp32_peak_gflops"].get<double>();
    const auto use = emoe::bench::model_flop_utilisation(
        r["train_flops_per_token"].get<double>() * r["train_tokens_per_s"].get<double>() / 1e9,
        peak);
    std::string method = r["method"].get<std::string>();
    if (r.contains("moe"))
      method += fmt::format(" (N {}, k {}, {} layers)", r["moe"]["experts"].get<int64_t>(),
                            r["moe"]["topk"].get<int64_t>(), r["moe"]["layers"].get<int64_t>());
    const double vs_dense = r["moe_step_over_dense_step"].get<double>();
    md << fmt::format(
        "| {} | {} | {} | {:.1f} | {:.2f} | {:.2f} | {} | {} | {:.0f} | {:.0f} %{} | {:.0f} | "
        "{:.0f} "
        "| {} | {:.0f} | {} |\n",
        r["model"].get<std::string>(), method, r["precision"].get<std::string>(),
        r["parameters"].get<double>() / 1e6, r["trainable"].get<double>() / 1e6, step,
        full_step > 0 ? fmt_ratio(step / full_step) : "-", vs_dense > 0 ? fmt_ratio(vs_dense) : "-",
        r["train_tokens_per_s"].get<double>(), 100.0 * use.mfu, use.capped ? "*" : "",
        r["inference_tokens_per_s"].get<double>(), tensors,
        full_tensors > 0 ? fmt_ratio(tensors / full_tensors) : "-", mem,
        full_mem > 0 ? fmt_ratio(mem / full_mem) : "-");
  }
  // which kernels each dispatched row's experts ran on (chosen per shape by measurement)
  std::set<std::string> paths;
  for (const auto& r : rows)
    if (r.contains("moe") && r["moe"].contains("expert_paths"))
      for (const auto& line : r["moe"]["expert_paths"])
        paths.insert(fmt::format("{} ({}): {}", r["model"].get<std::string>(),
                                 r["precision"].get<std::string>(), line.get<std::string>()));
  if (!paths.empty()) {
    md << "\nDispatched experts' kernels, chosen per shape by measurement in each row's process:\n";
    for (const auto& p : paths) md << "- " << p << "\n";
  }
  // oneDNN's implementations chosen by measurement (emoe::onednn_implementation_choices): the
  // product classes where another than oneDNN's default won ("(over <default>; ...)")
  std::set<std::string> impls;
  size_t timed = 0;
  for (const auto& r : rows)
    if (r.contains("onednn_implementations"))
      for (const auto& line_json : r["onednn_implementations"]) {
        const auto line = line_json.get<std::string>();
        ++timed;
        if (line.find(" (over ") != std::string::npos)
          impls.insert(fmt::format("{} {} {}: {}", r["model"].get<std::string>(),
                                   r["method"].get<std::string>(),
                                   r["precision"].get<std::string>(), line));
      }
  if (timed > 0) {
    md << fmt::format(
        "\noneDNN implementations timed per product class: {} classes over all rows, {} of them "
        "faster in another implementation than oneDNN's default:\n",
        timed, impls.size());
    for (const auto& p : impls) md << "- " << p << "\n";
  }
  std::cout << md.str();
  nlohmann::json doc = {{"threads", threads},
                        {"device", a.device},
                        {"cpu", cpu.model},
                        {"isa", cpu.isa},
                        {"fp32_peak_gflops", peak32},
                        {"fp32_peak_where", best32.where},
                        {"fp32_emoe_backend", emoe::matmul_backend_name()},
                        {"bf16_peak_gflops", peak16},
                        {"bf16_peak_where", best16.where},
                        {"isa_fp32_peak_gflops", isa_peak.fp32_gflops},
                        {"isa_bf16_peak_gflops", isa_peak.bf16_gflops},
                        {"rows", rows}};
  if (!a.json_out.empty()) emoe::write_text_atomic(a.json_out, doc.dump(1) + "\n");
  if (!a.markdown_out.empty()) emoe::write_text_atomic(a.markdown_out, md.str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  emoe::ensure_runtime_environment(argc, argv);
  emoe::init_logging(1);
  Args a;
  const int parsed = emoe::bench::parse_flags(
      argc, argv, "bench_train", kUsage,
      [&](const std::string& k, const emoe::bench::FlagValue& value) {
        if (k == "--models") {
          a.models = value();
        } else if (k == "--methods") {
          a.methods = value();
        } else if (k == "--precision") {
          a.precision = value();
        } else if (k == "--device") {
          a.device = value();
        } else if (k == "--json") {
          a.json_out = value();
        } else if (k == "--markdown") {
          a.markdown_out = value();
        } else if (k == "--steps") {
          a.steps = emoe::bench::positive(k, value());
        } else if (k == "--warmup") {
          a.warmup = emoe::bench::integer_at_least(k, value(), 0);
        } else if (k == "--batch") {  // (0: the shape's own, as the rows' processes are told)
          a.batch = emoe::bench::integer_at_least(k, value(), 0);
        } else if (k == "--seq") {
          a.seq = emoe::bench::integer_at_least(k, value(), 0);
        } else if (k == "--layers") {
          a.layers = emoe::bench::integer_at_least(k, value(), 0);
        } else if (k == "--peak-seconds") {
          a.peak_seconds = emoe::bench::seconds(k, value());
        } else if (k == "--profile") {
          a.profile = value();
        } else if (k == "--profile-inference") {
          a.profile_inference = value();
        } else if (k == "--gemm-ab") {
          a.gemm_ab = true;
        } else if (k == "--shadow-ab") {
          a.shadow_ab = true;
        } else if (k == "--pack-ab") {
          a.pack_ab = true;
        } else if (k == "--checkpoint-ab") {
          a.checkpoint_ab = true;
        } else if (k == "--single") {
          a.single_model = value();
          a.single_method = value();
          a.single_precision = value();
        } else {
          return false;
        }
        return true;
      },
      [&] {
        EMOE_CHECK(a.precision == "fp32" || a.precision == "bf16" || a.precision == "both",
                   UsageError, "--precision: expected fp32, bf16 or both, got '{}'", a.precision);
      });
  if (parsed >= 0) return parsed;
  try {
    if (!a.single_model.empty()) {
      emoe::configure_threads(0);
      emoe::pin_kernel_choices_from_env();  // EMOE_KERNELS: every row on one record's kernels
      measure_one(a);
      return 0;
    }
    return run(a);
  } catch (const std::exception& e) {
    std::cerr << "bench_train: error: " << e.what() << "\n";
    return 1;
  }
}
