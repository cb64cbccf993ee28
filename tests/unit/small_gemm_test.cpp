// The small-product kernels (decoding's few rows) against float64, on every instruction set this
// CPU has, and the conditions under which the layers take them.
#include "emoe/models/small_gemm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "emoe/core/autocast_compat.h"
#include "emoe/core/error.h"
#include "emoe/models/generate.h"
#include "emoe/models/linear.h"
#include "emoe/models/loader.h"

namespace {

// The instruction sets this CPU runs the kernels with.
std::vector<std::string> kernel_sets() {
  const auto prev = emoe::set_small_gemm_isa("");  // (reads EMOE_SMALL_GEMM once)
  std::vector<std::string> sets;
  for (const std::string isa : {"avx512-bf16", "avx512", "avx2"}) {
    try {
      emoe::set_small_gemm_isa(isa);
      sets.push_back(isa);
    } catch (const emoe::UsageError&) {
    }
  }
  emoe::set_small_gemm_isa(prev);
  return sets;
}

struct IsaScope {  // pins the kernels for one block
  std::string prev;
  explicit IsaScope(const std::string& isa) : prev(emoe::set_small_gemm_isa(isa)) {}
  ~IsaScope() { emoe::set_small_gemm_isa(prev); }
};

TEST(SmallGemm, EveryKernelSetMatchesFloat64InBothLayoutsAndDtypes) {
  const auto sets = kernel_sets();
  if (sets.empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::NoGradGuard no_grad;
  // rows, K, N: tails of every block (K not a multiple of 8 or 16, N not of the row blocks or
  // registers), one row, and the most rows; N over several of the bfloat16 kernels' 80-row
  // chunks, the last one partial (7 rows: a group of four and one of three)
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 5, 3},   {3, 37, 19},   {8, 130, 70},
                                                      {5, 16, 33}, {2, 512, 100}, {7, 64, 48},
                                                      {4, 33, 40}, {6, 96, 300},  {7, 40, 203}};
  for (const auto& isa : sets) {
    IsaScope pin(isa);
    for (auto dtype : {torch::kFloat, torch::kBFloat16})
      for (bool kn : {false, true})
        for (bool with_bias : {false, true})
          for (const auto& [m, k, n] : shapes) {
            SCOPED_TRACE(fmt::format("{} {} {} bias {} M {} K {} N {}", isa,
                                     dtype == torch::kFloat ? "float32" : "bfloat16",
                                     kn ? "[K, N]" : "[N, K]", with_bias, m, k, n));
            torch::manual_seed(m * 1000 + k + n);
            auto x = torch::randn({m, k}).to(dtype);
            auto w = (kn ? torch::randn({k, n}) : torch::randn({n, k})).to(dtype);
            auto b = with_bias ? torch::randn({n}).to(dtype) : torch::Tensor();
            ASSERT_TRUE(emoe::small_gemm_applies(x, w, b, kn));
            const int64_t before = emoe::small_gemm_count();
            auto y = emoe::small_gemm_linear(x, w, b, kn);
            EXPECT_EQ(emoe::small_gemm_count(), before + 1);
            ASSERT_EQ(y.scalar_type(), dtype);
            ASSERT_EQ(y.sizes(), (std::vector<int64_t>{m, n}));
            auto wd = kn ? w.to(torch::kDouble) : w.to(torch::kDouble).t();
            auto ref = torch::mm(x.to(torch::kDouble), wd);
            if (with_bias) ref = ref + b.to(torch::kDouble);
            // float32 sums (order differs from float64's); bfloat16: rounded once at the end
            const auto scale = torch::mm(x.to(torch::kDouble).abs(), wd.abs()) + 1.0;
            const double rel = dtype == torch::kFloat ? 0.0 : std::ldexp(1.0, -8);
            auto bound = ref.abs() * rel + scale * 1e-6;
            EXPECT_TRUE(((y.to(torch::kDouble) - ref).abs() <= bound).all().item<bool>())
                << "max error " << (y.to(torch::kDouble) - ref).abs().max().item<double>();
          }
  }
}

