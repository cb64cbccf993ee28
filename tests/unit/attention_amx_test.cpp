// Attention's forward on AMX tiles (models/attention_amx.h): against float64, against the path
// without it (batched products + the softmax kernel), and where it applies.
#include "emoe/models/attention_amx.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "emoe/core/autocast_compat.h"
#include "emoe/core/cpu_info.h"
#include "emoe/models/attention.h"
#include "emoe/models/matmul.h"
#include "emoe/models/row_kernels.h"
#include "support/test_support.h"

namespace {

// softmax(scale q kᵀ, mask) v in float64, grouped-query heads repeated
torch::Tensor reference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& mask, double scale) {
  const int64_t rep = q.size(1) / k.size(1);
  auto k64 = k.to(torch::kDouble).repeat_interleave(rep, 1);
  auto v64 = v.to(torch::kDouble).repeat_interleave(rep, 1);
  auto scores = torch::matmul(q.to(torch::kDouble), k64.transpose(-2, -1)) * scale;
  if (mask.defined()) scores = scores.masked_fill(mask, -1e300);
  return torch::matmul(scores.softmax(-1), v64);
}

// The path without the tiles, for one key/value head per query head: the scores' product, the
// softmax kernel (scale inside), the context's product.
torch::Tensor without_tiles(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& mask, double scale) {
  auto scores = emoe::matmul(q, k.transpose(-2, -1));
  return emoe::matmul(emoe::masked_softmax_forward(scores, mask, scale), v);
}

}  // namespace

// Shapes off the tiles' multiples (T, S not multiples of 16 or 32; d 80: a padded last step),
// grouped-query heads, padding and causal masks (a query of batch row 0 blocked everywhere),
// views of a [B, T, H·d] projection: float64's values within bfloat16's rounding.
TEST(AmxAttention, MatchesFloat64OnShapesOffTheTiles) {
  if (!emoe::amx_available()) GTEST_SKIP() << "this CPU has no AMX (or Linux did not grant it)";
  torch::manual_seed(21);
  torch::NoGradGuard no_grad;
  struct Case {
    int64_t b, hq, hkv, t, s, d;
    bool causal, padded;
  };
  for (const Case& c :
       {Case{2, 4, 4, 37, 37, 64, false, true}, Case{2, 6, 2, 19, 45, 80, true, true},
        Case{1, 2, 1, 1, 17, 16, false, false}, Case{3, 2, 2, 130, 130, 64, true, false}}) {
    SCOPED_TRACE(::testing::Message() << "T " << c.t << " S " << c.s << " d " << c.d << " Hq "
                                      << c.hq << " Hkv " << c.hkv);
    auto q = torch::randn({c.b, c.t, c.hq, c.d}).to(torch::kBFloat16).transpose(1, 2);
    auto k = (torch::randn({c.b, c.hkv, c.s, c.d}) * 2).to(torch::kBFloat16);
    auto v = torch::randn({c.b, c.s, c.hkv, c.d}).to(torch::kBFloat16).transpose(1, 2);
    auto pad = torch::ones({c.b, c.s}, torch::kLong);
    if (c.padded) pad.index_put_({0, torch::indexing::Slice(0, c.s - c.t + 1)}, 0);
    const auto mask =
        emoe::build_block_mask(c.padded ? pad : at::Tensor(), c.t, c.s, c.causal, torch::kCPU);
    ASSERT_TRUE(emoe::amx_attention_applies(q, k, v, mask));
    const auto got = emoe::amx_attention(q, k, v, mask, 0.125);
    ASSERT_EQ(got.sizes(), q.sizes());
    ASSERT_EQ(got.scalar_type(), torch::kBFloat16);
    const auto want = reference(q, k, v, mask, 0.125);
    EXPECT_LT(emoe::test::max_abs_diff(got.to(torch::kDouble), want),
              0.02 * (1 + want.abs().max().item<double>()));
    // merge_heads of its output is a view of the memory it wrote
    EXPECT_TRUE(got.transpose(1, 2).is_contiguous());
  }
}

