// Products with few rows on the CPU (see the header): AVX-512F and AVX2+FMA kernels.
#include "emoe/models/small_gemm.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <immintrin.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "emoe/core/autocast_compat.h"
#include "emoe/core/error.h"
#include "emoe/models/matmul.h"

namespace emoe {
namespace {

// ---- the kernels, once per instruction set (small_gemm_kernels.inc) ----
// Only the functions inside these regions carry the targets, and they have internal linkage.

// (GCC 12's _mm512_reduce_add_ps starts from a register it declares undefined on purpose)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {
#define VEC __m512
#define VW 16
#define VZERO() _mm512_setzero_ps()
#define VLOADF(p) _mm512_loadu_ps(p)
#define VLOADBF(p)                       \
  _mm512_castsi512_ps(_mm512_slli_epi32( \
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16))
#define VSET1(f) _mm512_set1_ps(f)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VSUM(v) _mm512_reduce_add_ps(v)
#define VSTOREF(p, v) _mm512_storeu_ps(p, v)
#define NT_NR 4  // 4 x 4 accumulators, 4 weight rows, one row of x: 21 of 32 registers
#define NN_MR 8  // 8 x 2 accumulators
#include "emoe/models/small_gemm_kernels.inc"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#define VEC __m256
#define VW 8
#define VZERO() _mm256_setzero_ps()
#define VLOADF(p) _mm256_loadu_ps(p)
#define VLOADBF(p)                       \
  _mm256_castsi256_ps(_mm256_slli_epi32( \
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16))
#define VSET1(f) _mm256_set1_ps(f)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VSUM(v) hsum256(v)
#define VSTOREF(p, v) _mm256_storeu_ps(p, v)
#define NT_NR 2  // 4 x 2 accumulators of 16 registers
#define NN_MR 4  // 4 x 2 accumulators
#include "emoe/models/small_gemm_kernels.inc"
}  // namespace avx2
#pragma GCC pop_options

// bfloat16 weights [N, K] and rows: vdpbf16ps takes 32 of them per instruction (products exact,
// summed in float32) with no widening; the K tail by masked loads (zeros add nothing). A block is
// MR rows of x times NR rows of w, MR·NR <= 16 accumulators, summed at the end together: four
// levels of "evens + odds" of two registers turn 16 registers into one whose lane t is register
// t's sum (15 adds and 30 permutes, where one horizontal sum each took 16 x 8). Every loop over
// the block is unrolled (the accumulators stay in registers: the earlier kernel, indexing them
// at run time, stored all 16 to the stack on every step of K, 3x slower at eight rows).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
namespace avx512bf16 {

// lane t of the result: the sum of a[t]'s 16 lanes (a[t] for t >= count: zero)
template <int Count>
inline __attribute__((always_inline)) __m512 sum_each(__m512 (&a)[16]) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
#pragma GCC unroll 16
  for (int t = Count; t < 16; ++t) a[t] = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int width = 16; width > 1; width /= 2)
#pragma GCC unroll 8
    for (int t = 0; t < width / 2; ++t)
      a[t] = _mm512_add_ps(_mm512_permutex2var_ps(a[2 * t], even, a[2 * t + 1]),
                           _mm512_permutex2var_ps(a[2 * t], odd, a[2 * t + 1]));
  return a[0];
}

