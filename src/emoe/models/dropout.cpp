// Counter-based parallel dropout masks.
#include "emoe/models/dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <mutex>
#include <type_traits>

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

// out[i] = in[i] · (kept ? 1/(1-p) : 0), the keep decision of element i a hash of (seed, i).
// The same function drops the input in the forward pass and the gradient in the backward pass,
// so the mask is never stored: it is recomputed from the seed.
// bfloat16 and half are scaled in float and rounded once.
template <typename T>
void apply_mask(const T* in, T* out, int64_t n, uint64_t seed, double p) {
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
  // keep when the top 32 bits of the hash are >= p * 2^32
  const uint64_t threshold = static_cast<uint64_t>(p * 4294967296.0);
  const Acc keep = static_cast<Acc>(1.0 / (1.0 - p));
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t h = splitmix64(seed ^ (static_cast<uint64_t>(i) * 0xd1342543de82ef95ULL));
      out[i] = static_cast<T>(static_cast<Acc>(in[i]) * ((h >> 32) >= threshold ? keep : Acc(0)));
    }
  });
}

at::Tensor masked_copy(const at::Tensor& x, uint64_t seed, double p) {
  auto in = x.contiguous();
  auto out = torch::empty_like(in, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, in.scalar_type(), "emoe_dropout", [&] {
    apply_mask(in.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), in.numel(), seed, p);
  });
  return out;
}

// Saves the seed, not a mask: a float mask as large as the input (12 MiB per BERT-base attention
// layer at batch 16 x 128) would otherwise live until the backward pass.
class DropoutFn : public torch::autograd::Function<DropoutFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, double p) {
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
  if (!x.device().is_cpu() || (t != at::kFloat && t != at::kDouble && t != at::kBFloat16 && t != at::kHalf))
    return torch::dropout(x, p, true);
  return DropoutFn::apply(x, p);
}

}  // namespace emoe
