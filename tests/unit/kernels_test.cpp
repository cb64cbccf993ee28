// The hot-loop kernels against their plain definitions: grouped expert GEMMs, the parallel
// dropout, the fused AdamW step, fused q/k/v projections and mixed-precision scopes.
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <regex>

#include "emoe/core/autocast_compat.h"
#include "emoe/core/cpu_info.h"
#include "emoe/core/error.h"
#include "emoe/core/runtime.h"
#include "emoe/models/activation.h"
#include "emoe/models/attention.h"
#include "emoe/models/dropout.h"
#include "emoe/models/linear.h"
#include "emoe/models/lm_loss.h"
#include "emoe/models/loader.h"
#include "emoe/models/matmul.h"
#include "emoe/models/model.h"
#include "emoe/moe/convert.h"
#include "emoe/moe/expert_ffn.h"
#include "emoe/moe/expert_kernels.h"
#include "emoe/moe/segment_linear.h"
#include "emoe/train/optim.h"
#include "emoe/train/precision.h"
#include "support/test_support.h"

namespace {

// got within one bfloat16 rounding of want (any dtypes; the sums' order may differ)
bool within_a_bf16_step(const torch::Tensor& got, const torch::Tensor& want) {
  const auto g = got.to(torch::kDouble), w = want.to(torch::kDouble);
  return ((g - w).abs() <= w.abs() / 128 + 1e-6).all().item<bool>();
}

// bfloat16 results equal to autocast's, or within one bfloat16 step where bfloat16 products are
// computed in float32 (matmul.h's Bf16Gemm::kFloat32, the default without AVX-512: the sums run
// in another order than ATen's bfloat16 products)
bool same_bf16_result(const torch::Tensor& got, const torch::Tensor& want) {
  if (emoe::bf16_gemm() != emoe::Bf16Gemm::kFloat32) return torch::equal(got, want);
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) return false;
  return within_a_bf16_step(got, want);
}

// segment j of x times block j of w (the definition), with autograd through narrow()
torch::Tensor kernels_reference(const torch::Tensor& x, const torch::Tensor& w,
                                const torch::Tensor& b, const std::vector<int64_t>& counts,
                                int64_t block_dim) {
  const int64_t e = static_cast<int64_t>(counts.size()), s = w.size(block_dim) / e;
  std::vector<torch::Tensor> parts;
  int64_t off = 0;
  for (int64_t j = 0; j < e; ++j) {
    auto wj = w.narrow(block_dim, j * s, s);
    parts.push_back(torch::linear(x.narrow(0, off, counts[j]), wj,
                                  b.defined() ? b.narrow(0, j * s, s) : torch::Tensor()));
    off += counts[j];
  }
  return torch::cat(parts, 0);
}

// the dispatched experts by their definition: each routed row through its expert's weight blocks
// with plain autograd operations, scaled by its weight and summed into its token's output
torch::Tensor kernels_expert_reference(const torch::Tensor& x, const torch::Tensor& tokens,
                                       const std::vector<int64_t>& counts,
                                       const torch::Tensor& weights, const torch::Tensor& w_in,
                                       const torch::Tensor& b_in, const torch::Tensor& w_up,
                                       const torch::Tensor& w_out, emoe::Activation act) {
  const int64_t e = static_cast<int64_t>(counts.size()), s = w_in.size(0) / e;
  auto out = torch::zeros_like(x);
  int64_t off = 0;
  for (int64_t j = 0; j < e; ++j) {
    auto idx = tokens.narrow(0, off, counts[j]);
    auto xj = x.index_select(0, idx);
    auto h =
        emoe::activate(torch::linear(xj, w_in.narrow(0, j * s, s),
                                     b_in.defined() ? b_in.narrow(0, j * s, s) : torch::Tensor()),
                       act);
    if (w_up.defined()) h = h * torch::linear(xj, w_up.narrow(0, j * s, s));
    auto y = torch::linear(h, w_out.narrow(1, j * s, s));
    if (weights.defined()) y = y * weights.narrow(0, off, counts[j]).unsqueeze(1);
    out = out.index_add(0, idx, y);
    off += counts[j];
  }
  return out;
}

// rows sorted by expert, `counts[j]` for expert j, each expert's tokens distinct (as top-k
// routing gives them) and drawn from n
torch::Tensor kernels_routed_tokens(int64_t n, const std::vector<int64_t>& counts) {
  std::vector<torch::Tensor> segs;
  for (auto c : counts) segs.push_back(torch::randperm(n, torch::kLong).narrow(0, 0, c));
  return torch::cat(segs);
}

}  // namespace

TEST(ExpertFfn, DispatchedMatchesTheDefinitionInValuesAndEveryGradient) {
  torch::manual_seed(4);
  const int64_t n = 9, d = 6, e = 4, s = 5;
  const std::vector<int64_t> counts = {7, 0, 4, 6};  // expert 1 gets no rows; tokens repeat
  auto tokens = torch::randint(0, n, {17}, torch::kLong);
  for (auto act : {emoe::Activation::kGeluErf, emoe::Activation::kGeluTanh, emoe::Activation::kSilu,
                   emoe::Activation::kRelu})
    for (bool gated : {false, true})
      for (bool weighted : {false, true})
        for (bool bias : {false, true}) {
          // experts gathered one group for all, one expert per group, or about two per group
          const int64_t group_bytes = bias ? (weighted ? 1 : int64_t{16} << 20) : 10 * d * 8;
          SCOPED_TRACE(emoe::activation_name(act) + (gated ? " gated" : "") +
                       (weighted ? " weighted" : "") + (bias ? " bias" : "") + " group bytes " +
                       std::to_string(group_bytes));
          auto x = torch::randn({n, d}, torch::kDouble), go = torch::randn({n, d}, torch::kDouble);
          auto w_in = torch::randn({e * s, d}, torch::kDouble),
               w_out = torch::randn({d, e * s}, torch::kDouble);
          auto b_in = bias ? torch::randn({e * s}, torch::kDouble) : torch::Tensor();
          auto w_up = gated ? torch::randn({e * s, d}, torch::kDouble) : torch::Tensor();
          auto weights = weighted ? torch::rand({17}, torch::kDouble) : torch::Tensor();
          auto run = [&](bool ours) {
            auto leaf = [](const torch::Tensor& t) {
              return t.defined() ? t.clone().requires_grad_(true) : torch::Tensor();
            };
            auto xx = leaf(x), wi = leaf(w_in), bi = leaf(b_in), wu = leaf(w_up), wo = leaf(w_out),
                 ww = leaf(weights);
            auto y = ours ? emoe::dispatched_expert_ffn(xx, tokens, counts, ww, wi, bi, wu, wo, act,
                                                        group_bytes)
                          : kernels_expert_reference(xx, tokens, counts, ww, wi, bi, wu, wo, act);
            (y * go).sum().backward();
            auto grad = [](const torch::Tensor& t) {
              return t.defined() ? t.grad() : torch::zeros({1});
            };
            return std::vector<torch::Tensor>{y.detach(), grad(xx), grad(wi), grad(bi),
                                              grad(wu),   grad(wo), grad(ww)};
          };
          auto ours = run(true), ref = run(false);
          for (size_t i = 0; i < ours.size(); ++i) {
            ASSERT_TRUE(ours[i].defined()) << i;
            EXPECT_LT(emoe::test::max_abs_diff(ours[i], ref[i]), 1e-10) << i;
          }
          // the row-less expert's weight blocks have zero gradients (not garbage)
          EXPECT_EQ(ours[2].narrow(0, s, s).abs().max().item<double>(), 0.0);
          EXPECT_EQ(ours[5].narrow(1, s, s).abs().max().item<double>(), 0.0);
        }
  // frozen weights (LoRA beside EMoE): only x gets a gradient, the same one
  auto x = torch::randn({n, d}, torch::kDouble).requires_grad_(true);
  auto w_in = torch::randn({e * s, d}, torch::kDouble),
       w_out = torch::randn({d, e * s}, torch::kDouble);
  auto y = emoe::dispatched_expert_ffn(x, tokens, counts, {}, w_in, {}, {}, w_out,
                                       emoe::Activation::kGeluErf);
  y.sum().backward();
  auto x2 = x.detach().clone().requires_grad_(true);
  kernels_expert_reference(x2, tokens, counts, {}, w_in, {}, {}, w_out, emoe::Activation::kGeluErf)
      .sum()
      .backward();
  EXPECT_LT(emoe::test::max_abs_diff(x.grad(), x2.grad()), 1e-10);
  EXPECT_THROW(emoe::dispatched_expert_ffn(x, tokens, {7, 4, 6}, {}, w_in, {}, {}, w_out,
                                           emoe::Activation::kRelu),
               emoe::UsageError);
}