template <int MR, int NR>
inline __attribute__((always_inline)) void dot_step(__m512 (&acc)[16], const uint16_t* x,
                                                    int64_t m0, const uint16_t* w, int64_t n0,
                                                    int64_t K, int64_t k, __mmask32 mask) {
  __m512i xv[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) xv[i] = _mm512_maskz_loadu_epi16(mask, x + (m0 + i) * K + k);
#pragma GCC unroll 16
  for (int j = 0; j < NR; ++j) {
    if (MR > 1) _mm_prefetch(reinterpret_cast<const char*>(w + (n0 + NR + j) * K + k), _MM_HINT_T0);
    const __m512i wv = _mm512_maskz_loadu_epi16(mask, w + (n0 + j) * K + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
      acc[i * NR + j] = _mm512_dpbf16_ps(acc[i * NR + j], (__m512bh)xv[i], (__m512bh)wv);
  }
}

// y[m0 + i, n0 + j] for i < MR, j < NR
template <int MR, int NR, class Out>
inline __attribute__((always_inline)) void nt_block(const uint16_t* x, int64_t m0, int64_t K,
                                                    const uint16_t* w, int64_t n0, const Out& out) {
  static_assert(MR * NR <= 16, "16 accumulators at most");
  __m512 acc[16];
#pragma GCC unroll 16
  for (int t = 0; t < MR * NR; ++t) acc[t] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) dot_step<MR, NR>(acc, x, m0, w, n0, K, k, ~__mmask32{0});
  if (k < K) dot_step<MR, NR>(acc, x, m0, w, n0, K, k, (__mmask32{1} << (K - k)) - 1);
  __m512 sums = sum_each<MR * NR>(acc);
  if (out.bias) {  // lane i·NR + j: bias[n0 + j]
    alignas(64) static constexpr int kLane[16] = {
        0 % NR, 1 % NR, 2 % NR,  3 % NR,  4 % NR,  5 % NR,  6 % NR,  7 % NR,
        8 % NR, 9 % NR, 10 % NR, 11 % NR, 12 % NR, 13 % NR, 14 % NR, 15 % NR};
    const __m512i b16 = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
        static_cast<__mmask16>((1u << NR) - 1), reinterpret_cast<const uint16_t*>(out.bias) + n0));
    const __m512 b = _mm512_castsi512_ps(_mm512_slli_epi32(b16, 16));
    sums = _mm512_add_ps(sums, _mm512_permutexvar_ps(_mm512_load_si512(kLane), b));
  }
  // rounded to nearest even, as c10::BFloat16's conversion (NaN stays NaN)
  alignas(32) uint16_t rounded[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(rounded), (__m256i)_mm512_cvtneps_pbh(sums));
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
    std::memcpy(out.y + (m0 + i) * out.ldy + n0, rounded + i * NR, NR * sizeof(uint16_t));
}

// MR rows of x against weight rows [n0, n1): blocks of NR, the tail one row at a time
template <int MR, int NR, class Out>
inline void nt_rows(const uint16_t* x, int64_t m0, int64_t K, const uint16_t* w, int64_t n0,
                    int64_t n1, const Out& out) {
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) nt_block<MR, NR>(x, m0, K, w, n, out);
  for (; n < n1; ++n) nt_block<MR, 1>(x, m0, K, w, n, out);
}

// Rows [n0, n1) of the output's columns, weight [N, K]: four rows of x at a time, against 4
// weight rows a block (one row: 16, two: 8, three: 5). At eight rows, 4 x 4 twice (the weights'
// block read again from L1) measured 1.4-1.8x faster than 8 x 2 on the 32000-word head (2-core
// AMD EPYC, bench_gemm --small-only), and the same on the smaller weights. The weights go by in
// chunks of 80 rows (a multiple of every block width: 16, 8, 5, 4), every group of four x rows
// taking its turn on a chunk while it is in cache (80 KiB at K = 512, 640 KiB at K = 4096):
// with the groups outside, each over the task's whole range, five to eight rows streamed the
// task's weights from memory once per group.
template <class Out>
void nt_range(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, int64_t n0, int64_t n1,
              const Out& out) {
  constexpr int64_t kChunk = 80;
  for (int64_t c0 = n0; c0 < n1; c0 += kChunk) {
    const int64_t c1 = std::min(n1, c0 + kChunk);
    for (int64_t m = 0; m < M; m += 4) {
      switch (std::min<int64_t>(M - m, 4)) {
        case 1:
          nt_rows<1, 16>(x, m, K, w, c0, c1, out);
          break;
        case 2:
          nt_rows<2, 8>(x, m, K, w, c0, c1, out);
          break;
        case 3:
          nt_rows<3, 5>(x, m, K, w, c0, c1, out);
          break;
        default:
          nt_rows<4, 4>(x, m, K, w, c0, c1, out);
          break;
      }
    }
  }
}
}  // namespace avx512bf16
#pragma GCC pop_options
#pragma GCC diagnostic pop

