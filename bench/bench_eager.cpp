// Benchmark: emoe against the same models in eager ATen (bench/eager_reference.h: BERT and Llama
// in plain operations, in the order Hugging Face transformers 4.33 makes them), in one process,
// steps alternated, on bench_train's shapes: full fine-tuning and LoRA (AdamW;
// torch::optim::AdamW for the reference, as Hugging Face's Trainer uses torch's; LoRA as PEFT
// 0.5's LoRA Linear), inference, and greedy generation with the KV cache (Llama-style, as
// Hugging Face's generate). The reference gets emoe's weights and must give emoe's loss and
// logits first (within float32 or bfloat16 rounding), and in float32 every trained weight's
// gradient; then both are timed. The ratios stand in for issue 27's "vs Hugging Face" where
// transformers cannot be installed: Hugging Face also pays Python's per-operation overhead, so
// emoe's lead over it is at least this.
//
// Usage: kUsage below (bench_eager --help).
//   --methods full,lora: what trains (default both); LoRA r 8, alpha 16, dropout 0.1 on the
//   query and value layers (emoe's defaults, PEFT's), the base frozen.
//   --profile-inference PREFIX: also one inference forward of each side under the autograd
//   profiler, PREFIX.MODEL.METHOD.PRECISION.{emoe,reference}.json (scripts/profile_summary.py).
//   --peak-seconds: per shape and path of the measured GEMM peak (bench_train's; default 0.4).
//   --batch/--seq/--layers shrink the shapes (the quick check); the defaults are bench_train's.
//   Generation runs on the Llama-style model with float32 and bfloat16 weights.
#include <iostream>
#include <sstream>

#include "bench_common.h"
#include "bench_models.h"
#include "eager_reference.h"
#include "emoe/analysis/flops.h"
#include "emoe/core/cpu_info.h"
#include "emoe/core/error.h"
#include "emoe/core/logging.h"
#include "emoe/core/runtime.h"
#include "emoe/io/atomic_file.h"
#include "emoe/models/generate.h"
#include "emoe/models/loader.h"
#include "emoe/train/method.h"
#include "emoe/train/optim.h"
#include "emoe/train/precision.h"
#include "emoe/train/run_config.h"
#include "torch/csrc/autograd/profiler_legacy.h"

namespace {

using emoe::bench::EagerReference;
using emoe::bench::positive;
using emoe::bench::seconds_since;
using emoe::bench::split_list;

constexpr const char* kUsage =
    "bench_eager [--models bert-base,llama-style] [--methods full,lora]\n"
    "            [--precision fp32|bf16|both] [--steps 3]\n"
    "            [--warmup 2] [--batch B --seq T] [--layers L] [--no-generate]\n"
    "            [--batches 1,8] [--prompt 32] [--new 64] [--reps 2]\n"
    "            [--profile-inference PREFIX] [--peak-seconds S]\n"
    "            [--markdown FILE] [--json FILE]\n";

struct Args {
  std::vector<std::string> models = {"bert-base", "llama-style"};
  std::vector<std::string> precisions = {"fp32", "bf16"};
  std::vector<std::string> methods = {"full", "lora"};  // lora: PEFT's defaults, r 8 on q and v
  std::vector<int64_t> batches = {1, 8};
  int64_t steps = 3, warmup = 2, batch = 0, seq = 0, layers = 0, prompt = 32, new_tokens = 64,
          reps = 2;
  bool generate = true;
  std::string profile;        // prefix of the inference profiles (emoe's and the reference's)
  double peak_seconds = 0.4;  // per shape and path of the measured peak (< 0.1: a 512-cube)
  std::string markdown_out, json_out;
};

struct Case {
  nlohmann::json config;
  EagerReference::Kind kind;
  emoe::Head head;
  int64_t batch, seq;
};

Case model_case(const std::string& name, const Args& a) {
  Case c;
  if (name == "bert-base") {
    c = {emoe::bench::bert_base_config(), EagerReference::Kind::kBert,
         emoe::Head::kSequenceClassification, 16, 128};
  } else if (name == "llama-style") {
    c = {emoe::bench::llama_style_config(), EagerReference::Kind::kLlama, emoe::Head::kCausalLM, 8,
         256};
  } else {
    EMOE_THROW(UsageError, "--models: unknown model '{}' (known: bert-base, llama-style)", name);
  }
  if (a.batch > 0) c.batch = a.batch;
  if (a.seq > 0) c.seq = a.seq;
  if (a.layers > 0) c.config["num_hidden_layers"] = a.layers;
  return c;
}

// The largest |a - b| over max(|b|) (a relative error of the whole tensor).
double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  auto x = a.detach().to(torch::kDouble), y = b.detach().to(torch::kDouble);
  return (x - y).abs().max().item<double>() / std::max(y.abs().max().item<double>(), 1e-30);
}

