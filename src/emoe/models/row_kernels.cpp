// Row kernels (see the header): one source (row_kernels.inc) compiled for AVX-512F and for
// AVX2+FMA, the set chosen at run time.
#include "emoe/models/row_kernels.h"

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <type_traits>
#include <vector>

#include "emoe/core/aligned.h"
#include "emoe/core/autocast_compat.h"
#include "emoe/core/bf16_round.h"
#include "emoe/core/error.h"
#include "emoe/models/attention.h"
#include "emoe/models/dropout.h"

namespace emoe {
namespace {

inline float scalar(float v) {
  return v;
}
inline float scalar(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
template <class T>
inline T from_float(float f);
template <>
inline float from_float<float>(float f) {
  return f;
}
template <>
inline uint16_t from_float<uint16_t>(float f) {  // round to nearest even, as c10::BFloat16
  return c10::BFloat16(f).x;
}

// exp's range reduction and polynomial (Cephes's expf): x = n ln2 + r, |r| <= ln2 / 2,
// exp(r) ~ 1 + r + r^2 (c5 + c4 r + ... + c0 r^5)
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kC0 = 1.9875691500e-4f, kC1 = 1.3981999507e-3f, kC2 = 8.3334519073e-3f,
                kC3 = 4.1665795894e-2f, kC4 = 1.6666665459e-1f, kC5 = 5.0000001201e-1f;
// below this exp is not a normal float (the result is then ~1e-38, not 0: nothing next to a
// softmax's denominator of at least 1)
constexpr float kExpLo = -87.33654f, kExpHi = 88.3762626647949f;

// (GCC 12's _mm512_reduce_*_ps start from a register it declares undefined on purpose)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw")
namespace avx512 {
inline __m512 vexp(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpLo)), _mm512_set1_ps(kExpHi));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kC0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC5));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}
inline __m512 load_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline void store_bf16(uint16_t* p, __m512 v) {  // round to nearest even
  bf16_round::store_low_halves(p, bf16_round::rne(_mm512_castps_si512(v)));
}
// |m| with the sign of s
inline __m512 copysign_of(__m512 m, __m512 s) {
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_andnot_si512(sign, _mm512_castps_si512(m)),
                                             _mm512_and_si512(sign, _mm512_castps_si512(s))));
}
inline __m512 abs_of(__m512 v) {
  return _mm512_abs_ps(v);
}
// lanes whose mask byte is nonzero take `blocked`, the others v
inline __m512 blend_blocked(const uint8_t* m, __m512 v, __m512 blocked) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m)));
  return _mm512_mask_blend_ps(_mm512_test_epi32_mask(b, b), v, blocked);
}
#define VEC __m512
#define VW 16
#define VSET1(f) _mm512_set1_ps(f)
#define VLOADF(p) _mm512_loadu_ps(p)
#define VSTOREF(p, v) _mm512_storeu_ps(p, v)
#define VLOADBF(p) load_bf16(p)
#define VSTOREBF(p, v) store_bf16(p, v)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VDIV(a, b) _mm512_div_ps(a, b)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VREDMAX(v) _mm512_reduce_max_ps(v)
#define VREDSUM(v) _mm512_reduce_add_ps(v)
#include "emoe/models/row_kernels.inc"
}  // namespace avx512
#pragma GCC pop_options
#pragma GCC diagnostic pop

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
inline __m256 vexp(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLo)), _mm256_set1_ps(kExpHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kC0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC5));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n from the exponent bits (n in [-126, 127] after the clamp)
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
inline __m256 load_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline void store_bf16(uint16_t* p, __m256 v) {  // round to nearest even
  bf16_round::store_low_halves(p, bf16_round::rne(_mm256_castps_si256(v)));
}
inline float reduce_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline float reduce_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline __m256 copysign_of(__m256 m, __m256 s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  return _mm256_or_ps(_mm256_andnot_ps(sign, m), _mm256_and_ps(sign, s));
}
inline __m256 abs_of(__m256 v) {
  return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}
inline __m256 blend_blocked(const uint8_t* m, __m256 v, __m256 blocked) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m)));
  return _mm256_blendv_ps(v, blocked,
                          _mm256_castsi256_ps(_mm256_cmpgt_epi32(b, _mm256_setzero_si256())));
}
#define VEC __m256
#define VW 8
#define VSET1(f) _mm256_set1_ps(f)
#define VLOADF(p) _mm256_loadu_ps(p)
#define VSTOREF(p, v) _mm256_storeu_ps(p, v)
#define VLOADBF(p) load_bf16(p)
#define VSTOREBF(p, v) store_bf16(p, v)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VDIV(a, b) _mm256_div_ps(a, b)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VREDMAX(v) reduce_max(v)
#define VREDSUM(v) reduce_sum(v)
#include "emoe/models/row_kernels.inc"
}  // namespace avx2
#pragma GCC pop_options

// ---- choice of instruction set ----

enum class Isa { kNone, kAvx2, kAvx512 };

Isa detected_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
      return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
    return Isa::kNone;
  }();
  return isa;
}

std::string isa_name(Isa i) {
  return i == Isa::kAvx512 ? "avx512" : i == Isa::kAvx2 ? "avx2" : "";
}

