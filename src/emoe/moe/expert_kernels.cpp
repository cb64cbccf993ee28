// AVX-512 register-tile kernels for dispatched experts (see expert_kernels.h).
#include "emoe/moe/expert_kernels.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "emoe/core/aligned.h"
#include "emoe/moe/expert_kernels_detail.h"

namespace emoe::expert_kernels {

using detail::pack_pairs;
using detail::parallel_by_cost;
using detail::RowTile;

namespace {

// Only the tile functions below carry the AVX-512 target, and they have internal linkage: no
// inline function shared with the rest of the program is compiled for AVX-512 here.
#define EMOE_AVX512 __attribute__((target("avx512f")))

constexpr int kTileRows = 8;       // rows of a register tile
constexpr int64_t kTileCols = 48;  // columns of a register tile: 3 vectors, 24 accumulators

__mmask16 tail_mask(int64_t cols) {  // the first `cols` (1..16) lanes
  return cols >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << cols) - 1u);
}

// The register tile all three kernels share: acc[i][:] = Σ_t scalar(t, i) · row(t)[:] over
// t < steps, for R rows i and NV vectors of columns (the last one masked by `tail`).
template <int R, int NV, class RowAt, class ScalarAt>
EMOE_AVX512 inline __attribute__((always_inline)) void tile_accumulate(__m512 (&acc)[R][NV],
                                                                       int64_t steps,
                                                                       __mmask16 tail,
                                                                       const RowAt& row_at,
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
      rv[v] =
          v + 1 < NV ? _mm512_loadu_ps(row + 16 * v) : _mm512_maskz_loadu_ps(tail, row + 16 * v);
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

// The tiles' two epilogues: y_i[:] += acc[i][:] (rows anywhere), w[i, :] = acc[i][:] (strided
// rows).
template <int R, int NV>
EMOE_AVX512 inline __attribute__((always_inline)) void add_into_rows(const __m512 (&acc)[R][NV],
                                                                     __mmask16 tail,
                                                                     float* const* y) {
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = vector_mask(v, NV, tail);
      float* p = y[i] + 16 * v;
      _mm512_mask_storeu_ps(p, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, p), acc[i][v]));
    }
}

template <int R, int NV>
EMOE_AVX512 inline __attribute__((always_inline)) void store_rows(const __m512 (&acc)[R][NV],
                                                                  __mmask16 tail, float* w,
                                                                  int64_t ldw) {
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v)
      _mm512_mask_storeu_ps(w + i * ldw + 16 * v, vector_mask(v, NV, tail), acc[i][v]);
}

// c[i, :] (+bias) = Σ_kk a_i[kk] · b[kk, :]
template <int R, int NV>
EMOE_AVX512 void tile_gather(const float* const* a, int64_t k, const float* b, int64_t ldb,
                             __mmask16 tail, const float* bias, float* c, int64_t ldc) {
  const float* ap[R];
  for (int i = 0; i < R; ++i) ap[i] = a[i];
  __m512 acc[R][NV];
  tile_accumulate<R, NV>(
      acc, k, tail, [&](int64_t kk) { return b + kk * ldb; },
      [&](int64_t kk, int i) { return ap[i][kk]; });
#pragma GCC unroll 3
  for (int v = 0; v < NV; ++v) {
    const __mmask16 m = vector_mask(v, NV, tail);
    const __m512 bb = bias ? _mm512_maskz_loadu_ps(m, bias + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i)
      _mm512_mask_storeu_ps(c + i * ldc + 16 * v, m, _mm512_add_ps(acc[i][v], bb));
  }
}

// y_i[:] += Σ_kk h[i, kk] · b[kk, :] for R rows of h (row stride ldh), s terms
template <int R, int NV>
EMOE_AVX512 void tile_scatter(const float* h, int64_t ldh, int64_t s, const float* b, int64_t ldb,
                              __mmask16 tail, float* const* y) {
  __m512 acc[R][NV];
  tile_accumulate<R, NV>(
      acc, s, tail, [&](int64_t kk) { return b + kk * ldb; },
      [&](int64_t kk, int i) { return h[i * ldh + kk]; });
  add_into_rows<R, NV>(acc, tail, y);
}

