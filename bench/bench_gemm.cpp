// Benchmark: the machine's matrix-multiply peak in float32 (through ATen and through emoe's own
// product) and bfloat16, on the GEMM shapes of a BERT-base and a Llama-style training step. The
// training benchmarks divide by the best of these.
// Usage: bench_gemm [--device cpu|cuda] [--seconds S]
#include <iostream>

#include "bench_common.h"
#include "emoe/core/logging.h"
#include "emoe/core/runtime.h"

int main(int argc, char** argv) {
  emoe::ensure_runtime_environment(argc, argv);
  std::string device = "cpu";
  double seconds = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--device")
      device = argv[i + 1];
    else if (a == "--seconds")
      seconds = std::atof(argv[i + 1]);
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
