// The row kernels (the LM loss's softmax rows) against float64, on every instruction set this CPU
// has, and the chunked LM loss through them and through ATen's ops in one process.
#include "emoe/models/row_kernels.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "emoe/core/autocast_compat.h"
#include "emoe/core/error.h"
#include "emoe/models/activation.h"
#include "emoe/models/attention.h"
#include "emoe/models/dropout.h"
#include "emoe/models/lm_loss.h"
#include "emoe/models/matmul.h"
#include "emoe/models/norms.h"
#include "emoe/train/precision.h"
#include "support/test_support.h"

namespace {

std::vector<std::string> row_kernel_sets() {
  const auto prev = emoe::set_row_kernels_isa("");  // (reads EMOE_ROW_KERNELS once)
  std::vector<std::string> sets;
  for (const std::string isa : {"avx512", "avx2"}) {
    try {
      emoe::set_row_kernels_isa(isa);
      sets.push_back(isa);
    } catch (const emoe::UsageError&) {
    }
  }
  emoe::set_row_kernels_isa(prev);
  return sets;
}

struct RowIsaScope {  // pins the kernels (or ATen's ops: "library") for one block
  std::string prev;
  explicit RowIsaScope(const std::string& isa) : prev(emoe::set_row_kernels_isa(isa)) {}
  ~RowIsaScope() { emoe::set_row_kernels_isa(prev); }
};

TEST(RowKernels, SoftmaxCrossEntropyRowsMatchFloat64OnEveryKernelSet) {
  const auto sets = row_kernel_sets();
  if (sets.empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::manual_seed(3);
  for (const auto& isa : sets) {
    RowIsaScope pin(isa);
    // vocabularies with and without a tail past the vector width; wide logits (exp's whole
    // range: a row's smallest sits ~120 below its largest, past exp's normal floats)
    for (const int64_t v : {int64_t{7}, int64_t{64}, int64_t{1003}}) {
      for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
        const int64_t rows = 37;
        auto base = torch::randn({rows, v + 5}) * 12;  // a row stride past the row: a view
        base.index_put_({0, 0}, 60.0);
        auto x = base.to(dtype).narrow(1, 2, v);
        auto target = torch::randint(0, v, {rows}, torch::kLong);
        auto scale = torch::rand({rows});
        scale.index_put_({5}, 0.0);  // an ignored row
        const auto x64 = x.to(torch::kDouble);
        const auto lse = x64.logsumexp(1);
        const auto want_loss = lse - x64.gather(1, target.unsqueeze(1)).squeeze(1);
        auto want_grad = (x64 - lse.unsqueeze(1)).exp() * scale.to(torch::kDouble).unsqueeze(1);
        want_grad.scatter_add_(1, target.unsqueeze(1), -scale.to(torch::kDouble).unsqueeze(1));
        const auto what = isa + " V=" + std::to_string(v) + " " + c10::toString(dtype);
        // the loss alone leaves the logits as they were
        auto loss = torch::empty({rows});
        auto kept = x.clone();
        ASSERT_TRUE(emoe::softmax_xent_rows(kept, target, torch::Tensor(), loss)) << what;
        EXPECT_TRUE(torch::equal(kept, x)) << what;
        EXPECT_LT(emoe::test::max_abs_diff(loss.to(torch::kDouble), want_loss), 2e-5 * 60) << what;
        // with the gradient: in place, rounded once to the logits' dtype
        auto g = x.clone();
        auto loss2 = torch::empty({rows});
        ASSERT_TRUE(emoe::softmax_xent_rows(g, target, scale, loss2)) << what;
        EXPECT_TRUE(torch::equal(loss, loss2)) << what;
        const double tol = dtype == torch::kFloat ? 1e-6 : 4e-3;  // bf16: its rounding (2^-8)
        EXPECT_LT(emoe::test::max_abs_diff(g.to(torch::kDouble), want_grad), tol) << what;
        EXPECT_TRUE(torch::all(g[5] == 0).item<bool>()) << what;  // scale 0: nothing
      }
    }
  }
  // what they leave to ATen: another dtype; a non-contiguous row; out-of-range targets are errors
  auto loss = torch::empty({2});
  EXPECT_FALSE(emoe::softmax_xent_rows(torch::randn({2, 9}, torch::kDouble),
                                       torch::zeros({2}, torch::kLong), torch::Tensor(), loss));
  EXPECT_FALSE(emoe::softmax_xent_rows(torch::randn({9, 2}).t(), torch::zeros({2}, torch::kLong),
                                       torch::Tensor(), loss));
  EXPECT_ANY_THROW(emoe::softmax_xent_rows(torch::randn({2, 9}), torch::full({2}, 9, torch::kLong),
                                           torch::Tensor(), loss));
  {
    RowIsaScope library("library");
    EXPECT_EQ(emoe::row_kernels_isa(), "");
    EXPECT_FALSE(emoe::softmax_xent_rows(torch::randn({2, 9}), torch::zeros({2}, torch::kLong),
                                         torch::Tensor(), loss));
  }
  EXPECT_THROW(emoe::set_row_kernels_isa("sse9"), emoe::UsageError);
}

TEST(RowKernels, ChunkedLmLossGivesAtensValueAndGradientsThroughTheKernels) {
  const auto sets = row_kernel_sets();
  if (sets.empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::manual_seed(4);
  const int64_t b = 3, t = 9, h = 32, v = 517;
  auto labels = torch::randint(0, v, {b, t}, torch::kLong);
  labels.index_put_({1, 4}, -100);
  auto hidden = torch::randn({b, t, h});
  auto w = torch::randn({v, h}) * 0.3;
  for (const bool bf16 : {false, true}) {
    auto run = [&](const std::string& isa, int64_t chunk) {
      RowIsaScope pin(isa);
      std::unique_ptr<emoe::PrecisionScope> scope;
      if (bf16)
        scope = std::make_unique<emoe::PrecisionScope>(emoe::Precision::kBf16Mixed, torch::kCPU);
      auto hd = hidden.clone().requires_grad_(true), wd = w.clone().requires_grad_(true);
      auto loss = emoe::chunked_causal_lm_loss(hd, wd, labels, chunk);
      auto grads = torch::autograd::grad({loss * 2}, {hd, wd});
      return std::vector<torch::Tensor>{loss, grads[0], grads[1]};
    };
    const auto ref = run("library", 0);
    for (const auto& isa : sets) {
      for (const int64_t chunk : {int64_t{0}, int64_t{5}}) {
        const auto got = run(isa, chunk);
        const auto what = isa + (bf16 ? " bf16" : " fp32") + " chunk " + std::to_string(chunk);
        ASSERT_EQ(got[0].scalar_type(), torch::kFloat) << what;
        EXPECT_LT(std::abs(got[0].item<double>() - ref[0].item<double>()),
                  (bf16 ? 1e-4 : 1e-5) * std::abs(ref[0].item<double>()))
            << what;
        for (int i = 1; i < 3; ++i) {
          ASSERT_EQ(got[i].scalar_type(), torch::kFloat) << what;
          // bf16: the kernels sum the weight's gradient over chunks in float32 where ATen's path
          // rounds each chunk's part to bfloat16 first
          const double tol = (bf16 ? 1e-2 : 1e-5) * ref[i].abs().max().item<double>();
          EXPECT_LT(emoe::test::max_abs_diff(got[i], ref[i]), tol) << what << " grad " << i;
        }
      }
    }
  }
}

TEST(RowKernels, SiluMulAndItsGradientsMatchFloat64OnEveryKernelSet) {
  const auto sets = row_kernel_sets();
  if (sets.empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::manual_seed(5);
  for (const auto& isa : sets) {
    RowIsaScope pin(isa);
    // a tail past the vector width; gates far out on both sides (sigmoid saturating)
    for (const int64_t n : {int64_t{5}, int64_t{70001}}) {
      for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
        auto g0 = torch::randn({n}) * 4;
        g0.index_put_({0}, -100.0);
        g0.index_put_({1}, 95.0);
        const auto g = g0.to(dtype).requires_grad_(true);
        const auto u = torch::randn({n}).to(dtype).requires_grad_(true);
        const auto d = torch::randn({n}).to(dtype);
        const auto what = isa + " n=" + std::to_string(n) + " " + c10::toString(dtype);
        ASSERT_TRUE(emoe::silu_mul_applies(g, u)) << what;
        auto y = emoe::activate_gated(g, u, emoe::Activation::kSilu);
        ASSERT_EQ(y.scalar_type(), dtype);
        auto grads = torch::autograd::grad({y}, {g, u}, {d});
        auto g64 = g.detach().to(torch::kDouble), u64 = u.detach().to(torch::kDouble);
        auto d64 = d.to(torch::kDouble), s = g64.sigmoid();
        auto want_y = g64 * s * u64;
        auto want_dg = d64 * u64 * s * (1 + g64 * (1 - s));
        auto want_du = d64 * g64 * s;
        // within a rounding of the dtype, relative to each value (d gate: to its terms' size,
        // 1 + g (1 - s) cancels near g = -1.28)
        const double rel = dtype == torch::kFloat ? 2e-6 : 8e-3;
        auto check = [&](const torch::Tensor& got, const torch::Tensor& want, const char* name,
                         const torch::Tensor& size) {
          auto err = (got.to(torch::kDouble) - want).abs() - rel * size - 1e-30;
          EXPECT_LE(err.max().item<double>(), 0.0) << what << " " << name;
        };
        check(y, want_y, "y", want_y.abs());
        check(grads[0], want_dg, "d gate", (d64 * u64).abs() * (1 + g64.abs()) * s);
        check(grads[1], want_du, "d up", want_du.abs());
      }
    }
  }
  // ATen's ops where the kernels do not apply: another activation, mixed dtypes, no kernels
  auto g = torch::randn({4, 6}), u = torch::randn({4, 6});
  EXPECT_FALSE(emoe::silu_mul_applies(g, u.to(torch::kBFloat16)));
  EXPECT_FALSE(emoe::silu_mul_applies(g.t(), u.t()));
  EXPECT_TRUE(torch::allclose(emoe::activate_gated(g, u, emoe::Activation::kGeluTanh),
                              torch::gelu(g, "tanh") * u));
  RowIsaScope library("library");
  EXPECT_FALSE(emoe::silu_mul_applies(g, u));
  EXPECT_TRUE(
      torch::equal(emoe::activate_gated(g, u, emoe::Activation::kSilu), torch::silu(g) * u));
}

TEST(RowKernels, RmsNormAndItsGradientsMatchFloat64OnEveryKernelSet) {
  const auto sets = row_kernel_sets();
  if (sets.empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::manual_seed(6);
  for (const auto& isa : sets) {
    RowIsaScope pin(isa);
    for (const int64_t d : {int64_t{7}, int64_t{64}, int64_t{515}}) {
      emoe::RMSNorm norm(d, 1e-5);
      {
        torch::NoGradGuard no_grad;
        norm->weight.copy_(torch::randn({d}));
      }
      auto x = (torch::randn({3, 41, d}) * 3).requires_grad_(true);
      auto dy = torch::randn({3, 41, d});
      const auto what = isa + " d=" + std::to_string(d);
      ASSERT_TRUE(emoe::rms_norm_applies(x, norm->weight)) << what;
      auto y = norm(x);
      auto grads = torch::autograd::grad({y}, {x, norm->weight}, {dy});
      // float64 through autograd's ops
      auto x64 = x.detach().to(torch::kDouble).requires_grad_(true);
      auto w64 = norm->weight.detach().to(torch::kDouble).requires_grad_(true);
      auto y64 = w64 * (x64 * torch::rsqrt(x64.pow(2).mean(-1, true) + 1e-5));
      auto want = torch::autograd::grad({y64}, {x64, w64}, {dy.to(torch::kDouble)});
      auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
        return (a.to(torch::kDouble) - b).abs().max().item<double>() / b.abs().max().item<double>();
      };
      EXPECT_LT(rel(y, y64.detach()), 1e-6) << what;
      EXPECT_LT(rel(grads[0], want[0]), 1e-5) << what;
      EXPECT_LT(rel(grads[1], want[1]), 1e-5) << what;
    }
  }
  // ATen's ops elsewhere: bfloat16 rows (Qwen3's per-head norms under autocast), strided rows
  emoe::RMSNorm norm(8, 1e-6);
  EXPECT_FALSE(emoe::rms_norm_applies(torch::randn({4, 8}).to(torch::kBFloat16), norm->weight));
  EXPECT_FALSE(emoe::rms_norm_applies(torch::randn({8, 4}).t(), norm->weight));
  auto x = torch::randn({4, 8});
  auto via_kernels = norm(x);
  RowIsaScope library("library");
  EXPECT_LT(emoe::test::max_abs_diff(norm(x), via_kernels), 1e-5);
}

TEST(RowKernels, Bfloat16RmsNormWithoutGradientsMatchesHuggingFacesRoundings) {
  // a bfloat16 model's RMSNorm when decoding: x * rstd rounded to bfloat16, then times the
  // weight, rounded again (LlamaRMSNorm's order); against ATen's ops ("library") on every set
  const auto sets = row_kernel_sets();
  if (sets.empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::manual_seed(16);
  for (const int64_t d : {int64_t{7}, int64_t{64}, int64_t{515}}) {
    emoe::RMSNorm norm(d, 1e-5);
    norm->to(torch::kBFloat16);
    {
      torch::NoGradGuard no_grad;
      norm->weight.copy_(torch::randn({d}));
    }
    const auto x = (torch::randn({5, 9, d}) * 3).to(torch::kBFloat16);
    torch::Tensor want;
    {
      RowIsaScope library("library");
      EXPECT_FALSE(emoe::rms_norm_bf16_applies(x, norm->weight));
      torch::NoGradGuard no_grad;
      want = norm(x);
    }
    for (const auto& isa : sets) {
      RowIsaScope pin(isa);
      const auto what = isa + " d=" + std::to_string(d);
      ASSERT_TRUE(emoe::rms_norm_bf16_applies(x, norm->weight)) << what;
      torch::NoGradGuard no_grad;
      const auto y = norm(x);
      ASSERT_EQ(y.scalar_type(), torch::kBFloat16) << what;
      // rstd's float32 sum runs in another order: a rounding may fall the other way, by one
      // bfloat16 step of x * rstd (times the weight) at most
      const auto x64 = x.to(torch::kDouble);
      const auto n64 = x64 * torch::rsqrt(x64.pow(2).mean(-1, true) + 1e-5);
      const auto diff = (y.to(torch::kDouble) - want.to(torch::kDouble)).abs();
      const auto step =
          (norm->weight.to(torch::kDouble).abs() * n64.abs() + want.to(torch::kDouble).abs()) *
          std::ldexp(1.0, -7) * 1.01;
      EXPECT_TRUE((diff <= step).all().item<bool>()) << what;
      EXPECT_GE((diff == 0).to(torch::kDouble).mean().item<double>(), 0.99) << what;
    }
  }
  // with gradients wanted, ATen's ops (the kernel has no backward for bfloat16)
  emoe::RMSNorm norm(16, 1e-5);
  norm->to(torch::kBFloat16);
  auto y = norm(torch::randn({2, 16}).to(torch::kBFloat16));
  EXPECT_TRUE(y.requires_grad());
  EXPECT_NE(y.grad_fn()->name().find("Mul"), std::string::npos) << y.grad_fn()->name();
}

TEST(RowKernels, ResidualLayerNormAndItsGradientsMatchFloat64OnEveryKernelSet) {
  // LayerNorm(a + r) as BERT's post-norm blocks call it: a float32, or bfloat16 (a linear's output
  // under autocast) with its gradient rounded to bfloat16 once; r, the weight and the bias float32
  const auto sets = row_kernel_sets();
  if (sets.empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::manual_seed(17);
  for (const auto& isa : sets) {
    RowIsaScope pin(isa);
    for (const auto a_dtype : {torch::kFloat, torch::kBFloat16})
      for (const int64_t d : {int64_t{7}, int64_t{64}, int64_t{515}}) {
        const auto what =
            isa + (a_dtype == torch::kFloat ? " float32" : " bfloat16") + " d=" + std::to_string(d);
        emoe::LayerNorm norm(d, 1e-12);
        {
          torch::NoGradGuard no_grad;
          norm->weight.copy_(torch::randn({d}));
          norm->bias.copy_(torch::randn({d}));
        }
        auto a = (torch::randn({3, 11, d}) * 2 + 1).to(a_dtype).requires_grad_(true);
        auto r = torch::randn({3, 11, d}).requires_grad_(true);
        auto dy = torch::randn({3, 11, d});
        ASSERT_TRUE(emoe::add_layer_norm_applies(a, r, norm->weight, norm->bias)) << what;
        auto y = norm->forward_residual(a, r);
        ASSERT_EQ(y.scalar_type(), torch::kFloat) << what;
        ASSERT_NE(y.grad_fn()->name().find("AddLayerNorm"), std::string::npos) << what;
        auto g = torch::autograd::grad({y}, {a, r, norm->weight, norm->bias}, {dy});
        auto a64 = a.detach().to(torch::kDouble).requires_grad_(true);
        auto r64 = r.detach().to(torch::kDouble).requires_grad_(true);
        auto w64 = norm->weight.detach().to(torch::kDouble).requires_grad_(true);
        auto b64 = norm->bias.detach().to(torch::kDouble).requires_grad_(true);
        auto y64 = torch::layer_norm(a64 + r64, {d}, w64, b64, 1e-12);
        auto want = torch::autograd::grad({y64}, {a64, r64, w64, b64}, {dy.to(torch::kDouble)});
        auto rel = [](const torch::Tensor& x, const torch::Tensor& ref) {
          return (x.to(torch::kDouble) - ref).abs().max().item<double>() /
                 ref.abs().max().item<double>();
        };
        EXPECT_LT(rel(y, y64.detach()), 1e-6) << what;
        // a's gradient in a's dtype: rounded to bfloat16 once
        EXPECT_EQ(g[0].scalar_type(), a_dtype) << what;
        EXPECT_LT(rel(g[0], want[0]), a_dtype == torch::kFloat ? 1e-5 : std::ldexp(1.0, -8))
            << what;
        EXPECT_LT(rel(g[1], want[1]), 1e-5) << what;
        EXPECT_LT(rel(g[2], want[2]), 1e-5) << what;
        EXPECT_LT(rel(g[3], want[3]), 1e-5) << what;
        // without gradients: the same output (no sum kept)
        torch::NoGradGuard no_grad;
        EXPECT_TRUE(torch::equal(norm->forward_residual(a, r), y.detach())) << what;
      }
  }
  // elsewhere the sum and ATen's layer_norm: a bfloat16 residual, ATen's ops pinned
  emoe::LayerNorm norm(8, 1e-12);
  const auto a = torch::randn({4, 8});
  EXPECT_FALSE(emoe::add_layer_norm_applies(a, a.to(torch::kBFloat16), norm->weight, norm->bias));
  const auto via_kernels = norm->forward_residual(a, a * 2);
  RowIsaScope library("library");
  EXPECT_FALSE(emoe::add_layer_norm_applies(a, a, norm->weight, norm->bias));
  EXPECT_LT(emoe::test::max_abs_diff(norm->forward_residual(a, a * 2), via_kernels), 1e-5);
}

// BERT's dropouts inside the row kernels' passes: the hidden dropout in the residual LayerNorm,
// the probabilities' dropout in the attention's softmax. Same draws from the default generator,
// so the output and every gradient equal, bit for bit, those of emoe::dropout as its own op.
TEST(RowKernels, DropoutFusedIntoLayerNormAndSoftmaxGivesTheSeparateOpsBits) {
  const auto sets = row_kernel_sets();
  if (sets.empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  for (const auto& isa : sets) {
    RowIsaScope pin(isa);
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      const auto what = isa + (dtype == torch::kFloat ? " float32" : " bfloat16");
      torch::manual_seed(23);
      const int64_t d = 70;
      emoe::LayerNorm norm(d, 1e-12);
      auto a = torch::randn({3, 9, d}).to(dtype).requires_grad_(true);
      auto r = torch::randn({3, 9, d}).requires_grad_(true);
      auto dy = torch::randn({3, 9, d});
      auto residual = [&](bool fused) {
        torch::manual_seed(5);
        auto y = fused ? norm->forward_residual(a, r, 0.3)
                       : norm->forward_residual(emoe::dropout(a, 0.3, true), r);
        auto g = torch::autograd::grad({y}, {a, r, norm->weight, norm->bias}, {dy});
        return std::vector<at::Tensor>{y, g[0], g[1], g[2], g[3]};
      };
      const auto fused = residual(true), separate = residual(false);
      {  // fused: a goes straight into the LayerNorm's node, no dropout node between
        torch::manual_seed(5);
        auto y = norm->forward_residual(a, r, 0.3);
        ASSERT_NE(y.grad_fn()->name().find("AddLayerNorm"), std::string::npos) << what;
        EXPECT_EQ(y.grad_fn()->next_edges()[0].function->name().find("Dropout"), std::string::npos)
            << what;
      }
      for (size_t i = 0; i < fused.size(); ++i)
        EXPECT_TRUE(torch::equal(fused[i], separate[i])) << what << " layer norm, tensor " << i;
      // about 30 % of a's gradient dropped (not all, not none)
      const double zeros = (fused[1] == 0).to(torch::kDouble).mean().item<double>();
      EXPECT_GT(zeros, 0.2) << what;
      EXPECT_LT(zeros, 0.4) << what;

      // attention: handing out the probabilities keeps the dropout a separate op
      const int64_t b = 2, h = 3, t = 11, hd = 8;
      auto pad = torch::ones({b, t}, torch::kLong);
      pad.index_put_({1, torch::indexing::Slice(0, 4)}, 0);
      const auto mask = emoe::build_block_mask(pad, t, t, false, torch::kCPU);
      auto q = torch::randn({b, h, t, hd}).to(dtype).requires_grad_();
      auto k = torch::randn({b, h, t, hd}).to(dtype).requires_grad_();
      auto v = torch::randn({b, h, t, hd}).to(dtype).requires_grad_();
      auto dout = torch::randn({b, h, t, hd}).to(dtype);
      auto attend = [&](bool fused_softmax) {
        torch::manual_seed(9);
        at::Tensor probs;
        auto out = emoe::scaled_attention(q, k, v, mask, 0.125, 0.4, true,
                                          fused_softmax ? nullptr : &probs);
        auto g = torch::autograd::grad({out}, {q, k, v}, {dout});
        return std::vector<at::Tensor>{out, g[0], g[1], g[2]};
      };
      const auto in_softmax = attend(true), as_op = attend(false);
      for (size_t i = 0; i < in_softmax.size(); ++i)
        EXPECT_TRUE(torch::equal(in_softmax[i], as_op[i])) << what << " attention, tensor " << i;
      // and the dropout does drop: without it the output differs
      torch::manual_seed(9);
      EXPECT_FALSE(torch::equal(emoe::scaled_attention(q, k, v, mask, 0.125, 0.0, true).detach(),
                                in_softmax[0]))
          << what;
    }
  }
}

TEST(RowKernels, ColumnSumsMatchFloat64OnEveryKernelSet) {
  const auto sets = row_kernel_sets();
  if (sets.empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::manual_seed(7);
  for (const auto& isa : sets) {
    RowIsaScope pin(isa);
    for (const int64_t n : {int64_t{3}, int64_t{64}, int64_t{200}}) {
      for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
        auto g = torch::randn({77, n + 3}).to(dtype).narrow(1, 1, n);  // rows with a stride
        ASSERT_TRUE(emoe::column_sum_applies(g));
        auto got = emoe::column_sum(g);
        ASSERT_EQ(got.scalar_type(), torch::kFloat);
        EXPECT_LT(emoe::test::max_abs_diff(got.to(torch::kDouble), g.to(torch::kDouble).sum(0)),
                  1e-4)
            << isa << " " << n;
      }
    }
  }
  EXPECT_FALSE(emoe::column_sum_applies(torch::randn({4, 5}).t()));
  EXPECT_FALSE(emoe::column_sum_applies(torch::randn({4, 5}, torch::kDouble)));
}

// A pre-norm block's residual sum under bf16 autocast (float32 stream + bfloat16 output): ATen's
// mixed-dtype add's bits, forward and backward, on every kernel set; other dtypes stay ATen's.
TEST(RowKernels, ResidualAddGivesAtensBitsOnEveryKernelSet) {
  const auto sets = row_kernel_sets();
  if (sets.empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::manual_seed(15);
  for (const auto& isa : sets) {
    RowIsaScope pin(isa);
    SCOPED_TRACE(isa);
    auto x = torch::randn({3, 7, 37}).requires_grad_();  // 777 elements: a vector tail
    auto a = torch::randn({3, 7, 37}).to(torch::kBFloat16).requires_grad_();
    ASSERT_TRUE(emoe::residual_add_applies(x, a));
    const auto g = torch::randn({3, 7, 37});
    auto y = emoe::residual_add(x, a);
    auto got = torch::autograd::grad({y}, {x, a}, {g});
    auto want_y = x + a;
    auto want = torch::autograd::grad({want_y}, {x, a}, {g});
    EXPECT_EQ(y.scalar_type(), torch::kFloat);
    EXPECT_TRUE(torch::equal(y, want_y));
    EXPECT_TRUE(torch::equal(got[0], want[0]));
    EXPECT_EQ(got[1].scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(got[1], want[1]));
  }
  EXPECT_FALSE(emoe::residual_add_applies(torch::randn({4}), torch::randn({4})));
  EXPECT_FALSE(emoe::residual_add_applies(torch::randn({4, 2}).t(),
                                          torch::randn({2, 4}).to(torch::kBFloat16)));
}

// Attention probabilities: the blocked positions (causal, padding, a query blocked everywhere) as
// ATen's fill + float32 softmax computes them, in float64, and the gradient.
TEST(RowKernels, MaskedSoftmaxAndItsGradientMatchFloat64OnEveryKernelSet) {
  const auto sets = row_kernel_sets();
  if (sets.empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::manual_seed(11);
  const int64_t b = 2, h = 3, t = 5;
  for (const auto& isa : sets) {
    RowIsaScope pin(isa);
    for (const int64_t s : {int64_t{7}, int64_t{64}, int64_t{203}}) {
      auto causal = emoe::build_block_mask(at::Tensor(), t, s, true, torch::kCPU);
      auto pad = torch::ones({b, s}, torch::kLong);
      pad.index_put_({0, torch::indexing::Slice(s - 2, torch::indexing::None)}, 0);
      pad.index_put_({1, torch::indexing::Slice(0, s - t + 2)}, 0);  // query 0 of row 1: none open
      auto both = emoe::build_block_mask(pad, t, s, true, torch::kCPU);
      ASSERT_TRUE(both.index({1, 0, 0}).all().item<bool>());
      for (const auto& mask : {at::Tensor(), causal, both}) {
        for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
          const double scale = s == 64 ? 0.3 : 1.0;  // the scores scaled inside the kernels
          SCOPED_TRACE(isa + " S " + std::to_string(s) + (mask.defined() ? " masked " : " open ") +
                       (dtype == torch::kFloat ? "float32" : "bfloat16"));
          auto x = (torch::randn({b, h, t, s}) * 6).to(dtype);
          ASSERT_TRUE(emoe::masked_softmax_applies(x, mask));
          auto y = emoe::masked_softmax_forward(x, mask, scale);
          ASSERT_EQ(y.scalar_type(), dtype);
          auto x64 = x.to(torch::kDouble) * scale;
          if (mask.defined()) x64 = x64.masked_fill(mask, emoe::lowest_value(dtype).toDouble());
          const auto want = x64.softmax(-1);
          const double tol = dtype == torch::kFloat ? 1e-6 : 4e-3;
          EXPECT_LT(emoe::test::max_abs_diff(y.to(torch::kDouble), want), tol);
          auto dy = torch::randn({b, h, t, s}).to(dtype);
          auto dx = emoe::masked_softmax_backward(y, dy, mask, scale);
          const auto y64 = y.to(torch::kDouble), dy64 = dy.to(torch::kDouble);
          auto want_dx = scale * y64 * (dy64 - (dy64 * y64).sum(-1, true));
          if (mask.defined()) want_dx = want_dx.masked_fill(mask, 0.0);
          EXPECT_LT(emoe::test::max_abs_diff(dx.to(torch::kDouble), want_dx),
                    (dtype == torch::kFloat ? 1e-5 : 2e-2) * want_dx.abs().max().item<double>());
        }
      }
    }
  }
  // what the kernels leave to ATen: float64, a strided view, a mask broadcast along its last axis
  EXPECT_FALSE(emoe::masked_softmax_applies(torch::randn({2, 3}, torch::kDouble), at::Tensor()));
  EXPECT_FALSE(emoe::masked_softmax_applies(torch::randn({3, 2}).t(), at::Tensor()));
  EXPECT_FALSE(
      emoe::masked_softmax_applies(torch::randn({2, 3}), torch::zeros({2, 1}, torch::kBool)));
}

// scaled_attention through the kernels and through ATen's ops (grouped-query, causal + padding,
// float32 and bf16 autocast): the same output and gradients.
TEST(RowKernels, ScaledAttentionGivesAtensValuesAndGradients) {
  if (row_kernel_sets().empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::manual_seed(12);
  const int64_t b = 2, hq = 4, hkv = 2, t = 9, d = 16;
  auto pad = torch::ones({b, t}, torch::kLong);
  pad.index_put_({1, torch::indexing::Slice(0, 3)}, 0);
  const auto mask = emoe::build_block_mask(pad, t, t, true, torch::kCPU);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    auto q = torch::randn({b, hq, t, d}).to(dtype).requires_grad_();
    auto k = torch::randn({b, hkv, t, d}).to(dtype).requires_grad_();
    auto v = torch::randn({b, hkv, t, d}).to(dtype).requires_grad_();
    auto dout = torch::randn({b, hq, t, d}).to(dtype);
    for (const double scale : {0.25, 0.3}) {
      auto run = [&](const std::string& isa) {
        RowIsaScope pin(isa);
        auto out = emoe::scaled_attention(q, k, v, mask, scale, 0.0, true);
        auto g = torch::autograd::grad({out}, {q, k, v}, {dout});
        return std::vector<at::Tensor>{out, g[0], g[1], g[2]};
      };
      const auto got = run("auto"), want = run("library");
      const double tol = dtype == torch::kFloat ? 1e-5 : 3e-2;
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].scalar_type(), dtype) << i;
        EXPECT_LT(emoe::test::max_abs_diff(got[i].to(torch::kDouble), want[i].to(torch::kDouble)),
                  tol * (1 + want[i].abs().max().item<double>()))
            << i << (dtype == torch::kFloat ? " float32 " : " bfloat16 ") << scale;
      }
    }
  }
}

// The scale inside the softmax kernels: with a power of two (BERT-base's and Llama's 1/8), the
// output and gradients are bit for bit those of q scaled before its product with the keys.
TEST(RowKernels, AttentionScaleInTheSoftmaxGivesTheScaledQuerysBits) {
  if (row_kernel_sets().empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::manual_seed(14);
  const int64_t b = 2, h = 3, t = 33, d = 16;
  auto pad = torch::ones({b, t}, torch::kLong);
  pad.index_put_({1, torch::indexing::Slice(0, 5)}, 0);
  const auto mask = emoe::build_block_mask(pad, t, t, false, torch::kCPU);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(dtype == torch::kFloat ? "float32" : "bfloat16");
    auto q = torch::randn({b, h, t, d}).to(dtype).requires_grad_();
    auto k = torch::randn({b, h, t, d}).to(dtype).requires_grad_();
    auto v = torch::randn({b, h, t, d}).to(dtype).requires_grad_();
    auto dout = torch::randn({b, h, t, d}).to(dtype);
    auto out = emoe::scaled_attention(q, k, v, mask, 0.125, 0.0, true);
    auto got = torch::autograd::grad({out}, {q, k, v}, {dout});
    auto want_out = emoe::scaled_attention(q * 0.125, k, v, mask, 1.0, 0.0, true);
    auto want = torch::autograd::grad({want_out}, {q, k, v}, {dout});
    EXPECT_TRUE(torch::equal(out, want_out));
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << i;
    // a scale that is not a power of two rounds differently, and the comparison sees it
    auto other = emoe::scaled_attention(q, k, v, mask, 0.13, 0.0, true);
    auto other_want = emoe::scaled_attention(q * 0.13, k, v, mask, 1.0, 0.0, true);
    EXPECT_FALSE(torch::equal(other, other_want));
  }
}

// Decoding's attention (a few queries against a cache): against float64 on every kernel set,
// with grouped-query heads, keys and values viewed from a cache with room (strided), causal +
// padding masks with a query blocked everywhere, S across the vector width; and scaled_attention
// takes it in inference only (not with a gradient wanted, nor for more than 8 queries).
TEST(RowKernels, DecodeAttentionMatchesFloat64OnEveryKernelSet) {
  const auto sets = row_kernel_sets();
  if (sets.empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::manual_seed(13);
  const int64_t b = 2, hq = 6, hkv = 2, d = 20;  // d: a vector tail on both sets
  for (const auto& isa : sets) {
    RowIsaScope pin(isa);
    for (const int64_t t : {int64_t{1}, int64_t{3}}) {
      for (const int64_t s : {int64_t{3}, int64_t{17}, int64_t{70}}) {
        auto pad = torch::ones({b, s}, torch::kLong);
        pad.index_put_({1, torch::indexing::Slice(0, s - t + 1)}, 0);  // row 1, query 0: none open
        const auto causal = emoe::build_block_mask(at::Tensor(), t, s, true, torch::kCPU);
        const auto both = emoe::build_block_mask(pad, t, s, true, torch::kCPU);
        for (const auto& mask : {at::Tensor(), causal, both}) {
          for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
            SCOPED_TRACE(isa + " T " + std::to_string(t) + " S " + std::to_string(s) +
                         (mask.defined() ? " masked " : " open ") +
                         (dtype == torch::kFloat ? "float32" : "bfloat16"));
            auto q = torch::randn({b, hq, t, d}).to(dtype);
            auto room_k = torch::randn({b, hkv, s + 5, d}).to(dtype);
            auto room_v = torch::randn({b, hkv, s + 5, d}).to(dtype);
            auto k = room_k.narrow(2, 0, s), v = room_v.narrow(2, 0, s);
            torch::NoGradGuard no_grad;
            ASSERT_TRUE(emoe::decode_attention_applies(q, k, v, mask));
            auto got = emoe::decode_attention(q, k, v, mask, 0.3);
            ASSERT_EQ(got.scalar_type(), dtype);
            ASSERT_EQ(got.sizes(), q.sizes());
            const auto k64 = k.to(torch::kDouble).repeat_interleave(hq / hkv, 1);
            const auto v64 = v.to(torch::kDouble).repeat_interleave(hq / hkv, 1);
            auto scores = torch::matmul(q.to(torch::kDouble), k64.transpose(-2, -1)) * 0.3;
            if (mask.defined())
              scores = scores.masked_fill(mask, emoe::lowest_value(dtype).toDouble());
            const auto want = torch::matmul(scores.softmax(-1), v64);
            const double tol = dtype == torch::kFloat ? 1e-5 : 2e-2;
            EXPECT_LT(emoe::test::max_abs_diff(got.to(torch::kDouble), want),
                      tol * (1 + want.abs().max().item<double>()));
            // through scaled_attention, as the models call it
            auto via = emoe::scaled_attention(q, k, v, mask, 0.3, 0.1, false);
            EXPECT_TRUE(torch::equal(via, got));
          }
        }
      }
    }
  }
  auto q = torch::randn({1, 2, 1, 8}), k = torch::randn({1, 2, 5, 8}),
       v = torch::randn({1, 2, 5, 8});
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(emoe::decode_attention_applies(torch::randn({1, 2, 9, 8}), k, v, at::Tensor()));
    EXPECT_FALSE(emoe::decode_attention_applies(q.to(torch::kDouble), k, v, at::Tensor()));
    EXPECT_FALSE(emoe::decode_attention_applies(q, k.transpose(2, 3), v, at::Tensor()));
  }
  EXPECT_FALSE(emoe::decode_attention_applies(q.requires_grad_(), k, v, at::Tensor()));
  RowIsaScope library("library");
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(emoe::decode_attention_applies(q, k, v, at::Tensor()));
}

// RoPE through the kernels and through ATen's ops: x a view of heads (as split_heads gives),
// cos/sin per batch row or shared, float32, bfloat16 and the mixed case of autocast (bfloat16 x,
// float32 cos and sin: a float32 result): the same values and x's gradient.
TEST(RowKernels, RopeGivesAtensValuesAndGradients) {
  if (row_kernel_sets().empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::manual_seed(13);
  const int64_t b = 2, h = 3, t = 7, d = 16;
  for (const int64_t cb : {int64_t{1}, b}) {
    for (const auto xd : {torch::kFloat, torch::kBFloat16}) {
      for (const auto cd : {torch::kFloat, torch::kBFloat16}) {
        auto x = torch::randn({b, t, h * d}).to(xd).requires_grad_();
        auto heads = emoe::split_heads(x, h);  // [b, h, t, d], not contiguous
        auto pos = torch::arange(t, torch::kLong).unsqueeze(0).expand({cb, t}).contiguous() +
                   torch::arange(cb, torch::kLong).unsqueeze(1) * 3;
        auto [cos, sin] = emoe::rope_cos_sin(pos, d, 10000.0, cd);
        ASSERT_TRUE(emoe::rope_applies(heads, cos, sin));
        auto run = [&](const std::string& isa) {
          RowIsaScope pin(isa);
          auto y = emoe::apply_rope(heads, cos, sin);
          auto dy = torch::linspace(-1, 1, y.numel()).view(y.sizes()).to(y.scalar_type());
          auto g = torch::autograd::grad({y}, {x}, {dy});
          return std::make_pair(y, g[0]);
        };
        const auto [y, gx] = run("auto");
        const auto [want_y, want_gx] = run("library");
        SCOPED_TRACE(std::to_string(cb) + (xd == torch::kFloat ? " x float32" : " x bfloat16") +
                     (cd == torch::kFloat ? " cos float32" : " cos bfloat16"));
        ASSERT_EQ(y.scalar_type(), want_y.scalar_type());
        ASSERT_EQ(gx.scalar_type(), xd);
        const double tol = y.scalar_type() == torch::kFloat ? 1e-5 : 2e-2;
        EXPECT_LT(emoe::test::max_abs_diff(y.to(torch::kDouble), want_y.to(torch::kDouble)), tol);
        EXPECT_LT(emoe::test::max_abs_diff(gx.to(torch::kDouble), want_gx.to(torch::kDouble)),
                  xd == torch::kFloat ? 1e-5 : 2e-2);
      }
    }
  }
  // what the kernels leave to ATen: an odd width, cos that wants a gradient
  auto x = torch::randn({1, 1, 2, 5});
  auto c = torch::randn({1, 1, 2, 5});
  EXPECT_FALSE(emoe::rope_applies(x, c, c));
  auto x2 = torch::randn({1, 1, 2, 4});
  auto c2 = torch::randn({1, 1, 2, 4}, torch::requires_grad());
  EXPECT_FALSE(emoe::rope_applies(x2, c2, c2));
}

// GELU (erf form) and its gradient against float64, on every kernel set; through activate() the
// autograd function gives ATen's gradient.
TEST(RowKernels, GeluErfAndItsGradientMatchFloat64OnEveryKernelSet) {
  const auto sets = row_kernel_sets();
  if (sets.empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::manual_seed(14);
  for (const auto& isa : sets) {
    RowIsaScope pin(isa);
    for (const int64_t n : {int64_t{5}, int64_t{64}, int64_t{1001}}) {
      for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
        SCOPED_TRACE(isa + " n " + std::to_string(n) +
                     (dtype == torch::kFloat ? " float32" : " bfloat16"));
        auto x = (torch::randn({3, n}) * 4).to(dtype);
        x.index_put_({0, 0}, 0.0);
        x.index_put_({1, 0}, -12.0);  // far in the tail: Phi ~ 0
        ASSERT_TRUE(emoe::gelu_erf_applies(x));
        const auto x64 = x.to(torch::kDouble);
        const auto cdf = 0.5 * (1 + torch::erf(x64 / std::sqrt(2.0)));
        const auto pdf = torch::exp(-0.5 * x64 * x64) / std::sqrt(2 * M_PI);
        const double tol = dtype == torch::kFloat ? 2e-6 : 1e-2;
        const auto y = emoe::gelu_erf_forward(x);
        ASSERT_EQ(y.scalar_type(), dtype);
        EXPECT_LT(emoe::test::max_abs_diff(y.to(torch::kDouble), x64 * cdf),
                  tol * (1 + (x64 * cdf).abs().max().item<double>()));
        const auto dy = torch::randn({3, n}).to(dtype);
        const auto dx = emoe::gelu_erf_backward(x, dy);
        const auto want = dy.to(torch::kDouble) * (cdf + x64 * pdf);
        EXPECT_LT(emoe::test::max_abs_diff(dx.to(torch::kDouble), want),
                  tol * (1 + want.abs().max().item<double>()));
      }
    }
  }
  auto x = torch::randn({4, 37}, torch::requires_grad());
  auto y = emoe::activate(x, emoe::Activation::kGeluErf);
  auto g = torch::autograd::grad({y.sum()}, {x})[0];
  auto x2 = x.detach().clone().requires_grad_();
  auto g2 = torch::autograd::grad({torch::gelu(x2).sum()}, {x2})[0];
  EXPECT_LT(emoe::test::max_abs_diff(y, torch::gelu(x2)), 1e-5);
  EXPECT_LT(emoe::test::max_abs_diff(g, g2), 1e-5);
}

// Under bf16 autocast a float32 weight's gradient is summed straight into float32: it equals the
// float64 product of the bfloat16 operands to float32 rounding, where autocast's linear rounds it
// to bfloat16 (about 2^-9 relative) before copying it back.
TEST(AutocastLinear, GivesAutocastsOutputAndFloat32WeightGradients) {
  torch::manual_seed(9);
  auto x = torch::randn({6, 33, 96}, torch::requires_grad());
  auto w = torch::randn({80, 96}, torch::requires_grad());
  auto b = torch::randn({80}, torch::requires_grad());
  auto dy = torch::randn({6, 33, 80});
  emoe::PrecisionScope bf16(emoe::Precision::kBf16Mixed, torch::kCPU);
  if (!emoe::autocast_linear_applies(x, w, b))
    GTEST_SKIP() << "no oneDNN bfloat16 products on this CPU (autocast's own linear runs)";
  auto y = emoe::linear(x, w, b);
  auto ref = torch::linear(x, w, b);  // autocast's
  ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_LT(emoe::test::max_abs_diff(y.to(torch::kFloat), ref.to(torch::kFloat)),
            1e-2 * ref.abs().max().item<double>());
  auto g = torch::autograd::grad({y}, {x, w, b}, {dy.to(torch::kBFloat16)});
  auto gr = torch::autograd::grad({ref}, {x, w, b}, {dy.to(torch::kBFloat16)});
  for (int i = 0; i < 3; ++i) ASSERT_EQ(g[i].scalar_type(), torch::kFloat) << i;
  EXPECT_LT(emoe::test::max_abs_diff(g[0], gr[0]), 1e-2 * gr[0].abs().max().item<double>());
  // the weight's and bias's gradients: float64 sums of the bfloat16 operands
  emoe::set_autocast_enabled(at::kCPU, false);
  const auto d64 = dy.to(torch::kBFloat16).to(torch::kDouble).reshape({-1, 80});
  const auto x64 = x.detach().to(torch::kBFloat16).to(torch::kDouble).reshape({-1, 96});
  const auto want_w = d64.t().mm(x64), want_b = d64.sum(0);
  const double scale_w = want_w.abs().max().item<double>();
  EXPECT_LT(emoe::test::max_abs_diff(g[1].to(torch::kDouble), want_w), 1e-5 * scale_w);
  EXPECT_GT(emoe::test::max_abs_diff(gr[1].to(torch::kDouble), want_w), 1e-4 * scale_w);
  EXPECT_LT(emoe::test::max_abs_diff(g[2].to(torch::kDouble), want_b),
            1e-5 * want_b.abs().max().item<double>());
  emoe::set_autocast_enabled(at::kCPU, true);
}

// Attention's products under bf16 autocast (emoe::matmul): autocast's values and gradients, in the
// inputs' dtypes, on the heads' strided views without copying them; the output bit-equal to the
// product of the bfloat16-rounded inputs summed in float64 and rounded once (to a step).
TEST(AutocastMatmul, GivesAutocastsProductAndGradientsOnStridedHeadViews) {
  torch::manual_seed(10);
  // q: float32 (as after RoPE in float32), heads split from [B, T, H * d] as split_heads does
  auto q_flat = torch::randn({2, 37, 4 * 24}, torch::requires_grad());
  auto k = torch::randn({2, 4, 24, 41}).to(torch::kBFloat16).requires_grad_(true);
  auto dy = torch::randn({2, 4, 37, 41}).to(torch::kBFloat16);
  emoe::PrecisionScope bf16(emoe::Precision::kBf16Mixed, torch::kCPU);
  auto q = q_flat.view({2, 37, 4, 24}).transpose(1, 2);
  ASSERT_FALSE(q.is_contiguous());
  auto y = emoe::matmul(q, k);
  auto ref = torch::matmul(q, k);  // autocast's
  ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
  if (y.grad_fn()->name().find("AutocastMatmul") == std::string::npos)
    GTEST_SKIP() << "no oneDNN bfloat16 products on this CPU (autocast's own matmul ran)";
  const double scale = ref.abs().max().item<double>();
  EXPECT_LT(emoe::test::max_abs_diff(y.to(torch::kFloat), ref.to(torch::kFloat)), 1e-2 * scale);
  auto g = torch::autograd::grad({y}, {q_flat, k}, {dy});
  auto gr = torch::autograd::grad({ref}, {q_flat, k}, {dy});
  ASSERT_EQ(g[0].scalar_type(), torch::kFloat);
  ASSERT_EQ(g[1].scalar_type(), torch::kBFloat16);
  for (int i = 0; i < 2; ++i)
    EXPECT_LT(emoe::test::max_abs_diff(g[i].to(torch::kFloat), gr[i].to(torch::kFloat)),
              1e-2 * gr[i].abs().max().item<double>())
        << i;
  // against float64: within one bfloat16 rounding of the exact sum
  emoe::set_autocast_enabled(at::kCPU, false);
  const auto exact = torch::matmul(q.detach().to(torch::kBFloat16).to(torch::kDouble),
                                   k.detach().to(torch::kDouble));
  EXPECT_TRUE(((y.to(torch::kDouble) - exact).abs() <= exact.abs() * std::ldexp(1.0, -8) + 1e-6)
                  .all()
                  .item<bool>());
  emoe::set_autocast_enabled(at::kCPU, true);
}

}  // namespace