Isa parse_isa(const std::string& text, const std::string& what) {
  const Isa have = detected_isa();
  if (text.empty() || text == "library") return Isa::kNone;
  if (text == "auto") return have;
  if (text == "avx512" && have == Isa::kAvx512) return Isa::kAvx512;
  if (text == "avx2" && have != Isa::kNone) return Isa::kAvx2;
  EMOE_THROW(UsageError, "{}: expected auto, library{}, got '{}'", what,
             have == Isa::kAvx512 ? ", avx512 or avx2"
             : have == Isa::kAvx2 ? " or avx2"
                                  : " (this CPU has neither AVX2+FMA nor AVX-512)",
             text);
}

std::atomic<int> isa_setting{-1};  // Isa, or -1: not yet read from EMOE_ROW_KERNELS

Isa current_isa() {
  int v = isa_setting.load();
  if (v < 0) {
    static std::mutex m;
    std::lock_guard<std::mutex> lock(m);
    v = isa_setting.load();
    if (v < 0) {
      const char* env = std::getenv("EMOE_ROW_KERNELS");
      v = static_cast<int>(parse_isa(env && *env ? env : "auto", "EMOE_ROW_KERNELS"));
      isa_setting.store(v);
    }
  }
  return static_cast<Isa>(v);
}

template <class T>
void xent_rows(Isa isa, T* x, int64_t rows, int64_t V, int64_t ld, const int64_t* target,
               const float* scale, float* loss) {
  // a task of at least ~64k columns (one row of a 32000-word vocabulary is ~20 µs of work)
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(V, 1));
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    thread_local AlignedVector<float> scratch;
    if (!std::is_same<T, float>::value && scale != nullptr &&
        scratch.size() < static_cast<size_t>(V))
      scratch.resize(static_cast<size_t>(V));
    for (int64_t r = r0; r < r1; ++r) {
      const bool grad = scale != nullptr;
      const float s = grad ? scale[r] : 0.0f;
      loss[r] = isa == Isa::kAvx512
                    ? avx512::xent_row(x + r * ld, V, target[r], grad, s, scratch.data())
                    : avx2::xent_row(x + r * ld, V, target[r], grad, s, scratch.data());
    }
  });
}

// Elementwise over n elements in tasks of at least 32k (below that one thread: waking the pool
// costs more).
template <class F>
void elementwise(int64_t n, const F& f) {
  at::parallel_for(0, n, int64_t{1} << 15, [&](int64_t b, int64_t e) { f(b, e - b); });
}

bool same_plain(const at::Tensor& a, const at::Tensor& b) {
  return a.device().is_cpu() && a.is_contiguous() && b.is_contiguous() &&
         a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         (a.scalar_type() == at::kFloat || a.scalar_type() == at::kBFloat16);
}

template <class T>
T* ptr(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

template <class T>
void silu_mul_run(Isa isa, const at::Tensor& g, const at::Tensor& u, const at::Tensor& out) {
  elementwise(g.numel(), [&](int64_t b, int64_t n) {
    (isa == Isa::kAvx512 ? avx512::silu_mul<T> : avx2::silu_mul<T>)(ptr<T>(g) + b, ptr<T>(u) + b,
                                                                    ptr<T>(out) + b, n);
  });
}

template <class T>
void silu_mul_backward_run(Isa isa, const at::Tensor& g, const at::Tensor& u,
                           const at::Tensor& dout, const at::Tensor& dg, const at::Tensor& du) {
  elementwise(g.numel(), [&](int64_t b, int64_t n) {
    (isa == Isa::kAvx512 ? avx512::silu_mul_backward<T>
                         : avx2::silu_mul_backward<T>)(ptr<T>(g) + b, ptr<T>(u) + b,
                                                       ptr<T>(dout) + b, ptr<T>(dg) + b,
                                                       ptr<T>(du) + b, n);
  });
}

}  // namespace

bool residual_add_applies(const at::Tensor& x, const at::Tensor& a) {
  return current_isa() != Isa::kNone && x.defined() && a.defined() && x.device().is_cpu() &&
         a.device().is_cpu() && x.scalar_type() == at::kFloat && a.scalar_type() == at::kBFloat16 &&
         x.sizes() == a.sizes() && x.is_contiguous() && a.is_contiguous();
}

at::Tensor residual_add_forward(const at::Tensor& x, const at::Tensor& a) {
  TORCH_CHECK(residual_add_applies(x, a), "residual_add: the kernels do not apply");
  auto y = at::empty_like(x);
  const Isa isa = current_isa();
  elementwise(x.numel(), [&](int64_t b, int64_t n) {
    (isa == Isa::kAvx512 ? avx512::add_widened<uint16_t>
                         : avx2::add_widened<uint16_t>)(ptr<const float>(x) + b,
                                                        ptr<const uint16_t>(a) + b,
                                                        ptr<float>(y) + b, n);
  });
  return y;
}

bool gelu_erf_applies(const at::Tensor& x) {
  return current_isa() != Isa::kNone && x.defined() && same_plain(x, x);
}

at::Tensor gelu_erf_forward(const at::Tensor& x) {
  TORCH_CHECK(gelu_erf_applies(x), "gelu_erf_forward: the kernels do not apply");
  auto y = at::empty_like(x);
  const Isa isa = current_isa();
  auto run = [&](auto* xp, auto* yp) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(yp)>>;
    elementwise(x.numel(), [&](int64_t b, int64_t n) {
      (isa == Isa::kAvx512 ? avx512::gelu_erf<T> : avx2::gelu_erf<T>)(xp + b, yp + b, n);
    });
  };
  if (x.scalar_type() == at::kFloat)
    run(ptr<const float>(x), ptr<float>(y));
  else
    run(ptr<const uint16_t>(x), ptr<uint16_t>(y));
  return y;
}