TEST(SmallGemm, TakenOnlyForFewRowsWithoutGradientsOrAutocast) {
  if (kernel_sets().empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  IsaScope pin(kernel_sets().front());
  auto w = torch::randn({6, 4});
  auto x = torch::randn({2, 3, 4});  // 6 rows
  EXPECT_TRUE(emoe::small_gemm_applies(x, w, {}, false));
  EXPECT_FALSE(emoe::small_gemm_applies(x, w, {}, true));  // [K, N] = [6, 4]: K 6, not 4
  EXPECT_FALSE(emoe::small_gemm_applies(torch::randn({9, 4}), w, {}, false));  // 9 rows
  EXPECT_FALSE(emoe::small_gemm_applies(x.to(torch::kDouble), w.to(torch::kDouble), {}, false));
  EXPECT_FALSE(emoe::small_gemm_applies(x.to(torch::kBFloat16), w, {}, false));  // mixed dtypes
  EXPECT_FALSE(emoe::small_gemm_applies(x, w.t(), {}, true));                    // not contiguous
  EXPECT_FALSE(emoe::small_gemm_applies(x, w, torch::randn({5}), false));        // bias of 5, N 6
  auto wg = w.clone().requires_grad_(true);
  EXPECT_FALSE(emoe::small_gemm_applies(x, wg, {}, false));  // a gradient is wanted
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(emoe::small_gemm_applies(x, wg, {}, false));
    emoe::set_autocast_enabled(at::kCPU, true);
    EXPECT_FALSE(emoe::small_gemm_applies(x, w, {}, false));
    emoe::set_autocast_enabled(at::kCPU, false);
  }
  {
    IsaScope none("");
    EXPECT_FALSE(emoe::small_gemm_applies(x, w, {}, false));
    EXPECT_EQ(emoe::small_gemm_isa(), "");
  }
  EXPECT_THROW(emoe::set_small_gemm_isa("sse2"), emoe::UsageError);

  // a Linear layer takes them in inference (its output keeps x's leading dims), not in training
  emoe::Linear lin(emoe::LinearOptions{4, 6, true, false});
  const int64_t before = emoe::small_gemm_count();
  auto y_train = lin->forward(x);
  EXPECT_EQ(emoe::small_gemm_count(), before);
  torch::NoGradGuard no_grad;
  auto y = lin->forward(x);
  EXPECT_EQ(emoe::small_gemm_count(), before + 1);
  EXPECT_EQ(y.sizes(), y_train.sizes());
  EXPECT_TRUE(torch::allclose(y, y_train, 1e-5, 1e-5));
}

