// Attention's forward on AMX tiles (see attention_amx.h).
#include "emoe/models/attention_amx.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "emoe/core/aligned.h"
#include "emoe/core/amx_tiles.h"
#include "emoe/core/autocast_compat.h"
#include "emoe/core/bf16_round.h"
#include "emoe/models/row_kernels.h"

namespace emoe {

namespace {

using amx::kRows;
using amx::kStep;
using amx::lanes;
using amx::round_up;

// c[16, 0:width] = a · b over `steps`, width a multiple of 16, 64 columns at a time
void tile_rows(const uint16_t* a, int64_t lda, const uint32_t* b, int64_t ldb, int64_t steps,
               int64_t width, float* c, int64_t ldc) {
  for (int64_t c0 = 0; c0 < width; c0 += 64)
    amx::kTileGemm16[std::min<int64_t>(64, width - c0) / 16 - 1](a, lda, b + c0, ldb, steps, c + c0,
                                                                 ldc);
}

// kp[i·sp + j] = the pair (k[j][2i], k[j][2i + 1]) for j < s, i < d/2; zero for j in [s, sp) and
// for i in [d/2, dp/2): the keys transposed into the tiles' right operand of q kᵀ
EMOE_AMX void pack_keys(const uint16_t* k, int64_t ldk, int64_t s, int64_t d, int64_t sp,
                        int64_t dp, uint32_t* kp) {
  const __m512i index = amx::lane_offsets(ldk);
  for (int64_t j0 = 0; j0 < sp; j0 += 16) {
    const __mmask16 m = lanes(std::max<int64_t>(0, s - j0));
    for (int64_t i = 0; i < dp / 2; ++i) {
      __m512i v = _mm512_setzero_si512();
      if (i < d / 2 && m)  // element offsets at scale 2: bytes
        v = _mm512_mask_i32gather_epi32(v, m, index, k + j0 * ldk + 2 * i, 2);
      _mm512_storeu_si512(kp + i * sp + j0, v);
    }
  }
}

// vp[p·d + c] = v[2p][c] | v[2p + 1][c] << 16 for 2p < s (the odd last row's partner zero), zero
// rows for 2p >= s up to sp/2: the values as the right operand of p·v
EMOE_AMX void pack_values(const uint16_t* v, int64_t ldv, int64_t s, int64_t d, int64_t sp,
                          uint32_t* vp) {
  for (int64_t p = 0; p < sp / 2; ++p) {
    const int64_t r = 2 * p;
    if (r < s)
      amx::interleave_pair(v + r * ldv, r + 1 < s ? v + (r + 1) * ldv : nullptr, d, vp + p * d);
    else
      std::memset(vp + p * d, 0, static_cast<size_t>(d) * 4);
  }
}

// y[0:n] = bf16(x[0:n]), rounded to nearest even
EMOE_AMX void round_row(const float* x, int64_t n, uint16_t* y) {
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = lanes(n - c);
    const __m512i bits = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, x + c));
    _mm256_mask_storeu_epi16(y + c, m, _mm512_cvtepi32_epi16(bf16_round::rne(bits)));
  }
}

// The bfloat16 rows [n, d] (row stride in elements) of head `h` of batch row `bi` of t: t's own
// memory where it is bfloat16, else rounded into buf (row stride d).
const uint16_t* bf16_rows(const at::Tensor& t, int64_t bi, int64_t h, AlignedVector<uint16_t>& buf,
                          int64_t* stride) {
  const int64_t n = t.size(2), d = t.size(3);
  if (t.scalar_type() == at::kBFloat16) {
    *stride = t.stride(2);
    return reinterpret_cast<const uint16_t*>(t.data_ptr()) + bi * t.stride(0) + h * t.stride(1);
  }
  // float32 queries, keys or values (RoPE's, under autocast) rounded as autocast's product
  // rounds them
  if (buf.size() < static_cast<size_t>(n * d)) buf.resize(static_cast<size_t>(n * d));
  const float* src = t.data_ptr<float>() + bi * t.stride(0) + h * t.stride(1);
  for (int64_t r = 0; r < n; ++r) round_row(src + r * t.stride(2), d, buf.data() + r * d);
  *stride = d;
  return buf.data();
}

