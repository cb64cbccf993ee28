// Benchmark: one FFN layer forward+backward, dense vs EMoE masked vs EMoE dispatched at
// k/N = 1/2, 1/4, 1/8, the dispatched experts on each path this CPU has (float32: library GEMMs
// and the AVX-512 register tiles; bfloat16: library, AVX-512 BF16 and AMX tiles). Prints times
// and ratios measured in the same run: for each row all are timed in turn, step after step, and
// each column is the median of its steps, so that the machine's load changes all three alike.
// Usage: bench_ffn [--tokens 2048] [--reps 5] [--precision fp32|bf16] [--device cpu|cuda]
//        (the older positional form `bench_ffn TOKENS REPS` still works)
#include <algorithm>
#include <chrono>
#include <iostream>
#include <vector>

#include "bench_common.h"
#include "emoe/core/error.h"
#include "emoe/core/logging.h"
#include "emoe/core/runtime.h"
#include "emoe/models/loader.h"
#include "emoe/moe/convert.h"
#include "emoe/moe/expert_ffn.h"
#include "emoe/train/precision.h"

namespace {

constexpr const char* kUsage =
    "usage: bench_ffn [--tokens N] [--reps R] [--precision fp32|bf16] [--device cpu|cuda]\n"
    "                 [TOKENS [REPS]]\n"
    "  one BERT-base FFN (768 x 3072) forward+backward: dense, EMoE masked and EMoE dispatched\n"
    "  at N 64 and 16, k/N 1/2, 1/4, 1/8; medians of R steps after one warm-up (defaults 2048, "
    "5)\n";

double time_once(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

using emoe::bench::positive;

int main(int argc, char** argv) {
  emoe::ensure_runtime_environment(argc, argv);
  int64_t tokens = 2048, reps = 5;
  std::string precision_text = "fp32", device_text = "cpu";
  emoe::Precision precision = emoe::Precision::kFp32;
  c10::Device device(c10::kCPU);
  std::vector<std::string> positional;
  const int parsed = emoe::bench::parse_flags(
      argc, argv, "bench_ffn", kUsage,
      [&](const std::string& k, const emoe::bench::FlagValue& value) {
        if (k == "--tokens") {
          tokens = positive(k, value());
        } else if (k == "--reps") {
          reps = positive(k, value());
        } else if (k == "--precision") {
          precision_text = value();
        } else if (k == "--device") {
          device_text = value();
        } else if (!k.empty() && k[0] != '-') {
          positional.push_back(k);
        } else {
          return false;
        }
        return true;
      },
      [&] {
        EMOE_CHECK(positional.size() <= 2, UsageError,
                   "expected at most two positional arguments (TOKENS REPS)");
        if (!positional.empty()) tokens = positive("TOKENS", positional[0]);
        if (positional.size() > 1) reps = positive("REPS", positional[1]);
        precision = emoe::parse_precision(precision_text);
        device = emoe::parse_device(device_text);
      });
  if (parsed >= 0) return parsed;
  emoe::configure_threads(0);
  emoe::init_logging(0);
  const int64_t d = 768, d_ff = 3072;
  nlohmann::json cfg = {{"model_type", "bert"},          {"hidden_size", d},
                        {"intermediate_size", d_ff},     {"num_hidden_layers", 1},
                        {"num_attention_heads", 12},     {"vocab_size", 100},
                        {"max_position_embeddings", 512}};
  torch::manual_seed(0);
  auto model = emoe::create_model(emoe::JsonFields(cfg, "bench"), emoe::Head::kBase);
  model->to(device);
  auto* slot = model->ffn_slots()[0];
  auto x = torch::randn({tokens, d}, torch::TensorOptions().device(device).requires_grad(true));
  auto step = [&] {
    model->zero_grad();
    emoe::PrecisionScope scope(precision, device);
    auto y = slot->run_ffn(x, {});
    y.sum().backward();
    if (device.is_cuda()) (void)x.grad().sum().item<double>();  // waits for the device
  };
  std::cout << "FFN " << d << " x " << d_ff << ", " << tokens << " tokens, forward+backward, "
            << emoe::to_string(precision) << ", " << device_text << ", "
            << emoe::configure_threads(0) << " threads\n";
  // the dispatched experts' paths this CPU has, each timed in the same loop: float32 the
  // register tiles or the library GEMMs; bfloat16 also the AVX-512 BF16 and AMX tiles
  struct Path {
    std::string name;
    std::function<void()> select, restore;
  };
  std::vector<Path> paths;
  const auto dtype = precision == emoe::Precision::kBf16Mixed ? at::kBFloat16 : at::kFloat;
  if (device.is_cpu())
    for (auto p : emoe::expert_paths_available(dtype))
      paths.push_back({emoe::to_string(p), [p] { emoe::force_expert_path(p); },
                       [] { emoe::force_expert_path(c10::nullopt); }});
  else
    paths.push_back({"library", [] {}, [] {}});
  std::string head = "| N | k/N | dense (ms) | masked (ms) |", rule = "|---|---|---|---|";
  for (const auto& p : paths) {
    head += fmt::format(" dispatched {} (ms) |", p.name);
    rule += "---|";
  }
  head += " masked/dense |";
  rule += "---|";
  for (const auto& p : paths) {
    head += fmt::format(" {}/dense |", p.name);
    rule += "---|";
  }
  std::cout << head << "\n" << rule << "\n";
  for (int64_t experts : {64, 16}) {
    auto c = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
    c.experts = experts;
    c.layers = {0};
    c.split = "random";
    c.topk = 1;
    model->ffn_slots()[0]->set_plug(nullptr);
    emoe::convert_to_moe(*model, c);
    auto* plug = emoe::moe_plugs(*model)[0];
    for (int64_t div : {2, 4, 8}) {
      plug->mutable_config().topk = experts / div;
      std::vector<double> td, tm;
      std::vector<std::vector<double>> tx(paths.size());
      for (int64_t r = -1; r < reps; ++r) {  // r = -1: warm-up of each
        plug->set_dense_override(true);
        const double a = time_once(step);
        plug->set_dense_override(false);
        plug->mutable_config().execution = emoe::Execution::kMasked;
        const double b = time_once(step);
        plug->mutable_config().execution = emoe::Execution::kDispatched;
        std::vector<double> ts;
        for (const auto& p : paths) {
          p.select();
          ts.push_back(time_once(step));
          p.restore();
        }
        if (r < 0) continue;
        td.push_back(a), tm.push_back(b);
        for (size_t i = 0; i < paths.size(); ++i) tx[i].push_back(ts[i]);
      }
      const double dense = median(td), masked = median(tm);
      std::string row =
          fmt::format("| {} | 1/{} | {:.1f} | {:.1f} |", experts, div, dense * 1e3, masked * 1e3);
      for (auto& t : tx) row += fmt::format(" {:.1f} |", median(t) * 1e3);
      row += fmt::format(" {:.2f} |", masked / dense);
      for (auto& t : tx) row += fmt::format(" {:.2f} |", median(t) / dense);
      std::cout << row << "\n";
    }
  }
  // the path the dispatched experts take by default at each of these shapes (measured once)
  if (device.is_cpu())
    for (int64_t experts : {64, 16})
      std::cout << fmt::format(
          "default for {} experts: {}\n", experts,
          emoe::expert_path_report({dtype, d, d_ff / experts, experts, /*gated=*/false}));
  return 0;
}