TEST(ExpertFfn, Float32RegisterTileKernelsMatchTheDefinitionAndTheLibraryPath) {
  // float32 on CPU takes the AVX-512 register-tile kernels (expert_kernels.h) where the CPU has
  // them: compared with the definition in float64 and with the library-GEMM path. The sizes
  // leave partial tiles everywhere: d 37 (column tails, a thread's partial column range), experts
  // with 0, 3, 13 and 17 rows, s from one partial vector (5) to two column chunks (50).
  if (!emoe::expert_kernels_used(torch::zeros({1}, torch::kFloat)))
    std::cout << "note: this CPU has no AVX-512: the float32 experts use the library path here\n";
  torch::manual_seed(11);
  const int64_t n = 21, d = 37;
  const std::vector<int64_t> counts = {13, 0, 3, 17, 8};
  const int64_t e = static_cast<int64_t>(counts.size()), rows = 41;
  auto tokens = kernels_routed_tokens(n, counts);
  ASSERT_EQ(tokens.size(0), rows);
  for (int64_t s : {5, 43, 50}) {
    for (bool gated : {false, true})
      for (bool weighted : {false, true}) {
        const bool bias = !gated;
        SCOPED_TRACE("s " + std::to_string(s) + (gated ? " gated" : "") +
                     (weighted ? " weighted" : ""));
        const auto act = gated ? emoe::Activation::kSilu : emoe::Activation::kGeluErf;
        auto x = torch::randn({n, d}), go = torch::randn({n, d});
        auto w_in = torch::randn({e * s, d}) * 0.3, w_out = torch::randn({d, e * s}) * 0.3;
        auto b_in = bias ? torch::randn({e * s}) : torch::Tensor();
        auto w_up = gated ? torch::randn({e * s, d}) * 0.3 : torch::Tensor();
        auto weights = weighted ? torch::rand({rows}) : torch::Tensor();
        // mode 0: definition in float64; 1: float32 kernels; 2: float32 library path
        auto run = [&](int mode, bool x_grad, bool w_grad) {
          auto leaf = [&](const torch::Tensor& t, bool grad) {
            if (!t.defined()) return torch::Tensor();
            auto c = (mode == 0 ? t.to(torch::kDouble) : t).clone();
            return grad ? c.requires_grad_(true) : c;
          };
          auto xx = leaf(x, x_grad), wi = leaf(w_in, w_grad), bi = leaf(b_in, w_grad),
               wu = leaf(w_up, w_grad), wo = leaf(w_out, w_grad), ww = leaf(weights, w_grad);
          // the path forced (by default each shape's is measured: either may win here)
          const auto before = emoe::force_expert_path(mode == 1 ? emoe::ExpertPath::kAvx512
                                                                : emoe::ExpertPath::kLibrary);
          auto y = mode == 0
                       ? kernels_expert_reference(xx, tokens, counts, ww, wi, bi, wu, wo, act)
                       : emoe::dispatched_expert_ffn(xx, tokens, counts, ww, wi, bi, wu, wo, act);
          (y * go.to(y.scalar_type())).sum().backward();
          emoe::force_expert_path(before);
          auto grad = [](const torch::Tensor& t) {
            return t.defined() && t.grad().defined() ? t.grad().to(torch::kDouble)
                                                     : torch::zeros({1}, torch::kDouble);
          };
          return std::vector<torch::Tensor>{y.detach().to(torch::kDouble),
                                            grad(xx),
                                            grad(wi),
                                            grad(bi),
                                            grad(wu),
                                            grad(wo),
                                            grad(ww)};
        };
        for (auto [x_grad, w_grad] :
             {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
          SCOPED_TRACE(std::string(x_grad ? "x grad" : "") + (w_grad ? " weight grads" : ""));
          auto ref = run(0, x_grad, w_grad), ours = run(1, x_grad, w_grad),
               lib = run(2, x_grad, w_grad);
          for (size_t i = 0; i < ref.size(); ++i) {
            const double scale = std::max(1.0, ref[i].abs().max().item<double>());
            EXPECT_LT(emoe::test::max_abs_diff(ours[i], ref[i]) / scale, 2e-5) << i;
            EXPECT_LT(emoe::test::max_abs_diff(ours[i], lib[i]) / scale, 2e-5) << i;
          }
          if (w_grad) {  // the row-less expert's blocks: exactly zero
            EXPECT_EQ(ours[2].narrow(0, s, s).abs().max().item<double>(), 0.0);
            EXPECT_EQ(ours[5].narrow(1, s, s).abs().max().item<double>(), 0.0);
          }
        }
      }
  }
}

// The bfloat16 kernels themselves (expert_kernels.h), each set this CPU has (AVX-512 BF16 register
// tiles, AMX tiles), against float64 products of the same bf16 values: products exact and summed
// in float32, so the float32 outputs agree to float32 rounding and the bf16 outputs to one bf16
// rounding. Odd k (37, a pair split at each row's end, rows starting at odd addresses), odd s
// (43: a half pair), odd row counts (a half pair of tokens in the weight gradients), an expert
// without rows, column tails, weights in both layouts; and a larger case (k 130, s 70, experts
// of 40 and 66 rows) past one AMX step, one accumulator panel and one tile of rows.
namespace {

struct Bf16KernelSet {
  const char* name;
  decltype(&emoe::expert_kernels::gather_gemm_bf16) gather;
  // (the AMX scatter's arguments: y's rows, and whether it adds into y or overwrites it)
  decltype(&emoe::expert_kernels::scatter_gemm_amx) scatter;
  bool overwrites;  // the scatter can overwrite y (accumulate false)
  // w [d, E·s] at strides (w_k, w_c)
  decltype(&emoe::expert_kernels::gather_weight_grad_bf16) weight_grad;
};

std::vector<Bf16KernelSet> bf16_kernel_sets() {
  namespace ek = emoe::expert_kernels;
  std::vector<Bf16KernelSet> sets;
  if (ek::bf16_available())
    sets.push_back(
        {"avx512-bf16", ek::gather_gemm_bf16,
         [](const uint16_t* h, const int64_t* tokens, const std::vector<int64_t>& counts, int64_t s,
            const uint16_t* b, int64_t b_k, int64_t b_c, int64_t n, float* y, int64_t ldy, int64_t,
            bool) { ek::scatter_gemm_bf16(h, tokens, counts, s, b, b_k, b_c, n, y, ldy); },
         false, ek::gather_weight_grad_bf16});
  if (emoe::amx_available())
    sets.push_back(
        {"amx", ek::gather_gemm_amx, ek::scatter_gemm_amx, true, ek::gather_weight_grad_amx});
  return sets;
}

}  // namespace

TEST(ExpertKernels, Bfloat16ProductsMatchFloat64) {
  const auto sets = bf16_kernel_sets();
  if (sets.empty())
    GTEST_SKIP() << "this CPU has neither AVX-512 BF16 nor AMX: the bfloat16 experts use the "
                    "library path here";
  auto bits = [](const torch::Tensor& t) {
    return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>());
  };
  auto bf16 = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).contiguous(); };
  auto f64 = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
  struct Case {
    int64_t n, d;
    std::vector<int64_t> counts, widths;
    bool ascending = false;  // each expert's tokens ascending, as routing gives them
  };
  // (the third: a real batch's thousands of tokens, each expert's rows in random token order;
  // the fourth: the same ascending, which the AMX scatter runs in chunks of tokens, over four
  // 64-column slabs, the last one partial; the fifth: ascending and sparse, most tokens and whole
  // chunks without rows)
  const std::vector<Case> cases = {{23, 37, {13, 0, 3, 17, 8}, {5, 43, 50}},
                                   {70, 130, {40, 0, 3, 66, 17}, {70}},
                                   {2300, 24, {700, 0, 2300, 90}, {20}},
                                   {2300, 200, {700, 0, 2300, 90, 1200}, {48}, true},
                                   {2300, 64, {30, 0, 50, 10}, {48}, true}};
  for (const auto& set : sets)
    for (const auto& cs : cases) {
      SCOPED_TRACE(std::string(set.name) + ", k " + std::to_string(cs.d) +
                   (cs.ascending ? ", ascending tokens" : ""));
      torch::manual_seed(12);
      const int64_t n = cs.n, d = cs.d;
      const auto& counts = cs.counts;
      const int64_t e = static_cast<int64_t>(counts.size());
      int64_t rows = 0;
      for (auto c : counts) rows += c;
      auto tokens = kernels_routed_tokens(n, counts);
      if (cs.ascending)
        for (int64_t j = 0, off = 0; j < e; off += counts[j], ++j) {
          auto seg = tokens.narrow(0, off, counts[j]);
          seg.copy_(std::get<0>(seg.sort()));
        }
      const int64_t* tok = tokens.data_ptr<int64_t>();
      for (int64_t s : cs.widths) {
        SCOPED_TRACE("s " + std::to_string(s));
        auto x = bf16(torch::randn({n, d})), h = bf16(torch::randn({rows, s}));
        auto w_rows = bf16(torch::randn({e * s, d}));  // neuron rows [E·s, d]
        auto w_cols = bf16(torch::randn({d, e * s}));  // neuron columns [d, E·s]
        auto bias = torch::randn({e * s});
        // the definition: expert j's rows of x (or h) times its block, in float64
        auto gathered = f64(x).index_select(0, tokens);  // [rows, d]
        auto block_product = [&](const torch::Tensor& a, const torch::Tensor& w_ds, int64_t j,
                                 int64_t off) {
          return a.narrow(0, off, counts[j]).mm(f64(w_ds).narrow(1, j * s, s));  // [d, E·s]
        };
        for (bool neuron_rows : {true, false}) {
          SCOPED_TRACE(neuron_rows ? "neuron rows" : "neuron columns");
          const auto& w = neuron_rows ? w_rows : w_cols;
          auto w_ds = neuron_rows ? w_rows.t() : w_cols;  // as [d, E·s]
          // gather: c[r] = bf16(x[tokens[r]] · block_j + bias_j)
          auto c = torch::empty({rows, s}, torch::kBFloat16);
          set.gather(bits(x), d, d, tok, counts, s, bits(w), neuron_rows ? 1 : e * s,
                     neuron_rows ? d : 1, bias.data_ptr<float>(),
                     reinterpret_cast<uint16_t*>(c.data_ptr<at::BFloat16>()));
          std::vector<torch::Tensor> parts;
          for (int64_t j = 0, off = 0; j < e; off += counts[j], ++j)
            parts.push_back(block_product(gathered, w_ds, j, off) + f64(bias).narrow(0, j * s, s));
          auto want = torch::cat(parts);
          // within one rounding to bf16 (2^-8 of the value) plus float32 summation
          auto err =
              (f64(c) - want).abs() - want.abs() * std::ldexp(1.0, -8) - 1e-5 * want.abs().max();
          EXPECT_LE(err.max().item<double>(), 0.0);
          // scatter: y[tokens[r]] += h[r] · block_jᵀ (block_j as [s, d]), on top of what y held
          auto y0 = torch::randn({n, d});
          auto y = y0.clone();
          set.scatter(bits(h), tok, counts, s, bits(w), neuron_rows ? d : 1,
                      neuron_rows ? 1 : e * s, d, y.data_ptr<float>(), d, n, true);
          auto terms = torch::zeros({n, d}, torch::kDouble);
          for (int64_t j = 0, off = 0; j < e; off += counts[j], ++j)
            terms.index_add_(
                0, tokens.narrow(0, off, counts[j]),
                f64(h).narrow(0, off, counts[j]).mm(f64(w_ds).narrow(1, j * s, s).t()));
          auto want_y = f64(y0) + terms;
          EXPECT_LT(emoe::test::max_abs_diff(y, want_y), 1e-5 * want_y.abs().max().item<double>());
          // each element sums its experts' terms in one order whatever the thread count
          const int threads = at::get_num_threads();
          at::set_num_threads(1);
          auto y1 = y0.clone();
          set.scatter(bits(h), tok, counts, s, bits(w), neuron_rows ? d : 1,
                      neuron_rows ? 1 : e * s, d, y1.data_ptr<float>(), d, n, true);
          at::set_num_threads(threads);
          EXPECT_TRUE(torch::equal(y1, y));
          // overwriting: y = the terms whatever it held (NaN here), zero for a token without rows
          if (set.overwrites) {
            auto y2 = torch::full({n, d}, std::nan(""));
            set.scatter(bits(h), tok, counts, s, bits(w), neuron_rows ? d : 1,
                        neuron_rows ? 1 : e * s, d, y2.data_ptr<float>(), d, n, false);
            EXPECT_LT(emoe::test::max_abs_diff(y2, terms), 1e-5 * terms.abs().max().item<double>());
          }
        }
        // weight gradient: block j of w = Σ_r x[tokens[r]]ᵀ h[r], zero for the row-less expert
        std::vector<torch::Tensor> blocks;
        for (int64_t j = 0, off = 0; j < e; off += counts[j], ++j)
          blocks.push_back(
              gathered.narrow(0, off, counts[j]).t().mm(f64(h).narrow(0, off, counts[j])));
        auto want_wg = torch::cat(blocks, 1);
        // [d, E·s] row-major, and written as the transpose of a row-major [E·s, d]: the
        // gradient of a neuron-rows weight in place
        for (bool transposed : {false, true}) {
          auto wg = transposed ? torch::full({e * s, d}, 7.0f).t() : torch::full({d, e * s}, 7.0f);
          set.weight_grad(bits(x), d, d, tok, counts, s, bits(h), wg.data_ptr<float>(),
                          wg.stride(0), wg.stride(1));
          EXPECT_LT(emoe::test::max_abs_diff(wg, want_wg),
                    1e-5 * want_wg.abs().max().item<double>());
          EXPECT_EQ(wg.narrow(1, s, s).abs().max().item<double>(), 0.0);
        }
      }
    }
}