// ---- choice of instruction set ----

// kAvx512Bf16: kAvx512 with bfloat16 [N, K] products by vdpbf16ps instead of widening
enum class Isa { kNone, kAvx2, kAvx512, kAvx512Bf16 };

bool cpu_has_avx512_bf16() {
  // (GCC 12's __builtin_cpu_supports does not know avx512bf16: CPUID leaf 7 subleaf 1, EAX bit 5)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl")) return false;
  __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(1));
  return (eax >> 5) & 1u;
}

Isa detected_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && cpu_has_avx512_bf16()) return Isa::kAvx512Bf16;
    if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
    return Isa::kNone;
  }();
  return isa;
}

std::string isa_name(Isa i) {
  return i == Isa::kAvx512Bf16 ? "avx512-bf16"
         : i == Isa::kAvx512   ? "avx512"
         : i == Isa::kAvx2     ? "avx2"
                               : "";
}

Isa parse_isa(const std::string& text, const std::string& what) {
  const Isa have = detected_isa();
  if (text.empty() || text == "library") return Isa::kNone;
  if (text == "auto") return have;
  // each set includes the ones below it (AVX-512 CPUs have AVX2+FMA)
  if (text == "avx512-bf16" && have == Isa::kAvx512Bf16) return Isa::kAvx512Bf16;
  if (text == "avx512" && have >= Isa::kAvx512) return Isa::kAvx512;
  if (text == "avx2" && have != Isa::kNone) return Isa::kAvx2;
  EMOE_THROW(UsageError, "{}: expected auto, library{}, got '{}'", what,
             have == Isa::kAvx512Bf16 ? ", avx512-bf16, avx512 or avx2"
             : have == Isa::kAvx512   ? ", avx512 or avx2"
             : have == Isa::kAvx2     ? " or avx2"
                                      : " (this CPU has neither AVX2+FMA nor AVX-512)",
             text);
}

// The setting: the kernels' instruction set, plus kMeasuredFlag when each shape is measured
// against the library (auto); -1: not yet read from EMOE_SMALL_GEMM.
constexpr int kMeasuredFlag = 16;
std::atomic<int> isa_setting{-1};
std::atomic<int64_t> product_count{0};

int encode_setting(const std::string& text, const std::string& what) {
  const Isa isa = parse_isa(text, what);
  return static_cast<int>(isa) + (text == "auto" && isa != Isa::kNone ? kMeasuredFlag : 0);
}

int current_setting() {
  int v = isa_setting.load();
  if (v < 0) {
    static std::mutex m;
    std::lock_guard<std::mutex> lock(m);
    v = isa_setting.load();
    if (v < 0) {
      const char* env = std::getenv("EMOE_SMALL_GEMM");
      v = encode_setting(env && *env ? env : "auto", "EMOE_SMALL_GEMM");
      isa_setting.store(v);
    }
  }
  return v;
}

Isa current_isa() {
  return static_cast<Isa>(current_setting() % kMeasuredFlag);
}

// auto: for each shape (dtype, rows, K, N, layout, bias) the kernels and the library's product
// are timed where the model calls them, alternated over its first kSmallGemmTrialCalls calls
// (the first call of each untimed: oneDNN makes its primitive), and the one with the lower median
// is kept (the trial's calls all return the kernels' result: the library's is computed, timed,
// and dropped); the library must win by 5 %, so that close calls mostly fall the same way in every
// process. Timed in place, not on a product repeated on its own: there a decoding layer's weights
// are in the cache, as they are not between two layers of a model, and a product on one thread
// (a small weight is) looked twice as fast as the library's on two, where in the model it was
// slower (measured on a 2-core AMD EPYC, 8 rows against 512 x 512 bfloat16: 44 against 90 us
// alone, and greedy decoding at batch 8 at 0.50-0.75 of the library's tokens/s).
// The paths a trial times: the kernels of the process's instruction set, the library, and for
// bfloat16 weights [N, K] where that set is avx512-bf16, the AVX-512F kernels that widen the
// weights to float32 and use FMA (at eight rows they measured 1.4-2.8x faster than vdpbf16ps's
// dot products on a 2-core AMD EPYC, and slower at one row on some shapes).
enum Path : int { kKernels = 0, kLibrary = 1, kWidening = 2 };
struct Trial {
  int64_t calls = 0;
  std::vector<double> times[3];  // seconds per timed call, by Path
};
struct ShapeChoices {
  std::mutex mutex;
  std::map<std::array<int64_t, 6>, int> use_kernels;  // the Path kept
  std::map<std::array<int64_t, 6>, Trial> trials;
  int64_t chose_library = 0;
};
ShapeChoices& shape_choices() {
  static ShapeChoices c;
  return c;
}

