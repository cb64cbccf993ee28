// Benchmark: the machine's matrix-multiply peak in float32 (through ATen and through emoe's own
// product) and bfloat16, on the GEMM shapes of a BERT-base and a Llama-style training step. The
// training benchmarks divide by the best of these. Then decoding's products (1 and 8 rows against
// a weight, `y = x W^T`): the library's (torch::linear) against emoe's small-product kernels
// (src/emoe/models/small_gemm.h), as the rate the weights are read at, beside a plain sum of the
// same weights (what reading them costs).
// Usage: bench_gemm [--device cpu|cuda] [--seconds S] [--small-only]
#include <iostream>

#include "bench_common.h"
#include "emoe/core/logging.h"
#include "emoe/core/runtime.h"
#include "emoe/models/small_gemm.h"

namespace {

// Decoding's products: GB/s of weights read by the library's product, by emoe's kernels, and by a
// sum of the weights, for 1 and 8 rows, float32 and bfloat16.
void small_products(double seconds) {
  struct Shape {
    const char* what;
    int64_t k, n;
  };
  const Shape shapes[] = {{"Llama-style attention projection", 512, 512},
                          {"Llama-style FFN in", 512, 1376},
                          {"Llama-style FFN out", 1376, 512},
                          {"Llama-style LM head", 512, 32000},
                          {"BERT-base FFN in", 768, 3072}};
  const std::string isa = emoe::small_gemm_isa();
  std::cout << "Decoding's products (rows x K times a weight [N, K]), GB/s of weights read, best "
               "of 3; emoe's small-product kernels: "
            << (isa.empty() ? "none on this CPU" : isa) << "\n\n"
            << "| shape | rows | K x N | dtype | library | emoe | emoe / library | sum of the "
               "weights |\n|---|---|---|---|---|---|---|---|\n";
  torch::NoGradGuard no_grad;
  for (const auto& s : shapes)
    for (int64_t rows : {1, 8})
      for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
        auto w = torch::randn({s.n, s.k}).to(dtype);
        auto x = torch::randn({rows, s.k}).to(dtype);
        const double bytes = static_cast<double>(w.nbytes());
        auto rate = [&](const std::function<void()>& f) {
          double best = 0;
          for (int r = 0; r < 3; ++r)
            best = std::max(best, bytes / emoe::bench::time_per_call(f, 5, seconds / 12) / 1e9);
          return best;
        };
        const double lib = rate([&] { (void)torch::linear(x, w); });
        // the kernels themselves: pinned, not auto's per-shape choice (which may be the library)
        double ours = 0.0;
        if (!isa.empty()) {
          const auto setting = emoe::set_small_gemm_isa(isa);
          ours = rate([&] { (void)emoe::small_gemm_linear(x, w, {}, false); });
          emoe::set_small_gemm_isa(setting);
        }
        const double sum = rate([&] { (void)w.sum(); });
        std::cout << fmt::format("| {} | {} | {} x {} | {} | {:.1f} | {} | {} | {:.1f} |\n", s.what,
                                 rows, s.k, s.n, dtype == torch::kFloat ? "float32" : "bfloat16",
                                 lib, isa.empty() ? "-" : fmt::format("{:.1f}", ours),
                                 isa.empty() ? "-" : fmt::format("{:.2f}x", ours / lib), sum);
      }
  std::cout << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  emoe::ensure_runtime_environment(argc, argv);
  std::string device = "cpu";
  double seconds = 1.0;
  bool small_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--small-only")
      small_only = true;
    else if (a == "--device" && i + 1 < argc)
      device = argv[++i];
    else if (a == "--seconds" && i + 1 < argc)
      seconds = std::atof(argv[++i]);
  }
  const int threads = emoe::configure_threads(0);
  const auto dev = emoe::parse_device(device);
  struct Shape {
    const char* what;
    int64_t m, k, n;
  };
  const Shape shapes[] = {{"BERT-base FFN in (2048 tokens)", 2048, 768, 3072},
                          {"BERT-base FFN out", 2048, 3072, 768},
                          {"BERT-base attention projection", 2048, 768, 768},
                          {"Llama-style FFN in", 2048, 512, 1376},
                          {"square 2048", 2048, 2048, 2048}};
  if (dev.is_cpu()) small_products(seconds);
  if (small_only) return 0;
  const std::string backend = emoe::matmul_backend_name();
  std::cout << "GEMM throughput on " << device << ", " << threads
            << " threads (GFLOP/s, best of 3); "
            << "float32 through ATen's mm (OpenBLAS on CPU) and through emoe's own product ("
            << backend << "), bfloat16 through ATen (oneDNN on CPU)\n\n"
            << "| shape | m x k x n | float32 ATen | float32 emoe | bfloat16 | bf16/fp32 (best) "
               "|\n|---|---|---|---|---|---|\n";
  double best_aten = 0, best_emoe = 0, best16 = 0;
  for (const auto& s : shapes) {
    double f32 = emoe::bench::gemm_gflops(s.m, s.k, s.n, torch::kFloat, dev, seconds);
    double e32 =
        emoe::bench::gemm_gflops(s.m, s.k, s.n, torch::kFloat, dev, seconds, /*via_emoe=*/true);
    double b16 = emoe::bench::gemm_gflops(s.m, s.k, s.n, torch::kBFloat16, dev, seconds);
    best_aten = std::max(best_aten, f32);
    best_emoe = std::max(best_emoe, e32);
    best16 = std::max(best16, b16);
    std::cout << fmt::format("| {} | {} x {} x {} | {:.1f} | {:.1f} | {:.1f} | {:.3f} |\n", s.what,
                             s.m, s.k, s.n, f32, e32, b16, b16 / std::max(f32, e32));
  }
  const double best32 = std::max(best_aten, best_emoe);
  std::cout << fmt::format(
      "\npeak: float32 {:.1f} GFLOP/s (ATen {:.1f}, emoe {:.1f}), bfloat16 {:.1f} GFLOP/s\n",
      best32, best_aten, best_emoe, best16);
  std::cout << "JSON "
            << nlohmann::json{{"device", device},
                              {"threads", threads},
                              {"fp32_gflops", best32},
                              {"fp32_aten_gflops", best_aten},
                              {"fp32_emoe_gflops", best_emoe},
                              {"fp32_emoe_backend", backend},
                              {"bf16_gflops", best16}}
                   .dump()
            << "\n";
  return 0;
}
