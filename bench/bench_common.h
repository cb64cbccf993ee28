// Helpers shared by the benchmark programs: timing, the measured GEMM peak, peak memory.
#pragma once
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "emoe/core/error.h"
#include "emoe/core/torch_compat.h"
#include "emoe/models/matmul.h"
#ifdef EMOE_BENCH_HAS_CUDA_STATS  // defined by bench/CMakeLists.txt when libtorch has c10_cuda
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace emoe::bench {

// "a,b,,c" -> {"a", "b", "c"}: a list flag's items.
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

// `text` read whole as an integer (std::stoll) or a floating-point number (std::stod); nullopt
// if it is not one.
template <typename T>
std::optional<T> number_of(const std::string& text) {
  size_t used = 0;
  try {
    T v;
    if constexpr (std::is_integral_v<T>)
      v = std::stoll(text, &used);
    else
      v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// A flag's integer of at least `least`; UsageError naming the flag otherwise.
inline int64_t integer_at_least(const std::string& flag, const std::string& text, int64_t least) {
  const auto v = number_of<int64_t>(text);
  EMOE_CHECK(v && *v >= least, UsageError, "{}: expected {} integer, got '{}'", flag,
             least == 1 ? "a positive" : (least == 0 ? "a non-negative" : "an"), text);
  return *v;
}

inline int64_t positive(const std::string& flag, const std::string& text) {
  return integer_at_least(flag, text, 1);
}

// A flag's number of seconds (> 0); UsageError naming the flag otherwise.
inline double seconds(const std::string& flag, const std::string& text) {
  const auto v = number_of<double>(text);
  EMOE_CHECK(v && *v > 0, UsageError, "{}: expected seconds above 0, got '{}'", flag, text);
  return *v;
}

// The next command-line argument, the value of the flag being read (UsageError naming the flag
// when there is none).
using FlagValue = std::function<std::string()>;

// Reads argv[1..] as a benchmark's flags: -h/--help prints `usage` to stdout; every other
// argument goes to take(argument, value), which returns false for one it does not know; then
// `check` (if any) validates what was read. Returns 0 after --help, 2 after a usage error (one
// line "PROGRAM: error: ..." and the usage on stderr), and -1 when the program should go on.
inline int parse_flags(int argc, char** argv, const std::string& program, const std::string& usage,
                       const std::function<bool(const std::string&, const FlagValue&)>& take,
                       const std::function<void()>& check = {}) {
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string k = argv[i];
      if (k == "--help" || k == "-h") {
        std::cout << usage;
        return 0;
      }
      const FlagValue value = [&]() -> std::string {
        EMOE_CHECK(i + 1 < argc, UsageError, "{}: expected a value", k);
        return argv[++i];
      };
      EMOE_CHECK(take(k, value), UsageError, "unknown argument '{}'", k);
    }
    if (check) check();
  } catch (const std::exception& e) {
    std::cerr << program << ": error: " << e.what() << "\n" << usage;
    return 2;
  }
  return -1;
}

// Greedy decoding's flags, shared by bench_generate and bench_eager: --batches 1,8, --prompt N,
// --new N (at least 2), --reps N, --layers N. Returns whether `k` was one of them.
struct DecodeFlags {
  std::vector<int64_t>* batches;
  int64_t* prompt;
  int64_t* new_tokens;
  int64_t* reps;
  int64_t* layers;
};
inline bool decode_flag(const std::string& k, const FlagValue& value, const DecodeFlags& f) {
  if (k == "--batches") {
    f.batches->clear();
    for (const auto& b : split_list(value())) f.batches->push_back(positive(k, b));
    EMOE_CHECK(!f.batches->empty(), UsageError, "--batches: expected a list like 1,8");
  } else if (k == "--prompt") {
    *f.prompt = positive(k, value());
  } else if (k == "--new") {
    *f.new_tokens = positive(k, value());
    EMOE_CHECK(*f.new_tokens >= 2, UsageError, "--new: expected at least 2 tokens");
  } else if (k == "--reps") {
    *f.reps = positive(k, value());
  } else if (k == "--layers") {
    *f.layers = positive(k, value());
  } else {
    return false;
  }
  return true;
}

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
// the best of a few timed rounds. via_emoe: through emoe::gemm_out, the toolkit's own product
// (oneDNN for float32 on AVX-512 CPUs), else through ATen's mm (OpenBLAS on CPU).
inline double gemm_gflops(int64_t m, int64_t k, int64_t n, c10::ScalarType dtype,
                          const c10::Device& device, double min_seconds = 1.0,
                          bool via_emoe = false) {
  auto opts = torch::TensorOptions().dtype(dtype).device(device);
  auto a = torch::randn({m, k}, opts), b = torch::randn({k, n}, opts);
  auto c = torch::empty({m, n}, opts);
  auto sync = [&] {
    if (device.is_cuda()) (void)c.sum().item<double>();
  };
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    double s = time_per_call(
        [&] {
          if (via_emoe)
            emoe::gemm_out(c, a, b);
          else
            torch::mm_out(c, a, b);
          sync();
        },
        2, min_seconds / 3);
    best = std::max(best, 2.0 * static_cast<double>(m * n * k) / s / 1e9);
  }
  return best;
}

