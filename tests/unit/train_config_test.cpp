// Run configuration layering, schedules, optimiser groups and the multiple-choice scorer.
#include <fstream>

#include "emoe/core/error.h"
#include "emoe/eval/evaluate.h"
#include "emoe/models/loader.h"
#include "emoe/train/optim.h"
#include "emoe/train/run_config.h"
#include "support/test_support.h"

TEST(RunConfig, YamlThenOverridesThenValidation) {
  emoe::test::TempDir tmp;
  std::ofstream(tmp.file("run.yaml")) << "model: m\ntask: sst2\nmethod: emoe\n"
                                         "moe: {experts: 8, topk: 2, layers: [1, 3]}\n"
                                         "train:\n  lr: 3.0e-5\n  epochs: 2\n";
  auto c =
      emoe::load_run_config(tmp.file("run.yaml"), {"train.lr=1e-4", "moe.topk=4", "ood=[a, b]"});
  EXPECT_EQ(c.model, "m");
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-4);
  EXPECT_EQ(c.train.epochs, 2);
  EXPECT_EQ(c.moe.experts, 8);
  EXPECT_EQ(c.moe.topk, 4);
  EXPECT_EQ(c.moe.layers, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(c.ood, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(c.uses_moe());
  // round trip through the resolved JSON
  auto c2 = emoe::RunConfig::from_json(c.to_json(), "resolved");
  EXPECT_EQ(c2.to_json(), c.to_json());
  // errors name the file and the key
  auto msg = [&](const std::vector<std::string>& sets) {
    try {
      emoe::load_run_config(tmp.file("run.yaml"), sets);
    } catch (const emoe::InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg({"train.lrr=1"}).find("unknown key 'lrr'"), std::string::npos);
  EXPECT_NE(msg({"train.lr=abc"}).find(".train.lr: expected a number"), std::string::npos);
  EXPECT_NE(msg({"method=magic"}).find("method: expected one of"), std::string::npos);
  EXPECT_NE(msg({"train.lr=-1"}).find("train.lr: expected (0, inf), got -1"), std::string::npos);
  EXPECT_NE(msg({"moe.expertz=3"}).find("unknown key 'expertz'"), std::string::npos);
  // values that crashed, hung or were silently changed (issue 25): one line naming the field
  for (const auto& [set, expect] : std::vector<std::pair<std::string, std::string>>{
           {"train.log_every=0", "train.log_every: expected [1, inf), got 0"},
           {"threads=100000", "threads: expected [0, 4096], got 100000"},
           {"threads=-1", "threads: expected [0, 4096], got -1"},
           {"train.weight_decay=-0.1", "train.weight_decay: expected [0, inf)"},
           {"train.adam_beta1=1.5", "train.adam_beta1: expected [0, 1), got 1.5"},
           {"train.adam_eps=-1", "train.adam_eps: expected (0, 1], got -1"},
           {"train.max_steps=-3", "train.max_steps: expected [0, inf)"},
           {"train.warmup_steps=-1", "train.warmup_steps"},
           {"train.early_stopping=-1", "train.early_stopping"},
           {"train.save_every=-5", "train.save_every"},
           {"train.head_lr=-1", "train.head_lr"},
           {"train.lr=.nan", "train.lr: expected a number"},
           {"train.epochs=1.7", ".train.epochs: expected an integer, got 1.7"},
           {"train.seed=-1", ".train.seed: expected"},
           {"moe.layers=[1,1]", ".moe.layers: layer 1 is listed twice"}})
    EXPECT_NE(msg({set}).find(expect), std::string::npos) << set << ": " << msg({set});
  EXPECT_THROW(emoe::load_run_config(tmp.file("run.yaml"), {"novalue"}), emoe::UsageError);
  std::ofstream(tmp.file("bad.yaml")) << "model: [unclosed\n";
  EXPECT_THROW(emoe::load_run_config(tmp.file("bad.yaml")), emoe::InputError);
}

TEST(RunConfig, TutelSwitchAndMethodDefaults) {
  auto c = emoe::load_run_config("", {"model=m", "task=sst2", "method=gmoe"});
  EXPECT_EQ(c.moe.method, emoe::MoeMethod::kGmoe);
  EXPECT_EQ(c.moe.gate, emoe::GateKind::kCosine);
  auto t = emoe::load_run_config("", {"model=m", "task=sst2", "method=emoe", "moe.tutel=true"});
  EXPECT_DOUBLE_EQ(t.moe.capacity_factor, 1.5);
  EXPECT_EQ(t.moe.balance, emoe::BalanceLoss::kImportanceLoad);
  EXPECT_DOUBLE_EQ(t.moe.preact_dropout, 0.1);
  auto l = emoe::load_run_config("", {"model=m", "task=sst2", "method=emoe+lora"});
  EXPECT_EQ(l.peft_method(), emoe::PeftMethod::kLora);
  EXPECT_TRUE(l.uses_moe());
}

TEST(RunConfig, EmoeLearnIsTheCosineRouterAndInitIsItsLinearVariant) {
  auto c = emoe::load_run_config("", {"model=m", "task=sst2", "method=emoe-learn"});
  EXPECT_EQ(c.moe.method, emoe::MoeMethod::kEmoeLearn);
  EXPECT_EQ(c.moe.gate, emoe::GateKind::kCosine);
  EXPECT_NO_THROW(c.validate());
  auto i = emoe::load_run_config("", {"model=m", "task=sst2", "method=emoe-learn-init"});
  EXPECT_EQ(i.moe.method, emoe::MoeMethod::kEmoeLearn);
  EXPECT_EQ(i.moe.gate, emoe::GateKind::kLinear);
  EXPECT_EQ(i.moe.gate_init, "avgk");
  EXPECT_TRUE(i.uses_moe());
  EXPECT_EQ(i.peft_method(), emoe::PeftMethod::kNone);
  EXPECT_NO_THROW(i.validate());
  auto i2 = emoe::RunConfig::from_json(i.to_json(), "resolved");
  EXPECT_EQ(i2.to_json(), i.to_json());
  try {
    emoe::load_run_config("",
                          {"model=m", "task=sst2", "method=emoe-learn-init", "moe.gate=cosine"});
    FAIL();
  } catch (const emoe::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("emoe-learn-init is the linear gate initialised to avg-k"),
              std::string::npos)
        << e.what();
  }
}

TEST(RunConfig, MoeLayersNameTheEncoderAndTheDecoder) {
  auto c = emoe::load_run_config(
      "", {"model=m", "task=sst2", "method=emoe", "moe.layers=[encoder.5, decoder.0, decoder.5]"});
  EXPECT_TRUE(c.moe.layers.empty());  // resolved against the model at conversion
  EXPECT_EQ(c.moe.encoder_layers, (std::vector<int64_t>{5}));
  EXPECT_EQ(c.moe.decoder_layers, (std::vector<int64_t>{0, 5}));
  auto c2 = emoe::RunConfig::from_json(c.to_json(), "resolved");
  EXPECT_EQ(c2.to_json(), c.to_json());
  emoe::resolve_moe_layers(c.moe, 6, 6);
  EXPECT_EQ(c.moe.layers, (std::vector<int64_t>{5, 6, 11}));
  // plain integers keep counting both stacks together
  auto p = emoe::load_run_config("", {"model=m", "task=sst2", "method=emoe", "moe.layers=[7]"});
  EXPECT_EQ(p.moe.layers, (std::vector<int64_t>{7}));
  EXPECT_TRUE(p.moe.encoder_layers.empty());
  auto msg = [](const std::vector<std::string>& sets) {
    try {
      emoe::load_run_config("", sets);
    } catch (const emoe::InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(
      msg({"model=m", "task=sst2", "method=emoe", "moe.layers=[encoder.1, 3]"}).find("not both"),
      std::string::npos);
  EXPECT_NE(msg({"model=m", "task=sst2", "method=emoe", "moe.layers=[middle.1]"})
                .find("expected a layer index, encoder.N or decoder.N, got 'middle.1'"),
            std::string::npos);
  EXPECT_NE(msg({"model=m", "task=sst2", "method=emoe", "moe.layers=[1]", "moe.decoder_layers=[1]"})
                .find("not both"),
            std::string::npos);
}

TEST(Schedules, MatchHuggingFaceFormulas) {
  // linear with 10 warm-up steps over 110: 0, 0.5 at step 5, 1 at 10, 0.5 at 60, 0 at 110
  EXPECT_DOUBLE_EQ(emoe::schedule_factor("linear", 0, 110, 10), 0.0);
  EXPECT_DOUBLE_EQ(emoe::schedule_factor("linear", 5, 110, 10), 0.5);
  EXPECT_DOUBLE_EQ(emoe::schedule_factor("linear", 10, 110, 10), 1.0);
  EXPECT_DOUBLE_EQ(emoe::schedule_factor("linear", 60, 110, 10), 0.5);
  EXPECT_DOUBLE_EQ(emoe::schedule_factor("linear", 110, 110, 10), 0.0);
  EXPECT_NEAR(emoe::schedule_factor("cosine", 60, 110, 10), 0.5, 1e-12);
  EXPECT_NEAR(emoe::schedule_factor("cosine", 35, 110, 10), 0.5 * (1 + std::cos(M_PI * 0.25)),
              1e-12);
  EXPECT_DOUBLE_EQ(emoe::schedule_factor("constant", 60, 110, 10), 1.0);
  EXPECT_DOUBLE_EQ(emoe::schedule_factor("linear", 0, 100, 0), 1.0);
}

TEST(Optimizer, GroupsSplitDecayHeadAndFrozen) {
  nlohmann::json j = {{"model_type", "bert"},         {"hidden_size", 16},
                      {"intermediate_size", 32},      {"num_hidden_layers", 1},
                      {"num_attention_heads", 2},     {"vocab_size", 30},
                      {"max_position_embeddings", 16}};
  auto m = emoe::create_model(emoe::JsonFields(j, "c"), emoe::Head::kSequenceClassification, 2);
  m->named_parameters()["bert.embeddings.word_embeddings.weight"].set_requires_grad(false);
  emoe::TrainOptions o;
  o.lr = 1e-3;
  o.head_lr = 1e-2;
  o.weight_decay = 0.1;
  emoe::Optimizer opt(*m, o);
  std::map<std::string, double> lr;
  int64_t total = 0;
  for (const auto& g : opt.groups()) lr[g.name] = g.base_lr, total += g.numel;
  EXPECT_DOUBLE_EQ(lr.at("head"), 1e-2);
  EXPECT_DOUBLE_EQ(lr.at("body"), 1e-3);
  EXPECT_TRUE(lr.count("body/no_decay"));
  EXPECT_EQ(total, emoe::count_parameters(*m).trainable);
  opt.set_lr_factor(0.5);
  EXPECT_DOUBLE_EQ(opt.current_lr(), lr.at(opt.groups()[0].name) * 0.5);
}

TEST(MultipleChoice, ScorerPicksTheMostLikelyLetter) {
  auto logits = torch::zeros({10});
  logits[7] = 5.0;
  EXPECT_EQ(emoe::pick_choice(logits, {3, 5, 7, 9}), 2);
  // a hand-made "model" that knows the answer: it reads the question's last word ("A".."D")
  // from the prompt and puts its mass on that letter's token
  struct FakeTokenizer : emoe::Tokenizer {
    std::string kind() const override { return "fake"; }
    int64_t vocab_size() const override { return 256; }
    std::optional<int64_t> token_to_id(const std::string&) const override { return std::nullopt; }
    std::string id_to_token(int64_t id) const override {
      return std::string(1, static_cast<char>(id));
    }
    const emoe::SpecialTokens& special() const override { return sp; }
    std::vector<int64_t> encode_plain(const std::string& t) const override {
      return std::vector<int64_t>(t.begin(), t.end());  // bytes
    }
    emoe::Encoding encode(const std::string& t, bool, int64_t) const override {
      return {encode_plain(t), {}};
    }
    emoe::Encoding encode_pair(const std::string& a, const std::string& b, bool,
                               int64_t) const override {
      return {encode_plain(a + b), {}};
    }
    std::string decode(const std::vector<int64_t>& ids, bool) const override {
      return std::string(ids.begin(), ids.end());
    }
    emoe::SpecialTokens sp;
  } tok;
  std::vector<emoe::MultipleChoiceExample> qs;
  for (int i = 0; i < 8; ++i) {
    emoe::MultipleChoiceExample q;
    q.subject = "toy";
    q.answer = i % 4;
    q.question = std::string("the answer is ") + static_cast<char>('A' + q.answer);
    q.choices = {"w", "x", "y", "z"};
    qs.push_back(q);
  }
  auto oracle = [&](const std::vector<int64_t>& ids) {
    std::string text(ids.begin(), ids.end());
    auto pos = text.rfind("the answer is ");
    char letter = text[pos + 14];
    auto l = torch::zeros({256});
    l[static_cast<int64_t>(letter)] = 10.0;
    return l;
  };
  auto r = emoe::evaluate_multiple_choice(oracle, tok, qs, {}, 0, 0);
  EXPECT_DOUBLE_EQ(r.accuracy, 100.0);
  auto always_a = [&](const std::vector<int64_t>&) {
    auto l = torch::zeros({256});
    l['A'] = 10.0;
    return l;
  };
  EXPECT_DOUBLE_EQ(emoe::evaluate_multiple_choice(always_a, tok, qs, {}, 0, 0).accuracy, 25.0);
}
