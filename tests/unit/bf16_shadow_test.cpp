// The optimiser's bfloat16 copies of float32 parameters (core/bf16_shadow.h): training steps
// under bf16 autocast give the same bits with them as without (the copies are used, and are the
// rounding a fresh cast makes), and a copy serves only while its parameter is unchanged.
#include "emoe/core/bf16_shadow.h"

#include <nlohmann/json.hpp>

#include "emoe/io/hf_config.h"
#include "emoe/train/method.h"
#include "emoe/train/optim.h"
#include "emoe/train/precision.h"
#include "emoe/train/run_config.h"
#include "support/test_support.h"

namespace {

struct StepsCase {
  std::string name;
  nlohmann::json config;
  emoe::Head head;
  std::vector<std::string> sets;
};

// Three AdamW steps under bf16 autocast from the same start: each step's loss, and the end's
// parameters
std::pair<std::vector<double>, std::map<std::string, torch::Tensor>> three_steps(
    const StepsCase& c) {
  torch::manual_seed(0);
  auto model = emoe::create_model(emoe::JsonFields(c.config, "config.json"), c.head, 2);
  std::vector<std::string> sets = {"model=m", "task=sst2"};
  sets.insert(sets.end(), c.sets.begin(), c.sets.end());
  auto cfg = emoe::load_run_config("", sets);
  torch::manual_seed(3);
  emoe::ModelInputs in;
  in.input_ids = torch::randint(2, 60, {3, 12}, torch::kLong);
  in.attention_mask = torch::ones({3, 12}, torch::kLong);
  in.labels = c.head == emoe::Head::kSequenceClassification
                  ? torch::randint(0, 2, {3}, torch::kLong)
                  : in.input_ids.clone();
  in.output_logits = false;
  emoe::apply_method(*model, cfg, {in});
  model->train();
  emoe::TrainOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.01;
  emoe::Optimizer opt(*model, o);
  std::vector<double> losses;
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(11 + step);  // dropout
    torch::Tensor loss;
    {
      emoe::PrecisionScope scope(emoe::Precision::kBf16Mixed, torch::kCPU);
      loss = model->forward(in).loss;
    }
    loss.backward();
    opt.step();
    opt.zero_grad();
    losses.push_back(loss.item<double>());
  }
  std::map<std::string, torch::Tensor> params;
  for (const auto& p : model->named_parameters()) params[p.key()] = p.value().detach().clone();
  return {losses, params};
}

}  // namespace

