// AMX tile helpers shared by the kernels that use the tile unit (the dispatched experts' products
// in moe/expert_kernels_amx.cpp, attention in models/attention_amx.cpp): the tile configuration,
// the micro-kernel of a 16-row accumulator over steps of 32 bf16, and the packing of rows into
// the pairs the tile instruction takes. Include only from files
// compiled alone (outside the unity batches): the functions carry AMX target attributes.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "emoe/core/cpu_info.h"  // amx_available()

namespace emoe {

namespace amx {

#define EMOE_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

constexpr int64_t kRows = 16;  // rows of a tile
constexpr int64_t kStep = 32;  // bf16 of the summed dimension per tile step (16 pairs)
constexpr int64_t kCols = 16;  // float32 columns of an accumulator tile

inline int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

// the first n (0..16) lanes
inline __mmask16 lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}
// The 64-byte operand of ldtilecfg: palette 1, every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

EMOE_AMX inline void configure_tiles() {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.colsb[i] = 64;
    cfg.rows[i] = kRows;
  }
  // GCC 12's _tile_loadconfig names only the first 8 bytes as its memory operand, so the
  // compiler dropped the stores of the tile shapes before it: the whole struct is the operand.
  __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

EMOE_AMX inline void release_tiles() {
  _tile_release();
}

// Tile state for the calling thread's parallel region: configured on entry, released on exit.
struct TileScope {
  TileScope() { configure_tiles(); }
  ~TileScope() { release_tiles(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// c[16, 0:16·NT] = Σ over `steps` of a[:, 32·t : 32·t + 32] · b[16·t : 16·t + 16, 0:16·NT]:
// a bf16 with row stride lda (elements), b packed pairs with row stride ldb (32-bit words), c
// float32 with row stride ldc. Tiles 0..3 accumulate, 4 holds a, 5..7 b.
template <int NT>
EMOE_AMX inline void tile_gemm(const uint16_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                               int64_t steps, float* c, int64_t ldc) {
  const int64_t sa = lda * 2, sb = ldb * 4, sc = ldc * 4;
  _tile_zero(0);
  if constexpr (NT > 1) _tile_zero(1);
  if constexpr (NT > 2) _tile_zero(2);
  if constexpr (NT > 3) _tile_zero(3);
  for (int64_t t = 0; t < steps; ++t) {
    const uint32_t* bt = b + t * 16 * ldb;
    _tile_loadd(4, a + t * kStep, sa);
    _tile_loadd(5, bt, sb);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (NT > 1) {
      _tile_loadd(6, bt + 16, sb);
      _tile_dpbf16ps(1, 4, 6);
    }
    if constexpr (NT > 2) {
      _tile_loadd(7, bt + 32, sb);
      _tile_dpbf16ps(2, 4, 7);
    }
    if constexpr (NT > 3) {
      _tile_loadd(5, bt + 48, sb);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, c, sc);
  if constexpr (NT > 1) _tile_stored(1, c + 16, sc);
  if constexpr (NT > 2) _tile_stored(2, c + 32, sc);
  if constexpr (NT > 3) _tile_stored(3, c + 48, sc);
}

// tile_gemm<NT> by its count of column tiles (1..4)
using TileGemm = void (*)(const uint16_t*, int64_t, const uint32_t*, int64_t, int64_t, float*,
                          int64_t);
inline const TileGemm kTileGemm16[4] = {tile_gemm<1>, tile_gemm<2>, tile_gemm<3>, tile_gemm<4>};

// lane i: i · stride (the offsets of a gather of 16 rows `stride` elements apart)
EMOE_AMX inline __m512i lane_offsets(int64_t stride) {
  return _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                            _mm512_set1_epi32(static_cast<int>(stride)));
}

// out[p][0:n] = x[t0][0:n] | x[t1][0:n] << 16 (t1's half zero when absent): two routed rows'
// features interleaved into the pairs of one step
EMOE_AMX inline void interleave_pair(const uint16_t* lo, const uint16_t* hi, int64_t n,
                                     uint32_t* out) {
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = lanes(n - c);
    const __m512i a = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo + c));
    const __m512i b =
        hi ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, hi + c)) : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(out + c, m, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
  }
}

}  // namespace amx
}  // namespace emoe
