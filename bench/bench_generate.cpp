// Benchmark: greedy generation with the KV cache (`emoe generate`'s path) on the Llama-style
// decoder of bench_train (8 layers, hidden 512, FFN 1376, vocabulary 32000; random weights):
// the prompt's forward pass (prefill) and the decoding speed, in tokens per second over every
// row, for each batch size and weight dtype: the default (emoe's small-product kernels or the
// library's product, chosen per shape by measurement: src/emoe/models/small_gemm.h), the kernels
// for every product, and the library's products for every product. Configurations
// alternate within each repetition, in an order that rotates from one repetition to the next, so
// that the ratios (kernels over library, bfloat16 over
// float32, a batch over batch 1) are measured under the same load; each figure is the best
// repetition.
//
// Usage: bench_generate [--batches 1,8] [--prompt 32] [--new 128] [--dtypes float32,bfloat16]
//                       [--layers L] [--kv-heads H] [--reps 3] [--device cpu|cuda]
//                       [--json FILE] [--profile trace.json] [-v]
//   --kv-heads: key/value heads (default 8, one per query head; 2: grouped-query attention as
//   Llama 3, Qwen and Mistral use it)
//   --profile: also one generation (the first dtype and batch, 16 new tokens) under the
//   autograd profiler, as a Chrome trace (scripts/profile_summary.py sums it by operator).
//   -v: log auto's decision for each product shape, with both paths' median times.
#include <iostream>
#include <sstream>

#include "bench_common.h"
#include "bench_models.h"
#include "emoe/core/cpu_info.h"
#include "emoe/core/error.h"
#include "emoe/core/logging.h"
#include "emoe/core/runtime.h"
#include "emoe/io/atomic_file.h"
#include "emoe/models/generate.h"
#include "emoe/models/loader.h"
#include "emoe/models/small_gemm.h"
#include "torch/csrc/autograd/profiler_legacy.h"