// w[i, :] = Σ_r x[tokens[r]][i] · h[r, :] for R consecutive columns i of x (x offset to them)
template <int R, int NV>
EMOE_AVX512 void tile_wgrad(const float* x, int64_t ldx, const int64_t* tokens, int64_t m,
                            const float* h, int64_t ldh, __mmask16 tail, float* w, int64_t ldw) {
  __m512 acc[R][NV];
  tile_accumulate<R, NV>(
      acc, m, tail, [&](int64_t r) { return h + r * ldh; },
      [&](int64_t r, int i) { return x[tokens[r] * ldx + i]; });
  store_rows<R, NV>(acc, tail, w, ldw);
}

using GatherTile = void (*)(const float* const*, int64_t, const float*, int64_t, __mmask16,
                            const float*, float*, int64_t);
using ScatterTile = void (*)(const float*, int64_t, int64_t, const float*, int64_t, __mmask16,
                             float* const*);
using WgradTile = void (*)(const float*, int64_t, const int64_t*, int64_t, const float*, int64_t,
                           __mmask16, float*, int64_t);

// [rows - 1][vectors - 1] (the bfloat16 tables below use the same macros)
#define EMOE_TILE_ROW(F, R) \
  { &F<R, 1>, &F<R, 2>, &F<R, 3> }
#define EMOE_TILE_TABLE(F)                                                                 \
  {                                                                                        \
    EMOE_TILE_ROW(F, 1), EMOE_TILE_ROW(F, 2), EMOE_TILE_ROW(F, 3), EMOE_TILE_ROW(F, 4),    \
        EMOE_TILE_ROW(F, 5), EMOE_TILE_ROW(F, 6), EMOE_TILE_ROW(F, 7), EMOE_TILE_ROW(F, 8) \
  }
const GatherTile kGatherTiles[kTileRows][3] = EMOE_TILE_TABLE(tile_gather);
const ScatterTile kScatterTiles[kTileRows][3] = EMOE_TILE_TABLE(tile_scatter);
const WgradTile kWgradTiles[kTileRows][3] = EMOE_TILE_TABLE(tile_wgrad);

// A column chunk [c0, c0 + width) of at most kTileCols: its vector count and last vector's mask.
struct Chunk {
  int nv;
  __mmask16 tail;
};
Chunk column_chunk(int64_t width) {
  const int64_t nv = (width + 15) / 16;
  return {static_cast<int>(nv), tail_mask(width - 16 * (nv - 1))};
}

// --- bfloat16: AVX-512 BF16 (vdpbf16ps) ------------------------------------------------------
// vdpbf16ps multiplies pairs of bf16 along the summed dimension: lane c of the accumulator gets
// a[2p]·b[2p][c] + a[2p+1]·b[2p+1][c]. The right-hand operand is packed so that each 32-bit lane
// holds such a pair (`pack_pairs`: [ceil(K/2)][N], the odd K's last pair with a zero high half);
// the left-hand pair is one 32-bit broadcast, read straight from a row whose summed dimension is
// contiguous (an input row, h) or, for the weight gradients, from a small buffer of interleaved
// token rows made per tile. The products are exact and summed in float32.
#define EMOE_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

inline uint32_t load_pair(const uint16_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// acc[i][:] += a_at(i) ⊙ row[:] (bf16 pairs) for R rows and NV vectors (the last one masked).
// (A helper rather than a lambda: lambdas do not inherit the target attribute.)
template <int R, int NV, class AAt>
EMOE_AVX512BF16 inline __attribute__((always_inline)) void dp_step(__m512 (&acc)[R][NV],
                                                                   const uint32_t* row,
                                                                   __mmask16 tail,
                                                                   const AAt& a_at) {
  __m512i rv[NV];
#pragma GCC unroll 3
  for (int v = 0; v < NV; ++v)
    rv[v] = v + 1 < NV ? _mm512_loadu_si512(row + 16 * v)
                       : _mm512_maskz_loadu_epi32(tail, row + 16 * v);
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    const __m512i av = _mm512_set1_epi32(static_cast<int>(a_at(i)));
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v)
      acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)av, (__m512bh)rv[v]);
  }
}