// One model, method and precision: agreement, then alternated training steps and inference
// passes.
nlohmann::json measure(const std::string& name, const std::string& method,
                       const std::string& precision_name, const Args& a) {
  const Case c = model_case(name, a);
  const auto dev = c10::Device(c10::kCPU);
  const auto precision = emoe::parse_precision(precision_name);
  torch::manual_seed(0);
  auto model = emoe::create_model(
      emoe::JsonFields(c.config, name), c.head,
      c.head == emoe::Head::kSequenceClassification ? std::optional<int64_t>(2) : std::nullopt);
  const auto summary = model->summary();
  emoe::MethodCost cost;  // full fine-tuning: every weight trained
  double lora_scaling = 1, lora_dropout = 0;
  if (method == "lora") {
    const auto st = emoe::apply_method(
        *model, emoe::load_run_config("", {"model=(random)", "task=sst2", "method=lora"}), {});
    cost.name = method, cost.peft = st.peft, cost.trainable_body = false;
    lora_scaling = st.peft.alpha / static_cast<double>(st.peft.r), lora_dropout = st.peft.dropout;
    // lora_B starts at zero (PEFT's initialisation), where lora_A gets no gradient: a random
    // lora_B, so that the gradient check below covers both
    torch::NoGradGuard g;
    const std::string b_suffix = "lora_B.weight";
    for (auto& p : model->named_parameters(true))
      if (p.key().size() >= b_suffix.size() &&
          p.key().compare(p.key().size() - b_suffix.size(), b_suffix.size(), b_suffix) == 0)
        p.value().normal_(0.0, 0.02);
  }
  EagerReference ref(c.kind, c.config, emoe::model_state(*model));
  ref.set_lora(lora_scaling, lora_dropout);
  const std::string what = name + " " + method;
  const int64_t vocab = c.config["vocab_size"].get<int64_t>();
  emoe::ModelInputs in;
  in.input_ids = torch::randint(5, vocab, {c.batch, c.seq}, torch::kLong);
  in.attention_mask = torch::ones({c.batch, c.seq}, torch::kLong);
  in.labels = c.head == emoe::Head::kCausalLM ? in.input_ids
                                              : torch::randint(0, 2, {c.batch}, torch::kLong);

  // 1. the same computation: loss and logits without dropout
  model->eval();
  ref.train(false);
  double loss_difference = 0, logits_difference = 0;
  {
    torch::NoGradGuard g;
    emoe::PrecisionScope scope(precision, dev);
    auto ours = model->forward(in);
    auto theirs = ref.forward(in.input_ids, in.attention_mask, in.labels);
    loss_difference = relative_difference(ours.loss, theirs.loss);
    logits_difference = relative_difference(ours.logits, theirs.logits);
  }
  const double tolerance = precision == emoe::Precision::kFp32 ? 1e-4 : 5e-2;
  EMOE_CHECK(loss_difference <= tolerance && logits_difference <= tolerance, RuntimeError,
             "{} {}: the eager reference disagrees with emoe's model (loss {:.2e}, logits {:.2e} "
             "relative; tolerance {:.0e}): it would not be timing the same computation",
             what, precision_name, loss_difference, logits_difference, tolerance);
  // ... and in float32 every weight's gradient (the backward passes too; random weights leave
  // some forward differences, such as attention's scale, below the loss's rounding)
  double gradient_difference = 0;
  std::string worst;
  if (precision == emoe::Precision::kFp32) {
    model->forward(in).loss.backward();
    ref.forward(in.input_ids, in.attention_mask, in.labels).loss.backward();
    // each tensor's difference over its own largest gradient, or over 1e-4 of the model's
    // largest where its own is smaller (a key bias's gradient is zero but for rounding)
    const auto state = emoe::model_state(*model);
    double largest = 0;
    for (const auto& [key, w] : state) {
      if (!w.requires_grad()) continue;  // frozen (LoRA's base)
      EMOE_CHECK(w.grad().defined() && ref.weight(key).grad().defined(), RuntimeError,
                 "{}: no gradient for {} on one side", what, key);
      largest = std::max(largest, ref.weight(key).grad().abs().max().item<double>());
    }
    for (const auto& [key, w] : state) {
      if (!w.requires_grad()) continue;
      const auto ours = w.grad().to(torch::kDouble),
                 theirs = ref.weight(key).grad().to(torch::kDouble);
      const double d = (ours - theirs).abs().max().item<double>() /
                       std::max(theirs.abs().max().item<double>(), 1e-4 * largest);
      if (d > gradient_difference) gradient_difference = d, worst = key;
    }
    model->zero_grad();
    for (auto& t : ref.parameters()) t.mutable_grad() = torch::Tensor();
    EMOE_CHECK(gradient_difference <= 1e-3, RuntimeError,
               "{} fp32: the eager reference's gradient of {} differs from emoe's by {:.2e} "
               "(relative; tolerance 1e-3): it would not be timing the same computation",
               what, worst, gradient_difference);
  }
  std::cerr << fmt::format(
      "{} {}: the reference gives emoe's loss and logits ({:.1e}, {:.1e}){}\n", what,
      precision_name, loss_difference, logits_difference,
      precision == emoe::Precision::kFp32
          ? fmt::format(" and every gradient ({:.1e}, {})", gradient_difference, worst)
          : std::string());

  // 2. training steps, alternated (which goes first alternates too)
  model->train();
  ref.train(true);
  in.output_logits = false;  // as the trainer: the loss only
  emoe::TrainOptions to;
  to.lr = 1e-5;
  emoe::Optimizer ours_opt(*model, to);
  torch::optim::AdamW theirs_opt(ref.parameters(),
                                 torch::optim::AdamWOptions(to.lr).weight_decay(to.weight_decay));
  auto ours_step = [&] {
    torch::Tensor loss;
    {
      emoe::PrecisionScope scope(precision, dev);
      loss = model->forward(in).loss;
    }
    loss.backward();
    ours_opt.step();
    ours_opt.zero_grad();
    (void)loss.item<double>();
  };
  auto theirs_step = [&] {
    torch::Tensor loss;
    {
      emoe::PrecisionScope scope(precision, dev);
      loss = ref.forward(in.input_ids, in.attention_mask, in.labels).loss;
    }
    loss.backward();
    theirs_opt.step();
    theirs_opt.zero_grad();
    (void)loss.item<double>();
  };
  double t_ours = 0, t_theirs = 0;
  for (int64_t i = 0; i < a.warmup + a.steps; ++i)
    for (int j = 0; j < 2; ++j) {
      const bool ours = (i + j) % 2 == 0;
      auto t0 = std::chrono::steady_clock::now();
      ours ? ours_step() : theirs_step();
      if (i >= a.warmup) (ours ? t_ours : t_theirs) += seconds_since(t0);
    }
  t_ours /= static_cast<double>(a.steps), t_theirs /= static_cast<double>(a.steps);

  // 3. inference (the logits), alternated
  model->eval();
  ref.train(false);
  in.output_logits = true;
  in.labels = torch::Tensor();  // the logits only, on both sides
  double i_ours = 0, i_theirs = 0;
  {
    torch::NoGradGuard g;
    for (int64_t i = 0; i < 1 + a.steps; ++i)
      for (int j = 0; j < 2; ++j) {
        const bool ours = (i + j) % 2 == 0;
        auto t0 = std::chrono::steady_clock::now();
        {
          emoe::PrecisionScope scope(precision, dev);
          auto logits = ours ? model->forward(in).logits
                             : ref.forward(in.input_ids, in.attention_mask, {}).logits;
          (void)logits.sum().item<double>();
        }
        if (i >= 1) (ours ? i_ours : i_theirs) += seconds_since(t0);
      }
  }
  i_ours /= static_cast<double>(a.steps), i_theirs /= static_cast<double>(a.steps);
  if (!a.profile.empty()) {
    torch::NoGradGuard g;
    for (bool ours : {true, false}) {
      const auto path = fmt::format("{}.{}.{}.{}.{}.json", a.profile, name, method, precision_name,
                                    ours ? "emoe" : "reference");
      emoe::PrecisionScope scope(precision, dev);
      torch::autograd::profiler::RecordProfile guard(path);
      auto logits = ours ? model->forward(in).logits
                         : ref.forward(in.input_ids, in.attention_mask, {}).logits;
      (void)logits.sum().item<double>();
    }
  }
  const double tokens = static_cast<double>(c.batch * c.seq);
  const auto flops = emoe::count_flops(summary, cost, c.seq);
  return {{"model", name},
          {"method", method},
          {"train_flops_per_token", 2.0 * flops.train_total},
          {"forward_flops_per_token", 2.0 * flops.forward_total},
          {"precision", precision_name},
          {"batch", c.batch},
          {"seq", c.seq},
          {"loss_relative_difference", loss_difference},
          {"logits_relative_difference", logits_difference},
          {"gradient_relative_difference", gradient_difference},
          {"train_step_s", t_ours},
          {"reference_train_step_s", t_theirs},
          {"train_tokens_per_s", tokens / t_ours},
          {"reference_train_tokens_per_s", tokens / t_theirs},
          {"inference_tokens_per_s", tokens / i_ours},
          {"reference_inference_tokens_per_s", tokens / i_theirs}};
}

