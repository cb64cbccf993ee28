// EMoE exactness on real architectures: k = N equals dense, recomposition, permutation round trip,
// masked vs dispatched agreement (outputs and gradients), GMoE with k = N equals dense; every PEFT
// method with its default targets on every family.
#include "emoe/io/safetensors.h"
#include "emoe/methods/model_folder.h"
#include "emoe/models/loader.h"
#include "emoe/moe/convert.h"
#include "emoe/peft/peft.h"
#include "support/test_support.h"

using emoe::test::max_abs_diff_masked;

namespace {

struct Case {
  std::string dir;  // under ../shared
  int64_t experts;
};

const std::vector<Case> kCases = {
    {"fixtures/tiny/bert_seqcls", 4}, {"fixtures/tiny/roberta_seqcls", 4},
    {"fixtures/tiny/gpt2_lm", 4},     {"fixtures/tiny/llama_lm", 4},
    {"fixtures/tiny/llama3_lm", 4},   {"fixtures/tiny/mistral_lm", 4},
    {"fixtures/tiny/qwen2_lm", 4},    {"fixtures/tiny/qwen3_lm", 4},
    {"models/stories260K/hf", 4}};

// A right-padded batch of random ids with a few pads, valid for every model here.
emoe::ModelInputs batch(int64_t vocab, uint64_t seed) {
  torch::manual_seed(seed);
  emoe::ModelInputs in;
  in.input_ids = torch::randint(3, std::min<int64_t>(vocab, 100), {3, 12}, torch::kLong);
  in.attention_mask = torch::ones({3, 12}, torch::kLong);
  in.attention_mask[1].narrow(0, 8, 4).zero_();
  in.attention_mask[2].narrow(0, 5, 7).zero_();
  in.input_ids.masked_fill_(in.attention_mask == 0, 0);
  return emoe::test::on_test_device(in);
}

// Equivalence is a property of the method, not of float32 rounding (a permutation reorders the
// sums inside W2 h): the exactness tests run in float64, where 1e-6 leaves no room for error.
emoe::ModelPtr load_f64(const std::string& dir) {
  emoe::LoadOptions o;
  o.dtype = torch::kDouble;
  return emoe::test::load_test_model(dir, o);
}

torch::Tensor output_of(emoe::PretrainedModelImpl& m, const emoe::ModelInputs& in) {
  auto out = m.forward(in);
  return out.logits.dim() == 3 ? out.logits : out.last_hidden_state;
}

std::vector<int64_t> all_layers(emoe::PretrainedModelImpl& m) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < m.summary().num_layers; ++i) v.push_back(i);
  return v;
}

emoe::MoeConfig emoe_config(int64_t n, int64_t k, std::vector<int64_t> layers) {
  auto c = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  c.experts = n;
  c.topk = k;
  c.layers = std::move(layers);
  c.kmeans.restarts = 2;
  return c;
}

}  // namespace

TEST(MoeEquivalence, EmoeWithKEqualsNReproducesDense) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.dir);
    EMOE_REQUIRE_SHARED(dir, c.dir);
    auto model = load_f64(dir);
    auto in = batch(model->summary().vocab_size, 1);
    torch::NoGradGuard g;
    auto dense = output_of(*model, in);
    auto before = emoe::count_parameters(*model);
    auto state =
        emoe::convert_to_moe(*model, emoe_config(c.experts, c.experts, all_layers(*model)));
    EXPECT_EQ(emoe::count_parameters(*model).total, before.total) << "EMoE adds no parameters";
    auto masked = output_of(*model, in);
    EXPECT_LT(max_abs_diff_masked(masked, dense, in.attention_mask), 1e-6);
    for (auto* p : emoe::moe_plugs(*model))
      p->mutable_config().execution = emoe::Execution::kDispatched;
    auto dispatched = output_of(*model, in);
    EXPECT_LT(max_abs_diff_masked(dispatched, dense, in.attention_mask), 1e-5);
  }
}

TEST(MoeEquivalence, PermutationRoundTripIsExact) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.dir);
    EMOE_REQUIRE_SHARED(dir, c.dir);
    auto model = emoe::test::load_test_model(dir);
    auto original = emoe::model_state(*model);
    std::vector<torch::Tensor> copies;
    for (auto& [k, t] : original) copies.push_back(t.clone());
    auto cfg = emoe_config(c.experts, 1, all_layers(*model));
    cfg.split = "random";
    auto state = emoe::convert_to_moe(*model, cfg);
    emoe::recompose_dense(*model, state);
    EXPECT_TRUE(emoe::moe_plugs(*model).empty());
    auto after = emoe::model_state(*model);
    ASSERT_EQ(after.size(), copies.size());
    for (size_t i = 0; i < after.size(); ++i)
      EXPECT_TRUE(torch::equal(after[i].second, copies[i])) << after[i].first;
  }
}