// 1 + the last column that any of the rows' masks leaves open: the columns past it get no
// scores and no products (a causal mask's upper triangle); s where a row has none open (its
// softmax is uniform over every column) or there is no mask.
int64_t open_columns(const uint8_t* const* rows, int64_t n, int64_t s) {
  int64_t limit = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* m = rows[i];
    if (!m) return s;
    int64_t j = s;
    while (j >= 8) {  // eight blocked columns (bool bytes of 1) at a time
      uint64_t w;
      std::memcpy(&w, m + j - 8, 8);
      if (w != 0x0101010101010101ULL) break;
      j -= 8;
    }
    while (j > 0 && m[j - 1]) --j;
    if (j == 0) return s;
    limit = std::max(limit, j);
  }
  return limit;
}

struct Shapes {
  int64_t b, hq, hkv, t, s, d, dp, sp;
};

// One (batch, key/value head): its keys and values packed, then each of its query heads' blocks
// of 16 queries.
EMOE_AMX void attend_group(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const uint8_t* mask, const int64_t* ms, double scale, const Shapes& z,
                           int64_t bi, int64_t g, uint16_t* out, AlignedVector<uint32_t>& kp,
                           AlignedVector<uint32_t>& vp, AlignedVector<uint16_t>& qs,
                           AlignedVector<float>& sc, AlignedVector<uint16_t>& sb,
                           AlignedVector<uint16_t>& pr, AlignedVector<float>& ob,
                           AlignedVector<float>& scratch, AlignedVector<uint16_t>& wide) {
  int64_t ldk = 0, ldv = 0, ldq = 0;
  const uint16_t* kb = bf16_rows(k, bi, g, wide, &ldk);
  pack_keys(kb, ldk, z.s, z.d, z.sp, z.dp, kp.data());
  const uint16_t* vb = bf16_rows(v, bi, g, wide, &ldv);
  pack_values(vb, ldv, z.s, z.d, z.sp, vp.data());
  const int64_t rep = z.hq / z.hkv;
  for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
    const uint16_t* qh = bf16_rows(q, bi, h, wide, &ldq);
    for (int64_t r0 = 0; r0 < z.t; r0 += kRows) {
      const int64_t rows = std::min(kRows, z.t - r0);
      // the block's queries, zero-padded to 16 rows of dp
      std::fill(qs.begin(), qs.end(), uint16_t{0});
      for (int64_t i = 0; i < rows; ++i)
        std::memcpy(qs.data() + i * z.dp, qh + (r0 + i) * ldq, static_cast<size_t>(z.d) * 2);
      const uint8_t* mrows[kRows] = {};
      for (int64_t i = 0; i < rows; ++i)
        mrows[i] = mask ? mask + bi * ms[0] + h * ms[1] + (r0 + i) * ms[2] : nullptr;
      // the columns past `width` are blocked for every row: no scores, zero probabilities (the
      // softmax over the first n columns, n a multiple of 16 or s, gives the bits of all s)
      const int64_t open = open_columns(mrows, rows, z.s);
      const int64_t width = round_up(open, kStep), n = std::min(z.s, round_up(open, 16));
      tile_rows(qs.data(), z.dp, kp.data(), z.sp, z.dp / kStep, width, sc.data(), z.sp);
      std::fill(pr.begin(), pr.end(), uint16_t{0});
      for (int64_t i = 0; i < rows; ++i) {
        round_row(sc.data() + i * z.sp, n, sb.data() + i * z.sp);
        masked_softmax_row_bf16(sb.data() + i * z.sp, mrows[i], scale, pr.data() + i * z.sp, n,
                                scratch.data());
      }
      tile_rows(pr.data(), z.sp, vp.data(), z.d, width / kStep, z.d, ob.data(), z.d);
      for (int64_t i = 0; i < rows; ++i)
        round_row(ob.data() + i * z.d, z.d, out + ((bi * z.t + r0 + i) * z.hq + h) * z.d);
    }
  }
}

}  // namespace