// Greedy generation on the Llama-style model: emoe's generate against the reference's loop, per
// weight dtype and batch; the best of the repetitions, the two alternated. Decode tokens/s
// counts every new token after the first, over every row.
nlohmann::json measure_generation(const Args& a) {
  auto config = emoe::bench::llama_style_config();
  if (a.layers > 0) config["num_hidden_layers"] = a.layers;
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string dtype_name : {"float32", "bfloat16"}) {
    const auto dtype = emoe::parse_dtype(dtype_name);
    torch::manual_seed(0);
    auto model = emoe::create_model(emoe::JsonFields(config, "llama-style"), emoe::Head::kCausalLM,
                                    std::nullopt);
    EagerReference ref(EagerReference::Kind::kLlama, config, emoe::model_state(*model));
    model->to(dtype);
    model->eval();
    ref.to(c10::Device(c10::kCPU), dtype);
    ref.train(false);
    const int64_t max_batch = *std::max_element(a.batches.begin(), a.batches.end());
    torch::manual_seed(1);
    const auto prompts =
        torch::randint(5, config["vocab_size"].get<int64_t>(), {max_batch, a.prompt}, torch::kLong);
    for (int64_t batch : a.batches) {
      const auto prompt = prompts.narrow(0, 0, batch);
      double best_ours = 0, best_theirs = 0;
      int64_t same_tokens = 0;
      torch::Tensor ours_out;                      // repetition 0's tokens (emoe runs first there)
      for (int64_t rep = 0; rep <= a.reps; ++rep)  // repetition 0 warms both
        for (int j = 0; j < 2; ++j) {
          const bool ours = (rep + j) % 2 == 0;
          std::chrono::steady_clock::time_point t_first;
          auto first = [&](int64_t step) {
            if (step == 0) t_first = std::chrono::steady_clock::now();
          };
          torch::Tensor out;
          if (ours) {
            emoe::GenerateOptions o;
            o.max_new_tokens = a.new_tokens;  // no eos: every step runs
            out = emoe::generate(*model, prompt, {}, o,
                                 [&](int64_t step, const at::Tensor&) { first(step); });
          } else {
            out = ref.greedy(prompt, a.new_tokens, first);
          }
          const double rate = static_cast<double>(batch * (a.new_tokens - 1)) /
                              std::max(seconds_since(t_first), 1e-9);
          if (rep == 0) {
            // the same tokens from both (float32: all of them; bfloat16 rounds differently
            // and may part ways, so the count is reported, not required)
            if (ours) {
              ours_out = out;
            } else {
              same_tokens = (out.narrow(1, a.prompt, a.new_tokens) ==
                             ours_out.narrow(1, a.prompt, a.new_tokens))
                                .all(0)
                                .to(torch::kLong)
                                .cumprod(0)
                                .sum()
                                .item<int64_t>();
            }
            continue;
          }
          (ours ? best_ours : best_theirs) = std::max(ours ? best_ours : best_theirs, rate);
        }
      if (dtype == torch::kFloat)
        EMOE_CHECK(same_tokens == a.new_tokens, RuntimeError,
                   "generation, float32, batch {}: the reference's greedy tokens part from "
                   "emoe's after {} of {}",
                   batch, same_tokens, a.new_tokens);
      rows.push_back({{"dtype", dtype_name},
                      {"batch", batch},
                      {"same_leading_tokens", same_tokens},
                      {"decode_tokens_per_s", best_ours},
                      {"reference_decode_tokens_per_s", best_theirs}});
      std::cerr << fmt::format("generation {} batch {}: {:.0f} against {:.0f} tokens/s\n",
                               dtype_name, batch, best_ours, best_theirs);
    }
  }
  return rows;
}