// The output: y[m, n] = s + bias[n], in float32 or rounded to bfloat16.
template <class T>
struct Store {
  T* y;
  int64_t ldy;
  const T* bias;
  void operator()(int64_t m, int64_t n, float s) const {
    if constexpr (std::is_same_v<T, float>) {
      y[m * ldy + n] = bias ? s + bias[n] : s;
    } else {
      const float b = bias ? static_cast<float>(bias[n]) : 0.0f;
      y[m * ldy + n] = static_cast<c10::BFloat16>(s + b);
    }
  }
};

// Each task reads at least 4 MiB of weights divided by the rows (the work per weight byte grows
// with them): a smaller product runs on the calling thread. At eight rows 512 KiB is enough: on
// a 2-core AMD EPYC the 8-row float32 kernels went from 0.87-0.97 of the library's decoding
// speed on one core to 1.01-1.24 on two (bench_generate).
// Waking the pool's threads (passive, as emoe runs OpenMP: ensure_runtime_environment) costs
// ~50 us, more than reading a few MiB from cache; measured on a 2-core Xeon with AMX
// (bench_gemm --small-only): 512 x 512 float32 at one row 14 GB/s on two threads, 110 on one.
constexpr int64_t kTaskBytes = int64_t{4} << 20;

// x: the rows widened to float32 (null where vdpbf16ps reads x16); x16: the same rows in
// bfloat16 (bf16 weights only)
template <class T, class W>
void run_kernels(Isa isa, const float* x, const uint16_t* x16, int64_t M, int64_t K, const W* w,
                 int64_t N, bool weight_kn, const Store<T>& out) {
  const int64_t row_bytes = K * static_cast<int64_t>(sizeof(W));
  if (!weight_kn) {
    // tasks of whole 16-row blocks (the kernels' blocks divide 16: no tails inside a product)
    const int64_t grain = std::max<int64_t>(
        1, kTaskBytes / std::max<int64_t>(row_bytes * 16 * std::max<int64_t>(M, 1), 1));
    at::parallel_for(0, (N + 15) / 16, grain, [&](int64_t b0, int64_t b1) {
      const int64_t n0 = b0 * 16, n1 = std::min(N, b1 * 16);
      if constexpr (std::is_same_v<W, uint16_t>) {
        if (isa == Isa::kAvx512Bf16) return avx512bf16::nt_range(x16, M, K, w, n0, n1, out);
      }
      if (isa >= Isa::kAvx512)
        avx512::nt_range(x, M, K, w, n0, n1, out);
      else
        avx2::nt_range(x, M, K, w, n0, n1, out);
    });
    return;
  }
  const int64_t vw = isa >= Isa::kAvx512 ? 16 : 8;  // columns in steps of whole registers
  const int64_t blocks = (N + vw - 1) / vw;
  const int64_t grain = std::max<int64_t>(
      1, kTaskBytes / std::max<int64_t>(row_bytes * vw * std::max<int64_t>(M, 1), 1));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    const int64_t c0 = b0 * vw, c1 = std::min(N, b1 * vw);
    if (isa >= Isa::kAvx512)
      avx512::nn_range(x, M, K, w, N, c0, c1, out);
    else
      avx2::nn_range(x, M, K, w, N, c0, c1, out);
  });
}

}  // namespace

std::string small_gemm_isa() {
  return isa_name(current_isa());
}

std::string set_small_gemm_isa(const std::string& isa) {
  const int prev = current_setting();
  isa_setting.store(encode_setting(isa, "small_gemm isa"));
  return prev >= kMeasuredFlag ? "auto" : isa_name(static_cast<Isa>(prev));
}

