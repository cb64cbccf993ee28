// Helpers shared by the benchmark programs: timing, the measured GEMM peak, peak memory.
#pragma once
#include <sys/resource.h>

#include <chrono>
#include <functional>
#include <string>

#include <torch/torch.h>

namespace emoe::bench {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Mean seconds per call after one warm-up call; repeats until `min_seconds` have passed and at
// least `min_reps` calls were timed.
inline double time_per_call(const std::function<void()>& f, int min_reps, double min_seconds) {
  f();
  int reps = 0;
  auto t0 = std::chrono::steady_clock::now();
  do {
    f();
    ++reps;
  } while (reps < min_reps || seconds_since(t0) < min_seconds);
  return seconds_since(t0) / reps;
}

// GFLOP/s of C = A B with A [m, k], B [k, n] in `dtype` on `device` (2 m n k FLOPs per call),
// the best of a few timed rounds.
inline double gemm_gflops(int64_t m, int64_t k, int64_t n, c10::ScalarType dtype,
                          const c10::Device& device, double min_seconds = 1.0) {
  auto opts = torch::TensorOptions().dtype(dtype).device(device);
  auto a = torch::randn({m, k}, opts), b = torch::randn({k, n}, opts);
  auto c = torch::empty({m, n}, opts);
  auto sync = [&] {
    if (device.is_cuda()) (void)c.sum().item<double>();
  };
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    double s = time_per_call([&] { torch::mm_out(c, a, b); sync(); }, 2, min_seconds / 3);
    best = std::max(best, 2.0 * static_cast<double>(m * n * k) / s / 1e9);
  }
  return best;
}

// The largest resident set of this process so far, in MiB (Linux reports KiB).
inline double peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

}  // namespace emoe::bench
