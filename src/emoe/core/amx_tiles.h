// AMX tile helpers shared by the kernels that use the tile unit (the dispatched experts' products
// in moe/expert_kernels_amx.cpp, attention in models/attention_amx.cpp): the tile configuration,
// and the micro-kernel of a 16-row accumulator over steps of 32 bf16. Include only from files
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

}  // namespace amx
}  // namespace emoe