int run(const Args& a) {
  const int threads = emoe::configure_threads(0);
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& m : a.models) model_case(m, a);  // unknown names fail before measuring
  // the GEMM peak of each precision in this process (bench_train's measurement), for the MFU of
  // both sides and the ceiling: no step can beat the reference by more than 1 / its MFU
  std::map<std::string, double> peak;
  for (const auto& p : a.precisions) {
    const auto dtype = p == "fp32" ? torch::kFloat : torch::kBFloat16;
    peak[p] = emoe::bench::measured_peak(dtype, c10::Device(c10::kCPU), a.peak_seconds).gflops;
  }
  for (const auto& m : a.models)
    for (const auto& method : a.methods)
      for (const auto& p : a.precisions) {
        auto r = measure(m, method, p, a);
        std::cerr << fmt::format("{} {} {}: train {:.0f} against {:.0f} tokens/s\n", m, method, p,
                                 r["train_tokens_per_s"].get<double>(),
                                 r["reference_train_tokens_per_s"].get<double>());
        rows.push_back(r);
      }
  nlohmann::json generation = a.generate ? measure_generation(a) : nlohmann::json::array();

  const emoe::CpuInfo cpu = emoe::read_cpu_info();
  std::ostringstream md;
  md << fmt::format("CPU: {} ({} logical cores; {}), {} threads\n\n",
                    cpu.model.empty() ? "unknown" : cpu.model, cpu.cores, cpu.isa_text(), threads)
     << "emoe against the same model in eager ATen operations, in Hugging Face transformers "
        "4.33's order (bench/eager_reference.h), same weights, one process, steps alternated; "
        "AdamW (the reference: torch::optim::AdamW) on what trains: every weight in full "
        "fine-tuning; in lora the adapters (r 8, alpha 16, dropout 0.1 on the query and value "
        "layers, as PEFT 0.5's LoRA Linear) and BERT's classifier; bf16 = autocast.\n\n"
     << fmt::format(
            "Measured GEMM peak (bench_train's: the best of 4 shapes x 2 paths):{}{}. "
            "MFU against it; \"ceiling\": the speed-up a step at 100 % MFU would have "
            "over the reference (1 / the reference's MFU).\n\n",
            peak.count("fp32") ? fmt::format(" float32 {:.0f} GFLOP/s", peak["fp32"])
                               : std::string(),
            peak.count("bf16") ? fmt::format("{}bfloat16 {:.0f} GFLOP/s",
                                             peak.count("fp32") ? ", " : " ", peak["bf16"])
                               : std::string())
     << "| model | method | precision | batch x seq | train tokens/s (MFU) | reference (MFU) | "
        "speed-up | "
        "ceiling | inference tokens/s (MFU) | reference (MFU) | speed-up | ceiling | loss / "
        "logits agree to |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (auto& r : rows) {
    const double tr = r["train_tokens_per_s"].get<double>(),
                 tr_ref = r["reference_train_tokens_per_s"].get<double>(),
                 in = r["inference_tokens_per_s"].get<double>(),
                 in_ref = r["reference_inference_tokens_per_s"].get<double>();
    const double p = peak[r["precision"].get<std::string>()];
    auto use = [&](double tokens_per_s, const char* flops) {
      return emoe::bench::model_flop_utilisation(r[flops].get<double>() * tokens_per_s / 1e9, p);
    };
    auto cell = [](double tokens_per_s, const emoe::bench::Utilisation& u) {
      return fmt::format("{:.0f} ({:.0f} %{})", tokens_per_s, 100.0 * u.mfu, u.capped ? "*" : "");
    };
    const auto u_tr = use(tr, "train_flops_per_token"),
               u_tr_ref = use(tr_ref, "train_flops_per_token"),
               u_in = use(in, "forward_flops_per_token"),
               u_in_ref = use(in_ref, "forward_flops_per_token");
    r["peak_gflops"] = p;
    r["train_mfu"] = u_tr.mfu, r["reference_train_mfu"] = u_tr_ref.mfu;
    r["inference_mfu"] = u_in.mfu, r["reference_inference_mfu"] = u_in_ref.mfu;
    md << fmt::format(
        "| {} | {} | {} | {} x {} | {} | {} | {:.2f}x | {:.2f}x | {} | {} | {:.2f}x | {:.2f}x | "
        "{:.0e} / {:.0e} |\n",
        r["model"].get<std::string>(), r["method"].get<std::string>(),
        r["precision"].get<std::string>(), r["batch"].get<int64_t>(), r["seq"].get<int64_t>(),
        cell(tr, u_tr), cell(tr_ref, u_tr_ref), tr / tr_ref, 1.0 / u_tr_ref.mfu, cell(in, u_in),
        cell(in_ref, u_in_ref), in / in_ref, 1.0 / u_in_ref.mfu,
        r["loss_relative_difference"].get<double>(), r["logits_relative_difference"].get<double>());
  }
  if (!generation.empty()) {
    md << fmt::format(
              "\nGreedy generation with the KV cache, Llama-style decoder, prompt {} tokens, {} "
              "new tokens, weights in the dtype named; decode tokens/s over every row after the "
              "first new token, best of {} repetitions, the two alternated; the reference is "
              "Hugging Face's greedy search (the cache grown by torch.cat).\n\n",
              a.prompt, a.new_tokens, a.reps)
       << "| weights | batch | decode tokens/s | reference | speed-up | same greedy tokens |\n"
          "|---|---|---|---|---|---|\n";
    for (const auto& g : generation) {
      const double ours = g["decode_tokens_per_s"].get<double>(),
                   theirs = g["reference_decode_tokens_per_s"].get<double>();
      md << fmt::format("| {} | {} | {:.0f} | {:.0f} | {:.2f}x | {} of {} |\n",
                        g["dtype"].get<std::string>(), g["batch"].get<int64_t>(), ours, theirs,
                        ours / theirs, g["same_leading_tokens"].get<int64_t>(), a.new_tokens);
    }
  }
  std::cout << md.str();
  if (!a.markdown_out.empty()) emoe::write_text_atomic(a.markdown_out, md.str());
  if (!a.json_out.empty())
    emoe::write_text_atomic(a.json_out, nlohmann::json({{"cpu", cpu.model},
                                                        {"isa", cpu.isa},
                                                        {"threads", threads},
                                                        {"rows", rows},
                                                        {"generation", generation}})
                                                .dump(1) +
                                            "\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  emoe::ensure_runtime_environment(argc, argv);
  emoe::init_logging(1);
  Args a;
  const emoe::bench::DecodeFlags decode{&a.batches, &a.prompt, &a.new_tokens, &a.reps, &a.layers};
  const int parsed = emoe::bench::parse_flags(
      argc, argv, "bench_eager", kUsage,
      [&](const std::string& k, const emoe::bench::FlagValue& value) {
        if (emoe::bench::decode_flag(k, value, decode)) return true;
        if (k == "--models") {
          a.models = split_list(value());
        } else if (k == "--methods") {
          a.methods = split_list(value());
          for (const auto& m : a.methods)
            EMOE_CHECK(m == "full" || m == "lora", UsageError,
                       "--methods: expected full and/or lora, got '{}'", m);
          EMOE_CHECK(!a.methods.empty(), UsageError, "--methods: expected a list like full,lora");
        } else if (k == "--precision") {
          const auto p = value();
          EMOE_CHECK(p == "fp32" || p == "bf16" || p == "both", UsageError,
                     "--precision: expected fp32, bf16 or both, got '{}'", p);
          a.precisions =
              p == "both" ? std::vector<std::string>{"fp32", "bf16"} : std::vector<std::string>{p};
        } else if (k == "--steps") {
          a.steps = positive(k, value());
        } else if (k == "--warmup") {
          a.warmup = positive(k, value());
        } else if (k == "--batch") {
          a.batch = positive(k, value());
        } else if (k == "--seq") {
          a.seq = positive(k, value());
        } else if (k == "--no-generate") {
          a.generate = false;
        } else if (k == "--profile-inference") {
          a.profile = value();
        } else if (k == "--peak-seconds") {
          a.peak_seconds = emoe::bench::seconds(k, value());
        } else if (k == "--markdown") {
          a.markdown_out = value();
        } else if (k == "--json") {
          a.json_out = value();
        } else {
          return false;
        }
        return true;
      },
      [&] {
        EMOE_CHECK(!a.models.empty(), UsageError, "--models: expected a list like bert-base");
      });
  if (parsed >= 0) return parsed;
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::cerr << "bench_eager: error: " << e.what() << "\n";
    return 1;
  }
}
