// AVX-512 register-tile kernels for dispatched experts (see expert_kernels.h).
#include "emoe/moe/expert_kernels.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <immintrin.h>

#include <algorithm>

namespace emoe::expert_kernels {

namespace {

// Only the tile functions below carry the AVX-512 target, and they have internal linkage: no
// inline function shared with the rest of the program is compiled for AVX-512 here.
#define EMOE_AVX512 __attribute__((target("avx512f")))

constexpr int kTileRows = 8;        // rows of a register tile
constexpr int64_t kTileCols = 48;   // columns of a register tile: 3 vectors, 24 accumulators

__mmask16 tail_mask(int64_t cols) {  // the first `cols` (1..16) lanes
  return cols >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << cols) - 1u);
}

// The register tile all three kernels share: acc[i][:] = Σ_t scalar(t, i) · row(t)[:] over
// t < steps, for R rows i and NV vectors of columns (the last one masked by `tail`).
template <int R, int NV, class RowAt, class ScalarAt>
EMOE_AVX512 inline __attribute__((always_inline)) void tile_accumulate(__m512 (&acc)[R][NV], int64_t steps,
                                                                      __mmask16 tail, const RowAt& row_at,
                                                                      const ScalarAt& scalar_at) {
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t t = 0; t < steps; ++t) {
    const float* row = row_at(t);
    __m512 rv[NV];
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v)
      rv[v] = v + 1 < NV ? _mm512_loadu_ps(row + 16 * v) : _mm512_maskz_loadu_ps(tail, row + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 av = _mm512_set1_ps(scalar_at(t, i));
#pragma GCC unroll 3
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(av, rv[v], acc[i][v]);
    }
  }
}

inline __mmask16 vector_mask(int v, int nv, __mmask16 tail) {
  return v + 1 < nv ? static_cast<__mmask16>(0xFFFF) : tail;
}

// c[i, :] (+bias) = Σ_kk a_i[kk] · b[kk, :]
template <int R, int NV>
EMOE_AVX512 void tile_gather(const float* const* a, int64_t k, const float* b, int64_t ldb, __mmask16 tail,
                             const float* bias, float* c, int64_t ldc) {
  const float* ap[R];
  for (int i = 0; i < R; ++i) ap[i] = a[i];
  __m512 acc[R][NV];
  tile_accumulate<R, NV>(
      acc, k, tail, [&](int64_t kk) { return b + kk * ldb; }, [&](int64_t kk, int i) { return ap[i][kk]; });
#pragma GCC unroll 3
  for (int v = 0; v < NV; ++v) {
    const __mmask16 m = vector_mask(v, NV, tail);
    const __m512 bb = bias ? _mm512_maskz_loadu_ps(m, bias + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) _mm512_mask_storeu_ps(c + i * ldc + 16 * v, m, _mm512_add_ps(acc[i][v], bb));
  }
}

// y_i[:] += Σ_kk h[i, kk] · b[kk, :] for R rows of h (row stride ldh), s terms
template <int R, int NV>
EMOE_AVX512 void tile_scatter(const float* h, int64_t ldh, int64_t s, const float* b, int64_t ldb,
                              __mmask16 tail, float* const* y) {
  __m512 acc[R][NV];
  tile_accumulate<R, NV>(
      acc, s, tail, [&](int64_t kk) { return b + kk * ldb; }, [&](int64_t kk, int i) { return h[i * ldh + kk]; });
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = vector_mask(v, NV, tail);
      float* p = y[i] + 16 * v;
      _mm512_mask_storeu_ps(p, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, p), acc[i][v]));
    }
}

// w[i, :] = Σ_r x[tokens[r]][i] · h[r, :] for R consecutive columns i of x (x offset to them)
template <int R, int NV>
EMOE_AVX512 void tile_wgrad(const float* x, int64_t ldx, const int64_t* tokens, int64_t m, const float* h,
                            int64_t ldh, __mmask16 tail, float* w, int64_t ldw) {
  __m512 acc[R][NV];
  tile_accumulate<R, NV>(
      acc, m, tail, [&](int64_t r) { return h + r * ldh; },
      [&](int64_t r, int i) { return x[tokens[r] * ldx + i]; });
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(w + i * ldw + 16 * v, vector_mask(v, NV, tail), acc[i][v]);
}