std::pair<int64_t, int64_t> small_gemm_measurements() {
  auto& c = shape_choices();
  std::lock_guard<std::mutex> lock(c.mutex);
  return {static_cast<int64_t>(c.use_kernels.size()), c.chose_library};
}

std::map<std::string, std::string> small_gemm_choices_made() {
  static const char* names[] = {"kernels", "library", "widening"};
  auto& c = shape_choices();
  std::lock_guard<std::mutex> lock(c.mutex);
  std::map<std::string, std::string> made;
  for (const auto& [key, path] : c.use_kernels)
    made[fmt::format("{}", fmt::join(key, ","))] = names[path];
  return made;
}

std::string pin_small_gemm_choices(const std::map<std::string, std::string>& choices) {
  std::map<std::array<int64_t, 6>, int> parsed;
  for (const auto& [text, name] : choices) {
    std::array<int64_t, 6> key{};
    size_t at = 0, i = 0;
    for (; i < key.size() && at <= text.size(); ++i) {
      const size_t end = std::min(text.find(',', at), text.size());
      const std::string part = text.substr(at, end - at);
      if (part.empty() || part.size() > 18 ||
          part.find_first_not_of("0123456789") != std::string::npos)
        break;
      key[i] = std::stoll(part);
      at = end + 1;
    }
    if (i != key.size() || at != text.size() + 1)
      return fmt::format("small product '{}': expected six comma-separated integers", text);
    const int path = name == "kernels"    ? kKernels
                     : name == "library"  ? kLibrary
                     : name == "widening" ? kWidening
                                          : -1;
    if (path < 0)
      return fmt::format("small product '{}': expected kernels, library or widening, got '{}'",
                         text, name);
    parsed[key] = path;
  }
  auto& c = shape_choices();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (const auto& [key, path] : parsed) {
    c.trials.erase(key);
    c.use_kernels.insert_or_assign(key, path);
  }
  return "";
}

void forget_small_gemm_choices() {
  auto& c = shape_choices();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.use_kernels.clear();
  c.trials.clear();
  c.chose_library = 0;
}

int64_t small_gemm_count() {
  return product_count.load();
}

bool small_gemm_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        bool weight_kn) {
  if (!x.defined() || !weight.defined() || current_isa() == Isa::kNone) return false;
  const auto dtype = weight.scalar_type();
  if (!x.device().is_cpu() || !weight.device().is_cpu() || x.scalar_type() != dtype ||
      (dtype != at::kFloat && dtype != at::kBFloat16) || weight.dim() != 2 ||
      !weight.is_contiguous() || x.dim() < 1 || emoe::autocast_enabled(at::kCPU))
    return false;
  const int64_t k = weight.size(weight_kn ? 0 : 1), n = weight.size(weight_kn ? 1 : 0);
  if (x.size(-1) != k || k == 0 || n == 0 || x.numel() / k > kSmallGemmMaxRows || x.numel() == 0)
    return false;
  if (bias.defined() && (!bias.device().is_cpu() || bias.scalar_type() != dtype ||
                         bias.dim() != 1 || bias.size(0) != n || !bias.is_contiguous()))
    return false;
  const bool grad_wanted =
      at::GradMode::is_enabled() &&
      (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  return !grad_wanted;
}

namespace {

// The product as the layer computes it without the kernels (LinearImpl::base_forward): emoe::linear
// (oneDNN for float32 on AVX-512, ATen's otherwise) on the weight as [out, in].
at::Tensor library_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                          bool weight_kn) {
  return emoe::linear(x, weight_kn ? weight.t() : weight, bias);
}

// A third path for auto's trial (Path): bfloat16 weights [N, K] under avx512-bf16.
bool widening_applies(const at::Tensor& weight, bool weight_kn) {
  return weight.scalar_type() == at::kBFloat16 && !weight_kn && current_isa() == Isa::kAvx512Bf16;
}

at::Tensor kernel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         bool weight_kn, Isa isa) {
  RECORD_FUNCTION("emoe::small_gemm", std::vector<c10::IValue>());
  const int64_t k = weight.size(weight_kn ? 0 : 1), n = weight.size(weight_kn ? 1 : 0);
  const int64_t m = x.numel() / k;
  const bool bf16 = weight.scalar_type() == at::kBFloat16;
  const auto x2 = x.reshape({m, k}).contiguous();
  // bfloat16 rows widened once, except for vdpbf16ps, which reads them as they are
  const auto xf = bf16 && !weight_kn && isa == Isa::kAvx512Bf16 ? at::Tensor() : x2.to(at::kFloat);
  const float* xfp = xf.defined() ? xf.data_ptr<float>() : nullptr;
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  auto y = at::empty(sizes, x.options());
  if (!bf16) {
    Store<float> out{y.data_ptr<float>(), n, bias.defined() ? bias.data_ptr<float>() : nullptr};
    run_kernels(isa, xfp, nullptr, m, k, weight.data_ptr<float>(), n, weight_kn, out);
  } else {
    Store<c10::BFloat16> out{y.data_ptr<c10::BFloat16>(), n,
                             bias.defined() ? bias.data_ptr<c10::BFloat16>() : nullptr};
    const auto* w = reinterpret_cast<const uint16_t*>(weight.data_ptr<c10::BFloat16>());
    const auto* x16 = reinterpret_cast<const uint16_t*>(x2.data_ptr<c10::BFloat16>());
    run_kernels(isa, xfp, x16, m, k, w, n, weight_kn, out);
  }
  product_count.fetch_add(1);
  return y;
}

}  // namespace