// The path of each expert shape is chosen once (a second ask measures nothing and gives the same
// answer), is one this CPU has, and EMOE_EXPERT_KERNELS pins it: a path of the shape's dtype is
// taken as it is, one of the other dtype leaves the shape measured, an unknown name is refused.
TEST(ExpertFfn, PathChosenOncePerShapeAndPinnedByEmoeExpertKernels) {
  ::unsetenv("EMOE_EXPERT_KERNELS");
  const emoe::ExpertShape shape{torch::kFloat, 40, 7, 6, false};
  const auto before = emoe::expert_path_reports().size();
  const auto path = emoe::expert_path(shape);
  const auto available = emoe::expert_paths_available(torch::kFloat);
  EXPECT_NE(std::find(available.begin(), available.end(), path), available.end());
  EXPECT_EQ(emoe::expert_path(shape), path);
  EXPECT_EQ(emoe::expert_path_reports().size(), before + 1);
  EXPECT_NE(emoe::expert_path_reports().back().find("6 experts of 7 x 40, float32"),
            std::string::npos)
      << emoe::expert_path_reports().back();
  ::setenv("EMOE_EXPERT_KERNELS", "library", 1);
  EXPECT_EQ(emoe::expert_path({torch::kBFloat16, 40, 7, 6, true}), emoe::ExpertPath::kLibrary);
  EXPECT_NE(
      emoe::expert_path_report({torch::kBFloat16, 40, 7, 6, true}).find("EMOE_EXPERT_KERNELS"),
      std::string::npos);
  if (emoe::expert_paths_available(torch::kBFloat16).size() > 1) {
    const auto bf16_path = emoe::expert_paths_available(torch::kBFloat16).back();
    ::setenv("EMOE_EXPERT_KERNELS", emoe::to_string(bf16_path), 1);
    EXPECT_EQ(emoe::expert_path({torch::kBFloat16, 41, 7, 6, false}), bf16_path);
    // a bfloat16 path named: float32 experts are measured
    EXPECT_EQ(emoe::expert_path_report({torch::kFloat, 41, 7, 6, false}).find("EMOE_EXPERT"),
              std::string::npos);
  }
  ::setenv("EMOE_EXPERT_KERNELS", "tpu", 1);
  EXPECT_THROW(emoe::expert_path({torch::kFloat, 42, 7, 6, false}), emoe::UsageError);
  ::unsetenv("EMOE_EXPERT_KERNELS");
}

// dispatched_expert_ffn in bfloat16 (summed in float32, as under autocast) through the bf16
// kernels, against the library-GEMM path and the definition in float64, values and gradients.
TEST(ExpertFfn, Bfloat16KernelPathsMatchTheLibraryPath) {
  const auto paths = emoe::expert_paths_available(torch::kBFloat16);
  if (paths.size() < 2)
    GTEST_SKIP() << "this CPU has neither AVX-512 BF16 nor AMX: the bfloat16 experts use the "
                    "library path here";
  torch::manual_seed(13);
  const int64_t n = 21, d = 37;
  const std::vector<int64_t> counts = {13, 0, 3, 17, 8};
  const int64_t e = static_cast<int64_t>(counts.size()), rows = 41;
  auto tokens = kernels_routed_tokens(n, counts);
  for (int64_t s : {5, 43}) {
    for (bool gated : {false, true}) {
      const bool bias = !gated, weighted = gated;
      SCOPED_TRACE("s " + std::to_string(s) + (gated ? " gated weighted" : " bias"));
      const auto act = gated ? emoe::Activation::kSilu : emoe::Activation::kGeluErf;
      auto bf = [](const torch::Tensor& t) { return t.to(torch::kBFloat16); };
      auto x = bf(torch::randn({n, d})), go = torch::randn({n, d});
      auto w_in = bf(torch::randn({e * s, d}) * 0.3), w_out = bf(torch::randn({d, e * s}) * 0.3);
      auto b_in = bias ? bf(torch::randn({e * s})) : torch::Tensor();
      auto w_up = gated ? bf(torch::randn({e * s, d}) * 0.3) : torch::Tensor();
      auto weights = weighted ? bf(torch::rand({rows})) : torch::Tensor();
      // mode 0: definition in float64; 1: the kernel path `path`; 2: bf16 library path
      auto run = [&](int mode, emoe::ExpertPath path) {
        auto leaf = [&](const torch::Tensor& t) {
          return t.defined() ? (mode == 0 ? t.to(torch::kDouble) : t).clone().requires_grad_(true)
                             : torch::Tensor();
        };
        auto xx = leaf(x), wi = leaf(w_in), bi = leaf(b_in), wu = leaf(w_up), wo = leaf(w_out),
             ww = leaf(weights);
        auto before = emoe::force_expert_path(mode == 1 ? path : emoe::ExpertPath::kLibrary);
        auto y = mode == 0 ? kernels_expert_reference(xx, tokens, counts, ww, wi, bi, wu, wo, act)
                           : emoe::dispatched_expert_ffn(xx, tokens, counts, ww, wi, bi, wu, wo,
                                                         act, int64_t{16} << 20, torch::kFloat);
        (y * go.to(y.scalar_type())).sum().backward();
        emoe::force_expert_path(before);
        auto grad = [](const torch::Tensor& t) {
          return t.defined() ? t.grad().to(torch::kDouble) : torch::zeros({1}, torch::kDouble);
        };
        return std::vector<torch::Tensor>{y.detach().to(torch::kDouble),
                                          grad(xx),
                                          grad(wi),
                                          grad(bi),
                                          grad(wu),
                                          grad(wo),
                                          grad(ww)};
      };
      auto ref = run(0, emoe::ExpertPath::kLibrary), lib = run(2, emoe::ExpertPath::kLibrary);
      for (auto path : paths) {
        if (path == emoe::ExpertPath::kLibrary) continue;
        SCOPED_TRACE(emoe::to_string(path));
        auto ours = run(1, path);
        ASSERT_EQ(ours[0].size(1), d);
        for (size_t i = 0; i < ref.size(); ++i) {
          const double scale = std::max(1.0, ref[i].abs().max().item<double>());
          EXPECT_LT(emoe::test::max_abs_diff(ours[i], ref[i]) / scale, 2e-2) << i;
          EXPECT_LT(emoe::test::max_abs_diff(ours[i], lib[i]) / scale, 2e-2) << i;
        }
        EXPECT_EQ(ours[2].narrow(0, s, s).abs().max().item<double>(), 0.0);
        EXPECT_EQ(ours[5].narrow(1, s, s).abs().max().item<double>(), 0.0);
      }
    }
  }
}

TEST(FrozenLinear, KeepsNoInputAndGivesTheSameInputGradient) {
  torch::manual_seed(6);
  for (bool transposed : {false, true}) {
    SCOPED_TRACE(transposed);
    emoe::Linear lin(emoe::LinearOptions{5, 3, true, transposed});
    for (auto& p : lin->parameters()) p.set_requires_grad(false);
    auto x = torch::randn({4, 2, 5}, torch::requires_grad());
    auto go = torch::randn({4, 2, 3});
    auto y = lin(x);
    (y * go).sum().backward();
    auto x2 = x.detach().clone().requires_grad_(true);
    auto y2 = torch::linear(x2, lin->weight_out_in(), lin->bias);
    (y2 * go).sum().backward();
    EXPECT_TRUE(torch::allclose(y, y2, 1e-6, 1e-6));
    EXPECT_TRUE(torch::allclose(x.grad(), x2.grad(), 1e-6, 1e-6));
    EXPECT_FALSE(lin->weight.grad().defined());
    // the output comes from a function that keeps the frozen weight only, not the input:
    // FrozenLinearFn, or emoe::linear's LinearFn where float32 products go through oneDNN
    const std::string fn = emoe::onednn_matmul_enabled(x) ? "LinearFn" : "FrozenLinear";
    EXPECT_NE(y.grad_fn()->name().find(fn), std::string::npos) << y.grad_fn()->name();
  }
}

TEST(SegmentLinear, MatchesPerExpertLinearInValuesAndGradients) {
  torch::manual_seed(3);
  const std::vector<int64_t> counts = {5, 0, 3, 9};  // expert 1 gets no rows
  for (int64_t block_dim : {0, 1}) {
    SCOPED_TRACE(block_dim);
    const int64_t in = block_dim == 0 ? 6 : 4, rows = 17;
    auto w = block_dim == 0 ? torch::randn({4 * 4, in}, torch::kDouble)
                            : torch::randn({7, 4 * 4}, torch::kDouble);
    auto b = block_dim == 0 ? torch::randn({16}, torch::kDouble) : torch::Tensor();
    auto x = torch::randn({rows, in}, torch::kDouble);
    auto go = torch::randn({rows, block_dim == 0 ? 4 : 7}, torch::kDouble);
    auto run = [&](bool ours) {
      auto xx = x.clone().requires_grad_(true), ww = w.clone().requires_grad_(true);
      auto bb = b.defined() ? b.clone().requires_grad_(true) : torch::Tensor();
      auto y = ours ? emoe::segment_linear(xx, ww, bb, counts, block_dim)
                    : kernels_reference(xx, ww, bb, counts, block_dim);
      (y * go).sum().backward();
      return std::vector<torch::Tensor>{y.detach(), xx.grad(), ww.grad(),
                                        bb.defined() ? bb.grad() : torch::zeros({1})};
    };
    auto ours = run(true), ref = run(false);
    for (size_t i = 0; i < ours.size(); ++i)
      EXPECT_LT(emoe::test::max_abs_diff(ours[i], ref[i]), 1e-12) << i;
    // the row-less expert's weight block has a zero gradient (not garbage)
    EXPECT_EQ(ours[2].narrow(block_dim, 4, 4).abs().max().item<double>(), 0.0);
  }
  EXPECT_THROW(emoe::segment_linear(torch::zeros({3, 2}), torch::zeros({4, 2}), {}, {1, 1}, 0),
               emoe::UsageError);
}

TEST(Dropout, KeepsOneMinusPScalesAndIsSeededByTheGenerator) {
  auto x = torch::ones({1000, 1000});
  torch::manual_seed(11);
  auto a = emoe::dropout(x, 0.1, true);
  torch::manual_seed(11);
  auto b = emoe::dropout(x, 0.1, true);
  EXPECT_TRUE(torch::equal(a, b));                             // same generator state, same mask
  EXPECT_FALSE(torch::equal(a, emoe::dropout(x, 0.1, true)));  // the next call differs
  const double kept = (a != 0).to(torch::kDouble).mean().item<double>();
  EXPECT_NEAR(kept, 0.9, 0.002);  // 1e6 draws: sd 3e-4
  EXPECT_NEAR(a.max().item<double>(), 1 / 0.9, 1e-6);
  EXPECT_NEAR(a.mean().item<double>(), 1.0, 0.003);  // unbiased
  // rows are not copies of each other (the hash mixes the index)
  EXPECT_FALSE(torch::equal(a[0], a[1]));
  // two calls draw independent masks: both drop an element with probability p^2
  auto m1 = emoe::dropout(x, 0.5, true) == 0, m2 = emoe::dropout(x, 0.5, true) == 0;
  EXPECT_NEAR((m1 & m2).to(torch::kDouble).mean().item<double>(), 0.25, 0.003);
  // and neighbouring elements within one mask too
  EXPECT_NEAR((m1.flatten().narrow(0, 0, 999999) & m1.flatten().narrow(0, 1, 999999))
                  .to(torch::kDouble)
                  .mean()
                  .item<double>(),
              0.25, 0.003);
  // gradient: the same mask
  auto xg = torch::randn({64, 64}, torch::requires_grad());
  auto y = emoe::dropout(xg, 0.5, true);
  y.sum().backward();
  EXPECT_TRUE(torch::equal((xg.grad() != 0), (y != 0)));
  // the backward pass recomputes the mask from the seed: an upstream gradient g comes back as
  // g · 1/(1-p) exactly where the forward pass kept the element, 0 elsewhere
  auto xs = torch::randn({37, 53}, torch::requires_grad());
  auto g = torch::randn({37, 53});
  auto ys = emoe::dropout(xs, 0.3, true);
  (ys * g).sum().backward();
  const float keep = static_cast<float>(1.0 / (1.0 - 0.3));
  EXPECT_TRUE(torch::equal(xs.grad(), torch::where(ys != 0, g * keep, torch::zeros_like(g))));
  // bfloat16 (autocast's dtype) the same way, scaled in float and rounded once
  auto xb = torch::randn({41, 29}).to(torch::kBFloat16).requires_grad_(true);
  auto gb = torch::randn({41, 29}).to(torch::kBFloat16);
  auto yb = emoe::dropout(xb, 0.3, true);
  ASSERT_EQ(yb.scalar_type(), torch::kBFloat16);
  (yb * gb).sum().backward();
  auto scaled = [&](const torch::Tensor& t) {
    return (t.to(torch::kFloat) * keep).to(torch::kBFloat16);
  };
  EXPECT_TRUE(torch::equal(yb, torch::where(yb != 0, scaled(xb.detach()), torch::zeros_like(yb))));
  EXPECT_TRUE(torch::equal(xb.grad(), torch::where(yb != 0, scaled(gb), torch::zeros_like(gb))));
  EXPECT_NEAR((yb != 0).to(torch::kDouble).mean().item<double>(), 0.7, 0.05);
  // NaN stays NaN where kept and becomes 0 where dropped (bf16 and float alike); infinities stay
  for (const auto dt : {torch::kBFloat16, torch::kFloat}) {
    auto nan = emoe::dropout(torch::full({1000}, std::nan(""), dt), 0.5, true).to(torch::kFloat);
    const auto n_nan = nan.isnan().sum().item<int64_t>(), n_zero = (nan == 0).sum().item<int64_t>();
    EXPECT_EQ(n_nan + n_zero, 1000);
    EXPECT_GT(n_nan, 400);
    EXPECT_GT(n_zero, 400);
    auto inf = emoe::dropout(torch::full({100}, INFINITY, dt), 0.5, true).to(torch::kFloat);
    EXPECT_EQ((inf.isinf() | (inf == 0)).sum().item<int64_t>(), 100);
  }
  // a strided input is dropped by its logical element order, like its contiguous copy
  torch::manual_seed(3);
  auto strided = emoe::dropout(xs.detach().t(), 0.3, true);
  torch::manual_seed(3);
  EXPECT_TRUE(torch::equal(strided, emoe::dropout(xs.detach().t().contiguous(), 0.3, true)));
  // evaluation / p = 0: the input itself
  EXPECT_TRUE(emoe::dropout(x, 0.1, false).is_same(x));
  EXPECT_TRUE(emoe::dropout(x, 0.0, true).is_same(x));
}