TEST(MoeEquivalence, RecomposedDenseReproducesPerturbedMoe) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.dir);
    EMOE_REQUIRE_SHARED(dir, c.dir);
    auto model = load_f64(dir);
    auto state =
        emoe::convert_to_moe(*model, emoe_config(c.experts, c.experts, all_layers(*model)));
    torch::NoGradGuard g;
    torch::manual_seed(5);
    for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.01);  // "fine-tuning"
    auto in = batch(model->summary().vocab_size, 2);
    auto moe_out = output_of(*model, in);
    emoe::recompose_dense(*model, state);
    auto dense_out = output_of(*model, in);
    EXPECT_LT(max_abs_diff_masked(dense_out, moe_out, in.attention_mask), 1e-6);
    // and the recomposed model saves as a plain checkpoint that reloads to the same function
    emoe::test::TempDir tmp;
    emoe::save_moe_model(*model, state, tmp.path());
    emoe::LoadOptions o;
    o.dtype = torch::kDouble;
    o.device = emoe::test::test_device();
    auto reloaded = emoe::load_any_model(tmp.path(), o);
    EXPECT_LT(max_abs_diff_masked(output_of(*reloaded, in), moe_out, in.attention_mask), 1e-6);
  }
}

TEST(MoeEquivalence, MaskedAndDispatchedAgreeOnOutputsAndGradients) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.dir);
    EMOE_REQUIRE_SHARED(dir, c.dir);
    for (const char* method : {"emoe", "emoe-learn", "emoe-learn-init"}) {
      auto model = load_f64(dir);
      auto cfg = emoe::MoeConfig::for_method_name(method);
      cfg.experts = c.experts;
      cfg.topk = 2;
      cfg.layers = all_layers(*model);
      cfg.kmeans.restarts = 1;
      emoe::convert_to_moe(*model, cfg);
      auto in = batch(model->summary().vocab_size, 3);
      auto run = [&](emoe::Execution e) {
        for (auto* p : emoe::moe_plugs(*model)) p->mutable_config().execution = e;
        model->zero_grad();
        auto out = output_of(*model, in);
        (out * out.detach().sin()).sum().backward();  // a loss with non-trivial gradients
        std::vector<torch::Tensor> grads;
        for (auto& p : model->parameters())
          grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
        return std::make_pair(out.detach(), grads);
      };
      auto [om, gm] = run(emoe::Execution::kMasked);
      auto [od, gd] = run(emoe::Execution::kDispatched);
      EXPECT_LT(max_abs_diff_masked(od, om, in.attention_mask), 1e-5);
      double gmax = 0;
      for (size_t i = 0; i < gm.size(); ++i)
        gmax = std::max(gmax, emoe::test::max_abs_diff(gm[i], gd[i]));
      EXPECT_LT(gmax, 1e-5) << method;
    }
  }
}

TEST(MoeEquivalence, GmoeWithAllExpertsEqualsDense) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.dir);
    EMOE_REQUIRE_SHARED(dir, c.dir);
    auto model = load_f64(dir);
    auto in = batch(model->summary().vocab_size, 4);
    torch::NoGradGuard g;
    auto dense = output_of(*model, in);
    auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kGmoe);
    cfg.experts = 3;
    cfg.topk = 3;  // every copy, weights sum to one
    cfg.layers = {0};
    emoe::convert_to_moe(*model, cfg);
    EXPECT_LT(max_abs_diff_masked(output_of(*model, in), dense, in.attention_mask), 1e-5);
  }
}

// Every PEFT method with the family's default targets adapts something and starts exactly at the
// base model (LoRA/MoLoRA B = 0, (IA)^3/MoV scales of 1); a trained LoRA merges into the weights.
TEST(PeftEveryFamily, DefaultTargetsAdaptAndStartAtTheBaseModel) {
  for (const Case& c : kCases) {
    EMOE_REQUIRE_SHARED(dir, c.dir);
    SCOPED_TRACE(c.dir);
    auto base = load_f64(dir);
    base->eval();
    const auto in = batch(base->summary().vocab_size, 11);
    torch::NoGradGuard g;
    const auto ref = output_of(*base, in);
    for (auto method : {emoe::PeftMethod::kLora, emoe::PeftMethod::kIa3, emoe::PeftMethod::kMov,
                        emoe::PeftMethod::kMolora}) {
      SCOPED_TRACE(emoe::to_string(method));
      auto m = load_f64(dir);
      m->eval();
      auto cfg = emoe::PeftConfig::for_method(method, m->summary().model_type);
      cfg.method = method;
      cfg.experts = 3;
      auto names = emoe::apply_peft(*m, cfg);
      EXPECT_GE(names.size(), static_cast<size_t>(m->summary().num_layers)) << "adapted too little";
      m->to(torch::kDouble);
      EXPECT_LT(max_abs_diff_masked(output_of(*m, in), ref, in.attention_mask), 1e-5);
      if (method != emoe::PeftMethod::kLora) continue;
      for (auto& p : m->named_parameters())
        if (p.key().find("lora_B") != std::string::npos ||
            p.key().find("lora_b") != std::string::npos)
          p.value().normal_(0, 0.3);
      const auto unmerged = output_of(*m, in);
      EXPECT_GT(max_abs_diff_masked(unmerged, ref, in.attention_mask), 1e-3) << "B was not found";
      emoe::merge_lora(*m);
      EXPECT_LT(max_abs_diff_masked(output_of(*m, in), unmerged, in.attention_mask), 1e-5);
    }
  }
}