namespace {

// auto's choice for one key (see ShapeChoices): the kept path once decided, else the trial's next
// call. kernels(isa) and library() compute the same product(s) (a tensor, or a group's tensors);
// `widening`: the AVX-512F kernels are a third path (Path).
template <class Kernels, class Library>
auto choose(const std::array<int64_t, 6>& key, const at::Tensor& weight, bool widening,
            Kernels&& kernels, Library&& library) -> decltype(kernels(Isa::kNone)) {
  auto& c = shape_choices();
  const Isa isa = current_isa();
  auto run = [&](int path) {
    return path == kLibrary ? library() : kernels(path == kWidening ? Isa::kAvx512 : isa);
  };
  int64_t call = 0;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.use_kernels.find(key);
    if (it != c.use_kernels.end()) return run(it->second);
    call = c.trials[key].calls++;
  }
  // which path this call times. Two: by the parity of the call's bit count (Thue-Morse), so that a
  // shape called at several places of a layer (q, k, v and o: four times) has each path timed
  // at each place, not one path always after the attention and the other always before it;
  // three: in turn (with four places, each path at each place within 12 calls)
  const int paths = widening ? 3 : 2;
  const int path =
      paths == 3
          ? static_cast<int>(call % 3)
          : (__builtin_popcountll(static_cast<unsigned long long>(call)) % 2 == 0 ? kKernels
                                                                                  : kLibrary);
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto y = run(path);
  const double seconds = std::chrono::duration<double>(clock::now() - t0).count();
  // every result of the trial is the kernels' (the same input gives the same output throughout;
  // the library's product, timed first, reads the weights as the model leaves them)
  if (path != kKernels) y = kernels(isa);
  if (call < paths) return y;  // untimed: one call of each (oneDNN makes its primitive)
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.trials.find(key);
  if (it == c.trials.end()) return y;  // decided meanwhile by another thread
  auto& times = it->second.times;
  times[path].push_back(seconds);
  constexpr size_t kTimed = (kSmallGemmTrialCalls - 2) / 2;
  for (int p = 0; p < paths; ++p)
    if (times[p].size() < kTimed) return y;
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  const double t_kernels = median(times[kKernels]), t_library = median(times[kLibrary]);
  const double t_widening = paths == 3 ? median(times[kWidening]) : 0.0;
  const int best_kernels = paths == 3 && t_widening < t_kernels ? kWidening : kKernels;
  const double t_best = best_kernels == kWidening ? t_widening : t_kernels;
  const int keep = t_library * 1.05 < t_best ? kLibrary : best_kernels;
  spdlog::debug(
      "small products: {} rows x {} times {} {} [{}, {}] {}: emoe kernels {:.1f} us{}, library "
      "{:.1f} us (medians in place): {}",
      key[1], key[3 - key[4] % 2], key[4] >= 2 ? key[4] / 2 : 1, key[4] >= 2 ? "weights" : "weight",
      key[2], key[3], c10::toString(weight.scalar_type()), t_kernels * 1e6,
      paths == 3 ? fmt::format(", widening to float32 {:.1f} us", t_widening * 1e6) : "",
      t_library * 1e6,
      keep == kLibrary ? "library" : (keep == kWidening ? "kernels (widening)" : "kernels"));
  c.trials.erase(it);
  if (c.use_kernels.emplace(key, keep).second && keep == kLibrary) ++c.chose_library;
  return y;
}

}  // namespace