at::Tensor gelu_erf_backward(const at::Tensor& x, const at::Tensor& grad_out) {
  TORCH_CHECK(gelu_erf_applies(x), "gelu_erf_backward: the kernels do not apply");
  const auto d = grad_out.to(x.scalar_type()).contiguous();
  TORCH_CHECK(d.sizes() == x.sizes(), "gelu_erf_backward: gradient of shape ", d.sizes(),
              " for an input of shape ", x.sizes());
  auto dx = at::empty_like(x);
  const Isa isa = current_isa();
  auto run = [&](auto* xp, auto* dp, auto* dxp) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(dxp)>>;
    elementwise(x.numel(), [&](int64_t b, int64_t n) {
      (isa == Isa::kAvx512 ? avx512::gelu_erf_backward<T>
                           : avx2::gelu_erf_backward<T>)(xp + b, dp + b, dxp + b, n);
    });
  };
  if (x.scalar_type() == at::kFloat)
    run(ptr<const float>(x), ptr<const float>(d), ptr<float>(dx));
  else
    run(ptr<const uint16_t>(x), ptr<const uint16_t>(d), ptr<uint16_t>(dx));
  return dx;
}

bool silu_mul_applies(const at::Tensor& gate, const at::Tensor& up) {
  return current_isa() != Isa::kNone && same_plain(gate, up);
}

at::Tensor silu_mul_forward(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(silu_mul_applies(gate, up), "silu_mul_forward: the kernels do not apply");
  auto out = at::empty_like(gate);
  if (gate.scalar_type() == at::kFloat)
    silu_mul_run<float>(current_isa(), gate, up, out);
  else
    silu_mul_run<uint16_t>(current_isa(), gate, up, out);
  return out;
}

std::pair<at::Tensor, at::Tensor> silu_mul_backward(const at::Tensor& gate, const at::Tensor& up,
                                                    const at::Tensor& grad_out) {
  TORCH_CHECK(silu_mul_applies(gate, up), "silu_mul_backward: the kernels do not apply");
  const auto d = grad_out.to(gate.scalar_type()).contiguous();
  auto dg = at::empty_like(gate), du = at::empty_like(up);
  if (gate.scalar_type() == at::kFloat)
    silu_mul_backward_run<float>(current_isa(), gate, up, d, dg, du);
  else
    silu_mul_backward_run<uint16_t>(current_isa(), gate, up, d, dg, du);
  return {dg, du};
}

bool rms_norm_applies(const at::Tensor& x, const at::Tensor& weight) {
  return current_isa() != Isa::kNone && x.device().is_cpu() && x.scalar_type() == at::kFloat &&
         x.is_contiguous() && x.dim() >= 1 && weight.defined() && weight.dim() == 1 &&
         weight.scalar_type() == at::kFloat && weight.is_contiguous() && weight.device().is_cpu() &&
         x.size(-1) == weight.size(0) && x.numel() > 0;
}

bool rms_norm_bf16_applies(const at::Tensor& x, const at::Tensor& weight) {
  return current_isa() != Isa::kNone && x.device().is_cpu() && x.scalar_type() == at::kBFloat16 &&
         x.is_contiguous() && x.dim() >= 1 && weight.defined() && weight.dim() == 1 &&
         weight.scalar_type() == at::kBFloat16 && weight.is_contiguous() &&
         weight.device().is_cpu() && x.size(-1) == weight.size(0) && x.numel() > 0;
}

namespace {
template <class T>
void rms_norm_run(Isa isa, const T* xp, const T* wp, T* yp, float* rp, int64_t rows, int64_t d,
                  float e) {
  at::parallel_for(
      0, rows, std::max<int64_t>(1, (int64_t{1} << 15) / d), [&](int64_t b, int64_t f) {
        for (int64_t r = b; r < f; ++r)
          rp[r] = isa == Isa::kAvx512 ? avx512::rms_norm_row(xp + r * d, wp, yp + r * d, d, e)
                                      : avx2::rms_norm_row(xp + r * d, wp, yp + r * d, d, e);
      });
}
}  // namespace

std::pair<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& x, const at::Tensor& weight,
                                                   double eps) {
  const bool bf16 = rms_norm_bf16_applies(x, weight);
  TORCH_CHECK(bf16 || rms_norm_applies(x, weight), "rms_norm_forward: the kernels do not apply");
  const int64_t d = x.size(-1), rows = x.numel() / d;
  auto y = at::empty_like(x);
  auto rstd = at::empty({rows}, x.options().dtype(at::kFloat));
  float* rp = rstd.data_ptr<float>();
  const auto e = static_cast<float>(eps);
  if (bf16) {
    auto bits = [](const at::Tensor& t) {
      return reinterpret_cast<uint16_t*>(t.data_ptr<c10::BFloat16>());
    };
    rms_norm_run<uint16_t>(current_isa(), bits(x), bits(weight), bits(y), rp, rows, d, e);
  } else {
    rms_norm_run<float>(current_isa(), x.data_ptr<float>(), weight.data_ptr<float>(),
                        y.data_ptr<float>(), rp, rows, d, e);
  }
  return {y, rstd};
}