using GatherTile = void (*)(const float* const*, int64_t, const float*, int64_t, __mmask16, const float*,
                            float*, int64_t);
using ScatterTile = void (*)(const float*, int64_t, int64_t, const float*, int64_t, __mmask16, float* const*);
using WgradTile = void (*)(const float*, int64_t, const int64_t*, int64_t, const float*, int64_t, __mmask16,
                           float*, int64_t);

// [rows - 1][vectors - 1]
#define EMOE_TILE_ROW(F, R) {&F<R, 1>, &F<R, 2>, &F<R, 3>}
#define EMOE_TILE_TABLE(F)                                                                          \
  {EMOE_TILE_ROW(F, 1), EMOE_TILE_ROW(F, 2), EMOE_TILE_ROW(F, 3), EMOE_TILE_ROW(F, 4),              \
   EMOE_TILE_ROW(F, 5), EMOE_TILE_ROW(F, 6), EMOE_TILE_ROW(F, 7), EMOE_TILE_ROW(F, 8)}
const GatherTile kGatherTiles[kTileRows][3] = EMOE_TILE_TABLE(tile_gather);
const ScatterTile kScatterTiles[kTileRows][3] = EMOE_TILE_TABLE(tile_scatter);
const WgradTile kWgradTiles[kTileRows][3] = EMOE_TILE_TABLE(tile_wgrad);
#undef EMOE_TILE_TABLE
#undef EMOE_TILE_ROW

// A column chunk [c0, c0 + width) of at most kTileCols: its vector count and last vector's mask.
struct Chunk {
  int nv;
  __mmask16 tail;
};
Chunk column_chunk(int64_t width) {
  const int64_t nv = (width + 15) / 16;
  return {static_cast<int>(nv), tail_mask(width - 16 * (nv - 1))};
}

// Runs work items [0, n) with costs `cost(i)` on the intra-op threads, each thread one contiguous
// run of about equal cost.
template <class Cost, class Body>
void parallel_by_cost(int64_t n, const Cost& cost, const Body& body) {
  if (n == 0) return;
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + cost(i);
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  auto bound = [&](int64_t t) {  // first item of thread t's run
    if (t >= threads) return n;
    const double target = prefix[n] * static_cast<double>(t) / static_cast<double>(threads);
    return static_cast<int64_t>(std::lower_bound(prefix.begin(), prefix.end(), target) - prefix.begin());
  };
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) body(std::min(bound(t), n), std::min(bound(t + 1), n));
  });
}

struct RowTile {
  int64_t expert, row, rows;
};

std::vector<RowTile> row_tiles(const std::vector<int64_t>& counts) {
  std::vector<RowTile> tiles;
  int64_t row = 0;
  for (int64_t j = 0; j < static_cast<int64_t>(counts.size()); ++j) {
    for (int64_t r = 0; r < counts[j]; r += kTileRows)
      tiles.push_back({j, row + r, std::min<int64_t>(kTileRows, counts[j] - r)});
    row += counts[j];
  }
  return tiles;
}

}  // namespace

bool available() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

void gather_gemm(const float* x, int64_t ldx, int64_t k, const int64_t* tokens,
                 const std::vector<int64_t>& counts, int64_t s, const float* b, int64_t ldb,
                 const float* bias, float* c) {
  RECORD_FUNCTION("emoe::expert_gather_gemm", std::vector<c10::IValue>());
  const auto tiles = row_tiles(counts);
  parallel_by_cost(
      static_cast<int64_t>(tiles.size()), [&](int64_t i) { return static_cast<double>(tiles[i].rows); },
      [&](int64_t t0, int64_t t1) {
        const float* a[kTileRows];
        for (int64_t t = t0; t < t1; ++t) {
          const auto& tile = tiles[t];
          for (int64_t i = 0; i < tile.rows; ++i) a[i] = x + tokens[tile.row + i] * ldx;
          for (int64_t c0 = 0; c0 < s; c0 += kTileCols) {
            const auto ch = column_chunk(std::min(kTileCols, s - c0));
            kGatherTiles[tile.rows - 1][ch.nv - 1](a, k, b + tile.expert * s + c0, ldb, ch.tail,
                                                   bias ? bias + tile.expert * s + c0 : nullptr,
                                                   c + tile.row * s + c0, s);
          }
        }
      });
}