// The masks as documented (dropout.cpp), computed here in scalar code: element i kept when
// mix32(mix32(i + k1) ^ k2) >= p · 2^32, (k1, k2) = splitmix64(seed) for i < 2^32. Whatever loop
// the CPU runs (AVX-512 written by hand, or the compiler's vectorisation), the bits are these.
TEST(Dropout, MasksAreTheDocumentedHashOnEveryLoop) {
  auto splitmix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  auto mix = [](uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
  };
  const uint64_t seed = 0x1234abcd5678ULL;
  const double p = 0.3;
  const uint64_t keys = splitmix(seed);
  const auto k1 = static_cast<uint32_t>(keys), k2 = static_cast<uint32_t>(keys >> 32);
  const auto threshold = static_cast<uint32_t>(p * 4294967296.0);
  const int64_t n = 1000, first = 77;  // a row starting off the vectors' multiples, a tail
  auto x = torch::randn({n});
  x[5] = std::numeric_limits<float>::quiet_NaN();
  auto want = torch::empty({n});
  for (int64_t j = 0; j < n; ++j) {
    const bool kept = mix(mix(static_cast<uint32_t>(first + j) + k1) ^ k2) >= threshold;
    want[j] = kept ? x[j].item<float>() * static_cast<float>(1.0 / (1.0 - p)) : 0.0f;
  }
  auto got = torch::empty({n});
  emoe::dropout_row(x.data_ptr<float>(), got.data_ptr<float>(), n, first, {seed, p});
  EXPECT_TRUE(torch::equal(got.isnan(), want.isnan()));
  EXPECT_TRUE(torch::equal(got.nan_to_num(), want.nan_to_num()));
  // bfloat16: the float32 product rounded once (NaN as the canonical quiet NaN)
  auto xb = x.to(torch::kBFloat16);
  auto gotb = torch::empty({n}, torch::kBFloat16);
  emoe::dropout_row(reinterpret_cast<const uint16_t*>(xb.data_ptr()),
                    reinterpret_cast<uint16_t*>(gotb.data_ptr()), n, first, {seed, p});
  auto wantb = torch::empty({n});
  for (int64_t j = 0; j < n; ++j) {
    const bool kept = mix(mix(static_cast<uint32_t>(first + j) + k1) ^ k2) >= threshold;
    wantb[j] = kept ? xb[j].item<float>() * static_cast<float>(1.0 / (1.0 - p)) : 0.0f;
  }
  EXPECT_TRUE(torch::equal(gotb.to(torch::kFloat).nan_to_num(),
                           wantb.to(torch::kBFloat16).to(torch::kFloat).nan_to_num()));
  EXPECT_EQ(std::isnan(gotb[5].item<float>()), std::isnan(wantb[5].item<float>()));
}

TEST(FusedAdamW, MatchesTorchAdamWOverSteps) {
  torch::manual_seed(5);
  auto model = emoe::test::tiny_bert_classifier();
  auto twin = emoe::test::tiny_bert_classifier();
  model->eval();  // no dropout: both see the same function
  twin->eval();
  {
    torch::NoGradGuard g;
    auto src = model->named_parameters();
    for (auto& p : twin->named_parameters()) p.value().copy_(src[p.key()]);
  }
  emoe::TrainOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  emoe::Optimizer ours(*model, o);
  emoe::Optimizer theirs_groups(*twin, o);
  auto& theirs = theirs_groups.adamw();
  // the same gradients for both (set by hand: through a model, rounding noise in gradients
  // that are 0 in exact arithmetic, such as a key bias's, is amplified by Adam's normalisation)
  for (int step = 0; step < 5; ++step) {
    torch::manual_seed(100 + step);
    auto b = twin->named_parameters();
    for (const auto& p : model->named_parameters()) {
      auto g = torch::randn_like(p.value()) * (step + 1);
      p.value().mutable_grad() = g;
      b[p.key()].mutable_grad() = g.clone();
    }
    ours.step();
    ours.zero_grad();
    theirs.step();  // libtorch's own AdamW on the same groups
    theirs.zero_grad();
  }
  auto b = twin->named_parameters();
  double worst = 0;
  for (const auto& p : model->named_parameters())
    worst = std::max(worst, emoe::test::max_abs_diff(p.value(), b[p.key()]));
  EXPECT_LT(worst, 1e-6);
  // zero_grad drops the gradients
  for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(FusedLinear, EqualsSeparateProjectionsAndFallsBackWithAdapters) {
  torch::manual_seed(2);
  emoe::Linear q(emoe::LinearOptions{8, 8, true, false}), k(emoe::LinearOptions{8, 4, true, false}),
      v(emoe::LinearOptions{8, 4, true, false});
  auto x = torch::randn({2, 3, 8});
  auto fused = emoe::fused_linear({q.get(), k.get(), v.get()}, x);
  ASSERT_EQ(fused.size(), 3u);
  EXPECT_LT(emoe::test::max_abs_diff(fused[0], q(x)), 1e-6);
  EXPECT_LT(emoe::test::max_abs_diff(fused[1], k(x)), 1e-6);
  EXPECT_LT(emoe::test::max_abs_diff(fused[2], v(x)), 1e-6);
  EXPECT_EQ(fused[1].sizes(), (std::vector<int64_t>{2, 3, 4}));
}

// Training under CPU bf16 autocast, a fused projection runs each weight's product apart (no
// concatenation of the weights, no split of the output): the outputs and the weights' and
// biases' gradients are the separate layers' bits, x's gradient their sum (in float32 here, so
// within bfloat16 rounding of it).
TEST(FusedLinear, TrainsUnderBf16AutocastOnEachWeightApart) {
  torch::manual_seed(4);
  emoe::Linear q(emoe::LinearOptions{24, 16, true, false}),
      k(emoe::LinearOptions{24, 8, true, false}), v(emoe::LinearOptions{24, 8, true, false});
  auto x = torch::randn({2, 5, 24}, torch::requires_grad());
  emoe::PrecisionScope scope(emoe::Precision::kBf16Mixed, torch::kCPU);
  if (!emoe::autocast_linear_applies(x, q->weight, q->bias))
    GTEST_SKIP() << "bf16 products are not on emoe's products on this CPU";
  std::vector<torch::Tensor> r = {torch::randn({2, 5, 16}), torch::randn({2, 5, 8}),
                                  torch::randn({2, 5, 8})};
  auto run = [&](bool fused) {
    std::vector<torch::Tensor> params = {q->weight, q->bias, k->weight, k->bias,
                                         v->weight, v->bias, x};
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
    const int64_t products = emoe::onednn_product_count();
    auto ys = fused ? emoe::fused_linear({q.get(), k.get(), v.get()}, x)
                    : std::vector<torch::Tensor>{q(x), k(x), v(x)};
    EXPECT_EQ(emoe::onednn_product_count() - products, 3);  // one per weight either way
    auto loss = torch::zeros({});
    for (size_t i = 0; i < ys.size(); ++i) loss = loss + (ys[i].to(torch::kFloat) * r[i]).sum();
    loss.backward();
    std::vector<torch::Tensor> out;
    for (auto& y : ys) out.push_back(y.detach());
    for (auto& p : params) out.push_back(p.grad().clone());
    return out;
  };
  const auto fused = run(true), apart = run(false);
  ASSERT_EQ(fused.size(), apart.size());
  for (size_t i = 0; i + 1 < fused.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(fused[i].scalar_type(), apart[i].scalar_type());
    EXPECT_TRUE(torch::equal(fused[i], apart[i]));
  }
  const auto& gx = fused.back();
  EXPECT_LE(emoe::test::max_abs_diff(gx, apart.back()),
            std::ldexp(1.0, -7) * apart.back().abs().max().item<double>());
  EXPECT_GT(gx.abs().max().item<double>(), 0.0);
}

TEST(LinearAutocast, AFrozenWeightIsCastOnceAndAgainAfterItChanges) {
  torch::manual_seed(5);
  for (bool transposed : {false, true}) {
    SCOPED_TRACE(transposed ? "Conv1D layout" : "Linear layout");
    emoe::LinearOptions o;
    o.in = 6;
    o.out = 4;
    o.transposed = transposed;
    emoe::Linear lin(o);
    lin->weight.requires_grad_(false);
    lin->bias.requires_grad_(false);
    // without autocast: the weight itself
    EXPECT_EQ(lin->autocast_weight().scalar_type(), torch::kFloat);
    EXPECT_EQ(lin->autocast_weight().data_ptr(), lin->weight.data_ptr());
    auto x = torch::randn({3, 6}, torch::requires_grad());
    emoe::PrecisionScope bf16(emoe::Precision::kBf16Mixed, torch::kCPU);
    auto y_ref = torch::linear(x, lin->weight_out_in(), lin->bias);  // autocast casts each call
    auto gx_ref = torch::autograd::grad({y_ref.sum()}, {x})[0];
    auto w1 = lin->autocast_weight(), w2 = lin->autocast_weight();
    EXPECT_EQ(w1.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(w1.is_same(w2));  // made once
    EXPECT_TRUE(torch::equal(w1, lin->weight_out_in().to(torch::kBFloat16)));
    auto y = lin->forward(x);
    ASSERT_EQ(y.scalar_type(), y_ref.scalar_type());
    if (emoe::bf16_products_on_gemm_out()) {
      // emoe's bfloat16 products (oneDNN's AVX-512 BF16 kernels, or computed in float32): within a
      // step of the float64 product of the bfloat16 operands (ATen's own bfloat16 product of the
      // Conv1D layout, autocast's reference here, strays further, by up to 4 %)
      torch::NoGradGuard no_grad;
      const auto want =
          torch::addmm(lin->bias.to(torch::kBFloat16).to(torch::kDouble),
                       x.to(torch::kBFloat16).to(torch::kDouble), w1.to(torch::kDouble).t());
      EXPECT_TRUE(within_a_bf16_step(y, want));
    } else {
      EXPECT_TRUE(torch::equal(y, y_ref));
    }
    auto gx = torch::autograd::grad({y.sum()}, {x})[0];
    EXPECT_LT(emoe::test::max_abs_diff(gx.to(torch::kFloat), gx_ref.to(torch::kFloat)),
              emoe::bf16_products_on_gemm_out() ? 2e-2 : 1e-6);
    {  // a changed weight: a new copy
      torch::NoGradGuard no_grad;
      lin->weight.mul_(2);
    }
    auto w3 = lin->autocast_weight();
    EXPECT_FALSE(w3.is_same(w1));
    EXPECT_TRUE(torch::equal(w3, lin->weight_out_in().to(torch::kBFloat16)));
    // a weight that trains: autocast's own cache applies, the weight itself is used
    lin->weight.requires_grad_(true);
    EXPECT_EQ(lin->autocast_weight().scalar_type(), torch::kFloat);
  }
}

TEST(Precision, ScopeEnablesAutocastOnlyWhileAliveAndParses) {
  EXPECT_EQ(emoe::parse_precision("bf16-mixed"), emoe::Precision::kBf16Mixed);
  EXPECT_EQ(emoe::parse_precision("fp32"), emoe::Precision::kFp32);
  EXPECT_THROW(emoe::parse_precision("fp8"), emoe::UsageError);
  auto a = torch::randn({4, 4}), b = torch::randn({4, 4});
  {
    emoe::PrecisionScope s(emoe::Precision::kBf16Mixed, torch::kCPU);
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat);
  {
    emoe::PrecisionScope s(emoe::Precision::kFp32, torch::kCPU);
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat);
  }
}

// Under bf16 autocast the dispatched experts compute in bfloat16 inside one function (inputs and
// weights cast once) and sum each token's experts in float32: the same numbers as the masked
// path under the same autocast, within bfloat16's precision, in outputs and input gradients.
TEST(ExpertFfn, DispatchedUnderAutocastMatchesMasked) {
  nlohmann::json cfg = {{"model_type", "bert"},         {"hidden_size", 32},
                        {"intermediate_size", 64},      {"num_hidden_layers", 1},
                        {"num_attention_heads", 2},     {"vocab_size", 20},
                        {"max_position_embeddings", 16}};
  torch::manual_seed(8);
  auto model = emoe::create_model(emoe::JsonFields(cfg, "test"), emoe::Head::kBase);
  auto c = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  c.experts = 8;
  c.topk = 2;
  c.layers = {0};
  c.split = "random";
  emoe::convert_to_moe(*model, c);
  auto* slot = model->ffn_slots()[0];
  auto* plug = emoe::moe_plugs(*model)[0];
  auto x0 = torch::randn({40, 32});
  auto run = [&](emoe::Execution execution, emoe::Precision precision) {
    plug->mutable_config().execution = execution;
    auto x = x0.clone().requires_grad_(true);
    torch::Tensor y;
    {
      emoe::PrecisionScope scope(precision, torch::kCPU);
      y = slot->run_ffn(x, {});
    }
    y.to(torch::kFloat).pow(2).sum().backward();
    return std::make_pair(y.detach().to(torch::kFloat), x.grad());
  };
  auto [y_masked, g_masked] = run(emoe::Execution::kMasked, emoe::Precision::kBf16Mixed);
  auto [y_disp, g_disp] = run(emoe::Execution::kDispatched, emoe::Precision::kBf16Mixed);
  auto [y_fp32, g_fp32] = run(emoe::Execution::kDispatched, emoe::Precision::kFp32);
  EXPECT_EQ(g_disp.scalar_type(), torch::kFloat);
  const double scale = y_fp32.abs().max().item<double>(),
               gscale = g_fp32.abs().max().item<double>();
  EXPECT_LT(emoe::test::max_abs_diff(y_disp, y_masked), 0.03 * scale);
  EXPECT_LT(emoe::test::max_abs_diff(g_disp, g_masked), 0.03 * gscale);
  EXPECT_LT(emoe::test::max_abs_diff(y_disp, y_fp32), 0.03 * scale);
  EXPECT_GT(emoe::test::max_abs_diff(y_disp, y_fp32), 0.0);  // it did compute in bfloat16
}

// The CPU allocator that tune_allocator installs: 64-byte aligned blocks from malloc, and a freed
// large block handed out again for the next request of its size (c10's posix_memalign blocks were
// not reused by glibc 2.36, so every large tensor was fresh, page-faulting memory).
TEST(CpuAllocator, AlignedAndReusesAFreedLargeBlock) {
  emoe::tune_allocator();
  c10::Allocator* alloc = c10::GetCPUAllocator();
  for (size_t n : {size_t{1}, size_t{63}, size_t{4096}, size_t{25} << 20}) {
    void* p = alloc->raw_allocate(n);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << n;
    static_cast<char*>(p)[0] = 1;
    static_cast<char*>(p)[n - 1] = 2;
    alloc->raw_deallocate(p);
  }
  EXPECT_EQ(alloc->allocate(0).get(), nullptr);
  const void* first = nullptr;
  {
    auto t = torch::empty({25 << 20}, torch::kUInt8);
    first = t.data_ptr();
    t.fill_(7);
  }
  auto again = torch::empty({25 << 20}, torch::kUInt8);
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(again.data_ptr()) % 64, 0u);
}