std::pair<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& x, const at::Tensor& weight,
                                                    const at::Tensor& rstd,
                                                    const at::Tensor& grad_out) {
  TORCH_CHECK(rms_norm_applies(x, weight), "rms_norm_backward: the kernels do not apply");
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const auto dy = grad_out.to(at::kFloat).contiguous();
  auto dx = at::empty_like(x);
  // the weight's gradient: a partial sum per thread, added at the end
  auto partial = at::zeros({at::get_num_threads(), d}, x.options());
  const Isa isa = current_isa();
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  const float* gp = dy.data_ptr<float>();
  const float* rp = rstd.data_ptr<float>();
  float* dxp = dx.data_ptr<float>();
  float* pp = partial.data_ptr<float>();
  at::parallel_for(
      0, rows, std::max<int64_t>(1, (int64_t{1} << 15) / d), [&](int64_t b, int64_t f) {
        float* dw = pp + at::get_thread_num() * d;
        for (int64_t r = b; r < f; ++r) {
          if (isa == Isa::kAvx512)
            avx512::rms_norm_row_backward(xp + r * d, wp, gp + r * d, rp[r], dxp + r * d, dw, d);
          else
            avx2::rms_norm_row_backward(xp + r * d, wp, gp + r * d, rp[r], dxp + r * d, dw, d);
        }
      });
  return {dx, partial.sum(0)};
}

bool add_layer_norm_applies(const at::Tensor& a, const at::Tensor& r, const at::Tensor& weight,
                            const at::Tensor& bias) {
  auto plain_float = [](const at::Tensor& t) {
    return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous();
  };
  return current_isa() != Isa::kNone && a.defined() && a.device().is_cpu() &&
         (a.scalar_type() == at::kFloat || a.scalar_type() == at::kBFloat16) && a.is_contiguous() &&
         plain_float(r) && a.sizes() == r.sizes() && a.dim() >= 1 && a.numel() > 0 &&
         plain_float(weight) && plain_float(bias) && weight.dim() == 1 && bias.dim() == 1 &&
         weight.size(0) == a.size(-1) && bias.size(0) == a.size(-1);
}

namespace {
// (with a dropout draw, each row of a dropped into a scratch row first: the dropped activation
// never goes to memory)
template <class A>
void add_layer_norm_run(Isa isa, const A* a, const float* r, const float* g, const float* b,
                        float* s, float* y, float* mean, float* rstd, int64_t rows, int64_t d,
                        float eps, const DropoutDraw* drop) {
  at::parallel_for(0, rows, std::max<int64_t>(1, (int64_t{1} << 15) / d),
                   [&](int64_t b0, int64_t b1) {
                     AlignedVector<float> scratch(s ? 0 : static_cast<size_t>(d));
                     AlignedVector<A> dropped(drop ? static_cast<size_t>(d) : 0);
                     for (int64_t i = b0; i < b1; ++i) {
                       float* si = s ? s + i * d : scratch.data();
                       const A* ai = a + i * d;
                       if (drop) {
                         dropout_row(ai, dropped.data(), d, i * d, *drop);
                         ai = dropped.data();
                       }
                       if (isa == Isa::kAvx512)
                         avx512::add_layer_norm_row(ai, r + i * d, g, b, si, y + i * d, d, eps,
                                                    mean + i, rstd + i);
                       else
                         avx2::add_layer_norm_row(ai, r + i * d, g, b, si, y + i * d, d, eps,
                                                  mean + i, rstd + i);
                     }
                   });
}

// (with a dropout draw, each row of a's gradient computed into a scratch row and dropped from
// there, as dropout's backward pass drops it)
template <class A>
void add_layer_norm_backward_run(Isa isa, const float* s, const float* g, const float* dy,
                                 const float* mean, const float* rstd, A* da, float* dr,
                                 float* partial, int64_t rows, int64_t d, const DropoutDraw* drop) {
  at::parallel_for(0, rows, std::max<int64_t>(1, (int64_t{1} << 15) / d),
                   [&](int64_t b0, int64_t b1) {
                     float* dg = partial + at::get_thread_num() * 2 * d;
                     float* db = dg + d;
                     AlignedVector<A> undropped(drop ? static_cast<size_t>(d) : 0);
                     for (int64_t i = b0; i < b1; ++i) {
                       A* dai = drop ? undropped.data() : da + i * d;
                       if (isa == Isa::kAvx512)
                         avx512::add_layer_norm_row_backward(s + i * d, g, dy + i * d, mean[i],
                                                             rstd[i], dai, dr + i * d, dg, db, d);
                       else
                         avx2::add_layer_norm_row_backward(s + i * d, g, dy + i * d, mean[i],
                                                           rstd[i], dai, dr + i * d, dg, db, d);
                       if (drop) dropout_row(dai, da + i * d, d, i * d, *drop);
                     }
                   });
}

uint16_t* bf16_bits(const at::Tensor& t) {
  return reinterpret_cast<uint16_t*>(t.data_ptr<c10::BFloat16>());
}
}  // namespace