TEST(SmallGemm, AutoTimesEachShapeInPlaceThenKeepsOnePathAndGivesTheProduct) {
  if (kernel_sets().empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  IsaScope pin("auto");
  EXPECT_EQ(emoe::small_gemm_isa(), kernel_sets().front());  // the best set this CPU has
  torch::NoGradGuard no_grad;
  auto w = torch::randn({41, 23}), b = torch::randn({41});  // a shape no other test uses
  auto x = torch::randn({3, 23});
  const auto ref = torch::linear(x, w, b);
  const auto before = emoe::small_gemm_measurements();
  const int64_t kernel_calls = emoe::small_gemm_count();
  const auto first = emoe::small_gemm_linear(x, w, b, false);
  EXPECT_TRUE(torch::allclose(first, ref, 1e-5, 1e-5));
  for (int64_t i = 1; i < emoe::kSmallGemmTrialCalls; ++i) {
    EXPECT_EQ(emoe::small_gemm_measurements().first, before.first) << "decided after " << i;
    // alternated with the library, but every result of the trial is the kernels'
    EXPECT_TRUE(torch::equal(emoe::small_gemm_linear(x, w, b, false), first)) << i;
  }
  EXPECT_EQ(emoe::small_gemm_count() - kernel_calls, emoe::kSmallGemmTrialCalls);
  const auto decided = emoe::small_gemm_measurements();
  EXPECT_EQ(decided.first, before.first + 1);
  auto y1 = emoe::small_gemm_linear(x, w, b, false);
  auto y2 = emoe::small_gemm_linear(x, w, b, false);
  EXPECT_EQ(emoe::small_gemm_measurements().first, decided.first);  // decided once
  EXPECT_TRUE(torch::allclose(y1, ref, 1e-5, 1e-5));
  EXPECT_TRUE(torch::equal(y1, y2));  // one path from then on
  const bool library = decided.second > before.second;
  EXPECT_EQ(emoe::small_gemm_count() - kernel_calls,
            emoe::kSmallGemmTrialCalls + (library ? 0 : 2));
  (void)emoe::small_gemm_linear(torch::randn({4, 23}), w, b, false);  // 4 rows: another shape
  EXPECT_EQ(emoe::small_gemm_measurements().first, decided.first);    // on trial, not decided
  EXPECT_EQ(emoe::set_small_gemm_isa("auto"), "auto");
}

TEST(SmallGemm, AutoTimesTheWideningKernelsAsAThirdPathForBfloat16Weights) {
  if (kernel_sets().empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  IsaScope pin("auto");
  // under avx512-bf16, bfloat16 weights [N, K] have two kernels (vdpbf16ps, and widening to
  // float32 with FMA) and the library: three paths, six calls each; elsewhere two
  const bool three = emoe::small_gemm_isa() == "avx512-bf16";
  const int64_t trial_calls =
      three ? emoe::kSmallGemmTrialCalls / 2 * 3 : emoe::kSmallGemmTrialCalls;
  torch::NoGradGuard no_grad;
  auto w = torch::randn({37, 45}).to(torch::kBFloat16), b = torch::randn({37}).to(torch::kBFloat16);
  auto x = torch::randn({5, 45}).to(torch::kBFloat16);  // a shape no other test uses
  const auto ref = torch::linear(x.to(torch::kFloat), w.to(torch::kFloat), b.to(torch::kFloat));
  const auto before = emoe::small_gemm_measurements();
  const auto first = emoe::small_gemm_linear(x, w, b, false);
  EXPECT_LT((first.to(torch::kFloat) - ref).abs().max().item<double>(), 0.1);
  for (int64_t i = 1; i < trial_calls; ++i) {
    EXPECT_EQ(emoe::small_gemm_measurements().first, before.first) << "decided after " << i;
    EXPECT_TRUE(torch::equal(emoe::small_gemm_linear(x, w, b, false), first)) << i;  // kernels'
  }
  EXPECT_EQ(emoe::small_gemm_measurements().first, before.first + 1);
  // whichever path was kept gives the product (bfloat16: rounded once, summed in another order)
  auto y1 = emoe::small_gemm_linear(x, w, b, false), y2 = emoe::small_gemm_linear(x, w, b, false);
  EXPECT_TRUE(torch::equal(y1, y2));
  EXPECT_LT((y1.to(torch::kFloat) - ref).abs().max().item<double>(), 0.1);
  // the widening kernels pinned (avx512) give the same product
  if (three) {
    IsaScope widen("avx512");
    auto yw = emoe::small_gemm_linear(x, w, b, false);
    EXPECT_LT((yw.to(torch::kFloat) - ref).abs().max().item<double>(), 0.1);
  }
}

// Greedy decoding of a random Llama (fused q/k/v, untied head) and GPT-2 (Conv1D [K, N] weights,
// tied head) model, batch 3, float32: the same tokens and logits with the kernels as with the
// library's products; the prompt pass's last-position logits are the full pass's.
TEST(SmallGemm, DecodingWithTheKernelsGivesTheLibrarysTokens) {
  if (kernel_sets().empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  const nlohmann::json llama = {{"model_type", "llama"},
                                {"architectures", {"LlamaForCausalLM"}},
                                {"hidden_size", 48},
                                {"intermediate_size", 80},
                                {"num_hidden_layers", 2},
                                {"num_attention_heads", 4},
                                {"num_key_value_heads", 2},
                                {"vocab_size", 300},
                                {"max_position_embeddings", 64}};
  const nlohmann::json gpt2 = {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}},
                               {"n_embd", 48},         {"n_layer", 2},
                               {"n_head", 4},          {"vocab_size", 300},
                               {"n_positions", 64}};
  for (const auto& cfg : {llama, gpt2}) {
    SCOPED_TRACE(cfg["model_type"].get<std::string>());
    torch::manual_seed(0);
    auto model = emoe::create_model(emoe::JsonFields(cfg, "config.json"), emoe::Head::kCausalLM);
    model->eval();
    auto prompt = torch::randint(3, 300, {3, 5}, torch::kLong);
    emoe::GenerateOptions o;
    o.max_new_tokens = 12;
    std::vector<at::Tensor> steps_lib, steps_kern;
    torch::Tensor lib, kern;
    {
      IsaScope none("");
      lib = emoe::generate(*model, prompt, {}, o);
    }
    IsaScope pin(kernel_sets().front());
    const int64_t before = emoe::small_gemm_count();
    kern = emoe::generate(*model, prompt, {}, o);
    EXPECT_GT(emoe::small_gemm_count(), before + 11 * 2);  // every decoding step, every layer
    EXPECT_TRUE(torch::equal(lib, kern)) << lib << "\n" << kern;
    // one cached step's logits
    torch::NoGradGuard no_grad;
    auto logits_of = [&](bool kernels) {
      IsaScope pin(kernels ? kernel_sets().front() : "");
      emoe::KvCache cache;
      emoe::ModelInputs in;
      in.input_ids = prompt;
      in.cache = &cache;
      (void)model->forward(in);
      in.input_ids = prompt.narrow(1, 0, 1);
      in.position_ids = torch::full({3, 1}, 5, torch::kLong);
      return model->forward(in).logits;
    };
    auto a = logits_of(false), b = logits_of(true);
    EXPECT_LT((a - b).abs().max().item<double>(), 1e-4);
    // generation's prompt pass: the last position's logits only, those of the full pass
    emoe::ModelInputs full;
    full.input_ids = prompt;
    auto all = model->forward(full).logits;
    full.last_logits_only = true;
    auto last = model->forward(full).logits;
    ASSERT_EQ(last.sizes(), (std::vector<int64_t>{3, 1, 300}));
    EXPECT_TRUE(torch::allclose(last, all.narrow(1, 4, 1), 1e-5, 1e-5));
    full.labels = prompt;  // with labels: every position, as the loss needs
    EXPECT_EQ(model->forward(full).logits.size(1), 5);
  }
}

}  // namespace