// emoe::linear / emoe::matmul / emoe::gemm_out (oneDNN for float32 on AVX-512 CPUs) against
// ATen's products: values and every gradient, in the layouts the models use (a transposed weight
// view, attention's head-split strides, a frozen weight, a frozen input).
TEST(Matmul, OneDnnProductsMatchAtenInValuesAndGradients) {
  torch::manual_seed(3);
  if (!emoe::onednn_matmul_enabled(torch::zeros({1})))
    GTEST_SKIP() << "float32 products use ATen here: " << emoe::matmul_backend_name();
  // oneDNN for every float32 product here (by default a large one may be measured faster in ATen)
  const auto setting = emoe::set_float32_gemm(emoe::Float32Gemm::kOneDnn);
  const int64_t before = emoe::onednn_product_count();
  auto close = [](const torch::Tensor& a, const torch::Tensor& b) {
    return emoe::test::max_abs_diff(a, b) <= 1e-4 * (1.0 + b.abs().max().item<double>());
  };
  for (bool transposed : {false, true})
    for (bool with_bias : {false, true})
      for (int frozen = 0; frozen < 3;
           ++frozen) {  // 0: all train, 1: weight frozen, 2: input frozen
        SCOPED_TRACE(fmt::format("transposed {} bias {} frozen {}", transposed, with_bias, frozen));
        auto x = torch::randn({3, 5, 24}).requires_grad_(frozen != 2);
        auto param = (transposed ? torch::randn({24, 40}) : torch::randn({40, 24}))
                         .requires_grad_(frozen != 1);
        auto b = with_bias ? torch::randn({40}).requires_grad_(frozen != 1) : torch::Tensor();
        auto w = transposed ? param.t() : param;
        auto y = emoe::linear(x, w, b);
        auto y_ref = torch::linear(x, w, b);
        ASSERT_TRUE(close(y, y_ref));
        auto g = torch::randn_like(y);
        std::vector<torch::Tensor> inputs;
        if (x.requires_grad()) inputs.push_back(x);
        if (param.requires_grad()) inputs.push_back(param);
        if (b.defined() && b.requires_grad()) inputs.push_back(b);
        auto grads = torch::autograd::grad({y}, inputs, {g});
        auto grads_ref = torch::autograd::grad({y_ref}, inputs, {g});
        for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(close(grads[i], grads_ref[i])) << i;
        if (param.requires_grad())
          EXPECT_TRUE(grads[x.requires_grad() ? 1 : 0].is_contiguous());  // the param's layout
      }
  // attention: q, k, v as split_heads leaves them ([B, T, H, D] viewed as [B, H, T, D])
  auto q = torch::randn({2, 7, 3, 8}).transpose(1, 2).requires_grad_(false);
  auto qs = (q * 0.5).requires_grad_(true), k = torch::randn({2, 7, 3, 8}).transpose(1, 2);
  auto kt = k.detach().requires_grad_(true);
  auto s = emoe::matmul(qs, kt.transpose(-2, -1));
  auto s_ref = torch::matmul(qs, kt.transpose(-2, -1));
  ASSERT_TRUE(close(s, s_ref));
  auto gs = torch::randn_like(s);
  auto ga = torch::autograd::grad({s}, {qs, kt}, {gs});
  auto ga_ref = torch::autograd::grad({s_ref}, {qs, kt}, {gs});
  EXPECT_TRUE(close(ga[0], ga_ref[0]));
  EXPECT_TRUE(close(ga[1], ga_ref[1]));
  // accumulate, and an empty inner dimension
  auto a = torch::randn({6, 9}), bb = torch::randn({9, 4}), out = torch::randn({6, 4});
  auto expect = out + a.mm(bb);
  emoe::gemm_out(out, a, bb, torch::Tensor(), /*accumulate=*/true);
  EXPECT_TRUE(close(out, expect));
  // a column-major output (the gradient of a weight kept [in, out]) is written as the
  // transposed product, also when accumulating
  for (bool accum : {false, true}) {
    auto a2 = torch::randn({5, 7}), b2 = torch::randn({7, 3}), o2 = torch::randn({3, 5}).t();
    auto expect2 = (accum ? o2.clone() : torch::zeros({5, 3})) + a2.mm(b2);
    emoe::gemm_out(o2, a2, b2, torch::Tensor(), accum);
    EXPECT_TRUE(close(o2, expect2)) << accum;
  }
  auto bias = torch::randn({4});
  emoe::gemm_out(out, torch::zeros({6, 0}), torch::zeros({0, 4}), bias);
  EXPECT_TRUE(close(out, bias.expand({6, 4})));
  // products whose sizes change call by call (an expert's rows) share a primitive: rows, inner
  // size, layouts, bias and accumulation vary
  for (int64_t m : {1, 17, 64, 5})
    for (int64_t k : {3, 48})
      for (bool bt : {false, true}) {
        SCOPED_TRACE(fmt::format("m {} k {} bt {}", m, k, bt));
        auto xa = torch::randn({m, k});
        auto wb = bt ? torch::randn({6, k}).t() : torch::randn({k, 6});
        auto ob = torch::empty({m, 6}), bias6 = torch::randn({6});
        emoe::gemm_out(ob, xa, wb, bias6, false, /*shapes_vary=*/true);
        EXPECT_TRUE(close(ob, torch::addmm(bias6, xa, wb)));
        auto gy = torch::randn({m, 6});
        auto acc = torch::randn({k, 6}),
             expect_acc = acc + xa.t().mm(gy);  // a weight gradient's form
        emoe::gemm_out(acc, xa.t(), gy, {}, /*accumulate=*/true, /*shapes_vary=*/true);
        EXPECT_TRUE(close(acc, expect_acc));
      }
  EXPECT_GT(emoe::onednn_product_count(), before + 20);  // they did go through oneDNN
  // bfloat16 (the experts' products under autocast), sizes varying: within bf16 rounding
  const int64_t before_bf16 = emoe::onednn_product_count();
  for (int64_t m : {3, 40, 9}) {
    auto xa = torch::randn({m, 32}).to(torch::kBFloat16),
         wb = torch::randn({8, 32}).to(torch::kBFloat16).t();
    auto ob = torch::empty({m, 8}, torch::kBFloat16);
    emoe::gemm_out(ob, xa, wb, {}, false, /*shapes_vary=*/true);
    auto expect_bf = xa.to(torch::kFloat).mm(wb.to(torch::kFloat));
    EXPECT_LT(emoe::test::max_abs_diff(ob.to(torch::kFloat), expect_bf),
              0.02 * (1.0 + expect_bf.abs().max().item<double>()));
  }
  if (emoe::matmul_backend_name().find("bf16") != std::string::npos)
    EXPECT_EQ(emoe::onednn_product_count(), before_bf16 + 3);
  emoe::set_float32_gemm(setting);
}