std::vector<at::Tensor> add_layer_norm_forward(const at::Tensor& a, const at::Tensor& r,
                                               const at::Tensor& weight, const at::Tensor& bias,
                                               double eps, bool keep_sum,
                                               const DropoutDraw* dropout) {
  TORCH_CHECK(add_layer_norm_applies(a, r, weight, bias),
              "add_layer_norm_forward: the kernels do not apply");
  const int64_t d = a.size(-1), rows = a.numel() / d;
  auto y = at::empty_like(r);
  auto s = keep_sum ? at::empty_like(r) : at::Tensor();
  auto mean = at::empty({rows}, r.options());
  auto rstd = at::empty({rows}, r.options());
  float* sp = keep_sum ? s.data_ptr<float>() : nullptr;
  const auto e = static_cast<float>(eps);
  if (a.scalar_type() == at::kBFloat16)
    add_layer_norm_run<uint16_t>(current_isa(), bf16_bits(a), r.data_ptr<float>(),
                                 weight.data_ptr<float>(), bias.data_ptr<float>(), sp,
                                 y.data_ptr<float>(), mean.data_ptr<float>(),
                                 rstd.data_ptr<float>(), rows, d, e, dropout);
  else
    add_layer_norm_run<float>(current_isa(), a.data_ptr<float>(), r.data_ptr<float>(),
                              weight.data_ptr<float>(), bias.data_ptr<float>(), sp,
                              y.data_ptr<float>(), mean.data_ptr<float>(), rstd.data_ptr<float>(),
                              rows, d, e, dropout);
  return {y, s, mean, rstd};
}

std::vector<at::Tensor> add_layer_norm_backward(const at::Tensor& s, const at::Tensor& mean,
                                                const at::Tensor& rstd, const at::Tensor& weight,
                                                const at::Tensor& grad_out, at::ScalarType a_dtype,
                                                const DropoutDraw* dropout) {
  TORCH_CHECK(current_isa() != Isa::kNone && s.is_contiguous() && s.scalar_type() == at::kFloat &&
                  (a_dtype == at::kFloat || a_dtype == at::kBFloat16),
              "add_layer_norm_backward: the kernels do not apply");
  const int64_t d = s.size(-1), rows = s.numel() / d;
  const auto dy = grad_out.to(at::kFloat).contiguous();
  auto dr = at::empty_like(s);
  auto da = at::empty_like(s, s.options().dtype(a_dtype));
  // the weight's and bias's gradients: a partial sum per thread, added at the end
  auto partial = at::zeros({at::get_num_threads(), 2, d}, s.options());
  const Isa isa = current_isa();
  if (a_dtype == at::kBFloat16)
    add_layer_norm_backward_run<uint16_t>(
        isa, s.data_ptr<float>(), weight.data_ptr<float>(), dy.data_ptr<float>(),
        mean.data_ptr<float>(), rstd.data_ptr<float>(), bf16_bits(da), dr.data_ptr<float>(),
        partial.data_ptr<float>(), rows, d, dropout);
  else
    add_layer_norm_backward_run<float>(
        isa, s.data_ptr<float>(), weight.data_ptr<float>(), dy.data_ptr<float>(),
        mean.data_ptr<float>(), rstd.data_ptr<float>(), da.data_ptr<float>(), dr.data_ptr<float>(),
        partial.data_ptr<float>(), rows, d, dropout);
  const auto sums = partial.sum(0);
  return {da, dr, sums[0], sums[1]};
}

bool column_sum_applies(const at::Tensor& g) {
  return current_isa() != Isa::kNone && g.device().is_cpu() && g.dim() == 2 && g.stride(1) == 1 &&
         (g.scalar_type() == at::kFloat || g.scalar_type() == at::kBFloat16);
}

at::Tensor column_sum(const at::Tensor& g) {
  TORCH_CHECK(column_sum_applies(g), "column_sum: the kernels do not apply");
  const int64_t rows = g.size(0), n = g.size(1), ld = g.stride(0);
  auto out = at::zeros({n}, g.options().dtype(at::kFloat));
  const Isa isa = current_isa();
  float* op = out.data_ptr<float>();
  // threads take blocks of 64 columns (each reads its columns of every row)
  const int64_t blocks = (n + 63) / 64;
  auto run = [&](auto* p) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(p)>>;
    at::parallel_for(0, blocks,
                     std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(rows * 64, 1)),
                     [&](int64_t b, int64_t e) {
                       const int64_t c0 = b * 64, c1 = std::min(n, e * 64);
                       if (isa == Isa::kAvx512)
                         avx512::column_sums<T>(p, ld, 0, rows, c0, c1, op);
                       else
                         avx2::column_sums<T>(p, ld, 0, rows, c0, c1, op);
                     });
  };
  if (g.scalar_type() == at::kFloat)
    run(g.data_ptr<float>());
  else
    run(reinterpret_cast<const uint16_t*>(g.data_ptr<at::BFloat16>()));
  return out;
}

namespace {

// Byte offsets of each row's mask in a mask expanded to `sizes` (strides 0 where broadcast).
struct MaskRows {
  const uint8_t* base = nullptr;
  std::vector<int64_t> sizes, strides;  // the leading dimensions (all but the last)
  const uint8_t* row(int64_t r) const {
    if (!base) return nullptr;
    int64_t off = 0;
    for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
      off += (r % sizes[d]) * strides[d];
      r /= sizes[d];
    }
    return base + off;
  }
};

MaskRows mask_rows(const at::Tensor& mask, at::IntArrayRef sizes, at::Tensor* keep) {
  MaskRows m;
  if (!mask.defined()) return m;
  *keep = mask.expand(sizes);
  m.base = reinterpret_cast<const uint8_t*>(keep->data_ptr<bool>());
  for (int64_t d = 0; d + 1 < static_cast<int64_t>(sizes.size()); ++d) {
    m.sizes.push_back(sizes[d]);
    m.strides.push_back(keep->stride(d));
  }
  return m;
}

}  // namespace