at::Tensor small_gemm_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             bool weight_kn) {
  TORCH_CHECK(small_gemm_applies(x, weight, bias, weight_kn),
              "small_gemm_linear: unsupported inputs");
  at::NoGradGuard no_grad;
  auto kernels = [&](Isa isa) { return kernel_linear(x, weight, bias, weight_kn, isa); };
  if (current_setting() < kMeasuredFlag) return kernels(current_isa());
  const std::array<int64_t, 6> key = {static_cast<int64_t>(weight.scalar_type()),
                                      x.numel() / x.size(-1),
                                      weight.size(0),
                                      weight.size(1),
                                      weight_kn,
                                      bias.defined()};
  return choose(key, weight, widening_applies(weight, weight_kn), kernels,
                [&] { return library_linear(x, weight, bias, weight_kn); });
}

std::vector<at::Tensor> small_gemm_group(const at::Tensor& x,
                                         const std::vector<at::Tensor>& weights,
                                         const std::vector<at::Tensor>& biases, bool weight_kn) {
  TORCH_CHECK(!weights.empty() && biases.size() == weights.size(),
              "small_gemm_group: one bias (or an undefined tensor) per weight");
  for (size_t i = 0; i < weights.size(); ++i)
    TORCH_CHECK(small_gemm_applies(x, weights[i], biases[i], weight_kn) &&
                    biases[i].defined() == biases[0].defined() &&
                    weights[i].size(weight_kn ? 0 : 1) == weights[0].size(weight_kn ? 0 : 1),
                "small_gemm_group: unsupported inputs");
  at::NoGradGuard no_grad;
  auto kernels = [&](Isa isa) {
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < weights.size(); ++i)
      out.push_back(kernel_linear(x, weights[i], biases[i], weight_kn, isa));
    return out;
  };
  if (current_setting() < kMeasuredFlag) return kernels(current_isa());
  // the library's way: one product over the weights concatenated (what a fused layer computes
  // without the kernels), or one product per weight for weights stored [K, N]
  auto library = [&] {
    std::vector<at::Tensor> out;
    if (weight_kn || weights.size() == 1) {
      for (size_t i = 0; i < weights.size(); ++i)
        out.push_back(library_linear(x, weights[i], biases[i], weight_kn));
      return out;
    }
    std::vector<int64_t> sizes;
    for (const auto& w : weights) sizes.push_back(w.size(0));
    auto y = emoe::linear(x, at::cat(weights, 0),
                          biases[0].defined() ? at::cat(biases, 0) : at::Tensor());
    for (auto& part : y.split_with_sizes(sizes, -1)) out.push_back(part);
    return out;
  };
  int64_t n = 0;
  for (const auto& w : weights) n += w.size(weight_kn ? 1 : 0);
  const int64_t k = weights[0].size(weight_kn ? 0 : 1);
  // key[4]: 2 x the number of weights + the layout (a single weight's key has 0 or 1 there)
  const std::array<int64_t, 6> key = {static_cast<int64_t>(weights[0].scalar_type()),
                                      x.numel() / x.size(-1),
                                      weight_kn ? k : n,
                                      weight_kn ? n : k,
                                      2 * static_cast<int64_t>(weights.size()) + weight_kn,
                                      biases[0].defined()};
  return choose(key, weights[0], widening_applies(weights[0], weight_kn), kernels, library);
}

}  // namespace emoe
