// Counter-based parallel dropout masks.
#include "emoe/models/dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
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

// out[i] = in[i] · (kept ? 1/(1-p) : 0), the keep decision of element i a hash of (seed, i).
// The same function drops the input in the forward pass and the gradient in the backward pass,
// so the mask is never stored: it is recomputed from the seed.
template <typename T, typename Kernel>
void apply_mask(const T* in, T* out, int64_t n, uint64_t seed, double p, Kernel kernel) {
  const auto threshold = static_cast<uint32_t>(std::min(p * 4294967296.0, 4294967295.0));
  const auto keep = static_cast<float>(1.0 / (1.0 - p));
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    // the keys change every 2^32 elements, so that every index has its own decision
    for (int64_t i = begin; i < end;) {
      const int64_t segment_end = std::min(end, ((i >> 32) + 1) << 32);
      const uint64_t keys = splitmix64(seed + static_cast<uint64_t>(i >> 32));
      const MaskParams m{static_cast<uint32_t>(keys), static_cast<uint32_t>(keys >> 32), threshold,
                         keep};
      kernel(in + i, out + i, segment_end - i, static_cast<uint32_t>(i), m);
      i = segment_end;
    }
  });
}

at::Tensor masked_copy(const at::Tensor& x, uint64_t seed, double p) {
  auto in = x.contiguous();
  auto out = torch::empty_like(in, at::MemoryFormat::Contiguous);
  const int64_t n = in.numel();
  switch (in.scalar_type()) {
    case at::kFloat:
      apply_mask(in.data_ptr<float>(), out.data_ptr<float>(), n, seed, p, mask_f32);
      break;
    case at::kBFloat16:
      apply_mask(reinterpret_cast<const uint16_t*>(in.data_ptr<at::BFloat16>()),
                 reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()), n, seed, p, mask_bf16);
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

void dropout_mask_into(const at::Tensor& in, const at::Tensor& out, uint64_t seed, double p,
                       bool accumulate) {
  EMOE_CHECK(in.device().is_cpu() && out.device().is_cpu() && in.scalar_type() == at::kFloat &&
                 out.scalar_type() == at::kFloat && in.is_contiguous() && out.is_contiguous() &&
                 in.numel() == out.numel(),
             UsageError,
             "dropout_mask_into: expected contiguous float32 CPU tensors of equal size");
  EMOE_CHECK(p >= 0 && p < 1, UsageError, "dropout probability must be in [0, 1), got {}", p);
  if (accumulate)
    apply_mask(in.data_ptr<float>(), out.data_ptr<float>(), in.numel(), seed, p, mask_add_f32);
  else
    apply_mask(in.data_ptr<float>(), out.data_ptr<float>(), in.numel(), seed, p, mask_f32);
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