// Float32Gemm::kMeasured: a 2-D float32 product past 16M multiply-adds is timed in oneDNN and ATen
// on first sight of its shape (once: a second product of that shape is not measured again), a
// product that accumulates is never measured, small ones never are, and every result is the
// product, whichever library computed it.
TEST(Matmul, Float32ProductsMeasuredOncePerShapeGiveTheProduct) {
  if (!emoe::onednn_matmul_enabled(torch::zeros({1})))
    GTEST_SKIP() << "float32 products use ATen here: " << emoe::matmul_backend_name();
  torch::manual_seed(5);
  const auto setting = emoe::set_float32_gemm(emoe::Float32Gemm::kMeasured);
  auto close = [](const torch::Tensor& a, const torch::Tensor& b) {
    return emoe::test::max_abs_diff(a, b) <= 1e-4 * (1.0 + b.abs().max().item<double>());
  };
  const auto start = emoe::float32_gemm_measurements().first;
  // an odd shape of its own, so no other test measured it first: 515 x 263 x 129 (17.5M)
  auto a = torch::randn({515, 263}), b = torch::randn({263, 129}), bias = torch::randn({129});
  auto out = torch::empty({515, 129});
  emoe::gemm_out(out, a, b, bias);
  EXPECT_TRUE(close(out, torch::addmm(bias, a, b)));
  EXPECT_EQ(emoe::float32_gemm_measurements().first, start + 1);
  auto a2 = torch::randn({515, 263});
  emoe::gemm_out(out, a2, b, bias);  // the same shape: the choice is reused
  EXPECT_TRUE(close(out, torch::addmm(bias, a2, b)));
  EXPECT_EQ(emoe::float32_gemm_measurements().first, start + 1);
  auto acc = torch::randn({517, 129}), expect = acc + torch::randn({517, 263}).mm(b);
  auto a3 = torch::randn({517, 263});
  expect = acc + a3.mm(b);
  emoe::gemm_out(acc, a3, b, {}, /*accumulate=*/true);  // a new shape, but accumulating
  EXPECT_TRUE(close(acc, expect));
  auto small = torch::empty({64, 64});
  auto sa = torch::randn({64, 64}), sb = torch::randn({64, 64});
  emoe::gemm_out(small, sa, sb);
  EXPECT_TRUE(close(small, sa.mm(sb)));
  EXPECT_EQ(emoe::float32_gemm_measurements().first, start + 1);
  EXPECT_NE(emoe::matmul_backend_name().find("whichever measured faster"), std::string::npos);
  emoe::set_float32_gemm(setting);
}

TEST(Matmul, OneDnnImplementationTimedOncePerClassGivesTheProduct) {
  // products past 16M multiply-adds: each of oneDNN's implementations timed once per class on a
  // scratch output (an accumulating product must add once, a bias product write over `out`), the
  // choice reused by another size of the class; EMOE_GEMM=onednn times nothing
  if (!emoe::onednn_matmul_enabled(torch::zeros({1})))
    GTEST_SKIP() << "float32 products use ATen here: " << emoe::matmul_backend_name();
  torch::manual_seed(6);
  const auto setting = emoe::set_float32_gemm(emoe::Float32Gemm::kMeasured);
  auto close = [](const torch::Tensor& got, const torch::Tensor& want) {
    return emoe::test::max_abs_diff(got, want) <= 1e-4 * (1.0 + want.abs().max().item<double>());
  };
  std::vector<at::ScalarType> dtypes{torch::kFloat};
  if (emoe::matmul_backend_name().find("bf16") != std::string::npos &&
      emoe::bf16_gemm() != emoe::Bf16Gemm::kFloat32)
    dtypes.push_back(torch::kBFloat16);
  for (const auto dtype : dtypes) {
    const auto what = c10::toString(dtype);
    const size_t start = emoe::onednn_implementation_choices().size();
    // a weight's gradient as the linear layers' backward pass computes it: g^T x, g read
    // transposed, summed into float32 (odd sizes: no other test's class); 700 x 150 x 330 (35M)
    auto g = torch::randn({700, 150}).to(dtype), x = torch::randn({700, 330}).to(dtype);
    const auto want = g.to(torch::kDouble).t().mm(x.to(torch::kDouble));
    auto out = torch::full({150, 330}, 7.0f);
    emoe::gemm_out(out, g.t(), x);
    EXPECT_TRUE(close(out, want)) << what;
    ASSERT_EQ(emoe::onednn_implementation_choices().size(), start + 1) << what;
    const auto line = emoe::onednn_implementation_choices().back();
    EXPECT_NE(line.find(std::string(what) + "->Float 256x1024x512 crr: "), std::string::npos)
        << line;
    // float32: where ATen won the library timing for this shape, the products below would go to
    // ATen (no oneDNN implementation to time); that choice is not what this tests
    auto made = emoe::gemm_choices_made();
    for (auto& entry : made.float32_library) entry.second = "onednn";
    ASSERT_EQ(emoe::pin_gemm_choices(made), "");
    // accumulating into out (its own class): out + g^T x, added once
    auto acc = torch::randn({150, 330});
    const auto acc_want = acc.to(torch::kDouble) + want;
    emoe::gemm_out(acc, g.t(), x, {}, /*accumulate=*/true);
    EXPECT_TRUE(close(acc, acc_want)) << what;
    EXPECT_EQ(emoe::onednn_implementation_choices().size(), start + 2) << what;
    // another size of the first class (rows 700 -> 650: still 1024 rounded up): reused
    auto g2 = torch::randn({650, 150}).to(dtype), x2 = torch::randn({650, 330}).to(dtype);
    emoe::gemm_out(out, g2.t(), x2);
    EXPECT_TRUE(close(out, g2.to(torch::kDouble).t().mm(x2.to(torch::kDouble)))) << what;
    EXPECT_EQ(emoe::onednn_implementation_choices().size(), start + 2) << what;
    // oneDNN's first implementation, untimed
    emoe::set_float32_gemm(emoe::Float32Gemm::kOneDnn);
    auto g3 = torch::randn({900, 150}).to(dtype), x3 = torch::randn({900, 330}).to(dtype);
    emoe::gemm_out(out, g3.t(), x3);
    EXPECT_TRUE(close(out, g3.to(torch::kDouble).t().mm(x3.to(torch::kDouble)))) << what;
    EXPECT_EQ(emoe::onednn_implementation_choices().size(), start + 2) << what;
    emoe::set_float32_gemm(emoe::Float32Gemm::kMeasured);
  }
  emoe::set_float32_gemm(setting);
}

TEST(Matmul, ProductsOnAPackedSecondOperandAreTheSameBits) {
  // PackB: b copied into oneDNN's blocked layout first, then the same implementation's product on
  // the copy — the same sums in the same order, so the same bits as on b as it is — for the
  // layer's forward (a transposed weight view, with a bias), its input gradient (the weight as it
  // is), a weight's gradient (g^T x), accumulation, odd sizes and bfloat16 summed into float32;
  // a measured class lists the packed candidate, and a pinned "(B packed)" choice is taken
  if (!emoe::onednn_matmul_enabled(torch::zeros({1})))
    GTEST_SKIP() << "float32 products use ATen here: " << emoe::matmul_backend_name();
  torch::manual_seed(12);
  const auto gemm = emoe::set_float32_gemm(emoe::Float32Gemm::kOneDnn);  // oneDNN's first, untimed
  const auto packing = emoe::set_pack_b(emoe::PackB::kNever);
  std::vector<at::ScalarType> dtypes{torch::kFloat};
  if (emoe::matmul_backend_name().find("bf16") != std::string::npos &&
      emoe::bf16_gemm() != emoe::Bf16Gemm::kFloat32)
    dtypes.push_back(torch::kBFloat16);
  for (const auto dtype : dtypes) {
    const auto what = std::string(c10::toString(dtype));
    auto x = torch::randn({301, 197}).to(dtype), w = torch::randn({143, 197}).to(dtype);
    auto bias = torch::randn({143}).to(dtype), g = torch::randn({301, 143}).to(dtype);
    auto acc0 = torch::randn({301, 197}).to(dtype);
    struct Case {
      std::string name;
      std::function<torch::Tensor()> run;
    };
    const std::vector<Case> cases = {
        {"x w^T + b",
         [&] {
           auto y = torch::empty({301, 143}, x.options());
           emoe::gemm_out(y, x, w.t(), bias);
           return y;
         }},
        {"g w",
         [&] {
           auto y = torch::empty({301, 197}, x.options());
           emoe::gemm_out(y, g, w);
           return y;
         }},
        {"g^T x into float32",
         [&] {
           auto y = torch::empty({143, 197}, x.options().dtype(torch::kFloat));
           emoe::gemm_out(y, g.t(), x);
           return y;
         }},
        {"acc + g w", [&] {
           auto y = acc0.clone();
           emoe::gemm_out(y, g, w, {}, /*accumulate=*/true);
           return y;
         }}};
    for (const auto& c : cases) {
      emoe::set_pack_b(emoe::PackB::kNever);
      const auto packed_before = emoe::onednn_packed_product_count();
      const auto plain = c.run();
      EXPECT_EQ(emoe::onednn_packed_product_count(), packed_before) << what << " " << c.name;
      emoe::set_pack_b(emoe::PackB::kAlways);
      const auto packed = c.run();
      EXPECT_EQ(emoe::onednn_packed_product_count(), packed_before + 1) << what << " " << c.name;
      EXPECT_TRUE(torch::equal(plain, packed)) << what << " " << c.name;
    }
  }
  // measured: the packed candidate is timed beside oneDNN's implementations (a class no other
  // test makes: 1100 x 260 x 330, 94M multiply-adds; packing is timed from 1024 rows)
  // (bfloat16 where oneDNN computes it: a float32 shape may go to ATen, timing none of oneDNN's)
  emoe::set_float32_gemm(emoe::Float32Gemm::kMeasured);
  emoe::set_pack_b(emoe::PackB::kMeasured);
  const auto dtype = dtypes.back();
  auto a = torch::randn({1100, 260}).to(dtype), w = torch::randn({330, 260}).to(dtype);
  const auto want = a.to(torch::kDouble).mm(w.to(torch::kDouble).t());
  // (a bfloat16 output: each sum rounded to 8 bits)
  const double tol =
      (dtype == torch::kFloat ? 1e-4 : 8e-3) * (1.0 + want.abs().max().item<double>());
  auto y = torch::empty({1100, 330}, a.options());
  const size_t start = emoe::onednn_implementation_choices().size();
  emoe::gemm_out(y, a, w.t());
  EXPECT_LE(emoe::test::max_abs_diff(y, want), tol);
  const auto lines = emoe::onednn_implementation_choices();
  if (lines.size() == start + 1) {
    const auto& line = lines.back();
    const std::regex packed_candidate(R"([;,] ([^;,()]+) \(B packed\) \d+ GFLOP/s)");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(line, m, packed_candidate)) << line;
    // pinned to the packed variant (as a kernels.json of a process where it won would say)
    const auto cls = line.substr(0, line.find(": "));
    emoe::GemmChoiceSet pin;
    pin.onednn_implementations[cls] = m[1].str() + " (B packed)";
    ASSERT_EQ(emoe::pin_gemm_choices(pin), "");
    const auto packed_before = emoe::onednn_packed_product_count();
    auto y2 = torch::empty({1100, 330}, a.options());
    emoe::gemm_out(y2, a, w.t());
    EXPECT_EQ(emoe::onednn_packed_product_count(), packed_before + 1) << line;
    EXPECT_LE(emoe::test::max_abs_diff(y2, want), tol);
    // ... and without packing, the same implementation on w as it is
    emoe::set_pack_b(emoe::PackB::kNever);
    auto y3 = torch::empty({1100, 330}, a.options());
    emoe::gemm_out(y3, a, w.t());
    EXPECT_EQ(emoe::onednn_packed_product_count(), packed_before + 1);
    EXPECT_TRUE(torch::equal(y2, y3));
  }
  emoe::set_pack_b(packing);
  emoe::set_float32_gemm(gemm);
}

