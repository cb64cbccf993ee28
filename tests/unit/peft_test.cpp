// PEFT adapters: LoRA / (IA)^3 / MoV / MoLoRA equivalences, targets, trainable selection, files.
#include "emoe/peft/peft.h"

#include <ATen/CPUGeneratorImpl.h>

#include <fstream>
#include <set>

#include "emoe/core/error.h"
#include "emoe/io/safetensors.h"
#include "emoe/models/dropout.h"
#include "emoe/models/linear.h"
#include "emoe/models/loader.h"
#include "emoe/models/low_rank_linear.h"
#include "emoe/moe/convert.h"
#include "emoe/peft/ia3.h"
#include "emoe/peft/lora.h"
#include "emoe/peft/molora.h"
#include "emoe/peft/targets.h"
#include "support/test_support.h"

namespace {

using emoe::Head;
using emoe::PeftConfig;
using emoe::PeftMethod;

// Tiny random models (hidden 16, 2 layers) with weights large enough that every change shows.
emoe::ModelPtr peft_tiny_model(const std::string& type, Head head, int64_t seed = 0) {
  nlohmann::json j;
  if (type == "bert")
    j = {{"model_type", "bert"},         {"hidden_size", 16},        {"intermediate_size", 32},
         {"num_hidden_layers", 2},       {"num_attention_heads", 2}, {"vocab_size", 50},
         {"max_position_embeddings", 32}};
  else if (type == "gpt2")
    j = {{"model_type", "gpt2"}, {"n_embd", 16},     {"n_layer", 2},
         {"n_head", 2},          {"vocab_size", 50}, {"n_positions", 32}};
  else if (type == "t5" || type == "t5-gated")
    j = {{"model_type", "t5"},
         {"vocab_size", 50},
         {"d_model", 16},
         {"d_kv", 8},
         {"d_ff", 32},
         {"num_layers", 2},
         {"num_decoder_layers", 2},
         {"num_heads", 2},
         {"feed_forward_proj", type == "t5" ? "relu" : "gated-gelu"}};
  else
    j = {{"model_type", "llama"},    {"hidden_size", 16},
         {"intermediate_size", 24},  {"num_hidden_layers", 2},
         {"num_attention_heads", 2}, {"num_key_value_heads", 1},
         {"vocab_size", 50},         {"max_position_embeddings", 32}};
  torch::manual_seed(seed);
  auto num_labels =
      head == Head::kSequenceClassification ? std::optional<int64_t>(2) : std::nullopt;
  auto m = emoe::create_model(emoe::JsonFields(j, type + "/config.json"), head, num_labels);
  torch::NoGradGuard g;
  for (auto& p : m->parameters()) p.normal_(0, 0.3);
  m->eval();
  return m;
}

Head peft_default_head(const std::string& type) {
  if (type == "t5") return Head::kSeq2SeqLM;
  return type == "bert" ? Head::kSequenceClassification : Head::kCausalLM;
}

emoe::ModelInputs peft_inputs() {
  torch::manual_seed(7);
  emoe::ModelInputs in;
  in.input_ids = torch::randint(3, 50, {2, 7}, torch::kLong);
  in.attention_mask = torch::ones({2, 7}, torch::kLong);
  in.attention_mask.index_put_({1, torch::indexing::Slice(5, 7)}, 0);
  return in;
}

torch::Tensor peft_run(emoe::PretrainedModelImpl& m) {
  torch::NoGradGuard g;
  auto in = peft_inputs();
  if (m.summary().encoder_decoder())
    in.decoder_input_ids = torch::randint(3, 50, {2, 5}, torch::kLong);
  auto out = m.forward(in);
  return out.logits.defined() ? out.logits : out.last_hidden_state;
}

PeftConfig peft_config(PeftMethod method, int64_t experts = 10) {
  auto c = PeftConfig::for_method(method, "");
  c.dropout = 0;
  c.experts = experts;
  return c;
}

template <typename A>
std::vector<std::pair<std::string, A*>> peft_adapters_of(emoe::PretrainedModelImpl& m) {
  std::vector<std::pair<std::string, A*>> out;
  for (const auto& l : emoe::named_linears(m))
    if (auto* a = dynamic_cast<A*>(l.linear->adapter().get())) out.emplace_back(l.name, a);
  return out;
}

emoe::LinearImpl& peft_linear_named(emoe::PretrainedModelImpl& m, const std::string& name) {
  for (const auto& l : emoe::named_linears(m))
    if (l.name == name) return *l.linear;
  throw std::runtime_error("no Linear " + name);
}

std::string peft_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const emoe::InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PeftConfigs, DefaultsAndNames) {
  for (auto m : {PeftMethod::kNone, PeftMethod::kLora, PeftMethod::kIa3, PeftMethod::kMov,
                 PeftMethod::kMolora})
    EXPECT_EQ(emoe::parse_peft_method(emoe::to_string(m)), m);
  EXPECT_THROW(emoe::parse_peft_method("qlora"), emoe::UsageError);
  auto c = PeftConfig::for_method(PeftMethod::kMolora, "llama");
  EXPECT_EQ(c.r, 4);
  EXPECT_EQ(c.experts, 10);
  EXPECT_EQ(c.alpha, 16);
  EXPECT_EQ(c.targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(PeftConfig::for_method(PeftMethod::kLora, "bert").r, 8);
  EXPECT_EQ(emoe::default_targets(PeftMethod::kLora, "gpt2"), std::vector<std::string>{"c_attn"});
  EXPECT_EQ(emoe::default_feedforward_targets(PeftMethod::kIa3, "llama"),
            std::vector<std::string>{"down_proj"});
  EXPECT_TRUE(emoe::default_feedforward_targets(PeftMethod::kLora, "bert").empty());
  EXPECT_EQ(emoe::default_targets(PeftMethod::kLora, "t5"), (std::vector<std::string>{"q", "v"}));
  EXPECT_EQ(emoe::default_feedforward_targets(PeftMethod::kIa3, "t5"),
            std::vector<std::string>{"wo"});
  EXPECT_THROW(emoe::default_targets(PeftMethod::kLora, "opt"), emoe::UsageError);
  // The wildcard picks BERT's FFN output, not the attention output projection
  EXPECT_TRUE(emoe::target_matches("layer.*.output.dense", "bert.encoder.layer.1.output.dense"));
  EXPECT_FALSE(
      emoe::target_matches("layer.*.output.dense", "bert.encoder.layer.1.attention.output.dense"));
  EXPECT_TRUE(emoe::target_matches("query", "bert.encoder.layer.0.attention.self.query"));
  EXPECT_FALSE(emoe::target_matches("uery", "bert.encoder.layer.0.attention.self.query"));
}

TEST(PeftIa3, DefaultTargetsScaleKeysValuesAndFfnInput) {
  auto m = peft_tiny_model("bert", Head::kSequenceClassification);
  auto names = emoe::apply_peft(*m, peft_config(PeftMethod::kIa3));
  EXPECT_EQ(
      names,
      (std::vector<std::string>{
          "bert.encoder.layer.0.attention.self.key", "bert.encoder.layer.0.attention.self.value",
          "bert.encoder.layer.0.output.dense", "bert.encoder.layer.1.attention.self.key",
          "bert.encoder.layer.1.attention.self.value", "bert.encoder.layer.1.output.dense"}));
  auto ia3 = peft_adapters_of<emoe::Ia3Adapter>(*m);
  ASSERT_EQ(ia3.size(), 6u);
  EXPECT_FALSE(ia3[0].second->feedforward());
  EXPECT_TRUE(ia3[2].second->feedforward());
  EXPECT_EQ(ia3[2].second->ia3_l.sizes(), (std::vector<int64_t>{1, 32}));
  EXPECT_EQ(ia3[0].second->ia3_l.sizes(), (std::vector<int64_t>{16, 1}));
  // PEFT's key names on the layer itself
  auto params = m->named_parameters();
  EXPECT_TRUE(params.contains("bert.encoder.layer.0.attention.self.key.ia3_l"));
}

TEST(PeftMov, OneExpertEqualsIa3) {
  for (std::string type : {"bert", "gpt2", "llama", "t5"}) {
    SCOPED_TRACE(type);
    auto base = peft_tiny_model(type, peft_default_head(type));
    auto ia3 = peft_tiny_model(type, peft_default_head(type));
    auto mov = peft_tiny_model(type, peft_default_head(type));
    emoe::apply_peft(*ia3, peft_config(PeftMethod::kIa3));
    auto names = emoe::apply_peft(*mov, peft_config(PeftMethod::kMov, 1));
    EXPECT_EQ(names, emoe::adapted_modules(*ia3));
    auto iv = peft_adapters_of<emoe::Ia3Adapter>(*ia3);
    auto mv = peft_adapters_of<emoe::MovAdapter>(*mov);
    ASSERT_EQ(iv.size(), mv.size());
    // T5: encoder k, v, wo and decoder self k, v, cross k, v, wo in each of 2 + 2 blocks
    ASSERT_EQ(iv.size(), type == "gpt2" ? 4u : type == "t5" ? 16u : 6u);
    torch::NoGradGuard g;
    for (size_t i = 0; i < iv.size(); ++i) {
      auto* a = iv[i].second;
      auto* b = mv[i].second;
      a->ia3_l.normal_(1.0, 0.5);
      auto l = a->ia3_l.view({-1});
      EXPECT_EQ(a->feedforward(), b->feedforward());
      for (size_t r = 0; r < b->ranges().size(); ++r) {
        const auto& range = b->ranges()[r];
        const int64_t off = a->feedforward() ? 0 : range.offset - a->range().offset;
        b->vectors[r].copy_(l.narrow(0, off, range.length).view({1, -1}));
        b->routers[r].normal_(0, 1.0);  // with one expert the router cannot matter
      }
    }
    auto y_base = peft_run(*base), y_ia3 = peft_run(*ia3), y_mov = peft_run(*mov);
    EXPECT_GT(emoe::test::max_abs_diff(y_base, y_ia3), 1e-2);
    EXPECT_LE(emoe::test::max_abs_diff(y_ia3, y_mov), 1e-6);
  }
}

TEST(PeftMov, OneExpertEqualsIa3OnT5LossAndFirstGradient) {
  // at initialisation (vectors of ones) a one-expert MoV is (IA)^3: the same seq2seq loss, and the
  // same gradient on each vector, whatever the (random) router
  auto ia3 = peft_tiny_model("t5", Head::kSeq2SeqLM);
  auto mov = peft_tiny_model("t5", Head::kSeq2SeqLM);
  emoe::apply_peft(*ia3, peft_config(PeftMethod::kIa3));
  emoe::apply_peft(*mov, peft_config(PeftMethod::kMov, 1));
  auto iv = peft_adapters_of<emoe::Ia3Adapter>(*ia3);
  auto mv = peft_adapters_of<emoe::MovAdapter>(*mov);
  ASSERT_EQ(iv.size(), mv.size());
  ASSERT_EQ(iv.size(), 16u);
  auto in = peft_inputs();
  in.labels = torch::randint(3, 50, {2, 4}, torch::kLong);
  in.labels.index_put_({1, 3}, -100);
  auto li = ia3->forward(in).loss;
  auto lm = mov->forward(in).loss;
  EXPECT_NEAR(li.item<double>(), lm.item<double>(), 1e-6);
  li.backward();
  lm.backward();
  for (size_t i = 0; i < iv.size(); ++i) {
    SCOPED_TRACE(iv[i].first);
    auto* a = iv[i].second;
    auto* b = mv[i].second;
    ASSERT_TRUE(a->ia3_l.grad().defined());
    auto ga = a->ia3_l.grad().view({-1});
    EXPECT_GT(ga.abs().max().item<double>(), 0.0);
    for (size_t r = 0; r < b->ranges().size(); ++r) {
      const auto& range = b->ranges()[r];
      const int64_t off = a->feedforward() ? 0 : range.offset - a->range().offset;
      ASSERT_TRUE(b->vectors[r].grad().defined());
      EXPECT_LE(emoe::test::max_abs_diff(b->vectors[r].grad().view({-1}),
                                         ga.narrow(0, off, range.length)),
                1e-6);
    }
  }
}

TEST(PeftMov, ExpertsMixPerToken) {
  auto m = peft_tiny_model("llama", Head::kCausalLM);
  emoe::apply_peft(*m, peft_config(PeftMethod::kMov, 3));
  auto mv = peft_adapters_of<emoe::MovAdapter>(*m);
  ASSERT_FALSE(mv.empty());
  auto* a = mv.front().second;
  EXPECT_EQ(a->routers[0].sizes(), (std::vector<int64_t>{8, 3}));  // k_proj: 1 kv head of 8
  EXPECT_EQ(a->vectors[0].sizes(), (std::vector<int64_t>{3, 8}));
  EXPECT_NEAR(a->routers[0].std().item<double>(), 0.02, 0.01);
  // Fresh vectors are ones: the output is the base model's
  auto plain = peft_tiny_model("llama", Head::kCausalLM);
  EXPECT_LE(emoe::test::max_abs_diff(peft_run(*plain), peft_run(*m)), 1e-6);
  // By hand on one layer: p = softmax(a W), scale = p V
  auto& lin = peft_linear_named(*m, mv.front().first);
  torch::NoGradGuard g;
  a->vectors[0].normal_(1, 0.5);
  auto x = torch::randn({4, 16});
  auto y = lin.base_forward(x);
  auto want = y * torch::softmax(y.matmul(a->routers[0]), -1).matmul(a->vectors[0]);
  EXPECT_LE(emoe::test::max_abs_diff(lin.forward(x), want), 1e-6);
}

// MoV routes keys and values per head with one router shared by the heads (SPEC §3.3; the
// reference's MoVAttention: router [head_dim, E], probabilities [.., heads, E], vectors per head),
// and the FFN intermediate as one activation. By hand on BERT's key (2 heads of 8).
TEST(PeftMov, KeysAndValuesAreRoutedPerHeadWithASharedRouter) {
  auto m = peft_tiny_model("bert", Head::kSequenceClassification);
  emoe::apply_peft(*m, peft_config(PeftMethod::kMov, 3));
  auto mv = peft_adapters_of<emoe::MovAdapter>(*m);
  emoe::MovAdapter* key = nullptr;
  emoe::MovAdapter* ffn = nullptr;
  std::string key_name;
  for (auto& [name, a] : mv) {
    if (name.size() >= 3 && name.compare(name.size() - 3, 3, "key") == 0 && !key) {
      key = a;
      key_name = name;
    }
    if (a->feedforward()) ffn = a;
  }
  ASSERT_TRUE(key && ffn);
  EXPECT_EQ(key->ranges()[0].head_dim, 8);
  EXPECT_EQ(key->routers[0].sizes(), (std::vector<int64_t>{8, 3}));
  EXPECT_EQ(key->vectors[0].sizes(), (std::vector<int64_t>{3, 16}));
  EXPECT_EQ(ffn->routers[0].sizes(), (std::vector<int64_t>{32, 3}));  // the whole intermediate
  torch::NoGradGuard g;
  key->vectors[0].normal_(1, 0.5);
  key->routers[0].normal_(0, 1);
  auto& lin = peft_linear_named(*m, key_name);
  auto x = torch::randn({4, 16});
  auto y = lin.base_forward(x);
  auto want = torch::empty_like(y);
  for (int64_t h = 0; h < 2; ++h) {
    auto a = y.narrow(1, 8 * h, 8);
    auto p = torch::softmax(a.matmul(key->routers[0]), -1);      // this head's own p
    auto scale = p.matmul(key->vectors[0].narrow(1, 8 * h, 8));  // its own vectors
    want.narrow(1, 8 * h, 8).copy_(a * scale);
  }
  EXPECT_LE(emoe::test::max_abs_diff(lin.forward(x), want), 1e-5);
  // routing the whole 16-wide key as one activation would give another output
  auto p_whole = torch::softmax(y.matmul(torch::cat({key->routers[0], key->routers[0]}, 0)), -1);
  EXPECT_GT(emoe::test::max_abs_diff(lin.forward(x), y * p_whole.matmul(key->vectors[0])), 1e-3);
}

// MoV's soft merging on T5 (v1.0 and the gated v1.1) at every site SPEC §3.3 names — keys and
// values of self- and cross-attention, the FFN intermediate (for v1.1 the product
// gelu(wi_0 x) * wi_1 x, so the scale applies on the gelu branch) — equals the explicit
// probability-weighted sum of the experts' (IA)^3 outputs: sum_e p_e(a) f(x; v_e).
TEST(PeftMov, SoftMergingEqualsTheWeightedSumOfExpertOutputsOnT5) {
  for (std::string type : {"t5", "t5-gated"}) {
    SCOPED_TRACE(type);
    auto m = peft_tiny_model(type, Head::kSeq2SeqLM);
    emoe::apply_peft(*m, peft_config(PeftMethod::kMov, 3));
    auto mv = peft_adapters_of<emoe::MovAdapter>(*m);
    ASSERT_EQ(mv.size(), 16u);
    std::set<std::string> sites;
    torch::NoGradGuard g;
    for (auto& [name, a] : mv) {
      SCOPED_TRACE(name);
      sites.insert(name.substr(name.rfind('.', name.size() - 4) + 1));
      for (size_t r = 0; r < a->vectors.size(); ++r) {
        a->vectors[r].normal_(1, 0.5);
        a->routers[r].normal_(0, 1);
      }
      auto& lin = peft_linear_named(*m, name);
      auto x = torch::randn({5, lin.options().in});
      torch::Tensor want;
      if (a->feedforward()) {
        auto p = torch::softmax(x.matmul(a->routers[0]), -1);
        want = torch::zeros({5, lin.options().out});
        for (int64_t e = 0; e < 3; ++e)
          want += p.narrow(1, e, 1) * lin.base_forward(x * a->vectors[0][e]);
      } else {
        auto y = lin.base_forward(x);
        want = y.clone();
        for (size_t r = 0; r < a->ranges().size(); ++r) {
          // keys and values: each of the 2 heads (d_kv 8) routed on its own by the shared router
          ASSERT_EQ(a->ranges()[r].head_dim, 8);
          auto slice = y.narrow(1, a->ranges()[r].offset, a->ranges()[r].length).view({5, 2, 8});
          auto p = torch::softmax(slice.matmul(a->routers[r]), -1);  // [5, 2, 3]
          auto sum = torch::zeros_like(slice);
          for (int64_t e = 0; e < 3; ++e)
            sum += p.narrow(2, e, 1) * (slice * a->vectors[r][e].view({2, 8}));
          want.narrow(1, a->ranges()[r].offset, a->ranges()[r].length).copy_(sum.view({5, 16}));
        }
      }
      EXPECT_LE(emoe::test::max_abs_diff(lin.forward(x), want), 1e-5);
    }
    // self-attention k, v and cross-attention k, v ("SelfAttention.k", "EncDecAttention.v", ...)
    // and the FFN output projection's input ("DenseReluDense.wo")
    EXPECT_EQ(sites,
              (std::set<std::string>{"SelfAttention.k", "SelfAttention.v", "EncDecAttention.k",
                                     "EncDecAttention.v", "DenseReluDense.wo"}));
  }
}

TEST(PeftMolora, OneExpertEqualsLora) {
  for (std::string type : {"bert", "gpt2", "llama"}) {
    SCOPED_TRACE(type);
    auto lora = peft_tiny_model(type, peft_default_head(type));
    auto molora = peft_tiny_model(type, peft_default_head(type));
    auto lc = peft_config(PeftMethod::kLora);
    lc.r = 4;
    emoe::apply_peft(*lora, lc);
    emoe::apply_peft(*molora, peft_config(PeftMethod::kMolora, 1));
    auto la = peft_adapters_of<emoe::LoraAdapter>(*lora);
    auto ma = peft_adapters_of<emoe::MoloraAdapter>(*molora);
    ASSERT_EQ(la.size(), ma.size());
    ASSERT_FALSE(la.empty());
    torch::NoGradGuard g;
    for (size_t i = 0; i < la.size(); ++i) {
      la[i].second->lora_b->weight.normal_(0, 0.5);
      ma[i].second->molora_A.copy_(la[i].second->lora_a->weight);
      ma[i].second->molora_B.copy_(la[i].second->lora_b->weight);
    }
    auto plain = peft_tiny_model(type, peft_default_head(type));
    EXPECT_GT(emoe::test::max_abs_diff(peft_run(*plain), peft_run(*lora)), 1e-2);
    EXPECT_LE(emoe::test::max_abs_diff(peft_run(*lora), peft_run(*molora)), 1e-6);
  }
}

TEST(PeftMolora, TopkMasksAndBalanceLossByHand) {
  emoe::Linear lin(emoe::LinearOptions{2, 1, false, false});
  {
    torch::NoGradGuard g;
    lin->weight.zero_();
  }
  emoe::MoloraOptions o;
  o.r = 1;
  o.alpha = 1;
  o.experts = 2;
  o.topk = 1;
  o.balance_weight = 0.5;
  auto gen = at::detail::createCPUGenerator(0);
  auto a = std::make_shared<emoe::MoloraAdapter>(*lin, o, gen);
  lin->set_adapter(a);
  EXPECT_TRUE(lin->named_parameters().contains("molora_router"));
  {
    torch::NoGradGuard g;
    a->molora_router.copy_(torch::eye(2));                       // logits = x
    a->molora_A.copy_(torch::tensor({{1.f, 1.f}, {1.f, 1.f}}));  // both experts: x0 + x1
    a->molora_B.copy_(torch::tensor({{1.f, 2.f}}));              // expert 0 -> 1, expert 1 -> 2
  }
  const double l3 = std::log(3.0);
  // p = [3/4, 1/4], [1/4, 3/4], [3/4, 1/4]; top-1 picks experts 0, 1, 0
  auto x = torch::tensor({{l3, 0.0}, {0.0, l3}, {l3, 0.0}}, torch::kFloat);
  lin->train();
  auto y = lin->forward(x).view({-1});
  EXPECT_NEAR(y[0].item<double>(), 0.75 * l3, 1e-6);
  EXPECT_NEAR(y[1].item<double>(), 2 * 0.75 * l3, 1e-6);
  EXPECT_NEAR(y[2].item<double>(), 0.75 * l3, 1e-6);
  // f = [2/3, 1/3], P = [7/12, 5/12]: E Σ f P = 2 (14/36 + 5/36) = 19/18, times 0.5
  ASSERT_TRUE(a->aux_loss().defined());
  EXPECT_NEAR(a->aux_loss().item<double>(), 19.0 / 36.0, 1e-6);
  lin->eval();
  lin->forward(x);
  EXPECT_FALSE(a->aux_loss().defined());

  // Soft merging: every expert weighted by its probability, no loss
  o.topk = 0;
  auto soft = std::make_shared<emoe::MoloraAdapter>(*lin, o, gen);
  {
    torch::NoGradGuard g;
    soft->molora_router.copy_(a->molora_router);
    soft->molora_A.copy_(a->molora_A);
    soft->molora_B.copy_(a->molora_B);
  }
  lin->set_adapter(soft);
  lin->train();
  y = lin->forward(x).view({-1});
  EXPECT_NEAR(y[0].item<double>(), (0.75 + 2 * 0.25) * l3, 1e-6);
  EXPECT_NEAR(y[1].item<double>(), (0.25 + 2 * 0.75) * l3, 1e-6);
  EXPECT_FALSE(soft->aux_loss().defined());
}

TEST(PeftMolora, CollectsTheBalanceLossOfEveryAdapter) {
  auto m = peft_tiny_model("gpt2", Head::kCausalLM);
  auto c = peft_config(PeftMethod::kMolora, 4);
  c.topk = 2;
  c.balance_weight = 0.1;
  emoe::apply_peft(*m, c);
  EXPECT_FALSE(emoe::collect_peft_aux_loss(*m).defined());
  m->train();
  m->forward(peft_inputs());
  auto total = emoe::collect_peft_aux_loss(*m);
  ASSERT_TRUE(total.defined());
  double sum = 0;
  for (const auto& [name, a] : peft_adapters_of<emoe::MoloraAdapter>(*m))
    sum += a->aux_loss().item<double>();
  EXPECT_NEAR(total.item<double>(), sum, 1e-6);
  // every adapter's loss is 0.1 * E Σ f P >= 0.1 (equality at perfect balance)
  EXPECT_GE(total.item<double>(), 2 * 0.1 - 1e-6);
  total.backward();  // flows into the routers
  auto ma = peft_adapters_of<emoe::MoloraAdapter>(*m);
  EXPECT_TRUE(ma.front().second->molora_router.grad().defined());
}

TEST(PeftLora, ZeroBLeavesOutputsUnchangedAndMergeMatches) {
  for (std::string type : {"bert", "gpt2", "llama"}) {
    SCOPED_TRACE(type);
    auto plain = peft_tiny_model(type, peft_default_head(type));
    auto m = peft_tiny_model(type, peft_default_head(type));
    auto names = emoe::apply_peft(*m, peft_config(PeftMethod::kLora));
    EXPECT_EQ(names.size(), type == "gpt2" ? 2u : 4u);
    // not bitwise: the plain model fuses q, k, v into one GEMM, the adapted one cannot
    EXPECT_LT(emoe::test::max_abs_diff(peft_run(*plain), peft_run(*m)), 1e-6);
    auto la = peft_adapters_of<emoe::LoraAdapter>(*m);
    {
      torch::NoGradGuard g;
      for (auto& [name, a] : la) a->lora_b->weight.normal_(0, 0.5);
    }
    auto unmerged = peft_run(*m);
    EXPECT_GT(emoe::test::max_abs_diff(peft_run(*plain), unmerged), 1e-2);
    emoe::merge_lora(*m);
    EXPECT_TRUE(emoe::adapted_modules(*m).empty());
    EXPECT_LE(emoe::test::max_abs_diff(peft_run(*m), unmerged), 1e-5);
    // The merged model has exactly the base architecture's parameters again
    EXPECT_EQ(m->named_parameters().size(), plain->named_parameters().size());
  }
}

TEST(PeftLora, InitShapesSeedAndDtype) {
  auto m = peft_tiny_model("gpt2", Head::kCausalLM);
  auto c = peft_config(PeftMethod::kLora);
  c.seed = 5;
  emoe::apply_peft(*m, c);
  auto params = m->named_parameters();
  ASSERT_TRUE(params.contains("transformer.h.0.attn.c_attn.lora_A.weight"));
  auto a = params["transformer.h.0.attn.c_attn.lora_A.weight"];
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(params["transformer.h.0.attn.c_attn.lora_B.weight"].sizes(),
            (std::vector<int64_t>{48, 8}));
  EXPECT_LE(a.abs().max().item<double>(), 0.25);  // kaiming-uniform(√5): bound 1/√16
  EXPECT_GT(a.abs().max().item<double>(), 0.2);
  auto again = peft_tiny_model("gpt2", Head::kCausalLM);
  emoe::apply_peft(*again, c);
  EXPECT_TRUE(
      torch::equal(a, again->named_parameters()["transformer.h.0.attn.c_attn.lora_A.weight"]));
  EXPECT_THROW(emoe::apply_peft(*again, c), emoe::UsageError);  // already adapted

  // Adapters are created in the layer's dtype (and device)
  auto d = peft_tiny_model("llama", Head::kCausalLM);
  d->to(torch::kDouble);
  emoe::apply_peft(*d, peft_config(PeftMethod::kMolora));
  for (const auto& p : d->named_parameters())
    EXPECT_EQ(p.value().scalar_type(), torch::kDouble) << p.key();
  EXPECT_EQ(peft_run(*d).scalar_type(), torch::kDouble);
}

TEST(PeftLora, DropoutOnlyInTraining) {
  auto m = peft_tiny_model("bert", Head::kSequenceClassification);
  auto c = peft_config(PeftMethod::kLora);
  c.dropout = 0.5;
  emoe::apply_peft(*m, c);
  auto& q = peft_linear_named(*m, "bert.encoder.layer.0.attention.self.query");
  {
    torch::NoGradGuard g;
    for (auto& [name, a] : peft_adapters_of<emoe::LoraAdapter>(*m))
      a->lora_b->weight.normal_(0, 0.5);
  }
  auto x = torch::randn({3, 16});
  m->eval();
  EXPECT_TRUE(torch::equal(q.forward(x), q.forward(x)));
  m->train();
  torch::manual_seed(1);
  auto y1 = q.forward(x);
  auto y2 = q.forward(x);
  EXPECT_GT(emoe::test::max_abs_diff(y1, y2), 1e-4);
}

TEST(PeftIa3, Gpt2CattnScalesKeysAndValuesOnly) {
  auto m = peft_tiny_model("gpt2", Head::kCausalLM);
  auto names = emoe::apply_peft(*m, peft_config(PeftMethod::kIa3));
  EXPECT_EQ(names, (std::vector<std::string>{
                       "transformer.h.0.attn.c_attn", "transformer.h.0.mlp.c_proj",
                       "transformer.h.1.attn.c_attn", "transformer.h.1.mlp.c_proj"}));
  auto& c_attn = peft_linear_named(*m, "transformer.h.0.attn.c_attn");
  auto* a = dynamic_cast<emoe::Ia3Adapter*>(c_attn.adapter().get());
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->ia3_l.sizes(), (std::vector<int64_t>{32, 1}));  // k|v of 16 each
  torch::NoGradGuard g;
  a->ia3_l.normal_(1, 0.5);
  auto x = torch::randn({2, 3, 16});
  auto y = c_attn.forward(x), base = c_attn.base_forward(x);
  EXPECT_TRUE(torch::equal(y.narrow(-1, 0, 16), base.narrow(-1, 0, 16)));  // q untouched
  EXPECT_LE(
      emoe::test::max_abs_diff(y.narrow(-1, 16, 32), base.narrow(-1, 16, 32) * a->ia3_l.view({-1})),
      1e-6);
  EXPECT_GT(emoe::test::max_abs_diff(y, base), 1e-2);
  // MoV on c_attn: separate k and v activations, each with its own router
  auto mov = peft_tiny_model("gpt2", Head::kCausalLM);
  emoe::apply_peft(*mov, peft_config(PeftMethod::kMov, 4));
  auto mp = mov->named_parameters();
  // keys and values routed per head: one router over a head's 8 dims, shared by the 2 heads
  EXPECT_EQ(mp["transformer.h.0.attn.c_attn.mov_router_k"].sizes(), (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(mp["transformer.h.0.attn.c_attn.mov_vectors_v"].sizes(), (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(mp["transformer.h.0.mlp.c_proj.mov_router"].sizes(), (std::vector<int64_t>{64, 4}));
}

TEST(PeftIa3, PeftFilesRoundTripOnGpt2) {
  auto m = peft_tiny_model("gpt2", Head::kCausalLM);
  auto c = peft_config(PeftMethod::kIa3);
  emoe::apply_peft(*m, c);
  {
    torch::NoGradGuard g;
    for (auto& [name, a] : peft_adapters_of<emoe::Ia3Adapter>(*m)) a->ia3_l.normal_(1, 0.5);
  }
  emoe::test::TempDir tmp;
  emoe::save_peft_adapter(*m, c, tmp.path(), "tiny/gpt2");
  auto j = nlohmann::json::parse(std::ifstream(tmp.file("adapter_config.json")));
  EXPECT_EQ(j["peft_type"], "IA3");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["fan_in_fan_out"], true);
  EXPECT_EQ(j["target_modules"], nlohmann::json({"c_attn", "mlp.c_proj"}));
  EXPECT_EQ(j["feedforward_modules"], nlohmann::json({"mlp.c_proj"}));
  auto file = emoe::load_safetensors(tmp.file("adapter_model.safetensors"));
  ASSERT_EQ(file.size(), 4u);
  auto v = file.at("base_model.model.transformer.h.0.attn.c_attn.ia3_l");
  EXPECT_EQ(v.sizes(), (std::vector<int64_t>{48, 1}));
  EXPECT_TRUE(torch::equal(v.narrow(0, 0, 16), torch::ones({16, 1})));  // q: PEFT's 1 = untouched
  EXPECT_EQ(file.at("base_model.model.transformer.h.1.mlp.c_proj.ia3_l").sizes(),
            (std::vector<int64_t>{1, 64}));

  auto back = peft_tiny_model("gpt2", Head::kCausalLM);
  auto lc = emoe::load_peft_adapter(*back, tmp.path());
  EXPECT_EQ(lc.method, PeftMethod::kIa3);
  EXPECT_EQ(lc.feedforward_targets, std::vector<std::string>{"mlp.c_proj"});
  EXPECT_EQ(emoe::test::max_abs_diff(peft_run(*m), peft_run(*back)), 0.0);

  // A file that scales q too (as PEFT's own c_attn (IA)^3 does) is reproduced, not truncated
  file.at("base_model.model.transformer.h.0.attn.c_attn.ia3_l").narrow(0, 0, 16).fill_(2.0);
  std::vector<std::pair<std::string, torch::Tensor>> tensors(file.begin(), file.end());
  emoe::save_safetensors(tmp.file("adapter_model.safetensors"), tensors);
  auto full = peft_tiny_model("gpt2", Head::kCausalLM);
  emoe::load_peft_adapter(*full, tmp.path());
  auto& c_attn = peft_linear_named(*full, "transformer.h.0.attn.c_attn");
  torch::NoGradGuard g;
  auto x = torch::randn({2, 16});
  EXPECT_LE(emoe::test::max_abs_diff(c_attn.forward(x).narrow(-1, 0, 16),
                                     2.0 * c_attn.base_forward(x).narrow(-1, 0, 16)),
            1e-6);
}

TEST(PeftTrainable, ExactlyAdaptersAndTaskHead) {
  auto count = [](PeftMethod method, const std::vector<std::string>& also = {}) {
    auto m = peft_tiny_model("bert", Head::kSequenceClassification);
    auto c = peft_config(method);
    emoe::apply_peft(*m, c);
    emoe::select_trainable(*m, c, also);
    return emoe::count_parameters(*m).trainable;
  };
  // head: classifier 16·2 + 2 (the pooler stays frozen, as in PEFT's SEQ_CLS)
  const int64_t head = 34;
  EXPECT_EQ(count(PeftMethod::kLora), 4 * (8 * 16 + 16 * 8) + head);
  EXPECT_EQ(count(PeftMethod::kIa3), 4 * 16 + 2 * 32 + head);
  // MoV: keys and values a router over one head (8 x 10) and 10 vectors of 16; the FFN 32 x 10
  EXPECT_EQ(count(PeftMethod::kMov), 4 * (8 * 10 + 10 * 16) + 2 * (32 * 10 * 2) + head);
  EXPECT_EQ(count(PeftMethod::kMolora), 4 * (40 * 16 + 16 * 40 + 10 * 16) + head);
  // also_train: every LayerNorm (embeddings + 2 per layer, 32 parameters each)
  EXPECT_EQ(count(PeftMethod::kLora, {"LayerNorm"}), 4 * (8 * 16 + 16 * 8) + head + 5 * 32);

  // Which names: adapters and the head, nothing else
  auto m = peft_tiny_model("bert", Head::kSequenceClassification);
  emoe::apply_peft(*m, peft_config(PeftMethod::kLora));
  emoe::select_trainable(*m, peft_config(PeftMethod::kLora));
  for (const auto& p : m->named_parameters()) {
    const auto& k = p.key();
    bool want = k.find("lora_") != std::string::npos || k.rfind("classifier.", 0) == 0;
    EXPECT_EQ(p.value().requires_grad(), want) << k;
  }
  // none: nothing is frozen
  auto full = peft_tiny_model("bert", Head::kSequenceClassification);
  emoe::select_trainable(*full, peft_config(PeftMethod::kNone));
  EXPECT_EQ(emoe::count_parameters(*full).trainable, emoe::count_parameters(*full).total);
  // A pretrained LM head stays frozen (Llama, untied); GPT-2's is tied to the embeddings
  auto llama = peft_tiny_model("llama", Head::kCausalLM);
  emoe::apply_peft(*llama, peft_config(PeftMethod::kLora));
  emoe::select_trainable(*llama, peft_config(PeftMethod::kLora));
  EXPECT_EQ(emoe::count_parameters(*llama).trainable, 2 * ((8 * 16 + 16 * 8) + (8 * 16 + 8 * 8)));
  // Selecting before applying is a usage error
  EXPECT_THROW(emoe::select_trainable(*peft_tiny_model("gpt2", Head::kCausalLM),
                                      peft_config(PeftMethod::kLora)),
               emoe::UsageError);
}

TEST(PeftTargets, BadTargetListsTheLinearNames) {
  auto m = peft_tiny_model("bert", Head::kSequenceClassification);
  auto c = peft_config(PeftMethod::kLora);
  c.targets = {"query", "q_proj"};
  std::string msg;
  try {
    emoe::apply_peft(*m, c);
  } catch (const emoe::UsageError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("'q_proj'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bert.encoder.layer.*.attention.self.query"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bert.encoder.layer.*.intermediate.dense"), std::string::npos) << msg;
  EXPECT_NE(msg.find("classifier"), std::string::npos) << msg;
  EXPECT_TRUE(emoe::adapted_modules(*m).empty());  // nothing half-applied

  auto f = peft_config(PeftMethod::kIa3);
  f.targets = {"key", "value"};
  f.feedforward_targets = {"intermediate.dense"};
  EXPECT_THROW(emoe::apply_peft(*m, f), emoe::UsageError);
  auto bad_r = peft_config(PeftMethod::kLora);
  bad_r.r = 0;
  EXPECT_THROW(emoe::apply_peft(*m, bad_r), emoe::UsageError);
  EXPECT_TRUE(emoe::apply_peft(*m, peft_config(PeftMethod::kNone)).empty());
}

TEST(PeftTargets, RefusesLinearsAnMoePlugBypasses) {
  auto moe = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  moe.experts = 4;
  moe.topk = 2;
  moe.layers = {1};
  moe.split = "contiguous";
  moe.execution = emoe::Execution::kDispatched;
  auto m = peft_tiny_model("bert", Head::kSequenceClassification);
  emoe::convert_to_moe(*m, moe);
  std::string msg;
  try {
    emoe::apply_peft(*m, peft_config(PeftMethod::kIa3));
  } catch (const emoe::UsageError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("bert.encoder.layer.1.output.dense"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dispatched"), std::string::npos) << msg;
  EXPECT_EQ(emoe::apply_peft(*m, peft_config(PeftMethod::kLora)).size(), 4u);  // attention: fine

  moe.execution = emoe::Execution::kMasked;
  auto masked = peft_tiny_model("bert", Head::kSequenceClassification);
  emoe::convert_to_moe(*masked, moe);
  EXPECT_EQ(emoe::apply_peft(*masked, peft_config(PeftMethod::kIa3)).size(), 6u);
}

TEST(PeftTargets, PreactivationDropoutKeepsAdaptersOnTheKeyProjectionInThePath) {
  // masked EMoE with pre-activation dropout computes the input projection through the layer's
  // Linear (FfnSlot::ffn_preactivation): a LoRA there is accepted and changes the training output
  auto moe = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  moe.experts = 4;
  moe.topk = 2;
  moe.layers = {1};
  moe.split = "contiguous";
  moe.preact_dropout = 0.1;
  auto m = peft_tiny_model("bert", Head::kSequenceClassification);
  emoe::convert_to_moe(*m, moe);
  auto c = peft_config(PeftMethod::kLora);
  c.targets = {"layer.1.intermediate.dense"};
  ASSERT_EQ(emoe::apply_peft(*m, c).size(), 1u);
  torch::manual_seed(3);
  auto ids = torch::randint(3, 50, {2, 6}, torch::kLong);
  auto run = [&] {
    m->train();
    torch::manual_seed(7);  // the same dropout masks in both runs
    emoe::ModelInputs in;
    in.input_ids = ids;
    return m->forward(in).logits;
  };
  auto before = run();
  {
    torch::NoGradGuard g;
    for (auto& p : m->named_parameters())
      if (p.key().find("lora_B") != std::string::npos) p.value().fill_(0.5);
  }
  EXPECT_GT((run() - before).abs().max().item<double>(), 1e-4) << "the adapter was skipped";
}

TEST(PeftIo, BadAdapterConfigIsOneInputErrorListingEveryProblem) {
  auto m = peft_tiny_model("bert", Head::kBase);
  auto c = peft_config(PeftMethod::kLora);
  emoe::apply_peft(*m, c);
  emoe::test::TempDir tmp;
  emoe::save_peft_adapter(*m, c, tmp.path(), "tiny/bert");
  auto j = nlohmann::json::parse(std::ifstream(tmp.file("adapter_config.json")));
  EXPECT_EQ(j["task_type"], "FEATURE_EXTRACTION");
  EXPECT_EQ(j["target_modules"], nlohmann::json({"query", "value"}));
  EXPECT_EQ(j["r"], 8);
  EXPECT_EQ(j["lora_alpha"], 16);
  j["r"] = 3;
  j["lora_dropout"] = 1.5;
  j["bias"] = "all";
  j["target_modules"] = {"query", "value", "nothing"};
  j["task_type"] = "SEQ_CLS";
  std::ofstream(tmp.file("adapter_config.json")) << j.dump(2);
  auto fresh = peft_tiny_model("bert", Head::kBase);
  std::string msg = peft_error_of([&] { emoe::load_peft_adapter(*fresh, tmp.path()); });
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const char* part :
       {"field 'lora_dropout'", "field 'bias'", "'nothing'", "field 'task_type'",
        "encoder.layer.0.attention.self.query.lora_A.weight: expected [3, 16], got [8, 16]",
        "12 problems"})
    EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
  EXPECT_TRUE(emoe::adapted_modules(*fresh).empty());

  // A method PEFT has but emoe does not read
  j = {{"peft_type", "PROMPT_TUNING"}, {"target_modules", {"query"}}};
  std::ofstream(tmp.file("adapter_config.json")) << j.dump(2);
  msg = peft_error_of([&] { emoe::load_peft_adapter(*fresh, tmp.path()); });
  EXPECT_NE(msg.find("field 'peft_type'"), std::string::npos) << msg;

  EXPECT_NE(peft_error_of([&] {
              emoe::load_peft_adapter(*fresh, tmp.file("nowhere"));
            }).find("adapter_config.json"),
            std::string::npos);
  // MoV / MoLoRA have no PEFT format
  auto mov = peft_tiny_model("bert", Head::kBase);
  emoe::apply_peft(*mov, peft_config(PeftMethod::kMov));
  EXPECT_THROW(emoe::save_peft_adapter(*mov, peft_config(PeftMethod::kMov), tmp.file("mov"), "x"),
               emoe::UsageError);
}

TEST(PeftIo, LoraRoundTripOnGpt2Seqcls) {
  auto m = peft_tiny_model("gpt2", Head::kSequenceClassification);
  auto c = peft_config(PeftMethod::kLora);
  emoe::apply_peft(*m, c);
  {
    torch::NoGradGuard g;
    for (auto& [name, a] : peft_adapters_of<emoe::LoraAdapter>(*m))
      a->lora_b->weight.normal_(0, 0.5);
  }
  emoe::test::TempDir tmp;
  emoe::save_peft_adapter(*m, c, tmp.path(), "tiny/gpt2_seqcls");
  auto file = emoe::load_safetensors(tmp.file("adapter_model.safetensors"));
  std::vector<std::string> keys;
  for (const auto& [k, v] : file) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "base_model.model.score.weight",
                      "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight",
                      "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight",
                      "base_model.model.transformer.h.1.attn.c_attn.lora_A.weight",
                      "base_model.model.transformer.h.1.attn.c_attn.lora_B.weight"}));
  auto j = nlohmann::json::parse(std::ifstream(tmp.file("adapter_config.json")));
  EXPECT_EQ(j["fan_in_fan_out"], true);
  EXPECT_EQ(j["task_type"], "SEQ_CLS");
  auto back =
      peft_tiny_model("gpt2", Head::kSequenceClassification, /*seed=*/1);  // other head weights
  {
    // same body as m, different score head: the file's head must be loaded
    torch::NoGradGuard g;
    auto src = m->named_parameters();
    for (auto& p : back->named_parameters())
      if (p.key().rfind("score.", 0) != 0) p.value().copy_(src[p.key()]);
  }
  emoe::load_peft_adapter(*back, tmp.path());
  EXPECT_EQ(emoe::test::max_abs_diff(peft_run(*m), peft_run(*back)), 0.0);
}

namespace {

// y = x W^T + b + Σ s·dropout(x) A^T B^T into each update's columns, from separate operations
torch::Tensor low_rank_reference(const torch::Tensor& x, const torch::Tensor& w,
                                 const torch::Tensor& b,
                                 const std::vector<emoe::LowRankUpdate>& updates) {
  auto y = torch::linear(x, w, b);
  std::vector<torch::Tensor> parts;
  int64_t col = 0;
  std::vector<torch::Tensor> deltas(updates.size());
  for (size_t i = 0; i < updates.size(); ++i) {
    const auto& u = updates[i];
    auto h = emoe::dropout(x, u.dropout, u.dropout > 0);
    deltas[i] = torch::linear(torch::linear(h, u.a) * u.scaling, u.b);
  }
  for (size_t i = 0; i < updates.size(); ++i) {
    const auto& u = updates[i];
    if (u.offset > col) parts.push_back(y.narrow(-1, col, u.offset - col));
    parts.push_back(y.narrow(-1, u.offset, u.b.size(0)) + deltas[i]);
    col = u.offset + u.b.size(0);
  }
  if (col < y.size(-1)) parts.push_back(y.narrow(-1, col, y.size(-1) - col));
  return torch::cat(parts, -1);
}

}  // namespace

TEST(LowRankLinear, MatchesSeparateOperationsInValuesAndGradientsWithDropout) {
  torch::manual_seed(4);
  const int64_t in = 24, out = 40;
  for (const bool with_bias : {true, false}) {
    for (const double p : {0.0, 0.3}) {
      for (const bool column_major : {false, true}) {
        auto w = column_major ? torch::randn({in, out}).t() : torch::randn({out, in});
        auto b = with_bias ? torch::randn({out}) : torch::Tensor();
        auto x = torch::randn({3, 5, in}, torch::requires_grad());
        // two updates on columns [0, 16) and [28, 40), ranks 4 and 2
        std::vector<emoe::LowRankUpdate> ups(2);
        ups[0].a = torch::randn({4, in}, torch::requires_grad());
        ups[0].b = torch::randn({16, 4}, torch::requires_grad());
        ups[0].offset = 0;
        ups[0].scaling = 2.0;
        ups[0].dropout = p;
        ups[1].a = torch::randn({2, in}, torch::requires_grad());
        ups[1].b = torch::randn({12, 2}, torch::requires_grad());
        ups[1].offset = 28;
        ups[1].scaling = 0.5;
        ups[1].dropout = p;
        ASSERT_TRUE(emoe::low_rank_linear_supported(x, w, b, ups));
        auto g = torch::randn({3, 5, out});
        torch::manual_seed(77);
        auto y = emoe::low_rank_linear(x, w, b, ups);
        (y * g).sum().backward();
        std::vector<torch::Tensor> grads{x.grad().clone(), ups[0].a.grad().clone(),
                                         ups[0].b.grad().clone(), ups[1].a.grad().clone(),
                                         ups[1].b.grad().clone()};
        for (auto* t : {&x, &ups[0].a, &ups[0].b, &ups[1].a, &ups[1].b})
          t->mutable_grad() = torch::Tensor();
        torch::manual_seed(77);  // the same seeds, so the same dropout masks
        auto ref = low_rank_reference(x, w, b, ups);
        (ref * g).sum().backward();
        ASSERT_EQ(y.sizes(), ref.sizes());
        EXPECT_LT(emoe::test::max_abs_diff(y, ref), 1e-4) << "bias " << with_bias << " p " << p;
        std::vector<torch::Tensor> ref_grads{x.grad(), ups[0].a.grad(), ups[0].b.grad(),
                                             ups[1].a.grad(), ups[1].b.grad()};
        for (size_t i = 0; i < grads.size(); ++i)
          EXPECT_LT(emoe::test::max_abs_diff(grads[i], ref_grads[i]), 1e-3)
              << "gradient " << i << " p " << p;
      }
    }
  }
  // an input that needs no gradient: only the adapters get one
  auto w = torch::randn({8, 6});
  std::vector<emoe::LowRankUpdate> one(1);
  one[0].a = torch::randn({2, 6}, torch::requires_grad());
  one[0].b = torch::randn({8, 2}, torch::requires_grad());
  auto x = torch::randn({4, 6});
  emoe::low_rank_linear(x, w, torch::Tensor(), one).sum().backward();
  EXPECT_TRUE(one[0].a.grad().defined() && one[0].b.grad().defined());
  // what it does not take: a trainable base weight, another dtype, an update outside the output
  EXPECT_FALSE(
      emoe::low_rank_linear_supported(x, w.clone().requires_grad_(true), torch::Tensor(), one));
  EXPECT_FALSE(emoe::low_rank_linear_supported(x.to(torch::kDouble), w, torch::Tensor(), one));
  one[0].offset = 1;
  EXPECT_FALSE(emoe::low_rank_linear_supported(x, w, torch::Tensor(), one));
}

TEST(LowRankLinear, FusedQkvWithLoraOnQAndVEqualsEachLayersForward) {
  torch::manual_seed(6);
  emoe::Linear q(emoe::LinearOptions{8, 8, true, false}), k(emoe::LinearOptions{8, 4, true, false}),
      v(emoe::LinearOptions{8, 4, true, false});
  at::Generator gen = at::detail::createCPUGenerator(3);
  for (auto* l : {q.get(), k.get(), v.get()}) {
    l->weight.requires_grad_(false);
    l->bias.requires_grad_(false);
  }
  auto lq = std::make_shared<emoe::LoraAdapter>(*q, emoe::LoraOptions{2, 4, 0.25}, gen);
  auto lv = std::make_shared<emoe::LoraAdapter>(*v, emoe::LoraOptions{2, 4, 0.25}, gen);
  {
    torch::NoGradGuard no_grad;  // B starts at zero: make the update visible
    lq->lora_b->weight.normal_();
    lv->lora_b->weight.normal_();
  }
  q->set_adapter(lq);
  v->set_adapter(lv);
  auto x = torch::randn({2, 3, 8}, torch::requires_grad());
  torch::manual_seed(9);
  auto fused = emoe::fused_linear({q.get(), k.get(), v.get()}, x);
  // one product: the three outputs are views of one buffer
  EXPECT_TRUE(fused[0].storage().is_alias_of(fused[2].storage()));
  (fused[0].sum() + 2 * fused[1].sum() + 3 * fused[2].sum()).backward();
  auto gx = x.grad().clone(), gaq = lq->lora_a->weight.grad().clone(),
       gbv = lv->lora_b->weight.grad().clone();
  for (auto* t :
       {&x, &lq->lora_a->weight, &lq->lora_b->weight, &lv->lora_a->weight, &lv->lora_b->weight})
    t->mutable_grad() = torch::Tensor();
  // each layer on its own: LoRA through its own forward, drawing its dropout seed in the same order
  torch::manual_seed(9);
  auto yq = q(x), yk = k(x), yv = v(x);
  (yq.sum() + 2 * yk.sum() + 3 * yv.sum()).backward();
  EXPECT_LT(emoe::test::max_abs_diff(fused[0], yq), 1e-5);
  EXPECT_LT(emoe::test::max_abs_diff(fused[1], yk), 1e-5);
  EXPECT_LT(emoe::test::max_abs_diff(fused[2], yv), 1e-5);
  EXPECT_LT(emoe::test::max_abs_diff(gx, x.grad()), 1e-4);
  EXPECT_LT(emoe::test::max_abs_diff(gaq, lq->lora_a->weight.grad()), 1e-4);
  EXPECT_LT(emoe::test::max_abs_diff(gbv, lv->lora_b->weight.grad()), 1e-4);
  // a trainable base layer: each layer's own forward, and its weight gets a gradient
  k->weight.requires_grad_(true);
  auto unfused = emoe::fused_linear({q.get(), k.get(), v.get()}, x);
  EXPECT_FALSE(unfused[0].storage().is_alias_of(unfused[1].storage()));
  unfused[1].sum().backward();
  EXPECT_TRUE(k->weight.grad().defined());
}