// The machine's matrix-product peak for a dtype, honestly: the best GFLOP/s over several large
// shapes (square, and BERT-base's FFN products both ways round) and both paths (ATen's mm and
// emoe's gemm_out), each the best of a few rounds, all in the calling process. One shape alone
// under-measured it (a training step's MFU came out above 100 %). seconds: per shape and path;
// below 0.1 only a 512-cube is measured (the benchmarks' quick mode).
struct MeasuredPeak {
  double gflops = 0;
  std::string where;  // "2048x2048x2048 via emoe"
};
inline MeasuredPeak measured_peak(c10::ScalarType dtype, const c10::Device& device,
                                  double seconds) {
  std::vector<std::array<int64_t, 3>> shapes = {
      {2048, 768, 3072}, {2048, 3072, 768}, {1024, 1024, 1024}, {2048, 2048, 2048}};
  if (seconds < 0.1) shapes = {{512, 512, 512}};
  MeasuredPeak best;
  for (const auto& s : shapes)
    for (bool via_emoe : {false, true}) {
      const double g = gemm_gflops(s[0], s[1], s[2], dtype, device, seconds, via_emoe);
      if (g > best.gflops)
        best = {g, std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" + std::to_string(s[2]) +
                       (via_emoe ? " via emoe" : " via ATen")};
    }
  return best;
}

// MFU against a peak; a step that ran faster than every product measured means the peak was
// under-measured (or the FLOP count is off): then the step's own rate is the peak (100 %) and
// `capped` says so, so that no MFU above 100 % is ever printed.
struct Utilisation {
  double mfu = 0;
  bool capped = false;
};
inline Utilisation model_flop_utilisation(double achieved_gflops, double peak_gflops) {
  if (peak_gflops <= 0) return {};
  if (achieved_gflops > peak_gflops) return {1.0, true};
  return {achieved_gflops / peak_gflops, false};
}

// Minor page faults of this process so far (each one a page of fresh memory touched).
inline int64_t minor_page_faults() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_minflt);
}

// The largest resident set of this process so far, in MiB (Linux reports KiB).
inline double peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

// Tensor memory: the bytes held by tensors at once, as torch.cuda.max_memory_allocated counts
// them — without the library's code pages and the C heap's retained pages that the RSS holds.
// On CPU a counting allocator wraps libtorch's default one (install() before the tensors to
// count are made); on CUDA the caching allocator's own statistics are read.
class TensorMemory final : public c10::Allocator {
 public:
  static TensorMemory& instance() {
    static TensorMemory t;
    return t;
  }
  // Routes every later CPU tensor allocation through the counter.
  void install() {
    if (installed_) return;
    inner_ = c10::GetCPUAllocator();
    c10::SetCPUAllocator(this, /*priority=*/100);
    installed_ = true;
  }
  // Starts a new peak from the bytes held now.
  void reset_peak(const c10::Device& device) {
    peak_.store(current_.load());
#ifdef EMOE_BENCH_HAS_CUDA_STATS
    if (device.is_cuda())
      c10::cuda::CUDACachingAllocator::resetPeakStats(device.index() < 0 ? 0 : device.index());
#else
    (void)device;
#endif
  }
  // The largest number of bytes held at once since reset_peak(), in MiB.
  double peak_mib(const c10::Device& device) const {
#ifdef EMOE_BENCH_HAS_CUDA_STATS
    if (device.is_cuda()) {
      auto stats =
          c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
      const size_t agg = 0;  // StatType::AGGREGATE (the enum left this namespace in libtorch 2.x)
      return static_cast<double>(stats.allocated_bytes[agg].peak) / (1024.0 * 1024.0);
    }
#else
    (void)device;
#endif
    return static_cast<double>(peak_.load()) / (1024.0 * 1024.0);
  }

  // A 64-byte header in front of each block holds its size (libtorch's raw_allocate needs the
  // data pointer to be the deleter's context); 64 keeps c10's alignment.
  c10::DataPtr allocate(size_t n) EMOE_ALLOCATOR_ALLOCATE_CONST override {
    void* base = inner_->raw_allocate(n + kHeader);
    *static_cast<size_t*>(base) = n;
    void* data = static_cast<char*>(base) + kHeader;
    const int64_t now = current_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, data, &TensorMemory::release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &TensorMemory::release;
  }
#if EMOE_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

 private:
  static constexpr size_t kHeader = 64;
  static void release(void* data) {
    if (data == nullptr) return;
    auto& self = instance();
    void* base = static_cast<char*>(data) - kHeader;
    self.current_.fetch_sub(static_cast<int64_t>(*static_cast<size_t*>(base)));
    self.inner_->raw_deallocate(base);
  }
  TensorMemory() = default;
  c10::Allocator* inner_ = nullptr;
  bool installed_ = false;
  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
};

}  // namespace emoe::bench
