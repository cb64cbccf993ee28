// AMX tile kernels for bfloat16 dispatched experts (see expert_kernels.h).
//
// Why: on a CPU with AMX, oneDNN's dense bfloat16 products run on the tile unit (~1.7 TFLOP/s
// on two Sapphire Rapids cores) and the AVX-512 BF16 register tiles cannot follow (dispatched
// experts measured 1.41x the dense step there). One micro-kernel serves all three products: an
// accumulator of 16 rows x 16..64 float32 columns (1..4 tiles) summed over steps of 32 bf16 along
// the summed dimension, the left operand a 16 x 32 tile at one row stride, the right one a
// 16 pairs x 16 tile of packed pairs (pack_pairs' layout, zero-padded to whole tiles).
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "emoe/core/aligned.h"
#include "emoe/core/amx_tiles.h"
#include "emoe/moe/expert_kernels.h"
#include "emoe/moe/expert_kernels_detail.h"

namespace emoe::expert_kernels {

namespace amx_tiles {

using namespace emoe::amx;

constexpr int64_t kPanel = 64;  // columns of the micro-kernel's accumulators (4 tiles)
constexpr int64_t kBlock = 32;  // rows of the micro-kernel's accumulators (2 tiles)

// c[32, 0:16·NT] for 32 rows of a (two tiles, rows 0-15 and 16-31) against NT (1 or 2) column
// tiles of b: each b tile loaded once for both row tiles. Tiles 0..3 accumulate (row tile i,
// column tile n in tile 2i + n), 4 and 5 hold a, 6 and 7 b.
template <int NT>
EMOE_AMX void tile_gemm_32(const uint16_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                           int64_t steps, float* c, int64_t ldc) {
  const int64_t sa = lda * 2, sb = ldb * 4, sc = ldc * 4;
  _tile_zero(0);
  _tile_zero(2);
  if constexpr (NT > 1) {
    _tile_zero(1);
    _tile_zero(3);
  }
  for (int64_t t = 0; t < steps; ++t) {
    const uint32_t* bt = b + t * 16 * ldb;
    _tile_loadd(4, a + t * kStep, sa);
    _tile_loadd(5, a + 16 * lda + t * kStep, sa);
    _tile_loadd(6, bt, sb);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if constexpr (NT > 1) {
      _tile_loadd(7, bt + 16, sb);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, sc);
  _tile_stored(2, c + 16 * ldc, sc);
  if constexpr (NT > 1) {
    _tile_stored(1, c + 16, sc);
    _tile_stored(3, c + 16 * ldc + 16, sc);
  }
}

const TileGemm kTileGemm32[2] = {tile_gemm_32<1>, tile_gemm_32<2>};

// c[0:rows, 0:width] (row stride kPanel) = a[0:rows] · b over `steps`, for rows <= 32 and
// width <= 64: 32 rows two column tiles at a time (a's tiles reloaded per pair, each b tile
// serving both row tiles), 16 rows up to four column tiles at once. a must hold 32 readable rows
// when rows > 16 (the rows past `rows` are computed and ignored).
void panel_gemm(const uint16_t* a, int64_t lda, int64_t rows, const uint32_t* b, int64_t ldb,
                int64_t steps, int64_t width, float* c) {
  const int64_t tiles = (width + kCols - 1) / kCols;
  if (rows <= kRows) {
    kTileGemm16[tiles - 1](a, lda, b, ldb, steps, c, kPanel);
    return;
  }
  for (int64_t n = 0; n < tiles; n += 2)
    kTileGemm32[std::min<int64_t>(2, tiles - n) - 1](a, lda, b + n * kCols, ldb, steps,
                                                     c + n * kCols, kPanel);
}

// out[0:n] = bf16(acc[0:n] + bias[0:n]) (bias may be null)
EMOE_AMX void store_bf16(const float* acc, const float* bias, int64_t n, uint16_t* out) {
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = lanes(n - c);
    __m512 v = _mm512_maskz_loadu_ps(m, acc + c);
    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + c));
    _mm256_mask_storeu_epi16(out + c, m, (__m256i)_mm512_cvtneps_pbh(v));
  }
}