// At BERT-base's attention shape the tiles' sums give the library path's bits (both sum each
// product in float32 over d = 64 and S = 128 in the same order of tile steps): the same scores
// rounded to bfloat16, the same softmax kernel, the same context. And scaled_attention takes the
// tiles in bf16 inference only.
TEST(AmxAttention, GivesThePathWithoutTilesAndServesInferenceOnly) {
  if (!emoe::amx_available()) GTEST_SKIP() << "this CPU has no AMX (or Linux did not grant it)";
  torch::manual_seed(22);
  const int64_t b = 2, h = 12, t = 128, d = 64;
  auto qkv = torch::randn({b, t, 3 * h * d}).to(torch::kBFloat16);
  auto heads = [&](int64_t i) { return emoe::split_heads(qkv.narrow(2, i * h * d, h * d), h); };
  const auto q = heads(0), k = heads(1), v = heads(2);
  {
    torch::NoGradGuard no_grad;
    const auto got = emoe::amx_attention(q, k, v, at::Tensor(), 0.125);
    const auto want = without_tiles(q, k, v, at::Tensor(), 0.125);
    EXPECT_LT(emoe::test::max_abs_diff(got.to(torch::kFloat), want.to(torch::kFloat)), 1e-2);
    EXPECT_GT((got == want).to(torch::kFloat).mean().item<double>(), 0.99);
    EXPECT_TRUE(
        torch::equal(emoe::scaled_attention(q, k, v, at::Tensor(), 0.125, 0.0, false), got));
    // causal: the blocks' columns past their last open one skipped, the same values
    const auto causal = emoe::build_block_mask(at::Tensor(), t, t, true, torch::kCPU);
    const auto got_causal = emoe::amx_attention(q, k, v, causal, 0.125);
    const auto want_causal = without_tiles(q, k, v, causal, 0.125);
    EXPECT_LT(emoe::test::max_abs_diff(got_causal.to(torch::kFloat), want_causal.to(torch::kFloat)),
              1e-2);
    EXPECT_GT((got_causal == want_causal).to(torch::kFloat).mean().item<double>(), 0.99);
  }
  // not with a gradient wanted, nor for float32, nor for d off the multiples of 16
  auto qg = q.detach().clone().requires_grad_();
  EXPECT_FALSE(emoe::amx_attention_applies(qg, k, v, at::Tensor()));
  EXPECT_FALSE(emoe::amx_attention_applies(q.to(torch::kFloat), k.to(torch::kFloat),
                                           v.to(torch::kFloat), at::Tensor()));
  auto odd = torch::randn({1, 2, 5, 24}).to(torch::kBFloat16);
  EXPECT_FALSE(emoe::amx_attention_applies(odd, odd, odd, at::Tensor()));
}

// Under CPU bf16 autocast, float32 queries and keys (RoPE's) are rounded as autocast's products
// round them: the bits of bfloat16 inputs; without autocast float32 stays off the tiles.
TEST(AmxAttention, RoundsFloat32QueriesAndKeysUnderAutocast) {
  if (!emoe::amx_available()) GTEST_SKIP() << "this CPU has no AMX (or Linux did not grant it)";
  torch::manual_seed(23);
  torch::NoGradGuard no_grad;
  auto q = torch::randn({2, 4, 21, 32}), k = torch::randn({2, 2, 21, 32});
  auto v = torch::randn({2, 2, 21, 32}).to(torch::kBFloat16);
  const auto mask = emoe::build_block_mask(at::Tensor(), 21, 21, true, torch::kCPU);
  EXPECT_FALSE(emoe::amx_attention_applies(q, k, v, mask));
  const bool was = emoe::autocast_enabled(at::kCPU);
  const auto dtype = emoe::autocast_dtype(at::kCPU);
  emoe::set_autocast_dtype(at::kCPU, at::kBFloat16);
  emoe::set_autocast_enabled(at::kCPU, true);
  const bool applies = emoe::amx_attention_applies(q, k, v, mask);
  const auto got = applies ? emoe::amx_attention(q, k, v, mask, 0.25) : at::Tensor();
  emoe::set_autocast_enabled(at::kCPU, was);
  emoe::set_autocast_dtype(at::kCPU, dtype);
  ASSERT_TRUE(applies);
  const auto want =
      emoe::amx_attention(q.to(torch::kBFloat16), k.to(torch::kBFloat16), v, mask, 0.25);
  EXPECT_TRUE(torch::equal(got, want));
}
