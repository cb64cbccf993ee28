// Counter-based parallel dropout masks.
#include "emoe/models/dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <immintrin.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "emoe/core/bf16_round.h"
#include "emoe/core/error.h"

namespace emoe {

namespace {

inline uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t draw_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get<at::CPUGeneratorImpl>()->random64();
}

// A 32-bit integer hash with full avalanche (Wellons' "lowbias32"); 32-bit operations only, so
// the element loops below vectorise (16 lanes on AVX-512).
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// The keep decision of element i (the low 32 bits of its index; the high bits go into the
// keys): kept when h >= threshold = p · 2^32. For fixed keys the hash is a bijection of i, and
// two keys give unrelated permutations, so masks of different calls are independent.
inline bool kept(uint32_t i, uint32_t k1, uint32_t k2, uint32_t threshold) {
  return mix32(mix32(i + k1) ^ k2) >= threshold;
}

struct MaskParams {
  uint32_t k1, k2, threshold;
  float keep;
};

// The element loops, compiled for AVX-512, AVX2 and the baseline; the loader picks one.
// (A scalar 64-bit hash per element took 3 ns: 8 % of a BERT-base fp32 step, 15 % of LoRA's.)
#define EMOE_DROPOUT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

EMOE_DROPOUT_CLONES
void mask_f32(const float* __restrict in, float* __restrict out, int64_t n, uint32_t i0,
              MaskParams m) {
  for (int64_t j = 0; j < n; ++j)
    out[j] = kept(i0 + static_cast<uint32_t>(j), m.k1, m.k2, m.threshold) ? in[j] * m.keep : 0.0f;
}

// out += mask(in) (the gradient of a dropped input added to a gradient already there)
EMOE_DROPOUT_CLONES
void mask_add_f32(const float* __restrict in, float* __restrict out, int64_t n, uint32_t i0,
                  MaskParams m) {
  for (int64_t j = 0; j < n; ++j)
    out[j] += kept(i0 + static_cast<uint32_t>(j), m.k1, m.k2, m.threshold) ? in[j] * m.keep : 0.0f;
}

// bfloat16 as raw bits: widened to float, scaled, rounded to nearest even once. Written without
// branches (masks instead of selects), or GCC leaves the loop scalar: 3.8 ns an element against
// 0.65 — bf16 dropout took 30 % of a bf16 BERT-base LoRA step.
EMOE_DROPOUT_CLONES
void mask_bf16(const uint16_t* __restrict in, uint16_t* __restrict out, int64_t n, uint32_t i0,
               MaskParams m) {
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t h = mix32(mix32(i0 + static_cast<uint32_t>(j) + m.k1) ^ m.k2);
    const uint32_t kept_bits = 0U - static_cast<uint32_t>(h >= m.threshold);  // all ones when kept
    float v;
    const uint32_t wide = static_cast<uint32_t>(in[j]) << 16;
    std::memcpy(&v, &wide, 4);
    v *= m.keep;
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits &= kept_bits;  // dropped: +0
    const uint32_t rounded = bf16_round::rne(bits);
    const uint32_t nan = 0U - static_cast<uint32_t>((bits & 0x7fffffffU) > 0x7f800000U);
    out[j] = static_cast<uint16_t>(rounded ^ ((rounded ^ 0x7fc0U) & nan));
  }
}

// The same three loops written for AVX-512 (F, BW, VL): GCC's vectorisation of mask_bf16 ran at
// 0.86 ns an element on one core of the AMX Xeon, 2.3 times its float32 loop, and BERT-base's
// dropouts (inside the residual LayerNorms and the attention's softmax) took ~6 % of a bf16
// training step. Same decisions and bits as the loops above.
namespace dropout_avx512 {

#define EMOE_DROPOUT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

EMOE_DROPOUT_AVX512 inline __m512i mix(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bU)));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

// the keep decisions of elements i .. i + 15
EMOE_DROPOUT_AVX512 inline __mmask16 kept16(__m512i i, const MaskParams& m) {
  const __m512i h =
      mix(_mm512_xor_si512(mix(_mm512_add_epi32(i, _mm512_set1_epi32(static_cast<int>(m.k1)))),
                           _mm512_set1_epi32(static_cast<int>(m.k2))));
  return _mm512_cmpge_epu32_mask(h, _mm512_set1_epi32(static_cast<int>(m.threshold)));
}

EMOE_DROPOUT_AVX512 inline __mmask16 tail(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
}