// y[0:n] += acc[0:n]
EMOE_AMX void add_into(const float* acc, int64_t n, float* y) {
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = lanes(n - c);
    _mm512_mask_storeu_ps(
        y + c, m,
        _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + c), _mm512_maskz_loadu_ps(m, acc + c)));
  }
}

// dst[kk·ld + c] = acc[c·kPanel + kk] for c < rows (<= 32), kk < width: each accumulator column
// gathered into a row of dst
EMOE_AMX void store_columns(const float* acc, int64_t rows, int64_t width, float* dst, int64_t ld) {
  const __m512i index = lane_offsets(kPanel);
  for (int64_t c0 = 0; c0 < rows; c0 += 16) {
    const __mmask16 m = lanes(rows - c0);
    const float* col = acc + c0 * kPanel;
    for (int64_t kk = 0; kk < width; ++kk)
      _mm512_mask_storeu_ps(dst + kk * ld + c0, m,
                            _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, index, col + kk, 4));
  }
}

// dst[c·ld + r] = src[r·s + c] for r < rows, c < s: 16 rows at a time, each pair of columns
// gathered as one 32-bit word per row and split into the two destination rows (a scalar
// transpose took ~0.6 ms of a 4 ms BERT-base weight gradient here)
EMOE_AMX void transpose_rows(const uint16_t* src, int64_t rows, int64_t s, uint16_t* dst,
                             int64_t ld) {
  const __m512i index = lane_offsets(s);
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const __mmask16 m = lanes(rows - r0);
    const uint16_t* block = src + r0 * s;
    int64_t c = 0;
    for (; c + 1 < s; c += 2) {  // element offsets at scale 2: bytes
      const __m512i pair =
          _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, index, block + c, 2);
      _mm256_mask_storeu_epi16(dst + c * ld + r0, m, _mm512_cvtepi32_epi16(pair));
      _mm256_mask_storeu_epi16(dst + (c + 1) * ld + r0, m,
                               _mm512_cvtepi32_epi16(_mm512_srli_epi32(pair, 16)));
    }
    if (c < s)  // an odd last column
      for (int64_t r = r0; r < std::min(rows, r0 + 16); ++r) dst[c * ld + r] = src[r * s + c];
  }
}

// Expert j's weights packed for the tiles: pack_pairs of its k x n block into a [kp/2, np]
// panel (row stride np words), zero in the padding rows and columns.
void pack_panel(const uint16_t* b, int64_t k, int64_t n, int64_t stride_k, int64_t stride_n,
                int64_t kp, int64_t np, uint32_t* out) {
  detail::pack_pairs(b, k, n, stride_k, stride_n, out, np);
  const int64_t pairs = (k + 1) / 2;
  if (np > n)
    for (int64_t p = 0; p < pairs; ++p) std::memset(out + p * np + n, 0, (np - n) * 4);
  if (kp / 2 > pairs) std::memset(out + pairs * np, 0, (kp / 2 - pairs) * np * 4);
}

}  // namespace amx_tiles

void gather_gemm_amx(const uint16_t* x, int64_t ldx, int64_t k, const int64_t* tokens,
                     const std::vector<int64_t>& counts, int64_t s, const uint16_t* b, int64_t b_k,
                     int64_t b_c, const float* bias, uint16_t* c) {
  using namespace amx_tiles;
  RECORD_FUNCTION("emoe::expert_gather_gemm_amx", std::vector<c10::IValue>());
  const int64_t kp = round_up(k, kStep), sp = round_up(s, kCols);
  const auto tiles = detail::row_tiles(counts, kBlock);
  detail::parallel_by_cost(
      static_cast<int64_t>(tiles.size()),
      [&](int64_t i) { return static_cast<double>(tiles[i].rows); },
      [&](int64_t t0, int64_t t1) {
        TileScope scope;
        auto a = aligned_array<uint16_t>(kBlock * kp);  // the block's token rows, zero past k
        std::memset(a.get(), 0, kBlock * kp * 2);
        // the current expert's weights, [kp/2, sp], packed by this thread as its tiles begin
        // (packed all at once before the tiles, the panels of BERT-base's 64 experts, 4.7 MB,
        // went out to memory and came back: ~15 % of the gather in a training step here)
        auto bj = aligned_array<uint32_t>(kp / 2 * sp);
        int64_t packed_expert = -1;
        alignas(64) float acc[kBlock * kPanel];
        for (int64_t t = t0; t < t1; ++t) {
          const auto& tile = tiles[t];
          if (tile.expert != packed_expert) {
            pack_panel(b + tile.expert * s * b_c, k, s, b_k, b_c, kp, sp, bj.get());
            packed_expert = tile.expert;
          }
          for (int64_t i = 0; i < tile.rows; ++i)
            std::memcpy(a.get() + i * kp, x + tokens[tile.row + i] * ldx, k * 2);
          for (int64_t c0 = 0; c0 < s; c0 += kPanel) {
            const int64_t width = std::min(kPanel, s - c0);
            panel_gemm(a.get(), kp, tile.rows, bj.get() + c0, sp, kp / kStep, width, acc);
            for (int64_t i = 0; i < tile.rows; ++i)
              store_bf16(acc + i * kPanel, bias ? bias + tile.expert * s + c0 : nullptr, width,
                         c + (tile.row + i) * s + c0);
          }
        }
      });
}