// A fused layer's weights (q, k and v) against one x: each output the layer's own product, under
// pinned kernels, the library and auto (whose trial times the group as one shape, and decides
// once), with and without biases.
TEST(SmallGemm, GroupGivesEachWeightsProductAndAutoDecidesTheGroupOnce) {
  if (kernel_sets().empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512";
  torch::NoGradGuard no_grad;
  const std::vector<at::Tensor> weights = {torch::randn({13, 29}), torch::randn({7, 29}),
                                           torch::randn({7, 29})};
  const std::vector<at::Tensor> biases = {torch::randn({13}), torch::randn({7}), torch::randn({7})};
  const std::vector<at::Tensor> none(3);
  auto x = torch::randn({2, 1, 29});
  for (const auto& isa : {kernel_sets().front(), std::string("auto")}) {
    IsaScope pin(isa);
    for (const auto* b : {&biases, &none}) {
      SCOPED_TRACE(isa + (b == &biases ? " biases" : " no biases"));
      const auto before = emoe::small_gemm_measurements();
      std::vector<at::Tensor> first;
      for (int64_t call = 0; call < emoe::kSmallGemmTrialCalls + 2; ++call) {
        auto out = emoe::small_gemm_group(x, weights, *b, false);
        ASSERT_EQ(out.size(), 3u);
        for (size_t i = 0; i < 3; ++i) {
          EXPECT_EQ(out[i].sizes(), (std::vector<int64_t>{2, 1, weights[i].size(0)}));
          EXPECT_TRUE(torch::allclose(out[i], torch::linear(x, weights[i], (*b)[i]), 1e-5, 1e-5));
        }
        if (call == 0) first = out;
        if (call < emoe::kSmallGemmTrialCalls)
          for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(out[i], first[i]));  // kernels'
      }
      EXPECT_EQ(emoe::small_gemm_measurements().first - before.first, isa == "auto" ? 1 : 0);
    }
  }
  // mixed biases or another K: rejected
  EXPECT_THROW(emoe::small_gemm_group(x, weights, {biases[0], at::Tensor(), biases[2]}, false),
               c10::Error);
  EXPECT_THROW(emoe::small_gemm_group(x, {weights[0], torch::randn({7, 28})},
                                      std::vector<at::Tensor>(2), false),
               c10::Error);
}