// acc[i][:] = Σ_p pair_at(p, i) ⊙ row_at(p)[:] over p < pairs (bf16 pairs), then, when `odd`,
// + last_at(i) (one bf16, the high half zero) ⊙ row_at(pairs)[:].
template <int R, int NV, class RowAt, class PairAt, class LastAt>
EMOE_AVX512BF16 inline __attribute__((always_inline)) void tile_accumulate_bf16(
    __m512 (&acc)[R][NV], int64_t pairs, bool odd, __mmask16 tail, const RowAt& row_at,
    const PairAt& pair_at, const LastAt& last_at) {
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p)
    dp_step<R, NV>(acc, row_at(p), tail, [&](int i) { return pair_at(p, i); });
  if (odd) dp_step<R, NV>(acc, row_at(pairs), tail, [&](int i) { return uint32_t{last_at(i)}; });
}

// c[i, :] = bf16(Σ_kk a_i[kk] · b[kk, :] (+ bias)), b packed in pairs (row stride ldb words)
template <int R, int NV>
EMOE_AVX512BF16 void tile_gather_bf16(const uint16_t* const* a, int64_t k, const uint32_t* b,
                                      int64_t ldb, __mmask16 tail, const float* bias, uint16_t* c,
                                      int64_t ldc) {
  const uint16_t* ap[R];
  for (int i = 0; i < R; ++i) ap[i] = a[i];
  __m512 acc[R][NV];
  tile_accumulate_bf16<R, NV>(
      acc, k / 2, k % 2 != 0, tail, [&](int64_t p) { return b + p * ldb; },
      [&](int64_t p, int i) { return load_pair(ap[i] + 2 * p); },
      [&](int i) { return ap[i][k - 1]; });
#pragma GCC unroll 3
  for (int v = 0; v < NV; ++v) {
    const __mmask16 m = vector_mask(v, NV, tail);
    const __m512 bb = bias ? _mm512_maskz_loadu_ps(m, bias + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i)
      _mm256_mask_storeu_epi16(c + i * ldc + 16 * v, m,
                               (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[i][v], bb)));
  }
}

// y_i[:] += Σ_kk h[i, kk] · b[kk, :] in float32 for R rows of h (row stride ldh), s terms
template <int R, int NV>
EMOE_AVX512BF16 void tile_scatter_bf16(const uint16_t* h, int64_t ldh, int64_t s, const uint32_t* b,
                                       int64_t ldb, __mmask16 tail, float* const* y) {
  __m512 acc[R][NV];
  tile_accumulate_bf16<R, NV>(
      acc, s / 2, s % 2 != 0, tail, [&](int64_t p) { return b + p * ldb; },
      [&](int64_t p, int i) { return load_pair(h + i * ldh + 2 * p); },
      [&](int i) { return h[i * ldh + s - 1]; });
  add_into_rows<R, NV>(acc, tail, y);
}

// w[i, :] = Σ_p at[p·8 + i] ⊙ b[p, :] (float32) for R rows i: `at` holds, per pair of routed
// rows, their tokens' elements of R consecutive input features interleaved
template <int R, int NV>
EMOE_AVX512BF16 void tile_wgrad_bf16(const uint32_t* at, int64_t pairs, const uint32_t* b,
                                     int64_t ldb, __mmask16 tail, float* w, int64_t ldw) {
  __m512 acc[R][NV];
  tile_accumulate_bf16<R, NV>(
      acc, pairs, false, tail, [&](int64_t p) { return b + p * ldb; },
      [&](int64_t p, int i) { return at[p * kTileRows + i]; }, [&](int) { return uint16_t{0}; });
  store_rows<R, NV>(acc, tail, w, ldw);
}

// at[p·8 + i] = x[t0][i] | x[t1][i] << 16 for the pair (t0, t1) = (tokens[2p], tokens[2p+1]) of
// m rows (the last pair's second row zero when m is odd), i < R (R <= 8: the rest zero)
EMOE_AVX512BF16 void interleave_rows_bf16(const uint16_t* x, int64_t ldx, const int64_t* tokens,
                                          int64_t m, int r, uint32_t* at) {
  const __mmask8 mask = static_cast<__mmask8>((1u << r) - 1u);
  for (int64_t p = 0; 2 * p < m; ++p) {
    const __m128i lo = _mm_maskz_loadu_epi16(mask, x + tokens[2 * p] * ldx);
    const __m128i hi = 2 * p + 1 < m ? _mm_maskz_loadu_epi16(mask, x + tokens[2 * p + 1] * ldx)
                                     : _mm_setzero_si128();
    _mm_storeu_si128(reinterpret_cast<__m128i*>(at + p * kTileRows), _mm_unpacklo_epi16(lo, hi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(at + p * kTileRows + 4),
                     _mm_unpackhi_epi16(lo, hi));
  }
}

using GatherTileBf16 = void (*)(const uint16_t* const*, int64_t, const uint32_t*, int64_t,
                                __mmask16, const float*, uint16_t*, int64_t);
using ScatterTileBf16 = void (*)(const uint16_t*, int64_t, int64_t, const uint32_t*, int64_t,
                                 __mmask16, float* const*);
using WgradTileBf16 = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, __mmask16,
                               float*, int64_t);