EMOE_DROPOUT_AVX512 inline __m512i first_indices(uint32_t i0) {
  return _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(i0)),
                          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

template <bool Add>
EMOE_DROPOUT_AVX512 void mask_f32(const float* __restrict in, float* __restrict out, int64_t n,
                                  uint32_t i0, MaskParams m) {
  const __m512 keep = _mm512_set1_ps(m.keep);
  __m512i i = first_indices(i0);
  for (int64_t j = 0; j < n; j += 16, i = _mm512_add_epi32(i, _mm512_set1_epi32(16))) {
    const __mmask16 lanes = tail(n - j);
    __m512 v = _mm512_maskz_mul_ps(kept16(i, m), _mm512_maskz_loadu_ps(lanes, in + j), keep);
    if constexpr (Add) v = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, out + j), v);
    _mm512_mask_storeu_ps(out + j, lanes, v);
  }
}

EMOE_DROPOUT_AVX512 void mask_bf16(const uint16_t* __restrict in, uint16_t* __restrict out,
                                   int64_t n, uint32_t i0, MaskParams m) {
  const __m512 keep = _mm512_set1_ps(m.keep);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  __m512i i = first_indices(i0);
  for (int64_t j = 0; j < n; j += 16, i = _mm512_add_epi32(i, _mm512_set1_epi32(16))) {
    const __mmask16 lanes = tail(n - j);
    const __m512i wide =
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, in + j)), 16);
    const __m512i bits = _mm512_castps_si512(
        _mm512_maskz_mul_ps(kept16(i, m), _mm512_castsi512_ps(wide), keep));  // dropped: +0
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, abs_mask), inf);
    const __m512i rounded =
        _mm512_mask_mov_epi32(bf16_round::rne(bits), nan, _mm512_set1_epi32(0x7fc0));
    _mm256_mask_storeu_epi16(out + j, lanes, _mm512_cvtepi32_epi16(rounded));
  }
}

}  // namespace dropout_avx512

bool use_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl");
  return ok;
}

using MaskF32 = void (*)(const float*, float*, int64_t, uint32_t, MaskParams);
using MaskBf16 = void (*)(const uint16_t*, uint16_t*, int64_t, uint32_t, MaskParams);
MaskF32 f32_kernel() {
  return use_avx512() ? dropout_avx512::mask_f32<false> : mask_f32;
}
MaskF32 f32_add_kernel() {
  return use_avx512() ? dropout_avx512::mask_f32<true> : mask_add_f32;
}
MaskBf16 bf16_kernel() {
  return use_avx512() ? dropout_avx512::mask_bf16 : mask_bf16;
}

// Other dtypes (double, half): the same decisions, not vectorised.
template <typename T>
void mask_generic(const T* in, T* out, int64_t n, uint32_t i0, MaskParams m) {
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const Acc keep = static_cast<Acc>(m.keep);
  for (int64_t j = 0; j < n; ++j)
    out[j] = static_cast<T>(kept(i0 + static_cast<uint32_t>(j), m.k1, m.k2, m.threshold)
                                ? static_cast<Acc>(in[j]) * keep
                                : Acc(0));
}

MaskParams params(uint64_t keys, double p) {
  return {static_cast<uint32_t>(keys), static_cast<uint32_t>(keys >> 32),
          static_cast<uint32_t>(std::min(p * 4294967296.0, 4294967295.0)),
          static_cast<float>(1.0 / (1.0 - p))};
}

// Elements [first, first + n) of the flat index space (in and out point at element `first`):
// the keys change every 2^32 elements, so that every index has its own decision.
template <typename T, typename Kernel>
void mask_span(const T* in, T* out, int64_t first, int64_t n, uint64_t seed, double p,
               Kernel kernel) {
  for (int64_t i = first, end = first + n; i < end;) {
    const int64_t segment_end = std::min(end, ((i >> 32) + 1) << 32);
    const MaskParams m = params(splitmix64(seed + static_cast<uint64_t>(i >> 32)), p);
    kernel(in + (i - first), out + (i - first), segment_end - i, static_cast<uint32_t>(i), m);
    i = segment_end;
  }
}

// out[i] = in[i] · (kept ? 1/(1-p) : 0), the keep decision of element i a hash of (seed, i).
// The same function drops the input in the forward pass and the gradient in the backward pass,
// so the mask is never stored: it is recomputed from the seed.
template <typename T, typename Kernel>
void apply_mask(const T* in, T* out, int64_t n, uint64_t seed, double p, Kernel kernel) {
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    mask_span(in + begin, out + begin, begin, end - begin, seed, p, kernel);
  });
}