namespace {

using emoe::bench::positive;
using emoe::bench::seconds_since;
using emoe::bench::split_list;

constexpr const char* kUsage =
    "bench_generate [--batches 1,8] [--prompt 32] [--new 128] [--dtypes float32,bfloat16]\n"
    "               [--layers L] [--kv-heads H] [--reps 3] [--device cpu|cuda]\n"
    "               [--json FILE] [--profile trace.json] [-v]\n";

struct Args {
  std::vector<int64_t> batches = {1, 8};
  std::vector<std::string> dtypes = {"float32", "bfloat16"};
  int64_t prompt = 32, new_tokens = 128, layers = 0, kv_heads = 0, reps = 3;
  std::string device = "cpu", json_out, profile;
};

struct Timing {
  double prefill_s = 0;            // the prompt's forward pass and the first new token
  double decode_tokens_per_s = 0;  // the later steps, tokens over every row
};

// One greedy generation of `a.new_tokens` tokens for `batch` rows of the prompt.
Timing generate_once(emoe::PretrainedModelImpl& model, const torch::Tensor& prompt,
                     int64_t new_tokens) {
  emoe::GenerateOptions o;
  o.max_new_tokens = new_tokens;  // no eos: every step runs
  auto t0 = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point t_first;
  auto on_step = [&](int64_t step, const at::Tensor& next) {
    if (step == 0) {
      (void)next.sum().item<int64_t>();  // the first token exists (a GPU has finished)
      t_first = std::chrono::steady_clock::now();
    }
  };
  auto out = emoe::generate(model, prompt, {}, o, on_step);
  (void)out.sum().item<int64_t>();
  Timing t;
  t.prefill_s = std::chrono::duration<double>(t_first - t0).count();
  const double decode_s = seconds_since(t_first);
  t.decode_tokens_per_s =
      static_cast<double>(prompt.size(0) * (new_tokens - 1)) / std::max(decode_s, 1e-9);
  return t;
}

int run(const Args& a) {
  const auto dev = emoe::parse_device(a.device);
  const int threads = emoe::configure_threads(0);
  auto config = emoe::bench::llama_style_config();
  if (a.layers > 0) config["num_hidden_layers"] = a.layers;
  if (a.kv_heads > 0) config["num_key_value_heads"] = a.kv_heads;
  std::vector<emoe::ModelPtr> models;
  for (const auto& d : a.dtypes) {
    const auto dtype = emoe::parse_dtype(d);
    torch::manual_seed(0);  // the same weights in every dtype
    auto m = emoe::create_model(emoe::JsonFields(config, "llama-style"), emoe::Head::kCausalLM,
                                std::nullopt);
    m->to(dev, dtype);
    m->eval();
    models.push_back(m);
  }
  const int64_t vocab = config["vocab_size"].get<int64_t>();
  torch::manual_seed(1);
  const int64_t max_batch = *std::max_element(a.batches.begin(), a.batches.end());
  const auto prompts = torch::randint(5, vocab, {max_batch, a.prompt}, torch::kLong).to(dev);

  if (!a.profile.empty()) {
    auto prompt = prompts.narrow(0, 0, a.batches[0]);
    generate_once(*models[0], prompt, 16);  // warm
    {
      torch::autograd::profiler::RecordProfile guard(a.profile);
      generate_once(*models[0], prompt, 16);
    }
    std::cerr << "profile of one generation (" << a.dtypes[0] << ", batch " << a.batches[0]
              << ", 16 new tokens) written to " << a.profile << "\n";
  }

  // the paths: auto (emoe's kernels or the library, measured per shape: the default), the
  // kernels for every shape, the library's products for every shape
  const std::string kernels = emoe::small_gemm_isa();
  std::vector<std::string> paths = {"library"};
  if (!kernels.empty()) paths = {"auto", kernels, "library"};
  auto path_name = [&](const std::string& p) {
    return p == "auto"      ? std::string("auto (per shape)")
           : p == "library" ? p
                            : "emoe kernels (" + p + ")";
  };
  // best[dtype][batch][path]
  std::vector<std::vector<std::vector<Timing>>> best(
      a.dtypes.size(),
      std::vector<std::vector<Timing>>(a.batches.size(), std::vector<Timing>(paths.size())));
  for (int64_t rep = 0; rep <= a.reps; ++rep) {  // repetition 0 warms every configuration
    for (size_t d = 0; d < a.dtypes.size(); ++d)
      for (size_t b = 0; b < a.batches.size(); ++b)
        for (size_t i = 0; i < paths.size(); ++i) {
          // the order rotates with the repetition: a configuration run right after another is
          // timed slower or faster by it (the library measured 0.88-1.13x of itself after the
          // kernels against after the library), so each path takes each place in turn
          const size_t p = (i + static_cast<size_t>(rep)) % paths.size();
          emoe::set_small_gemm_isa(paths[p]);
          auto t = generate_once(*models[d], prompts.narrow(0, 0, a.batches[b]), a.new_tokens);
          if (rep == 0) continue;
          auto& k = best[d][b][p];
          if (k.prefill_s == 0 || t.prefill_s < k.prefill_s) k.prefill_s = t.prefill_s;
          k.decode_tokens_per_s = std::max(k.decode_tokens_per_s, t.decode_tokens_per_s);
        }
    if (rep > 0) std::cerr << "repetition " << rep << " of " << a.reps << " done\n";
  }
  emoe::set_small_gemm_isa("auto");

  const emoe::CpuInfo cpu = emoe::read_cpu_info();
  std::ostringstream md;
  md << fmt::format("CPU: {} ({} logical cores; {}), {} threads, {}\n\n",
                    cpu.model.empty() ? "unknown" : cpu.model, cpu.cores, cpu.isa_text(), threads,
                    a.device)
     << fmt::format(
            "Greedy generation with the KV cache, Llama-style decoder ({} layers, hidden 512, 8 "
            "heads, {} key/value heads, vocabulary 32000, random weights), prompt {} tokens, {} "
            "new tokens; best of {} repetitions, configurations alternated in an order that "
            "rotates each repetition.\n\n",
            config["num_hidden_layers"].get<int64_t>(),
            config["num_key_value_heads"].get<int64_t>(), a.prompt, a.new_tokens, a.reps)
     << "| weights | batch | products | prefill (ms) | decode tokens/s (all rows) | vs library | "
        "vs "
     << a.dtypes[0] << " | vs batch " << a.batches[0] << " |\n|---|---|---|---|---|---|---|---|\n";
  nlohmann::json rows = nlohmann::json::array();
  for (size_t d = 0; d < a.dtypes.size(); ++d)
    for (size_t b = 0; b < a.batches.size(); ++b)
      for (size_t p = 0; p < paths.size(); ++p) {
        const auto& t = best[d][b][p];
        const double vs_library = t.decode_tokens_per_s / best[d][b].back().decode_tokens_per_s;
        const double vs_dtype = t.decode_tokens_per_s / best[0][b][p].decode_tokens_per_s;
        const double vs_batch = t.decode_tokens_per_s / best[d][0][p].decode_tokens_per_s;
        md << fmt::format("| {} | {} | {} | {:.1f} | {:.1f} | {:.2f}x | {:.2f}x | {:.2f}x |\n",
                          a.dtypes[d], a.batches[b], path_name(paths[p]), 1e3 * t.prefill_s,
                          t.decode_tokens_per_s, vs_library, vs_dtype, vs_batch);
        rows.push_back({{"dtype", a.dtypes[d]},
                        {"batch", a.batches[b]},
                        {"products", path_name(paths[p])},
                        {"prefill_s", t.prefill_s},
                        {"decode_tokens_per_s", t.decode_tokens_per_s},
                        {"decode_vs_library", vs_library},
                        {"decode_vs_first_dtype", vs_dtype},
                        {"decode_vs_first_batch", vs_batch}});
      }
  std::cout << md.str();
  std::cout << "BENCH " << nlohmann::json({{"rows", rows}}).dump() << "\n";
  if (!a.json_out.empty())
    emoe::write_text_atomic(a.json_out, nlohmann::json({{"cpu", cpu.model},
                                                        {"threads", threads},
                                                        {"prompt", a.prompt},
                                                        {"new_tokens", a.new_tokens},
                                                        {"rows", rows}})
                                            .dump(2));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  emoe::ensure_runtime_environment(argc, argv);
  Args a;
  const emoe::bench::DecodeFlags decode{&a.batches, &a.prompt, &a.new_tokens, &a.reps, &a.layers};
  const int parsed = emoe::bench::parse_flags(
      argc, argv, "bench_generate", kUsage,
      [&](const std::string& k, const emoe::bench::FlagValue& value) {
        if (emoe::bench::decode_flag(k, value, decode)) return true;
        if (k == "--dtypes") {
          a.dtypes = split_list(value());
          EMOE_CHECK(!a.dtypes.empty(), UsageError, "--dtypes: expected a list like float32");
          for (const auto& d : a.dtypes) (void)emoe::parse_dtype(d);
        } else if (k == "--kv-heads") {
          a.kv_heads = positive(k, value());
        } else if (k == "--device") {
          a.device = value();
        } else if (k == "--json") {
          a.json_out = value();
        } else if (k == "--profile") {
          a.profile = value();
        } else if (k == "-v" || k == "--verbose") {
          emoe::init_logging(2);  // auto's per-shape decisions, with both paths' times
        } else {
          return false;
        }
        return true;
      });
  if (parsed >= 0) return parsed;
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::cerr << "bench_generate: error: " << e.what() << "\n";
    return 1;
  }
}