const GatherTileBf16 kGatherTilesBf16[kTileRows][3] = EMOE_TILE_TABLE(tile_gather_bf16);
const ScatterTileBf16 kScatterTilesBf16[kTileRows][3] = EMOE_TILE_TABLE(tile_scatter_bf16);
const WgradTileBf16 kWgradTilesBf16[kTileRows][3] = EMOE_TILE_TABLE(tile_wgrad_bf16);
#undef EMOE_TILE_TABLE
#undef EMOE_TILE_ROW

// The row tiles of a gather, over the intra-op threads by cost: tile(a, tile, c0, chunk) with a
// the tile's input rows (x's rows of its tokens), for each column chunk of the s outputs.
template <class T, class TileFn>
void for_gather_tiles(const T* x, int64_t ldx, const int64_t* tokens,
                      const std::vector<int64_t>& counts, int64_t s, const TileFn& tile_fn) {
  const auto tiles = detail::row_tiles(counts, kTileRows);
  parallel_by_cost(
      static_cast<int64_t>(tiles.size()),
      [&](int64_t i) { return static_cast<double>(tiles[i].rows); },
      [&](int64_t t0, int64_t t1) {
        const T* a[kTileRows];
        for (int64_t t = t0; t < t1; ++t) {
          const auto& tile = tiles[t];
          for (int64_t i = 0; i < tile.rows; ++i) a[i] = x + tokens[tile.row + i] * ldx;
          for (int64_t c0 = 0; c0 < s; c0 += kTileCols)
            tile_fn(a, tile, c0, column_chunk(std::min(kTileCols, s - c0)));
        }
      });
}

// The tiles of a scatter into y [.., n]: threads own column ranges of y (multiples of 16 wide), so
// no two write the same element and each element sums its experts' terms in expert order
// whatever the thread count. tile_fn(expert, first row, rows, c0, chunk, y rows).
template <class TileFn>
void for_scatter_tiles(const int64_t* tokens, const std::vector<int64_t>& counts, int64_t n,
                       float* y, int64_t ldy, const TileFn& tile_fn) {
  const int64_t threads =
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), (n + 15) / 16));
  const int64_t span = (n + 15) / 16 / threads * 16 + ((n + 15) / 16 % threads ? 16 : 0);
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    float* yp[kTileRows];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t lo = t * span, hi = std::min(n, lo + span);
      int64_t row = 0;
      for (int64_t j = 0; j < static_cast<int64_t>(counts.size()); row += counts[j], ++j) {
        for (int64_t c0 = lo; c0 < hi; c0 += kTileCols) {
          const auto ch = column_chunk(std::min(kTileCols, hi - c0));
          for (int64_t r = 0; r < counts[j]; r += kTileRows) {
            const int64_t rows = std::min<int64_t>(kTileRows, counts[j] - r);
            for (int64_t i = 0; i < rows; ++i) yp[i] = y + tokens[row + r + i] * ldy + c0;
            // the next tile's output rows, while this one computes
            for (int64_t i = r + kTileRows; i < std::min(counts[j], r + 2 * kTileRows); ++i)
              for (int64_t l = 0; l < ch.nv; ++l)
                __builtin_prefetch(y + tokens[row + i] * ldy + c0 + 16 * l, 1);
            tile_fn(j, row + r, rows, c0, ch, yp);
          }
        }
      }
    }
  });
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
  for_gather_tiles(x, ldx, tokens, counts, s,
                   [&](const float* const* a, const RowTile& tile, int64_t c0, Chunk ch) {
                     kGatherTiles[tile.rows - 1][ch.nv - 1](
                         a, k, b + tile.expert * s + c0, ldb, ch.tail,
                         bias ? bias + tile.expert * s + c0 : nullptr, c + tile.row * s + c0, s);
                   });
}