at::Tensor masked_copy(const at::Tensor& x, uint64_t seed, double p) {
  auto in = x.contiguous();
  auto out = torch::empty_like(in, at::MemoryFormat::Contiguous);
  const int64_t n = in.numel();
  switch (in.scalar_type()) {
    case at::kFloat:
      apply_mask(in.data_ptr<float>(), out.data_ptr<float>(), n, seed, p, f32_kernel());
      break;
    case at::kBFloat16:
      apply_mask(reinterpret_cast<const uint16_t*>(in.data_ptr<at::BFloat16>()),
                 reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()), n, seed, p,
                 bf16_kernel());
      break;
    case at::kDouble:
      apply_mask(in.data_ptr<double>(), out.data_ptr<double>(), n, seed, p, mask_generic<double>);
      break;
    case at::kHalf:
      apply_mask(in.data_ptr<at::Half>(), out.data_ptr<at::Half>(), n, seed, p,
                 mask_generic<at::Half>);
      break;
    default:
      EMOE_THROW(UsageError, "dropout: unsupported dtype {}", c10::toString(in.scalar_type()));
  }
  return out;
}

}  // namespace

uint64_t draw_dropout_seed() {
  return draw_seed();
}

DropoutDraw draw_dropout(double p) {
  if (p <= 0) return {};
  EMOE_CHECK(p < 1, UsageError, "dropout probability must be in [0, 1), got {}", p);
  return {draw_seed(), p};
}

void dropout_row(const float* in, float* out, int64_t n, int64_t first, const DropoutDraw& d) {
  mask_span(in, out, first, n, d.seed, d.p, f32_kernel());
}

void dropout_row(const uint16_t* in, uint16_t* out, int64_t n, int64_t first,
                 const DropoutDraw& d) {
  mask_span(in, out, first, n, d.seed, d.p, bf16_kernel());
}

void dropout_mask_into(const at::Tensor& in, const at::Tensor& out, uint64_t seed, double p,
                       bool accumulate) {
  EMOE_CHECK(in.device().is_cpu() && out.device().is_cpu() && in.scalar_type() == at::kFloat &&
                 out.scalar_type() == at::kFloat && in.is_contiguous() && out.is_contiguous() &&
                 in.numel() == out.numel(),
             UsageError,
             "dropout_mask_into: expected contiguous float32 CPU tensors of equal size");
  EMOE_CHECK(p >= 0 && p < 1, UsageError, "dropout probability must be in [0, 1), got {}", p);
  if (accumulate)
    apply_mask(in.data_ptr<float>(), out.data_ptr<float>(), in.numel(), seed, p, f32_add_kernel());
  else
    apply_mask(in.data_ptr<float>(), out.data_ptr<float>(), in.numel(), seed, p, f32_kernel());
}

namespace {

// Saves the seed, not a mask: a float mask as large as the input (12 MiB per BERT-base attention
// layer at batch 16 x 128) would otherwise live until the backward pass.
class DropoutFn : public torch::autograd::Function<DropoutFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, double p) {
    RECORD_FUNCTION("emoe::dropout", std::vector<c10::IValue>());
    const uint64_t seed = draw_seed();
    ctx->saved_data["seed"] = static_cast<int64_t>(seed);
    ctx->saved_data["p"] = p;
    return masked_copy(x, seed, p);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto seed = static_cast<uint64_t>(ctx->saved_data["seed"].toInt());
    return {masked_copy(grads[0], seed, ctx->saved_data["p"].toDouble()), at::Tensor()};
  }
};

}  // namespace

at::Tensor dropout(const at::Tensor& x, double p, bool training) {
  if (!training || p <= 0) return x;
  EMOE_CHECK(p < 1, UsageError, "dropout probability must be < 1, got {}", p);
  const auto t = x.scalar_type();
  // (bfloat16 under autocast too: ATen's CPU bernoulli_ took 10 % of a bf16 BERT-base step)
  if (!x.device().is_cpu() ||
      (t != at::kFloat && t != at::kDouble && t != at::kBFloat16 && t != at::kHalf))
    return torch::dropout(x, p, true);
  return DropoutFn::apply(x, p);
}

}  // namespace emoe
