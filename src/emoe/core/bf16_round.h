// float32 to bfloat16 bits rounded to nearest even (c10::BFloat16's and ATen's rule), in scalar
// and vector form, for the kernels that write bfloat16 themselves (row kernels, dropout, the
// optimiser's bf16 weight copies). NaN is not special-cased here: a NaN whose payload lies only
// in the low 16 bits rounds to infinity, so callers that may meet NaN blend it in themselves.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace emoe::bf16_round {

// the top 16 bits after adding 0x7fff plus the kept part's lowest bit
inline uint32_t rne(uint32_t bits) {
  return (bits + 0x7fffU + ((bits >> 16) & 1U)) >> 16;
}

// the same in each 32-bit lane (the result in the low 16 bits of each lane)
__attribute__((target("avx512f"))) inline __m512i rne(__m512i bits) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
                           16);
}

__attribute__((target("avx2"))) inline __m256i rne(__m256i bits) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))),
                           16);
}

// sixteen (eight) 32-bit lanes, each below 2^16, stored as 16-bit values at p
__attribute__((target("avx512f"))) inline void store_low_halves(uint16_t* p, __m512i lanes) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(lanes));
}

__attribute__((target("avx2"))) inline void store_low_halves(uint16_t* p, __m256i lanes) {
  // pack within 128-bit halves, then gather the halves' low quadwords
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lanes, lanes), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

}  // namespace emoe::bf16_round