void scatter_gemm(const float* h, const int64_t* tokens, const std::vector<int64_t>& counts,
                  int64_t s, const float* b, int64_t ldb, int64_t n, float* y, int64_t ldy) {
  RECORD_FUNCTION("emoe::expert_scatter_gemm", std::vector<c10::IValue>());
  for_scatter_tiles(
      tokens, counts, n, y, ldy,
      [&](int64_t j, int64_t row, int64_t rows, int64_t c0, Chunk ch, float* const* yp) {
        kScatterTiles[rows - 1][ch.nv - 1](h + row * s, s, s, b + j * s * ldb + c0, ldb, ch.tail,
                                           yp);
      });
}

namespace {

// a [rows, cols] tile (row stride kTileCols) into w[kk·w_k + c·w_c]: for destinations whose
// columns are not contiguous (the gradient of a [E·s, d] weight, w_k 1: each column's rows are)
void store_tile_strided(const float* tile, int64_t rows, int64_t cols, float* w, int64_t w_k,
                        int64_t w_c) {
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t kk = 0; kk < rows; ++kk) w[kk * w_k + c * w_c] = tile[kk * kTileCols + c];
}

}  // namespace

void gather_weight_grad(const float* x, int64_t ldx, int64_t k, const int64_t* tokens,
                        const std::vector<int64_t>& counts, int64_t s, const float* h, float* w,
                        int64_t w_k, int64_t w_c) {
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
        alignas(64) float buf[kTileRows * kTileCols];  // a tile, where w's columns are strided
        for (int64_t t = t0; t < t1; ++t) {
          const auto& tile = tiles[t];
          const int64_t cols = std::min(kTileCols, s - tile.c0);
          const auto ch = column_chunk(cols);
          const int64_t rows = std::min<int64_t>(kTileRows, k - tile.k0);
          float* dst = w + tile.k0 * w_k + (tile.expert * s + tile.c0) * w_c;
          kWgradTiles[rows - 1][ch.nv - 1](x + tile.k0, ldx, tokens + tile.row, counts[tile.expert],
                                           h + tile.row * s + tile.c0, s, ch.tail,
                                           w_c == 1 ? dst : buf, w_c == 1 ? w_k : kTileCols);
          if (w_c != 1) store_tile_strided(buf, rows, cols, dst, w_k, w_c);
        }
      });
}

// --- bfloat16 ---------------------------------------------------------------------------------

bool bf16_available() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return ok;
}

void gather_gemm_bf16(const uint16_t* x, int64_t ldx, int64_t k, const int64_t* tokens,
                      const std::vector<int64_t>& counts, int64_t s, const uint16_t* b, int64_t b_k,
                      int64_t b_c, const float* bias, uint16_t* c) {
  RECORD_FUNCTION("emoe::expert_gather_gemm_bf16", std::vector<c10::IValue>());
  const int64_t e = static_cast<int64_t>(counts.size()), pairs = (k + 1) / 2;
  // expert j's [pairs, s] panel at j·pairs·s, pairs along k
  auto packed = aligned_array<uint32_t>(e * pairs * s);
  if (b_c == 1) {
    // the experts' blocks side by side in each row of b ([k, E·s] rows): two whole rows at a time
    // into every expert's panel, where packing expert by expert walked all k rows E times, s
    // elements each (the backward pass's w_out: 1.25 ms per BERT-base layer)
    at::parallel_for(0, pairs, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const uint16_t* lo = b + 2 * p * b_k;
        const uint16_t* hi = 2 * p + 1 < k ? lo + b_k : nullptr;
        for (int64_t j = 0; j < e; ++j) {
          uint32_t* o = packed.get() + j * pairs * s + p * s;
          const uint16_t* l = lo + j * s;
          if (hi) {
            const uint16_t* h = hi + j * s;
            for (int64_t c = 0; c < s; ++c) o[c] = uint32_t{l[c]} | uint32_t{h[c]} << 16;
          } else {
            for (int64_t c = 0; c < s; ++c) o[c] = l[c];
          }
        }
      }
    });
  } else {
    at::parallel_for(0, e, 1, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j)
        pack_pairs(b + j * s * b_c, k, s, b_k, b_c, packed.get() + j * pairs * s, s);
    });
  }
  for_gather_tiles(x, ldx, tokens, counts, s,
                   [&](const uint16_t* const* a, const RowTile& tile, int64_t c0, Chunk ch) {
                     kGatherTilesBf16[tile.rows - 1][ch.nv - 1](
                         a, k, packed.get() + tile.expert * pairs * s + c0, s, ch.tail,
                         bias ? bias + tile.expert * s + c0 : nullptr, c + tile.row * s + c0, s);
                   });
}