TEST(Bf16Shadow, StepsGiveTheSameBitsWithAndWithoutCopies) {
  const std::vector<StepsCase> cases = {
      {"bert full",
       {{"model_type", "bert"},
        {"hidden_size", 16},
        {"intermediate_size", 32},
        {"num_hidden_layers", 2},
        {"num_attention_heads", 2},
        {"vocab_size", 60},
        {"max_position_embeddings", 32}},
       emoe::Head::kSequenceClassification,
       {"method=full"}},
      // Conv1D weights, used as transposed views of the parameters
      {"gpt2 full",
       {{"model_type", "gpt2"},
        {"n_embd", 16},
        {"n_layer", 2},
        {"n_head", 2},
        {"vocab_size", 60},
        {"n_positions", 32}},
       emoe::Head::kCausalLM,
       {"method=full"}},
      // the dispatched experts' weights (an odd element count: 4 x 33, the update's tail)
      {"bert emoe dispatched",
       {{"model_type", "bert"},
        {"hidden_size", 33},
        {"intermediate_size", 64},
        {"num_hidden_layers", 2},
        {"num_attention_heads", 3},
        {"vocab_size", 60},
        {"max_position_embeddings", 32}},
       emoe::Head::kSequenceClassification,
       {"method=emoe", "moe.experts=4", "moe.topk=2", "moe.layers=[0,1]",
        "moe.execution=dispatched"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    emoe::set_bf16_shadows_enabled(false);
    const auto [plain_losses, plain] = three_steps(c);
    emoe::set_bf16_shadows_enabled(true);
    const int64_t hits = emoe::bf16_shadow_hits();
    const auto [losses, params] = three_steps(c);
    // the copies served the forwards of steps 2 and 3
    EXPECT_GT(emoe::bf16_shadow_hits(), hits);
    EXPECT_EQ(emoe::bf16_shadow_count(), 0) << "the optimiser dropped its copies";
    ASSERT_EQ(losses.size(), plain_losses.size());
    for (size_t i = 0; i < losses.size(); ++i)
      EXPECT_EQ(losses[i], plain_losses[i]) << "step " << i;
    for (const auto& [key, p] : plain) {
      SCOPED_TRACE(key);
      EXPECT_TRUE(torch::equal(p, params.at(key)));
    }
  }
}

TEST(Bf16Shadow, ACopyServesOnlyWhileItsParameterIsUnchanged) {
  emoe::set_bf16_shadows_enabled(true);
  torch::manual_seed(1);
  auto p = torch::randn({5, 7}).requires_grad_();
  auto fresh = [&](const torch::Tensor& t) { return t.detach().to(torch::kBFloat16); };
  // not a parameter's: a computed tensor is cast and never marked
  auto computed = p * 2;
  EXPECT_TRUE(torch::equal(emoe::bf16_cast(computed), fresh(computed)));
  EXPECT_EQ(emoe::bf16_shadow_target(computed.detach()), nullptr);
  // first cast: a fresh one, and the parameter marked
  EXPECT_EQ(emoe::bf16_shadow_target(p), nullptr);
  EXPECT_TRUE(torch::equal(emoe::bf16_cast(p), fresh(p)));
  uint16_t* out = emoe::bf16_shadow_target(p);
  ASSERT_NE(out, nullptr);
  // the optimiser's part: update p through its memory, write the copy, mark it written
  {
    torch::NoGradGuard g;
    float* d = p.data_ptr<float>();
    for (int64_t i = 0; i < p.numel(); ++i) d[i] += 0.25f;
  }
  auto rounded = fresh(p);
  std::memcpy(out, rounded.data_ptr(), p.numel() * 2);
  const auto version = p._version();
  emoe::bf16_shadow_written(p);
  EXPECT_EQ(p._version(), version + 1);
  EXPECT_EQ(emoe::bf16_shadow_count(), 1);
  EXPECT_EQ(emoe::bf16_shadow_bytes(), p.numel() * 2);
  // now the copy, in the parameter's layout and as its transpose
  const int64_t hits = emoe::bf16_shadow_hits();
  auto c = emoe::bf16_cast(p);
  EXPECT_EQ(c.data_ptr(), static_cast<void*>(out));
  EXPECT_TRUE(torch::equal(c, rounded));
  auto ct = emoe::bf16_cast(p.t());
  EXPECT_EQ(ct.data_ptr(), static_cast<void*>(out));
  EXPECT_TRUE(torch::equal(ct, fresh(p.t())));
  EXPECT_EQ(emoe::bf16_shadow_hits(), hits + 2);
  // a narrowed view is another layout: a fresh cast
  auto n = emoe::bf16_cast(p.narrow(0, 0, 2));
  EXPECT_NE(n.data_ptr(), static_cast<void*>(out));
  // an in-place change to the parameter (through a view sharing its version) retires the copy
  {
    torch::NoGradGuard g;
    p.detach().mul_(3);
  }
  auto after = emoe::bf16_cast(p);
  EXPECT_NE(after.data_ptr(), static_cast<void*>(out));
  EXPECT_TRUE(torch::equal(after, fresh(p)));
  EXPECT_EQ(emoe::bf16_shadow_hits(), hits + 2);
  // dropped: gone, and turning copies off casts afresh and holds none
  emoe::drop_bf16_shadows({p});
  EXPECT_EQ(emoe::bf16_shadow_count(), 0);
  emoe::bf16_cast(p);
  ASSERT_NE(emoe::bf16_shadow_target(p), nullptr);
  emoe::set_bf16_shadows_enabled(false);
  EXPECT_EQ(emoe::bf16_shadow_count(), 0);
  EXPECT_EQ(emoe::bf16_shadow_target(p), nullptr);
  emoe::set_bf16_shadows_enabled(true);
}