bool masked_softmax_applies(const at::Tensor& scores, const at::Tensor& mask) {
  if (current_isa() == Isa::kNone || !scores.defined() || !scores.device().is_cpu() ||
      scores.dim() < 1 || scores.size(-1) == 0 || !scores.is_contiguous() ||
      (scores.scalar_type() != at::kFloat && scores.scalar_type() != at::kBFloat16))
    return false;
  if (!mask.defined()) return true;
  if (!mask.device().is_cpu() || mask.scalar_type() != at::kBool || mask.dim() != scores.dim() ||
      mask.size(-1) != scores.size(-1) || mask.stride(-1) != 1)
    return false;
  for (int64_t d = 0; d < scores.dim(); ++d)
    if (mask.size(d) != 1 && mask.size(d) != scores.size(d)) return false;
  return true;
}

std::pair<at::Tensor, at::Tensor> masked_softmax_dropout_forward(const at::Tensor& scores,
                                                                 const at::Tensor& mask,
                                                                 double scale,
                                                                 const DropoutDraw* dropout) {
  TORCH_CHECK(masked_softmax_applies(scores, mask), "masked_softmax: the kernels do not apply");
  const int64_t n = scores.size(-1), rows = scores.numel() / n;
  auto y = at::empty_like(scores);
  auto dropped = dropout ? at::empty_like(scores) : at::Tensor();
  at::Tensor keep;
  const MaskRows m = mask_rows(mask, scores.sizes(), &keep);
  const Isa isa = current_isa();
  const float lowest = lowest_value(scores.scalar_type()).toFloat();  // what the fill would write
  const auto s = static_cast<float>(scale);
  auto run = [&](auto* x, auto* out, auto* out_dropped) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(x)>>;
    at::parallel_for(0, rows, std::max<int64_t>(1, (int64_t{1} << 15) / n),
                     [&](int64_t r0, int64_t r1) {
                       thread_local AlignedVector<float> scratch;
                       if (scratch.size() < static_cast<size_t>(n))
                         scratch.resize(static_cast<size_t>(n));
                       for (int64_t r = r0; r < r1; ++r) {
                         if (isa == Isa::kAvx512)
                           avx512::masked_softmax_row<T>(x + r * n, m.row(r), lowest, s,
                                                         out + r * n, n, scratch.data());
                         else
                           avx2::masked_softmax_row<T>(x + r * n, m.row(r), lowest, s, out + r * n,
                                                       n, scratch.data());
                         if (dropout)
                           dropout_row(out + r * n, out_dropped + r * n, n, r * n, *dropout);
                       }
                     });
  };
  if (scores.scalar_type() == at::kFloat)
    run(scores.data_ptr<float>(), y.data_ptr<float>(),
        dropout ? dropped.data_ptr<float>() : nullptr);
  else
    run(ptr<const uint16_t>(scores), ptr<uint16_t>(y), dropout ? ptr<uint16_t>(dropped) : nullptr);
  return {y, dropped};
}

at::Tensor masked_softmax_forward(const at::Tensor& scores, const at::Tensor& mask, double scale) {
  return masked_softmax_dropout_forward(scores, mask, scale, nullptr).first;
}

bool masked_softmax_row_bf16(const uint16_t* x, const uint8_t* mask, double scale, uint16_t* y,
                             int64_t n, float* scratch) {
  const Isa isa = current_isa();
  if (isa == Isa::kNone) return false;
  const float lowest = lowest_value(at::kBFloat16).toFloat();
  (isa == Isa::kAvx512 ? avx512::masked_softmax_row<uint16_t>
                       : avx2::masked_softmax_row<uint16_t>)(x, mask, lowest,
                                                             static_cast<float>(scale), y, n,
                                                             scratch);
  return true;
}

at::Tensor masked_softmax_backward(const at::Tensor& y, const at::Tensor& grad_out,
                                   const at::Tensor& mask, double scale,
                                   const DropoutDraw* dropout) {
  TORCH_CHECK(masked_softmax_applies(y, mask), "masked_softmax_backward: the kernels do not apply");
  const auto dy = grad_out.to(y.scalar_type()).contiguous();
  TORCH_CHECK(dy.sizes() == y.sizes(), "masked_softmax_backward: gradient of shape ", dy.sizes(),
              " for probabilities of shape ", y.sizes());
  const int64_t n = y.size(-1), rows = y.numel() / n;
  auto dx = at::empty_like(y);
  at::Tensor keep;
  const MaskRows m = mask_rows(mask, y.sizes(), &keep);
  const Isa isa = current_isa();
  const auto s = static_cast<float>(scale);
  auto run = [&](auto* yp, auto* dyp, auto* dxp) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(yp)>>;
    at::parallel_for(
        0, rows, std::max<int64_t>(1, (int64_t{1} << 15) / n), [&](int64_t r0, int64_t r1) {
          // with a dropout draw, the gradient of the dropped probabilities dropped
          // into a scratch row (dropout's backward pass) and taken from there
          AlignedVector<T> undropped(dropout ? static_cast<size_t>(n) : 0);
          for (int64_t r = r0; r < r1; ++r) {
            const T* g = dyp + r * n;
            if (dropout) {
              dropout_row(g, undropped.data(), n, r * n, *dropout);
              g = undropped.data();
            }
            if (isa == Isa::kAvx512)
              avx512::masked_softmax_row_backward<T>(yp + r * n, g, m.row(r), s, dxp + r * n, n);
            else
              avx2::masked_softmax_row_backward<T>(yp + r * n, g, m.row(r), s, dxp + r * n, n);
          }
        });
  };
  if (y.scalar_type() == at::kFloat)
    run(y.data_ptr<float>(), dy.data_ptr<float>(), dx.data_ptr<float>());
  else
    run(ptr<const uint16_t>(y), ptr<const uint16_t>(dy), ptr<uint16_t>(dx));
  return dx;
}