void scatter_gemm_bf16(const uint16_t* h, const int64_t* tokens, const std::vector<int64_t>& counts,
                       int64_t s, const uint16_t* b, int64_t b_k, int64_t b_c, int64_t n, float* y,
                       int64_t ldy) {
  RECORD_FUNCTION("emoe::expert_scatter_gemm_bf16", std::vector<c10::IValue>());
  const int64_t e = static_cast<int64_t>(counts.size()), pairs = (s + 1) / 2;
  auto packed = aligned_array<uint32_t>(e * pairs * n);  // expert j's [pairs, n] block at j·pairs·n
  at::parallel_for(0, e, 1, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j)
      pack_pairs(b + j * s * b_k, s, n, b_k, b_c, packed.get() + j * pairs * n, n);
  });
  for_scatter_tiles(
      tokens, counts, n, y, ldy,
      [&](int64_t j, int64_t row, int64_t rows, int64_t c0, Chunk ch, float* const* yp) {
        kScatterTilesBf16[rows - 1][ch.nv - 1](h + row * s, s, s, packed.get() + j * pairs * n + c0,
                                               n, ch.tail, yp);
      });
}

void gather_weight_grad_bf16(const uint16_t* x, int64_t ldx, int64_t k, const int64_t* tokens,
                             const std::vector<int64_t>& counts, int64_t s, const uint16_t* h,
                             float* w, int64_t w_k, int64_t w_c) {
  RECORD_FUNCTION("emoe::expert_weight_grad_bf16", std::vector<c10::IValue>());
  const int64_t e = static_cast<int64_t>(counts.size());
  // h's rows of each expert packed in pairs: expert j's [ceil(m_j/2), s] block at offset[j]
  std::vector<int64_t> first(e + 1, 0), offset(e + 1, 0);
  for (int64_t j = 0; j < e; ++j) {
    first[j + 1] = first[j] + counts[j];
    offset[j + 1] = offset[j] + (counts[j] + 1) / 2 * s;
  }
  auto packed = aligned_array<uint32_t>(offset[e]);
  at::parallel_for(0, e, 1, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j)
      pack_pairs(h + first[j] * s, counts[j], s, s, 1, packed.get() + offset[j], s);
  });
  struct Tile {
    int64_t expert, k0;
  };
  std::vector<Tile> tiles;
  for (int64_t j = 0; j < e; ++j)
    for (int64_t k0 = 0; k0 < k; k0 += kTileRows) tiles.push_back({j, k0});
  int64_t most = 1;
  for (auto m : counts) most = std::max(most, m);
  parallel_by_cost(
      static_cast<int64_t>(tiles.size()),
      [&](int64_t i) { return 1.0 + static_cast<double>(counts[tiles[i].expert]); },
      [&](int64_t t0, int64_t t1) {
        // this thread's interleaved token rows
        auto at = aligned_array<uint32_t>((most + 1) / 2 * kTileRows);
        alignas(64) float buf[kTileRows * kTileCols];  // a tile, where w's columns are strided
        for (int64_t t = t0; t < t1; ++t) {
          const auto& tile = tiles[t];
          const int64_t m = counts[tile.expert], pairs = (m + 1) / 2;
          const int r = static_cast<int>(std::min<int64_t>(kTileRows, k - tile.k0));
          interleave_rows_bf16(x + tile.k0, ldx, tokens + first[tile.expert], m, r, at.get());
          for (int64_t c0 = 0; c0 < s; c0 += kTileCols) {
            const int64_t cols = std::min(kTileCols, s - c0);
            const auto ch = column_chunk(cols);
            float* dst = w + tile.k0 * w_k + (tile.expert * s + c0) * w_c;
            kWgradTilesBf16[r - 1][ch.nv - 1](at.get(), pairs,
                                              packed.get() + offset[tile.expert] + c0, s, ch.tail,
                                              w_c == 1 ? dst : buf, w_c == 1 ? w_k : kTileCols);
            if (w_c != 1) store_tile_strided(buf, r, cols, dst, w_k, w_c);
          }
        }
      });
}

