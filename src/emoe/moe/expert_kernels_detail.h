// Helpers the dispatched experts' CPU kernels share (expert_kernels.cpp, expert_kernels_amx.cpp):
// not part of the kernels' interface.
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace emoe::expert_kernels::detail {

// Runs work items [0, n) with costs `cost(i)` on the intra-op threads, each thread one contiguous
// run of about equal cost.
template <class Cost, class Body>
inline void parallel_by_cost(int64_t n, const Cost& cost, const Body& body) {
  if (n == 0) return;
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + cost(i);
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  auto bound = [&](int64_t t) {  // first item of thread t's run
    if (t >= threads) return n;
    const double target = prefix[n] * static_cast<double>(t) / static_cast<double>(threads);
    return static_cast<int64_t>(std::lower_bound(prefix.begin(), prefix.end(), target) -
                                prefix.begin());
  };
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) body(std::min(bound(t), n), std::min(bound(t + 1), n));
  });
}

// A tile of up to `rows` routed rows of one expert (rows are grouped by expert, `counts[j]` for
// expert j, in order).
struct RowTile {
  int64_t expert, row, rows;
};

inline std::vector<RowTile> row_tiles(const std::vector<int64_t>& counts, int64_t rows) {
  std::vector<RowTile> tiles;
  int64_t row = 0;
  for (int64_t j = 0; j < static_cast<int64_t>(counts.size()); ++j) {
    for (int64_t r = 0; r < counts[j]; r += rows)
      tiles.push_back({j, row + r, std::min<int64_t>(rows, counts[j] - r)});
    row += counts[j];
  }
  return tiles;
}

// out[p][c] = S(2p, c) | S(2p + 1, c) << 16 with S(kk, c) = b[kk·stride_k + c·stride_n] (zero
// past K), for p < ceil(K/2), c < n; out row stride ldo: the bf16 pairs along K that vdpbf16ps
// and AMX's tdpbf16ps take as their right-hand operand.
void pack_pairs(const uint16_t* b, int64_t k, int64_t n, int64_t stride_k, int64_t stride_n,
                uint32_t* out, int64_t ldo);

}  // namespace emoe::expert_kernels::detail