namespace {

// One row of RoPE (forward, or with `back` its transpose: the gradient), in float32.
template <class TX, class TC, class TO>
void rope_row(const TX* x, const TC* c, const TC* s, TO* y, int64_t d, bool back) {
  const int64_t h = d / 2;
  for (int64_t i = 0; i < h; ++i) {
    const float a = scalar(x[i]), b = scalar(x[i + h]);
    if (!back) {
      y[i] = from_float<TO>(a * scalar(c[i]) - b * scalar(s[i]));
      y[i + h] = from_float<TO>(b * scalar(c[i + h]) + a * scalar(s[i + h]));
    } else {
      y[i] = from_float<TO>(a * scalar(c[i]) + b * scalar(s[i + h]));
      y[i + h] = from_float<TO>(b * scalar(c[i + h]) - a * scalar(s[i]));
    }
  }
}

template <class TX, class TC, class TO>
void rope_run(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
              const at::Tensor& y, bool back) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  const int64_t cb = cos.size(0) == 1 ? 0 : T * D;  // cos/sin: [1 or B, 1, T, D] contiguous
  const auto* xp = ptr<const TX>(x);
  const auto* cp = ptr<const TC>(cos);
  const auto* sp = ptr<const TC>(sin);
  auto* yp = ptr<TO>(y);
  const int64_t sb = x.stride(0), sh = x.stride(1), st = x.stride(2);
  at::parallel_for(0, B * H * T, std::max<int64_t>(1, (int64_t{1} << 15) / D),
                   [&](int64_t r0, int64_t r1) {
                     for (int64_t r = r0; r < r1; ++r) {
                       const int64_t t = r % T, bh = r / T, hh = bh % H, b = bh / H;
                       rope_row<TX, TC, TO>(xp + b * sb + hh * sh + t * st, cp + b * cb + t * D,
                                            sp + b * cb + t * D, yp + r * D, D, back);
                     }
                   });
}

bool float_or_bf16(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
}

// TX, TC and TO from the tensors' dtypes (float or bfloat16 bits)
template <class F>
void rope_dispatch(at::ScalarType x, at::ScalarType c, at::ScalarType o, const F& f) {
  auto by_o = [&](auto tx, auto tc) {
    if (o == at::kFloat)
      f(tx, tc, float{});
    else
      f(tx, tc, uint16_t{});
  };
  auto by_c = [&](auto tx) {
    if (c == at::kFloat)
      by_o(tx, float{});
    else
      by_o(tx, uint16_t{});
  };
  if (x == at::kFloat)
    by_c(float{});
  else
    by_c(uint16_t{});
}

}  // namespace

bool rope_applies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (current_isa() == Isa::kNone || !x.defined() || !cos.defined() || !sin.defined() ||
      x.dim() != 4 || !x.device().is_cpu() || !cos.device().is_cpu() || !sin.device().is_cpu() ||
      !float_or_bf16(x) || !float_or_bf16(cos) || cos.scalar_type() != sin.scalar_type() ||
      x.stride(3) != 1 || x.size(3) % 2 != 0 || x.numel() == 0 || cos.requires_grad() ||
      sin.requires_grad() || !cos.is_contiguous() || !sin.is_contiguous() ||
      cos.sizes() != sin.sizes() || cos.dim() != 4)
    return false;
  return (cos.size(0) == 1 || cos.size(0) == x.size(0)) && cos.size(1) == 1 &&
         cos.size(2) == x.size(2) && cos.size(3) == x.size(3);
}

at::Tensor rope_forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(rope_applies(x, cos, sin), "rope_forward: the kernels do not apply");
  const auto out_dtype = at::promote_types(x.scalar_type(), cos.scalar_type());
  auto y = at::empty(x.sizes(), x.options().dtype(out_dtype));
  rope_dispatch(x.scalar_type(), cos.scalar_type(), out_dtype, [&](auto tx, auto tc, auto to) {
    rope_run<decltype(tx), decltype(tc), decltype(to)>(x, cos, sin, y, false);
  });
  return y;
}

at::Tensor rope_backward(const at::Tensor& grad_out, const at::Tensor& cos, const at::Tensor& sin,
                         at::ScalarType x_dtype) {
  auto g = grad_out;
  if (!float_or_bf16(g) || g.stride(3) != 1) g = g.to(at::kFloat).contiguous();
  TORCH_CHECK(rope_applies(g, cos, sin), "rope_backward: the kernels do not apply");
  auto dx = at::empty(g.sizes(), g.options().dtype(x_dtype));
  rope_dispatch(g.scalar_type(), cos.scalar_type(), x_dtype, [&](auto tx, auto tc, auto to) {
    rope_run<decltype(tx), decltype(tc), decltype(to)>(g, cos, sin, dx, true);
  });
  return dx;
}