void scatter_gemm_amx(const uint16_t* h, const int64_t* tokens, const std::vector<int64_t>& counts,
                      int64_t s, const uint16_t* b, int64_t b_k, int64_t b_c, int64_t n, float* y,
                      int64_t ldy, int64_t y_rows, bool accumulate) {
  using namespace amx_tiles;
  RECORD_FUNCTION("emoe::expert_scatter_gemm_amx", std::vector<c10::IValue>());
  const int64_t e = static_cast<int64_t>(counts.size()), kp = round_up(s, kStep);
  const int64_t slabs = (n + kPanel - 1) / kPanel;
  // The weights are packed per 64 columns (a slab): expert j's block of slab q a [kp/2, 64]
  // panel of its own, so that a tile's 16 pair rows lie 256 bytes apart (at one row of all n
  // columns apart, the tiles' loads took ~1 ms more of a 4 ms BERT-base scatter here). Each
  // thread packs the panels of all experts for two slabs as it begins them (1 MB for BERT-base's
  // 64 experts, which stays in its cache; all slabs packed up front, 6 MB, went out to memory).
  const int64_t slab_panel = kp / 2 * kPanel;
  // h's rows padded to whole steps (zero past s), and a block of spare rows: the micro-kernel
  // reads 32 rows at a time
  int64_t rows = 0;
  for (auto m : counts) rows += m;
  auto hp = aligned_array<uint16_t>((rows + kBlock) * kp);
  at::parallel_for(0, rows + kBlock, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      uint16_t* dst = hp.get() + r * kp;
      const int64_t used = r < rows ? s : 0;
      if (used) std::memcpy(dst, h + r * s, s * 2);
      std::memset(dst + used, 0, (kp - used) * 2);
    }
  });
  // Token chunks: with each expert's tokens ascending (as routing gives them), the rows of a
  // chunk of tokens are a contiguous run of each expert's rows. A chunk's terms are summed in a
  // buffer of its own (rows 576 bytes apart: y's, 3072 bytes apart in BERT-base, fall in a
  // quarter of the first-level cache's sets), then written (or added) into y once, so that y
  // need not be zeroed first (6 MB per BERT-base call). About 48 rows of each expert per chunk,
  // at most 512 tokens. Tokens not ascending: one chunk, its terms added straight into y.
  // first[j·(chunks + 1) + c]: expert j's first row of chunk c (row offsets past its end: none).
  int64_t chunk = 0, chunks = 1;
  {
    bool ascending = true;
    int64_t last = 0;
    for (int64_t j = 0, r = 0; j < e && ascending; ++j)
      for (int64_t i = 0; i < counts[j]; ++i, ++r) {
        if (i > 0 && tokens[r] < tokens[r - 1]) ascending = false;
        last = std::max(last, tokens[r]);
      }
    if (ascending && rows > 0) {
      const int64_t per_expert = std::max<int64_t>(1, rows / std::max<int64_t>(1, e));
      chunk = std::clamp<int64_t>(round_up(48 * (last + 1) / per_expert, 16), 64, 512);
      chunks = (std::max(last + 1, y_rows) + chunk - 1) / chunk;
    }
  }
  std::vector<int64_t> first(e * (chunks + 1));
  for (int64_t j = 0, row = 0; j < e; row += counts[j], ++j) {
    int64_t r = row;
    for (int64_t c = 0; c < chunks; ++c) {
      first[j * (chunks + 1) + c] = r;
      if (chunk > 0)
        while (r < row + counts[j] && tokens[r] < (c + 1) * chunk) ++r;
    }
    first[j * (chunks + 1) + chunks] = row + counts[j];
  }
  // Threads own column ranges of y (whole slabs), so no two write the same element and each
  // element sums its experts' terms in expert order whatever the thread count (and whatever the
  // chunks: a token is in one).
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), slabs));
  const int64_t span = (slabs + threads - 1) / threads * kPanel;
  // Slabs in pairs: each block of h's rows runs through both while in the first-level cache (one
  // slab a pass, the passes read h's 4 MB from the third level 12 times in a BERT-base scatter;
  // pairs measured ~3 % faster here, three or six slabs slower: their panels leave the second).
  constexpr int64_t kGroup = 2 * kPanel;
  constexpr int64_t ld = kGroup + 16;  // the chunk buffer's row stride
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    TileScope scope;
    auto packed = aligned_array<uint32_t>(kGroup / kPanel * e * slab_panel);  // a pair's panels
    auto sums = aligned_array<float>(chunk * ld);  // a chunk's sums (chunks only)
    alignas(64) float acc[kBlock * kPanel];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t lo = t * span, hi = std::min(n, lo + span);
      if (chunk == 0 && !accumulate)
        for (int64_t r = 0; r < y_rows; ++r) std::memset(y + r * ldy + lo, 0, (hi - lo) * 4);
      for (int64_t g0 = lo; g0 < hi; g0 += kGroup) {
        const int64_t gw = std::min(hi, g0 + kGroup) - g0;
        for (int64_t q = 0; q * kPanel < gw; ++q)
          for (int64_t j = 0; j < e; ++j)
            pack_panel(b + j * s * b_k + (g0 + q * kPanel) * b_c, s,
                       std::min(kPanel, gw - q * kPanel), b_k, b_c, kp, kPanel,
                       packed.get() + (q * e + j) * slab_panel);
        for (int64_t c = 0; c < chunks; ++c) {
          // token tk's terms go into the chunk buffer's row tk - t_lo, or into y itself
          const int64_t t_lo = c * chunk, t_hi = std::min(y_rows, t_lo + chunk);
          auto row_of = [&](int64_t tk) {
            return chunk > 0 ? sums.get() + (tk - t_lo) * ld : y + tk * ldy + g0;
          };
          if (chunk > 0) std::memset(sums.get(), 0, chunk * ld * 4);
          for (int64_t j = 0; j < e; ++j) {
            const int64_t end = first[j * (chunks + 1) + c + 1];
            for (int64_t r = first[j * (chunks + 1) + c]; r < end; r += kBlock) {
              const int64_t block = std::min<int64_t>(kBlock, end - r);
              for (int64_t q = 0; q * kPanel < gw; ++q) {
                const int64_t width = std::min(kPanel, gw - q * kPanel);
                panel_gemm(hp.get() + r * kp, kp, block, packed.get() + (q * e + j) * slab_panel,
                           kPanel, kp / kStep, width, acc);
                for (int64_t i = 0; i < block; ++i)
                  add_into(acc + i * kPanel, width, row_of(tokens[r + i]) + q * kPanel);
              }
            }
          }
          if (chunk > 0)
            for (int64_t tk = t_lo; tk < t_hi; ++tk) {
              const float* src = sums.get() + (tk - t_lo) * ld;
              if (accumulate)
                add_into(src, gw, y + tk * ldy + g0);
              else
                std::memcpy(y + tk * ldy + g0, src, gw * 4);
            }
        }
      }
    }
  });
}