TEST(ChunkedLmLoss, MatchesCrossEntropyOfTheLogitsInValueAndGradients) {
  torch::manual_seed(8);
  const int64_t b = 3, t = 7, h = 16, v = 50;
  auto labels = torch::randint(0, v, {b, t}, torch::kLong);
  labels.index_put_({0, 3}, -100);  // ignored positions
  labels.index_put_({2, 6}, -100);
  for (const int64_t chunk : {0, 1, 4, 5}) {  // one chunk; a row at a time; uneven chunks
    for (const bool transposed_weight : {false, true}) {
      auto hidden = torch::randn({b, t, h}, torch::requires_grad());
      auto w = transposed_weight ? torch::randn({h, v}).t().requires_grad_(true)
                                 : torch::randn({v, h}, torch::requires_grad());
      auto ref = emoe::causal_lm_loss(torch::linear(hidden, w), labels);
      ref.backward();
      auto gh = hidden.grad().clone(), gw = w.grad().clone();
      hidden.mutable_grad() = torch::Tensor();
      w.mutable_grad() = torch::Tensor();
      auto loss = emoe::chunked_causal_lm_loss(hidden, w, labels, chunk);
      (loss * 3).backward();  // a scaled loss scales the gradients
      EXPECT_LT(std::abs(loss.item<double>() - ref.item<double>()), 1e-5) << "chunk " << chunk;
      EXPECT_LT(emoe::test::max_abs_diff(hidden.grad(), gh * 3), 1e-5) << "chunk " << chunk;
      EXPECT_LT(emoe::test::max_abs_diff(w.grad(), gw * 3), 1e-5) << "chunk " << chunk;
    }
  }
  // a frozen weight gets no gradient; without grad mode nothing is computed for one
  auto hidden = torch::randn({b, t, h}, torch::requires_grad());
  auto w = torch::randn({v, h});
  emoe::chunked_causal_lm_loss(hidden, w, labels, 2).backward();
  EXPECT_TRUE(hidden.grad().defined());
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(emoe::chunked_causal_lm_loss(hidden, w, labels).requires_grad());
  }
  // every label ignored: NaN, as cross_entropy's mean
  EXPECT_TRUE(
      std::isnan(emoe::chunked_causal_lm_loss(hidden, w, torch::full({b, t}, -100, torch::kLong))
                     .item<double>()));
  EXPECT_TRUE(std::isnan(
      emoe::causal_lm_loss(torch::linear(hidden, w), torch::full({b, t}, -100, torch::kLong))
          .item<double>()));
  // what it leaves to the plain path: bfloat16 tensors; float64 under autocast
  EXPECT_FALSE(
      emoe::chunked_lm_loss_supported(hidden.to(torch::kBFloat16), w.to(torch::kBFloat16)));
  // under bf16 autocast: products in bfloat16, softmax and sums in float32 — as autocast's
  // linear + cross_entropy (the logits rounded to bfloat16 either way)
  {
    emoe::PrecisionScope bf16(emoe::Precision::kBf16Mixed, torch::kCPU);
    EXPECT_FALSE(emoe::chunked_lm_loss_supported(hidden.to(torch::kDouble), w.to(torch::kDouble)));
    ASSERT_TRUE(emoe::chunked_lm_loss_supported(hidden, w));
    for (const int64_t chunk : {0, 4}) {
      auto hd = hidden.detach().clone().requires_grad_(true), wd = w.clone().requires_grad_(true);
      auto ref = emoe::causal_lm_loss(torch::linear(hd, wd), labels);
      ASSERT_EQ(ref.scalar_type(), torch::kFloat);
      auto ref_grads = torch::autograd::grad({ref}, {hd, wd});
      auto loss = emoe::chunked_causal_lm_loss(hd, wd, labels, chunk);
      ASSERT_EQ(loss.scalar_type(), torch::kFloat);
      auto grads = torch::autograd::grad({loss}, {hd, wd});
      EXPECT_LT(std::abs(loss.item<double>() - ref.item<double>()),
                2e-3 * std::abs(ref.item<double>()))
          << chunk;
      for (size_t i = 0; i < 2; ++i) {
        ASSERT_EQ(grads[i].scalar_type(), torch::kFloat);
        EXPECT_LT(emoe::test::max_abs_diff(grads[i], ref_grads[i]),
                  2e-2 * ref_grads[i].abs().max().item<double>())
            << chunk << " " << i;
      }
      // and far from the float32 result's rounding: the products did run in bfloat16
      if (chunk == 0) {
        emoe::set_autocast_enabled(at::kCPU, false);
        auto full = emoe::chunked_causal_lm_loss(hd, wd, labels, chunk);
        emoe::set_autocast_enabled(at::kCPU, true);
        EXPECT_GT(std::abs(full.item<double>() - loss.item<double>()), 1e-7);
      }
    }
  }
}

TEST(BlockMask, NoPaddingBlocksNothingAndPaddingBlocksItsKeys) {
  const auto ones = torch::ones({2, 5}, torch::kLong);
  // no padding: nothing to block (no masked_fill in attention), causal or not
  EXPECT_FALSE(emoe::build_block_mask(ones, 5, 5, /*causal=*/false, torch::kCPU).defined());
  EXPECT_TRUE(
      torch::equal(emoe::build_block_mask(ones, 3, 5, /*causal=*/true, torch::kCPU),
                   emoe::build_block_mask(torch::Tensor(), 3, 5, /*causal=*/true, torch::kCPU)));
  // padding: the pad keys of that row are blocked for every query
  auto padded = ones.clone();
  padded.index_put_({1, 4}, 0);
  auto m = emoe::build_block_mask(padded, 5, 5, /*causal=*/false, torch::kCPU);
  ASSERT_TRUE(m.defined());
  EXPECT_EQ(m.sum().item<int64_t>(), 1);
  EXPECT_TRUE(m[1][0][0][4].item<bool>());
  // a mask of the wrong length is still rejected
  EXPECT_ANY_THROW(
      emoe::build_block_mask(torch::ones({2, 4}, torch::kLong), 5, 5, false, torch::kCPU));
}

// The KV cache appends each step's keys and values into buffers with room to spare: the same
// keys and values as concatenation, a step copying its own positions only (the buffer is kept
// until it is full, then doubled), and beam search's row selection keeping both.
TEST(KvCache, AppendsInPlaceIntoRoomThatDoublesAndMatchesConcatenation) {
  emoe::LayerKv kv;
  auto k_all = torch::randn({3, 2, 0, 4}), v_all = torch::randn({3, 2, 0, 4});
  std::vector<const void*> buffers;
  for (int64_t t : {5, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 20}) {
    // split_heads gives a transposed view: appended from any layout
    auto k = torch::randn({3, t, 2, 4}).transpose(1, 2), v = torch::randn({3, 2, t, 4});
    k_all = torch::cat({k_all, k}, 2);
    v_all = torch::cat({v_all, v}, 2);
    const auto [kk, vv] = emoe::append_kv(&kv, k, v);
    EXPECT_TRUE(torch::equal(kk, k_all));
    EXPECT_TRUE(torch::equal(vv, v_all));
    EXPECT_TRUE(torch::equal(kv.k, k_all));
    if (kv.k_room.defined()) {
      EXPECT_EQ(kv.k.data_ptr(), kv.k_room.data_ptr());  // a view of the room
      EXPECT_GE(kv.k_room.size(2), kv.k.size(2));
      if (buffers.empty() || buffers.back() != kv.k_room.data_ptr())
        buffers.push_back(kv.k_room.data_ptr());
    }
  }
  // 5 positions stored as given, then room for 16, 34, 92: three buffers over 46 positions
  EXPECT_EQ(k_all.size(2), 46);
  EXPECT_EQ(buffers.size(), 3u);
  auto rows = torch::tensor({2, 0, 0}, torch::kLong);
  kv.select_rows(rows);
  EXPECT_TRUE(torch::equal(kv.k, k_all.index_select(0, rows)));
  EXPECT_TRUE(torch::equal(kv.v, v_all.index_select(0, rows)));
  auto k = torch::randn({3, 2, 1, 4}), v = torch::randn({3, 2, 1, 4});
  emoe::append_kv(&kv, k, v);
  EXPECT_TRUE(torch::equal(kv.k, torch::cat({k_all.index_select(0, rows), k}, 2)));
  EXPECT_TRUE(torch::equal(kv.v, torch::cat({v_all.index_select(0, rows), v}, 2)));
  EXPECT_THROW(emoe::append_kv(&kv, torch::randn({2, 2, 1, 4}), torch::randn({2, 2, 1, 4})),
               c10::Error);  // another batch size
  // a reserve (generate sets prompt + new tokens) makes the room once, at that size
  emoe::LayerKv reserved;
  reserved.reserve = 40;
  emoe::append_kv(&reserved, torch::randn({1, 2, 30, 4}), torch::randn({1, 2, 30, 4}));
  for (int i = 0; i < 10; ++i)
    emoe::append_kv(&reserved, torch::randn({1, 2, 1, 4}), torch::randn({1, 2, 1, 4}));
  EXPECT_EQ(reserved.k_room.size(2), 40);
  EXPECT_EQ(reserved.k.size(2), 40);
  emoe::append_kv(&reserved, torch::randn({1, 2, 1, 4}), torch::randn({1, 2, 1, 4}));
  EXPECT_EQ(reserved.k_room.size(2), 82);  // past the reserve: doubled
}

TEST(LinearAutocast, InferenceKeepsOneCastWhileTheWeightIsUnchangedAndTrainingDropsIt) {
  torch::manual_seed(6);
  emoe::LinearOptions o;
  o.in = 8;
  o.out = 5;
  emoe::Linear q(o), k(o), v(o);
  auto x = torch::randn({2, 3, 8});
  emoe::PrecisionScope bf16(emoe::Precision::kBf16Mixed, torch::kCPU);
  // what autocast's linear computes, cast here (autocast's own cache would keep a stale copy of a
  // weight changed in place)
  auto reference = [&](emoe::Linear& l) {
    return torch::linear(x.to(torch::kBFloat16), l->weight.to(torch::kBFloat16),
                         l->bias.to(torch::kBFloat16));
  };
  {
    torch::NoGradGuard no_grad;
    const int64_t products = emoe::onednn_product_count();
    auto y = q->forward(x);
    ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(same_bf16_result(y, reference(q)));
    // on oneDNN with the bias in its epilogue (autocast_inference_linear) where it has bfloat16
    if (emoe::matmul_backend_name().find("bf16") != std::string::npos)
      EXPECT_GT(emoe::onednn_product_count(), products);
    ASSERT_TRUE(q->holds_cast());
    EXPECT_TRUE(q->autocast_weight().is_same(q->autocast_weight()));  // made once
    {  // at a size where oneDNN blocks K (a layer of 768 inputs), the same rounding
      emoe::LinearOptions wide;
      wide.in = 768;
      wide.out = 96;
      emoe::Linear l(wide);
      l->bias.normal_();
      const auto xw = torch::randn({4, 33, 768});
      EXPECT_TRUE(same_bf16_result(
          l->forward(xw), torch::linear(xw.to(torch::kBFloat16), l->weight.to(torch::kBFloat16),
                                        l->bias.to(torch::kBFloat16))));
    }
    q->weight.mul_(-1);  // a changed weight: a new copy
    EXPECT_TRUE(same_bf16_result(q->forward(x), reference(q)));
    // q, k and v fused: one concatenation, kept by q, remade when any weight or bias changes
    auto fused = emoe::fused_linear({q.get(), k.get(), v.get()}, x);
    ASSERT_EQ(fused.size(), 3u);
    EXPECT_TRUE(q->holds_fused_cast());
    EXPECT_TRUE(same_bf16_result(fused[1], reference(k)));
    k->bias.add_(1);
    fused = emoe::fused_linear({q.get(), k.get(), v.get()}, x);
    EXPECT_TRUE(same_bf16_result(fused[0], reference(q)));
    EXPECT_TRUE(same_bf16_result(fused[1], reference(k)));
    EXPECT_TRUE(same_bf16_result(fused[2], reference(v)));
  }
  // a forward with gradients: the copies go, the weights train
  auto y = q->forward(x);
  EXPECT_FALSE(q->holds_cast());
  auto fused = emoe::fused_linear({q.get(), k.get(), v.get()}, x);
  EXPECT_FALSE(q->holds_fused_cast());
  fused[2].sum().backward();
  ASSERT_TRUE(v->weight.grad().defined());
  EXPECT_GT(v->weight.grad().abs().sum().item<double>(), 0);
  (void)y;
}