std::string row_kernels_isa() {
  return isa_name(current_isa());
}

std::string set_row_kernels_isa(const std::string& isa) {
  const std::string previous = row_kernels_isa();
  isa_setting.store(static_cast<int>(parse_isa(isa, "row kernels")));
  return previous.empty() ? "library" : previous;
}

bool softmax_xent_rows(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& scale,
                       const at::Tensor& loss) {
  const Isa isa = current_isa();
  if (isa == Isa::kNone || !logits.device().is_cpu() || logits.dim() != 2 ||
      logits.stride(1) != 1 || logits.size(1) == 0 ||
      (logits.scalar_type() != at::kFloat && logits.scalar_type() != at::kBFloat16))
    return false;
  const int64_t rows = logits.size(0), V = logits.size(1);
  TORCH_CHECK(
      target.scalar_type() == at::kLong && target.is_contiguous() && target.numel() == rows &&
          loss.scalar_type() == at::kFloat && loss.is_contiguous() && loss.numel() == rows &&
          (!scale.defined() ||
           (scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == rows)),
      "softmax_xent_rows: expected int64 targets and float32 loss (and scale) of ", rows, " rows");
  const int64_t* t = target.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r)
    TORCH_CHECK(t[r] >= 0 && t[r] < V, "softmax_xent_rows: target ", t[r], " outside [0, ", V, ")");
  const float* s = scale.defined() ? scale.data_ptr<float>() : nullptr;
  float* l = loss.data_ptr<float>();
  if (logits.scalar_type() == at::kFloat)
    xent_rows(isa, logits.data_ptr<float>(), rows, V, logits.stride(0), t, s, l);
  else
    xent_rows(isa, reinterpret_cast<uint16_t*>(logits.data_ptr<at::BFloat16>()), rows, V,
              logits.stride(0), t, s, l);
  return true;
}

bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& mask) {
  if (current_isa() == Isa::kNone || !q.defined() || !k.defined() || !v.defined() || q.dim() != 4 ||
      k.dim() != 4 || k.sizes() != v.sizes() || !q.device().is_cpu() || !k.device().is_cpu() ||
      !v.device().is_cpu() || emoe::autocast_enabled(at::kCPU))
    return false;
  const auto dtype = q.scalar_type();
  if ((dtype != at::kFloat && dtype != at::kBFloat16) || k.scalar_type() != dtype ||
      v.scalar_type() != dtype)
    return false;
  const int64_t b = q.size(0), hq = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t hkv = k.size(1), s = k.size(2);
  if (t == 0 || t > kDecodeAttentionRows || d == 0 || s == 0 || k.size(0) != b || k.size(3) != d ||
      hkv == 0 || hq % hkv != 0 || q.stride(3) != 1 || k.stride(3) != 1 || v.stride(3) != 1)
    return false;
  if (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad()))
    return false;
  if (!mask.defined()) return true;
  if (!mask.device().is_cpu() || mask.scalar_type() != at::kBool || mask.dim() != 4 ||
      mask.stride(3) != 1)
    return false;
  const int64_t want[4] = {b, hq, t, s};
  for (int64_t i = 0; i < 4; ++i)
    if (mask.size(i) != want[i] && !(i < 3 && mask.size(i) == 1)) return false;
  return true;
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask, double scale) {
  TORCH_CHECK(decode_attention_applies(q, k, v, mask),
              "decode_attention: the kernels do not apply");
  const int64_t b = q.size(0), hq = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t s = k.size(2), rep = hq / k.size(1);
  auto out = at::empty({b, hq, t, d}, q.options());
  at::Tensor keep;
  const MaskRows m = mask_rows(mask, {b, hq, t, s}, &keep);
  const Isa isa = current_isa();
  const float lowest = lowest_value(q.scalar_type()).toFloat();  // what the fill would write
  const int64_t rows = b * hq * t;
  // a task reads at least ~64 K keys' and values' elements: waking the other threads costs more
  // than a decoding step's few rows over a short cache
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, s * d));
  auto run = [&](auto* qp, auto* kp, auto* vp, auto* op) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(qp)>>;
    at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      thread_local AlignedVector<float> scratch;
      if (scratch.size() < static_cast<size_t>(s + d)) scratch.resize(static_cast<size_t>(s + d));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t bi = r / (hq * t), h = (r / t) % hq, ti = r % t, hk = h / rep;
        const T* qr = qp + bi * q.stride(0) + h * q.stride(1) + ti * q.stride(2);
        const T* kr = kp + bi * k.stride(0) + hk * k.stride(1);
        const T* vr = vp + bi * v.stride(0) + hk * v.stride(1);
        if (isa == Isa::kAvx512)
          avx512::attend_row<T>(qr, kr, k.stride(2), vr, v.stride(2), m.row(r),
                                static_cast<float>(scale), lowest, op + r * d, s, d,
                                scratch.data());
        else
          avx2::attend_row<T>(qr, kr, k.stride(2), vr, v.stride(2), m.row(r),
                              static_cast<float>(scale), lowest, op + r * d, s, d, scratch.data());
      }
    });
  };
  if (q.scalar_type() == at::kFloat)
    run(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr<float>());
  else
    run(ptr<const uint16_t>(q), ptr<const uint16_t>(k), ptr<const uint16_t>(v), ptr<uint16_t>(out));
  return out;
}

}  // namespace emoe