void gather_weight_grad_amx(const uint16_t* x, int64_t ldx, int64_t k, const int64_t* tokens,
                            const std::vector<int64_t>& counts, int64_t s, const uint16_t* h,
                            float* w, int64_t w_k, int64_t w_c) {
  using namespace amx_tiles;
  RECORD_FUNCTION("emoe::expert_weight_grad_amx", std::vector<c10::IValue>());
  // Computed transposed, w_jᵀ [s, k] = h_jᵀ [s, m] · x_j [m, k]: the left operand is h_jᵀ (a
  // small transpose per expert), the right one pairs of routed rows of x interleaved (contiguous
  // reads), and each accumulator tile is written back transposed.
  const int64_t e = static_cast<int64_t>(counts.size()), sp = round_up(s, kBlock);
  std::vector<int64_t> first(e + 1, 0), mp(e, 0), offset(e + 1, 0);
  for (int64_t j = 0; j < e; ++j) {
    first[j + 1] = first[j] + counts[j];
    mp[j] = round_up(counts[j], kStep);
    offset[j + 1] = offset[j] + sp * mp[j];
  }
  // expert j's h_jᵀ [sp, mp_j] at offset[j], zero-padded
  auto ht = aligned_array<uint16_t>(offset[e]);
  at::parallel_for(0, e, 1, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      uint16_t* t = ht.get() + offset[j];
      std::memset(t, 0, sp * mp[j] * 2);
      transpose_rows(h + first[j] * s, counts[j], s, t, mp[j]);
    }
  });
  // Work items: an expert and a chunk of 256 input features, whose routed rows are interleaved
  // once (contiguous 512-byte reads) for the four accumulator panels of the chunk.
  constexpr int64_t kChunk = 4 * kPanel;
  struct Tile {
    int64_t expert, k0;
  };
  std::vector<Tile> tiles;
  for (int64_t j = 0; j < e; ++j)
    for (int64_t k0 = 0; k0 < k; k0 += kChunk) tiles.push_back({j, k0});
  int64_t most = 0;
  for (auto m : mp) most = std::max(most, m);
  detail::parallel_by_cost(
      static_cast<int64_t>(tiles.size()),
      [&](int64_t i) { return 1.0 + static_cast<double>(counts[tiles[i].expert]); },
      [&](int64_t t0, int64_t t1) {
        TileScope scope;
        auto bx = aligned_array<uint32_t>(most / 2 * kChunk);  // pairs of routed rows, 256 features
        alignas(64) float acc[kBlock * kPanel];
        for (int64_t t = t0; t < t1; ++t) {
          const auto& tile = tiles[t];
          const int64_t j = tile.expert, m = counts[j], chunk = std::min(kChunk, k - tile.k0);
          if (m == 0) {
            for (int64_t kk = 0; kk < chunk; ++kk)
              for (int64_t c = 0; c < s; ++c) w[(tile.k0 + kk) * w_k + (j * s + c) * w_c] = 0.0f;
            continue;
          }
          const int64_t* tok = tokens + first[j];
          for (int64_t p = 0; p < mp[j] / 2; ++p) {
            uint32_t* out = bx.get() + p * kChunk;
            if (2 * p >= m) {
              std::memset(out, 0, kChunk * 4);
              continue;
            }
            interleave_pair(x + tok[2 * p] * ldx + tile.k0,
                            2 * p + 1 < m ? x + tok[2 * p + 1] * ldx + tile.k0 : nullptr, chunk,
                            out);
          }
          for (int64_t p0 = 0; p0 < chunk; p0 += kPanel) {
            const int64_t width = std::min(kPanel, chunk - p0);
            for (int64_t c0 = 0; c0 < s; c0 += kBlock) {
              const int64_t cs = std::min(kBlock, s - c0);
              panel_gemm(ht.get() + offset[j] + c0 * mp[j], mp[j], cs, bx.get() + p0, kChunk,
                         mp[j] / kStep, width, acc);
              float* dst = w + (tile.k0 + p0) * w_k + (j * s + c0) * w_c;
              if (w_k == 1) {  // rows of the gradient of a [E·s, d] weight: as computed
                for (int64_t c = 0; c < cs; ++c)
                  std::memcpy(dst + c * w_c, acc + c * kPanel, width * 4);
              } else if (w_c == 1) {  // [d, E·s] rows: the accumulators' columns
                store_columns(acc, cs, width, dst, w_k);
              } else {
                for (int64_t kk = 0; kk < width; ++kk)
                  for (int64_t c = 0; c < cs; ++c) dst[kk * w_k + c * w_c] = acc[c * kPanel + kk];
              }
            }
          }
        }
      });
}

}  // namespace emoe::expert_kernels
