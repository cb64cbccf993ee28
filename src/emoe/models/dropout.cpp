// Counter-based parallel dropout masks.
#include "emoe/models/dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <mutex>

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

template <typename T>
void fill_mask(T* out, int64_t n, uint64_t seed, double p) {
  // keep when the top 32 bits of the hash are >= p * 2^32
  const uint64_t threshold = static_cast<uint64_t>(p * 4294967296.0);
  const T keep = static_cast<T>(1.0 / (1.0 - p));
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t h = splitmix64(seed ^ (static_cast<uint64_t>(i) * 0xd1342543de82ef95ULL));
      out[i] = (h >> 32) >= threshold ? keep : T(0);
    }
  });
}

}  // namespace

at::Tensor dropout(const at::Tensor& x, double p, bool training) {
  if (!training || p <= 0) return x;
  EMOE_CHECK(p < 1, UsageError, "dropout probability must be < 1, got {}", p);
  const auto t = x.scalar_type();
  if (!x.device().is_cpu() || (t != at::kFloat && t != at::kDouble)) return torch::dropout(x, p, true);
  auto mask = torch::empty(x.sizes(), x.options().requires_grad(false));
  const uint64_t seed = draw_seed();
  if (t == at::kFloat) fill_mask(mask.data_ptr<float>(), mask.numel(), seed, p);
  else fill_mask(mask.data_ptr<double>(), mask.numel(), seed, p);
  return x * mask;
}

}  // namespace emoe