namespace {

// (GCC 12 takes the intrinsics' deliberately undefined pass-through operands for uninitialised
// reads)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// r[i] = column i of the 16 x 16 matrix of 32-bit words whose row i is r[i]: pairs of words,
// then pairs of 64-bit halves, then 128-bit lanes, exchanged between rows.
EMOE_AVX512 inline __attribute__((always_inline)) void transpose_words(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

// out[p·ldo + c] = the 32-bit word 2p, 2p + 1 of column c, for p < full_pairs and 16 columns c
// starting at b with stride stride_n (elements): blocks of 16 words of the 16 columns loaded and
// transposed in registers (a vector gather per row of out took 1.3x as long for a BERT-base
// expert's 768 x 48 block, 1.8x for a 48 x 64 one, the weights in cache).
EMOE_AVX512 void transpose_pair_rows(const uint16_t* b, int64_t full_pairs, int64_t stride_n,
                                     uint32_t* out, int64_t ldo) {
  for (int64_t p0 = 0; p0 < full_pairs; p0 += 16) {
    const int64_t np = std::min<int64_t>(16, full_pairs - p0);
    const __mmask16 m = tail_mask(np);
    __m512i r[16];
    for (int c = 0; c < 16; ++c) r[c] = _mm512_maskz_loadu_epi32(m, b + c * stride_n + 2 * p0);
    transpose_words(r);
    for (int64_t i = 0; i < np; ++i) _mm512_storeu_si512(out + (p0 + i) * ldo, r[i]);
  }
}
#pragma GCC diagnostic pop

}  // namespace

namespace detail {

// out[p][c] = S(2p, c) | S(2p + 1, c) << 16 with S(kk, c) = b[kk·stride_k + c·stride_n] (zero
// past K), for p < ceil(K/2), c < n; out row stride ldo.
void pack_pairs(const uint16_t* b, int64_t k, int64_t n, int64_t stride_k, int64_t stride_n,
                uint32_t* out, int64_t ldo) {
  RECORD_FUNCTION("emoe::pack_pairs", std::vector<c10::IValue>());
  const int64_t pairs = (k + 1) / 2;
  if (stride_k == 1) {  // pairs contiguous in b: a transpose of 32-bit words, in 16 x 16 blocks
    const bool vectors = available();
    at::parallel_for(0, (n + 15) / 16, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t cb = b0; cb < b1; ++cb)
        if (vectors && cb * 16 + 16 <= n) {  // 16 columns' whole pairs in registers
          transpose_pair_rows(b + cb * 16 * stride_n, k / 2, stride_n, out + cb * 16, ldo);
          if (k % 2)
            for (int64_t c = cb * 16; c < cb * 16 + 16; ++c)
              out[k / 2 * ldo + c] = b[c * stride_n + k - 1];
        } else {
          for (int64_t p0 = 0; p0 < pairs; p0 += 16)
            for (int64_t c = cb * 16; c < std::min(n, cb * 16 + 16); ++c) {
              const uint16_t* col = b + c * stride_n;
              for (int64_t p = p0; p < std::min(pairs, p0 + 16); ++p)
                out[p * ldo + c] = 2 * p + 1 < k ? load_pair(col + 2 * p) : col[2 * p];
            }
        }
    });
    return;
  }
  at::parallel_for(0, pairs, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const uint16_t* lo = b + 2 * p * stride_k;
      const uint16_t* hi = 2 * p + 1 < k ? lo + stride_k : nullptr;
      uint32_t* o = out + p * ldo;
      if (stride_n == 1 && hi) {
        for (int64_t c = 0; c < n; ++c) o[c] = uint32_t{lo[c]} | uint32_t{hi[c]} << 16;
      } else {
        for (int64_t c = 0; c < n; ++c)
          o[c] = uint32_t{lo[c * stride_n]} | (hi ? uint32_t{hi[c * stride_n]} << 16 : 0u);
      }
    }
  });
}

}  // namespace detail

}  // namespace emoe::expert_kernels