bool amx_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& mask) {
  // float32 operands only where CPU bf16 autocast rounds them for the products anyway
  const bool autocast_bf16 =
      autocast_enabled(at::kCPU) && autocast_dtype(at::kCPU) == at::kBFloat16;
  auto ok = [&](const at::Tensor& t) {
    return t.defined() && t.device().is_cpu() &&
           (t.scalar_type() == at::kBFloat16 || (autocast_bf16 && t.scalar_type() == at::kFloat)) &&
           t.dim() == 4 && t.stride(3) == 1 && !t.requires_grad();
  };
  if (!ok(q) || !ok(k) || !ok(v) || row_kernels_isa().empty() || !amx_available()) return false;
  const int64_t b = q.size(0), hq = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t hkv = k.size(1), s = k.size(2);
  if (k.size(0) != b || v.size(0) != b || v.size(1) != hkv || v.size(2) != s || k.size(3) != d ||
      v.size(3) != d || hkv == 0 || hq % hkv != 0 || d % 16 != 0 || d > 256 || t == 0 || s == 0)
    return false;
  if (!mask.defined()) return true;
  if (!mask.device().is_cpu() || mask.scalar_type() != at::kBool || mask.dim() != 4 ||
      mask.size(3) != s || mask.stride(3) != 1)
    return false;
  const int64_t want[4] = {b, hq, t, s};
  for (int64_t i = 0; i < 4; ++i)
    if (mask.size(i) != 1 && mask.size(i) != want[i]) return false;
  return true;
}

at::Tensor amx_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& mask, double scale) {
  TORCH_CHECK(amx_attention_applies(q, k, v, mask), "amx_attention: the kernel does not apply");
  RECORD_FUNCTION("emoe::amx_attention", std::vector<c10::IValue>());
  Shapes z{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), 0, 0};
  z.dp = round_up(z.d, kStep);
  z.sp = round_up(z.s, kStep);
  auto out = at::empty({z.b, z.t, z.hq, z.d}, q.options().dtype(at::kBFloat16));
  at::Tensor expanded;
  const uint8_t* mp = nullptr;
  int64_t ms[3] = {0, 0, 0};
  if (mask.defined()) {
    expanded = mask.expand({z.b, z.hq, z.t, z.s});
    mp = reinterpret_cast<const uint8_t*>(expanded.data_ptr());
    for (int i = 0; i < 3; ++i) ms[i] = expanded.stride(i);
  }
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, z.b * z.hkv, 1, [&](int64_t u0, int64_t u1) {
    AlignedVector<uint32_t> kp(static_cast<size_t>(z.dp / 2 * z.sp)),
        vp(static_cast<size_t>(z.sp / 2 * z.d));
    AlignedVector<uint16_t> qs(static_cast<size_t>(kRows * z.dp)),
        sb(static_cast<size_t>(kRows * z.sp)), pr(static_cast<size_t>(kRows * z.sp));
    AlignedVector<float> sc(static_cast<size_t>(kRows * z.sp)),
        ob(static_cast<size_t>(kRows * z.d)), scratch(static_cast<size_t>(z.sp));
    AlignedVector<uint16_t> wide;  // float32 rows rounded (bf16_rows)
    amx::TileScope tiles;
    for (int64_t u = u0; u < u1; ++u)
      attend_group(q, k, v, mp, ms, scale, z, u / z.hkv, u % z.hkv, op, kp, vp, qs, sc, sb, pr, ob,
                   scratch, wide);
  });
  return out.transpose(1, 2);
}

}  // namespace emoe