void scatter_gemm(const float* h, const int64_t* tokens, const std::vector<int64_t>& counts, int64_t s,
                  const float* b, int64_t ldb, int64_t n, float* y, int64_t ldy) {
  RECORD_FUNCTION("emoe::expert_scatter_gemm", std::vector<c10::IValue>());
  // Threads own column ranges of y (multiples of 16 wide): no two write the same element, and each
  // element's terms are added in expert order whatever the thread count.
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), (n + 15) / 16));
  const int64_t span = (n + 15) / 16 / threads * 16 + ((n + 15) / 16 % threads ? 16 : 0);
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    float* yp[kTileRows];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t lo = t * span, hi = std::min(n, lo + span);
      int64_t row = 0;
      for (int64_t j = 0; j < static_cast<int64_t>(counts.size()); row += counts[j], ++j) {
        const float* bj = b + j * s * ldb;
        for (int64_t c0 = lo; c0 < hi; c0 += kTileCols) {
          const auto ch = column_chunk(std::min(kTileCols, hi - c0));
          for (int64_t r = 0; r < counts[j]; r += kTileRows) {
            const int64_t rows = std::min<int64_t>(kTileRows, counts[j] - r);
            for (int64_t i = 0; i < rows; ++i) yp[i] = y + tokens[row + r + i] * ldy + c0;
            // the next tile's output rows, while this one computes
            for (int64_t i = r + kTileRows; i < std::min(counts[j], r + 2 * kTileRows); ++i)
              for (int64_t l = 0; l < ch.nv; ++l) __builtin_prefetch(y + tokens[row + i] * ldy + c0 + 16 * l, 1);
            kScatterTiles[rows - 1][ch.nv - 1](h + (row + r) * s, s, s, bj + c0, ldb, ch.tail, yp);
          }
        }
      }
    }
  });
}

void gather_weight_grad(const float* x, int64_t ldx, int64_t k, const int64_t* tokens,
                        const std::vector<int64_t>& counts, int64_t s, const float* h, float* w,
                        int64_t ldw) {
  RECORD_FUNCTION("emoe::expert_weight_grad", std::vector<c10::IValue>());
  // tiles: expert, column chunk, block of kTileRows columns of x — consecutive blocks share the
  // cache lines of the gathered rows. (Splitting an expert's rows into chunks that stay in L1
  // between blocks measured no faster, with balanced or skewed routing.)
  struct Tile {
    int64_t expert, row, c0, k0;
  };
  std::vector<Tile> tiles;
  int64_t row = 0;
  for (int64_t j = 0; j < static_cast<int64_t>(counts.size()); row += counts[j], ++j)
    for (int64_t c0 = 0; c0 < s; c0 += kTileCols)
      for (int64_t k0 = 0; k0 < k; k0 += kTileRows) tiles.push_back({j, row, c0, k0});
  parallel_by_cost(
      static_cast<int64_t>(tiles.size()),
      [&](int64_t i) { return 1.0 + static_cast<double>(counts[tiles[i].expert]); },
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const auto& tile = tiles[t];
          const auto ch = column_chunk(std::min(kTileCols, s - tile.c0));
          const int64_t rows = std::min<int64_t>(kTileRows, k - tile.k0);
          kWgradTiles[rows - 1][ch.nv - 1](x + tile.k0, ldx, tokens + tile.row, counts[tile.expert],
                                           h + tile.row * s + tile.c0, s, ch.tail,
                                           w + tile.k0 * ldw + tile.expert * s + tile.c0, ldw);
        }
      });
}

}  // namespace emoe::expert_kernels