TEST(CausalLmLoss, WithoutGradientsTheRowKernelsGiveCrossEntropysMean) {
  torch::manual_seed(8);
  const int64_t b = 3, t = 7, v = 50;
  auto labels = torch::randint(0, v, {b, t}, torch::kLong);
  labels.index_put_({1, 3}, -100);
  labels.index_put_({2, 5}, -100);
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto logits = (torch::randn({b, t, v}) * 4).to(dtype);
    auto ref = torch::nn::functional::cross_entropy(
        logits.narrow(1, 0, t - 1).reshape({-1, v}).to(torch::kFloat),
        labels.narrow(1, 1, t - 1).reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
    torch::NoGradGuard no_grad;
    auto loss = emoe::causal_lm_loss(logits, labels);
    ASSERT_EQ(loss.scalar_type(), torch::kFloat);
    EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-5 * std::abs(ref.item<double>()));
    // every position ignored: NaN, as cross_entropy's mean
    EXPECT_TRUE(std::isnan(
        emoe::causal_lm_loss(logits, torch::full({b, t}, -100, torch::kLong)).item<double>()));
  }
}

// Bf16Gemm::kFloat32 (the default on CPUs without AVX-512, where ATen's bfloat16 products are a
// scalar loop): every bfloat16 product is the float32 product of the widened operands, its sums
// rounded once to the output's dtype, with the bias, accumulation, strided batches and
// column-major outputs gemm_out takes; and the layers' bfloat16 paths run on emoe's products.
TEST(Matmul, Bfloat16ProductsComputedInFloat32AreTheRoundedFloat32Product) {
  torch::manual_seed(11);
  const auto setting = emoe::set_bf16_gemm(emoe::Bf16Gemm::kFloat32);
  const auto bf = torch::kBFloat16;
  auto a = torch::randn({13, 40}).to(bf), w = torch::randn({24, 40}).to(bf),
       bias = torch::randn({24}).to(bf);
  const auto want =
      torch::addmm(bias.to(torch::kFloat), a.to(torch::kFloat), w.to(torch::kFloat).t());
  auto out = torch::empty({13, 24}, bf);
  emoe::gemm_out(out, a, w.t(), bias);
  EXPECT_TRUE(within_a_bf16_step(out, want));
  // accumulating into a bfloat16 out, and bfloat16 operands summed into a float32 out
  auto acc = torch::randn({13, 24}).to(bf);
  const auto want_acc = acc.to(torch::kFloat) + want - bias.to(torch::kFloat);
  emoe::gemm_out(acc, a, w.t(), {}, /*accumulate=*/true);
  EXPECT_TRUE(within_a_bf16_step(acc, want_acc));
  auto acc32 = torch::randn({13, 24});
  const auto want32 = acc32 + (want - bias.to(torch::kFloat));
  emoe::gemm_out(acc32, a, w.t(), {}, /*accumulate=*/true);
  EXPECT_LT(emoe::test::max_abs_diff(acc32, want32), 1e-4);
  // a column-major out (a weight gradient kept [in, out]) and attention's strided batches
  auto col = torch::empty({24, 13}, bf).t();
  emoe::gemm_out(col, a, w.t());
  EXPECT_TRUE(within_a_bf16_step(col, want - bias.to(torch::kFloat)));
  auto q = torch::randn({2, 7, 3, 8}).to(bf).transpose(1, 2), k = torch::randn({2, 7, 3, 8}).to(bf);
  auto s = emoe::matmul(q, k.transpose(1, 2).transpose(-2, -1));
  EXPECT_TRUE(within_a_bf16_step(
      s,
      torch::matmul(q.to(torch::kFloat), k.transpose(1, 2).transpose(-2, -1).to(torch::kFloat))));
  // the layers: a bfloat16 layer without autocast (decoding a bfloat16 model) and a float32 one
  // under bf16 autocast, in inference and in training (gradients summed in float32)
  emoe::Linear lin(emoe::LinearOptions{40, 24, true, false});
  auto x = torch::randn({3, 5, 40});
  {
    torch::NoGradGuard no_grad;
    auto lin16 = emoe::Linear(emoe::LinearOptions{40, 24, true, false});
    lin16->weight.copy_(lin->weight);
    lin16->bias.copy_(lin->bias);
    lin16->to(bf);
    const auto y16 = lin16(x.to(bf));
    const auto ref = torch::linear(x.to(bf).to(torch::kFloat), lin16->weight.to(torch::kFloat),
                                   lin16->bias.to(torch::kFloat));
    EXPECT_TRUE(within_a_bf16_step(y16, ref));
    emoe::PrecisionScope scope(emoe::Precision::kBf16Mixed, torch::kCPU);
    const auto ya = lin(x);
    EXPECT_EQ(ya.scalar_type(), bf);
    EXPECT_TRUE(within_a_bf16_step(ya, ref));
  }
  auto xt = x.clone().requires_grad_(true);
  torch::Tensor yt;
  {
    emoe::PrecisionScope scope(emoe::Precision::kBf16Mixed, torch::kCPU);
    yt = lin(xt);
  }
  ASSERT_NE(yt.grad_fn(), nullptr);
  EXPECT_NE(yt.grad_fn()->name().find("AutocastLinearFn"), std::string::npos)
      << yt.grad_fn()->name();
  const auto g = torch::randn_like(yt, torch::kFloat);
  (yt.to(torch::kFloat) * g).sum().backward();
  const auto g16 = g.to(bf).to(torch::kFloat).reshape({-1, 24});
  const auto x16 = x.to(bf).to(torch::kFloat).reshape({-1, 40});
  const auto gw = g16.t().mm(x16);
  EXPECT_LT(emoe::test::max_abs_diff(lin->weight.grad(), gw),
            1e-3 * (1 + gw.abs().max().item<double>()));
  // the chunked LM loss under bf16 autocast (operands widened once, not per chunk): its loss and
  // gradients those of the products computed in bfloat16
  auto hidden = torch::randn({2, 9, 16}), head = torch::randn({50, 16}) * 0.3;
  auto labels = torch::randint(0, 50, {2, 9});
  labels[1][4] = -100;
  std::vector<std::vector<torch::Tensor>> runs;
  for (auto mode : {emoe::Bf16Gemm::kFloat32, emoe::Bf16Gemm::kNative}) {
    emoe::set_bf16_gemm(mode);
    auto hd = hidden.clone().requires_grad_(true), wd = head.clone().requires_grad_(true);
    torch::Tensor loss;
    {
      emoe::PrecisionScope scope(emoe::Precision::kBf16Mixed, torch::kCPU);
      loss = emoe::chunked_causal_lm_loss(hd, wd, labels, /*chunk_rows=*/5);
    }
    loss.backward();
    runs.push_back({loss.detach(), hd.grad(), wd.grad()});
  }
  EXPECT_NEAR(runs[0][0].item<double>(), runs[1][0].item<double>(), 1e-3);
  for (int i = 1; i < 3; ++i)
    EXPECT_LT(emoe::test::max_abs_diff(runs[0][i], runs[1][i]),
              1e-2 * (1 + runs[1][i].abs().max().item<double>()))
        << i;
  emoe::set_bf16_gemm(setting);
}

// GELU in the product's epilogue (inference under bf16 autocast): within one bfloat16 rounding of
// GELU of the exact product of the rounded operands (erf and tanh forms), taken once per scope,
// and Linear's forward_activated equal to activate(forward) wherever it is not taken (with
// gradients: nothing fused, the gradients flow through the activation).
TEST(LinearAutocast, GeluInTheProductsEpilogueForInference) {
  torch::manual_seed(9);
  emoe::LinearOptions o;
  o.in = 768;
  o.out = 96;
  emoe::Linear l(o);
  {
    torch::NoGradGuard no_grad;
    l->bias.normal_();
  }
  l->eval();
  const auto x = torch::randn({4, 33, 768});
  emoe::PrecisionScope bf16(emoe::Precision::kBf16Mixed, torch::kCPU);
  auto exact = [&](bool tanh) {  // float64 GELU of the rounded operands' product
    auto pre = torch::linear(x.to(torch::kBFloat16).to(torch::kDouble),
                             l->weight.to(torch::kBFloat16).to(torch::kDouble),
                             l->bias.to(torch::kBFloat16).to(torch::kDouble));
    return torch::gelu(pre, tanh ? "tanh" : "none");
  };
  auto close = [](const torch::Tensor& got, const torch::Tensor& want) {
    // one rounding to bfloat16 (2^-8 of the value) plus float32 sums over 768 terms
    auto err = (got.to(torch::kDouble) - want).abs() - want.abs() * std::ldexp(1.0, -8) - 1e-3;
    return err.max().item<double>() <= 0.0;
  };
  {
    torch::NoGradGuard no_grad;
    for (bool tanh : {false, true}) {
      SCOPED_TRACE(tanh ? "tanh" : "erf");
      const auto act = tanh ? emoe::Activation::kGeluTanh : emoe::Activation::kGeluErf;
      auto y = l->forward_activated(x, act);
      ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
      EXPECT_TRUE(close(y, exact(tanh)));
      if (emoe::bf16_products_on_gemm_out() &&
          emoe::matmul_backend_name().find("bf16") != std::string::npos) {
        emoe::InferenceGeluEpilogue epilogue(tanh);
        const auto w = l->autocast_weight();
        auto fused = emoe::autocast_inference_linear(x, w, l->bias);
        EXPECT_TRUE(epilogue.applied());
        EXPECT_TRUE(close(fused, exact(tanh)));
        EXPECT_TRUE(torch::equal(fused, y));
        // the request was for one product: the next one in the scope is the plain product
        auto plain = emoe::autocast_inference_linear(x, w, l->bias);
        EXPECT_TRUE(same_bf16_result(
            plain, torch::linear(x.to(torch::kBFloat16), w, l->bias.to(torch::kBFloat16))));
      }
    }
  }
  // in training mode without gradients (a checkpointed block's first forward): nothing fused,
  // the same bits as the recomputation with gradients will give
  l->train();
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::equal(l->forward_activated(x, emoe::Activation::kGeluErf),
                             emoe::activate(l->forward(x), emoe::Activation::kGeluErf)));
  }
  // with gradients: activate(forward), and the input's gradient goes through the activation
  auto xg = x.clone().requires_grad_(true);
  auto y = l->forward_activated(xg, emoe::Activation::kGeluErf);
  auto y_ref = emoe::activate(l->forward(xg), emoe::Activation::kGeluErf);
  EXPECT_TRUE(torch::equal(y, y_ref));
  auto g = torch::autograd::grad({y.to(torch::kFloat).sum()}, {xg})[0];
  auto g_ref = torch::autograd::grad({y_ref.to(torch::kFloat).sum()}, {xg})[0];
  EXPECT_TRUE(torch::allclose(g, g_ref));
}
