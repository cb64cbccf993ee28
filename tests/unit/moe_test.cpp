// MoE layer behaviour: gates, routing, capacity, balance losses, padding, usage, moe.json,
// MoEfication.
#include <cmath>
#include <fstream>
#include <limits>
#include <tuple>

#include "emoe/core/error.h"
#include "emoe/methods/model_folder.h"
#include "emoe/models/loader.h"
#include "emoe/moe/balance.h"
#include "emoe/moe/convert.h"
#include "emoe/moe/gates.h"
#include "emoe/moe/moefication.h"
#include "emoe/moe/routing.h"
#include "support/test_support.h"

namespace {

emoe::ModelPtr tiny_llama() {
  nlohmann::json j = {{"model_type", "llama"},
                      {"architectures", {"LlamaForCausalLM"}},
                      {"hidden_size", 16},
                      {"intermediate_size", 32},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 2},
                      {"num_key_value_heads", 1},
                      {"vocab_size", 50},
                      {"max_position_embeddings", 32}};
  torch::manual_seed(0);
  return emoe::create_model(emoe::JsonFields(j, "config.json"), emoe::Head::kCausalLM);
}

emoe::ModelPtr tiny_bert() {
  return emoe::test::tiny_bert_classifier();
}

}  // namespace

TEST(BalanceLosses, MatchHandComputedValues) {
  // importance = [0.5+0.25, 0.5+0.75] = [0.75, 1.25]: mean 1, unbiased var 0.125
  auto logits = torch::log(torch::tensor({{0.5, 0.5}, {0.25, 0.75}}, torch::kFloat));
  EXPECT_NEAR(emoe::cv_squared(torch::tensor({0.75f, 1.25f})).item<double>(), 0.125, 1e-6);
  auto top = torch::tensor({{0L}, {1L}});
  // switch: f = [0.5, 0.5], P = [0.375, 0.625] -> 2 * (0.1875 + 0.3125) = 1
  EXPECT_NEAR(emoe::switch_loss(logits.softmax(-1), top).item<double>(), 1.0, 1e-6);
  // z-loss: logsumexp of log-probabilities is 0 -> 0; of [0, 0] is ln 2
  EXPECT_NEAR(emoe::z_loss(logits).item<double>(), 0.0, 1e-6);
  EXPECT_NEAR(emoe::z_loss(torch::zeros({3, 2})).item<double>(), std::pow(std::log(2.0), 2), 1e-6);
  // importance+load with k = 1, clean = noisy: threshold = own max logit. Token 0: diff = [0, 0]
  // -> cdf 0.5, 0.5. Token 1: diffs ln(.25)-ln(.75) = -ln 3, 0 -> [Phi(-ln3/s), 0.5].
  double s = 0.5;
  auto top1 = torch::tensor({{0L}, {1L}});
  double phi = 0.5 * (1 + std::erf(-std::log(3.0) / (s * std::sqrt(2.0))));
  double l0 = 0.5 + 0.5 * 0 + 0.5, l1 = 0.5 + 0.5;
  l0 = 0.5 + phi;
  double mean = (l0 + l1) / 2, var = ((l0 - mean) * (l0 - mean) + (l1 - mean) * (l1 - mean));
  double want = 0.5 * (0.125 + var / (mean * mean + 1e-10));
  EXPECT_NEAR(emoe::importance_load_loss(logits, logits, top1, s, false).item<double>(), want,
              1e-5);
}

TEST(Routing, TopKMaskWeightsAndCapacity) {
  auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  cfg.experts = 4;
  cfg.topk = 2;
  auto logits = torch::tensor(
      {{4.f, 3.f, 0.f, 0.f}, {4.f, 0.f, 3.f, 0.f}, {4.f, 0.f, 0.f, 3.f}, {5.f, 0.f, 0.f, 1.f}});
  auto r = emoe::route_tokens(logits, cfg, false);
  EXPECT_TRUE(torch::equal(r.experts.select(1, 0), torch::tensor({0L, 0L, 0L, 0L})));
  EXPECT_TRUE(torch::equal(r.weights, torch::ones({4, 2})));
  EXPECT_TRUE(torch::equal(emoe::expert_counts(r, 4), torch::tensor({4L, 1L, 1L, 2L})));
  // capacity k * int(0.5 * ceil(4/4)) = 0 -> everything dropped; factor 2 -> cap 2*2 = 4 keeps all
  cfg.capacity_factor = 2.0;
  r = emoe::route_tokens(logits, cfg, false);
  EXPECT_EQ(emoe::expert_counts(r, 4).sum().item<int64_t>(), 8);
  // factor 1 -> capacity 2: expert 0 keeps its 2 most confident tokens (rows 3 and 0)
  cfg.capacity_factor = 1.0;
  r = emoe::route_tokens(logits, cfg, false);
  auto kept0 = (r.weights.select(1, 0) != 0);
  EXPECT_TRUE(torch::equal(kept0, torch::tensor({true, false, false, true})));
  // weighted: renormalised probabilities sum to one
  cfg.capacity_factor = 0;
  cfg.weighted = true;
  r = emoe::route_tokens(logits, cfg, false);
  EXPECT_TRUE(torch::allclose(r.weights.sum(1), torch::ones({4})));
}

TEST(Routing, TopKRowsIsTorchsTopKWithTiesToTheLowerIndex) {
  torch::manual_seed(3);
  // distinct values: torch::topk's answer is unique, and the partial sort must give its bits
  for (auto [n, e, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {2048, 64, 16}, {37, 8, 2}, {5, 32, 32}, {3, 7, 0}, {1, 1, 1}}) {
    auto x = torch::randn({n, e});
    auto [v, i] = emoe::top_k_rows(x, k);
    auto [tv, ti] = x.topk(k, -1);
    EXPECT_TRUE(torch::equal(v, tv)) << n << "x" << e << " k " << k;
    EXPECT_TRUE(torch::equal(i, ti)) << n << "x" << e << " k " << k;
  }
  // ties go to the lower index; NaN ranks first (as torch ranks it)
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto x = torch::tensor({{1.f, 3.f, 3.f, 2.f, 3.f}, {0.f, nan, 5.f, 5.f, -1.f}});
  auto [v, i] = emoe::top_k_rows(x, 3);
  EXPECT_TRUE(torch::equal(i, torch::tensor({{1L, 2L, 4L}, {1L, 2L, 3L}})));
  EXPECT_TRUE(std::isnan(v[1][0].item<float>()));
  EXPECT_EQ(v[0][2].item<float>(), 3.f);
  // other dtypes and strided rows go to torch::topk
  auto d = torch::randn({6, 9}, torch::kDouble);
  EXPECT_TRUE(torch::equal(std::get<1>(emoe::top_k_rows(d, 4)), std::get<1>(d.topk(4, -1))));
  auto t = torch::randn({9, 6}).t();
  EXPECT_TRUE(torch::equal(std::get<1>(emoe::top_k_rows(t, 4)), std::get<1>(t.topk(4, -1))));
}

TEST(EmoeLayer, AvgKGateFollowsTheKeysAfterAnOptimiserStep) {
  auto model = tiny_llama();
  auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  cfg.experts = 4;
  cfg.topk = 2;
  cfg.layers = {1};
  emoe::convert_to_moe(*model, cfg);
  auto* slot = model->ffn_slots()[1];
  auto x = torch::randn({5, 16});
  auto& gate = *emoe::moe_plugs(*model)[0]->gate();
  auto before = gate.logits(x, *slot).detach().clone();
  torch::optim::SGD opt(model->parameters(), 0.5);
  emoe::ModelInputs in;
  in.input_ids = torch::randint(0, 50, {2, 8}, torch::kLong);
  in.labels = in.input_ids;
  model->train();
  model->forward(in).loss.backward();
  opt.step();
  auto keys = slot->ffn_view().w_in.detach();
  auto expected = x.matmul(keys.view({4, 8, 16}).mean(1).t());
  auto after = gate.logits(x, *slot).detach();
  EXPECT_FALSE(torch::allclose(before, after));
  EXPECT_TRUE(torch::allclose(after, expected, 1e-6, 1e-6));
  EXPECT_TRUE(gate.parameters().empty());
}

TEST(EmoeLayer, PaddingIsCountedOnlyUnderTutelAndAuxLossIsProduced) {
  auto model = tiny_bert();
  auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  cfg.experts = 4;
  cfg.topk = 2;
  cfg.layers = {0, 1};
  cfg.enable_tutel_parity();
  emoe::convert_to_moe(*model, cfg);
  emoe::ModelInputs in;
  in.input_ids = torch::randint(1, 50, {2, 6}, torch::kLong);
  in.attention_mask = torch::tensor({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 0, 0, 0}});
  in.labels = torch::tensor({0L, 1L});
  model->train();
  auto out = model->forward(in);
  auto aux = emoe::collect_aux_loss(*model);
  ASSERT_TRUE(aux.defined());
  EXPECT_GT(aux.item<double>(), 0.0);
  (out.loss + aux).backward();
  for (auto* p : emoe::moe_plugs(*model)) {
    auto counts = p->take_usage(true);
    // tutel routes all 12 positions, padding too; k = 2 (capacity may drop)
    EXPECT_LE(counts.sum().item<int64_t>(), 12 * 2);
    EXPECT_GT(counts.sum().item<int64_t>(), 0);
    EXPECT_EQ(p->take_usage(true).sum().item<int64_t>(), 0) << "taking resets the counts";
  }
  model->eval();
  for (auto* p : emoe::moe_plugs(*model)) p->mutable_config().capacity_factor = 0;
  model->forward(in);
  for (auto* p : emoe::moe_plugs(*model)) EXPECT_EQ(p->take_usage(false).sum().item<int64_t>(), 24);
  // without tutel only the 9 real tokens are routed
  for (auto* p : emoe::moe_plugs(*model)) p->mutable_config().tutel = false;
  model->forward(in);
  for (auto* p : emoe::moe_plugs(*model)) EXPECT_EQ(p->take_usage(false).sum().item<int64_t>(), 18);
}

TEST(EmoeLayer, ConvertedFolderRoundTripsThroughMoeJson) {
  for (auto method :
       {emoe::MoeMethod::kEmoe, emoe::MoeMethod::kEmoeLearn, emoe::MoeMethod::kGmoe}) {
    SCOPED_TRACE(emoe::to_string(method));
    auto model = tiny_bert();
    auto cfg = emoe::MoeConfig::for_method(method);
    cfg.experts = 4;
    cfg.topk = 2;
    cfg.layers = {1};
    if (method == emoe::MoeMethod::kEmoeLearn) cfg.gate = emoe::GateKind::kCosine;
    auto state = emoe::convert_to_moe(*model, cfg);
    emoe::test::TempDir tmp;
    emoe::save_moe_model(*model, state, tmp.path());
    emoe::MoeState loaded;
    auto m2 = emoe::load_any_model(tmp.path(), {}, &loaded);
    EXPECT_EQ(loaded.config.method, method);
    EXPECT_EQ(loaded.splits.at(1).permutation, state.splits.at(1).permutation);
    model->eval();
    emoe::ModelInputs in;
    in.input_ids = torch::randint(1, 50, {2, 7}, torch::kLong);
    EXPECT_TRUE(torch::allclose(model->forward(in).logits, m2->forward(in).logits, 1e-6, 1e-6));
    EXPECT_EQ(emoe::count_parameters(*m2).total, emoe::count_parameters(*model).total);
  }
  // a corrupt moe.json is one clear error
  auto model = tiny_bert();
  auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  cfg.experts = 4;
  cfg.topk = 1;
  cfg.layers = {0};
  auto state = emoe::convert_to_moe(*model, cfg);
  state.splits[0].permutation[0] = state.splits[0].permutation[1];
  emoe::test::TempDir tmp;
  emoe::save_moe_model(*model, state, tmp.path());
  try {
    emoe::load_any_model(tmp.path());
    FAIL();
  } catch (const emoe::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("moe.json: layers.0.permutation is not a permutation"),
              std::string::npos)
        << e.what();
  }
}

TEST(EmoeLayer, ConfigErrorsAreClear) {
  auto model = tiny_bert();
  auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  cfg.experts = 5;
  cfg.topk = 2;
  cfg.layers = {0};
  try {
    emoe::convert_to_moe(*model, cfg);
    FAIL();
  } catch (const emoe::InputError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "d_ff 32 is not divisible by N = 5 experts; valid N: 1 2 4 8 16 32"),
              std::string::npos)
        << e.what();
  }
  cfg.experts = 4;
  cfg.topk = 5;
  EXPECT_THROW(emoe::convert_to_moe(*model, cfg), emoe::UsageError);
  cfg.topk = 2;
  cfg.layers = {7};
  EXPECT_THROW(emoe::convert_to_moe(*model, cfg), emoe::UsageError);
  EXPECT_EQ(emoe::default_moe_layers(32), (std::vector<int64_t>{28, 30}));
  EXPECT_EQ(emoe::default_moe_layers(12), (std::vector<int64_t>{8, 10}));
  EXPECT_EQ(emoe::parse_layer_list("1,3-4", 6), (std::vector<int64_t>{1, 3, 4}));
  EXPECT_THROW(emoe::parse_layer_list("x", 6), emoe::UsageError);
}

TEST(EmoeLearn, DefaultIsTheAuthorsCosineRouter) {
  // README of the authors: --gate_type cosine_top --num_experts 64 --top_k 16, random init
  const auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoeLearn);
  EXPECT_EQ(cfg.gate, emoe::GateKind::kCosine);
  EXPECT_EQ(cfg.gate_init, "random");
  EXPECT_EQ(cfg.experts, 64);
  EXPECT_EQ(cfg.topk, 16);
  EXPECT_EQ(cfg.cosine_dim, 256);
  EXPECT_TRUE(cfg.weighted);
  const auto init = emoe::MoeConfig::for_method_name("emoe-learn-init");
  EXPECT_EQ(init.method, emoe::MoeMethod::kEmoeLearn);
  EXPECT_EQ(init.gate, emoe::GateKind::kLinear);
  EXPECT_EQ(init.gate_init, "avgk");
  EXPECT_EQ(emoe::MoeConfig::for_method_name("gmoe").gate, emoe::GateKind::kCosine);
  EXPECT_THROW(emoe::MoeConfig::for_method_name("emoe-learn-x"), emoe::UsageError);
}

TEST(EmoeLearn, CosineRouterRoutesAsComputedByHand) {
  // d = 2, E = 3, projection to 2 dims = identity (bias 0); expert embeddings (columns)
  // (1, 0), (0, 2) and (-1, -1): cosine drops their lengths. Temperature ln 2 -> scale 2.
  emoe::CosineGateImpl gate(2, 3, 2);
  EXPECT_NEAR(gate.temperature.item<double>(), std::log(2.0), 1e-7);  // t0 = ln(1 / 0.5)
  EXPECT_EQ(gate.sim_matrix.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_LT(gate.sim_matrix.abs().max().item<double>(), 0.1);  // N(0, 0.01) at the start
  {
    torch::NoGradGuard g;
    gate.cosine_projector->weight.copy_(torch::eye(2));
    gate.cosine_projector->bias.zero_();
    gate.sim_matrix.copy_(torch::tensor({{1.f, 0.f, -1.f}, {0.f, 2.f, -1.f}}));
  }
  auto model = tiny_bert();  // the slot is not read by a learned gate
  auto& slot = *model->ffn_slots()[0];
  // x = (3, 4) -> (0.6, 0.8): cosines 0.6, 0.8, -1.4/sqrt(2); times 2
  auto x = torch::tensor({{3.f, 4.f}, {-30.f, -40.f}});
  auto logits = gate.logits(x, slot).detach();
  const double c2 = -1.4 / std::sqrt(2.0);
  auto want = torch::tensor({{1.2, 1.6, 2 * c2}, {-1.2, -1.6, -2 * c2}}, torch::kFloat);
  EXPECT_TRUE(torch::allclose(logits, want, 1e-5, 1e-5)) << logits;
  // top-2 with renormalised probabilities: token 0 picks experts 1 then 0, weights
  // sigmoid(+-0.4); token 1 (the opposite direction) picks 2 then 0, weights sigmoid(2.6 +- ...)
  auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoeLearn);
  cfg.experts = 3;
  cfg.topk = 2;
  auto r = emoe::route_tokens(logits, cfg, false);
  EXPECT_TRUE(torch::equal(r.experts, torch::tensor({{1L, 0L}, {2L, 0L}})));
  const double w0 = 1 / (1 + std::exp(-0.4)), w1 = 1 / (1 + std::exp(-(-2 * c2 + 1.2)));
  EXPECT_TRUE(torch::allclose(r.weights, torch::tensor({{w0, 1 - w0}, {w1, 1 - w1}}, torch::kFloat),
                              1e-5, 1e-5))
      << r.weights;
  // the learned temperature is capped at ln 100: scale 100, not e^10
  {
    torch::NoGradGuard g;
    gate.temperature.fill_(10.0);
  }
  EXPECT_NEAR(gate.logits(x, slot)[0][0].item<double>(), 60.0, 1e-3);
}

TEST(EmoeLearn, InitVariantStartsWithEmoesRouting) {
  // emoe-learn-init's linear gate starts at the experts' mean keys: the same logits, so the same
  // experts, as EMoE's avg-k gate on the same split; only the combine weights differ
  auto emoe_model = tiny_llama();
  auto init_model = tiny_llama();  // the same seed: the same weights
  auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  auto icfg = emoe::MoeConfig::for_method_name("emoe-learn-init");
  for (auto* c : {&cfg, &icfg}) {
    c->experts = 4;
    c->topk = 2;
    c->layers = {1};
    c->kmeans.restarts = 1;
  }
  emoe::convert_to_moe(*emoe_model, cfg);
  emoe::convert_to_moe(*init_model, icfg);
  auto x = torch::randn({9, 16});
  auto* es = emoe_model->ffn_slots()[1];
  auto* is = init_model->ffn_slots()[1];
  auto& egate = *emoe::moe_plugs(*emoe_model)[0]->gate();
  auto& igate = *emoe::moe_plugs(*init_model)[0]->gate();
  EXPECT_TRUE(egate.parameters().empty());
  ASSERT_EQ(igate.parameters().size(), 1u);  // E x d, no bias
  auto le = egate.logits(x, *es).detach(), li = igate.logits(x, *is).detach();
  EXPECT_TRUE(torch::allclose(le, li, 1e-6, 1e-6));
  auto re = emoe::route_tokens(le, cfg, false);
  auto ri = emoe::route_tokens(li, icfg, false);
  EXPECT_TRUE(torch::equal(std::get<0>(re.experts.sort(1)), std::get<0>(ri.experts.sort(1))));
}

namespace {

emoe::ModelPtr moe_tiny_t5(int64_t layers) {
  nlohmann::json j = {{"model_type", "t5"},
                      {"vocab_size", 50},
                      {"d_model", 16},
                      {"d_kv", 8},
                      {"d_ff", 32},
                      {"num_layers", layers},
                      {"num_decoder_layers", layers},
                      {"num_heads", 2},
                      {"feed_forward_proj", "gated-gelu"}};
  torch::manual_seed(0);
  return emoe::create_model(emoe::JsonFields(j, "t5/config.json"), emoe::Head::kSeq2SeqLM);
}

}  // namespace

TEST(MoeLayers, T5DefaultConvertsLayersOfTheEncoderAndTheDecoder) {
  auto model = moe_tiny_t5(6);
  ASSERT_EQ(model->summary().ffn_layers(), 12);
  auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  cfg.experts = 4;
  cfg.topk = 2;
  cfg.kmeans.restarts = 1;
  auto state = emoe::convert_to_moe(*model, cfg);  // no layers given: the default
  // every other among the last four of each stack: encoder 2, 4 and decoder 2, 4 (= 8, 10)
  EXPECT_EQ(state.config.layers, (std::vector<int64_t>{2, 4, 8, 10}));
  int64_t encoder = 0, decoder = 0;
  for (const auto& [l, split] : state.splits) (l < 6 ? encoder : decoder) += 1;
  EXPECT_EQ(encoder, 2);
  EXPECT_EQ(decoder, 2);
  for (int64_t l : {2, 4, 8, 10}) EXPECT_TRUE(model->ffn_slots()[l]->plug()) << l;
  EXPECT_EQ(emoe::default_moe_layers(6, 6), (std::vector<int64_t>{2, 4, 8, 10}));
  EXPECT_EQ(emoe::default_moe_layers(12, 0), (std::vector<int64_t>{8, 10}));

  // layers named per stack, in a config and on convert's command line
  auto named = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  named.encoder_layers = {5};
  named.decoder_layers = {0, 5};
  emoe::resolve_moe_layers(named, 6, 6);
  EXPECT_EQ(named.layers, (std::vector<int64_t>{5, 6, 11}));
  EXPECT_EQ(emoe::parse_layer_list("encoder.5,decoder.0,decoder.5", 12, 6),
            (std::vector<int64_t>{5, 6, 11}));
  EXPECT_EQ(emoe::parse_layer_list("", 12, 6), (std::vector<int64_t>{2, 4, 8, 10}));
  EXPECT_EQ(emoe::parse_layer_list("7", 12, 6), (std::vector<int64_t>{7}));  // = decoder.1
  EXPECT_THROW(emoe::parse_layer_list("decoder.6", 12, 6), emoe::UsageError);
  EXPECT_THROW(emoe::parse_layer_list("encoder.1", 12), emoe::UsageError);  // one stack
  EXPECT_THROW(emoe::parse_layer_list("encoder.x", 12, 6), emoe::UsageError);
  auto bad = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  bad.decoder_layers = {6};
  try {
    emoe::resolve_moe_layers(bad, 6, 6);
    FAIL();
  } catch (const emoe::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("decoder.6 does not exist (the decoder has layers 0..5)"),
              std::string::npos)
        << e.what();
  }
  bad.decoder_layers = {1};
  EXPECT_THROW(emoe::resolve_moe_layers(bad, 12, 0), emoe::UsageError);  // a decoder-only model
}

TEST(Moefication, RouterLearnsExpertScoresAndDispatchMatchesMasked) {
  auto model = tiny_llama();
  std::vector<emoe::ModelInputs> sample;
  for (int i = 0; i < 4; ++i) {
    emoe::ModelInputs in;
    in.input_ids = torch::randint(0, 50, {4, 16}, torch::kLong);
    sample.push_back(in);
  }
  auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kMoefication);
  cfg.experts = 4;
  cfg.topk = 2;
  cfg.layers = {0, 1};
  auto acts = emoe::collect_ffn_activations(*model, {0}, sample, 1000);
  EXPECT_EQ(acts.inputs[0].size(0), 4 * 4 * 16);
  auto state = emoe::convert_to_moe(*model, cfg, sample);
  auto plugs = emoe::moe_plugs(*model);
  ASSERT_EQ(plugs.size(), 2u);
  // router quality: its top-1 matches the true top expert more often than chance (1/4)
  auto* slot = model->ffn_slots()[0];
  auto x = acts.inputs[0];
  auto share = emoe::moefication_expert_scores(x, slot->ffn_view().w_in.detach(), 4);
  auto pred = plugs[0]->gate()->logits(x, *slot).argmax(1);
  double agree = (pred == share.argmax(1)).to(torch::kFloat).mean().item<double>();
  EXPECT_GT(agree, 0.4);
  emoe::ModelInputs in;
  in.input_ids = torch::randint(0, 50, {2, 9}, torch::kLong);
  torch::NoGradGuard g;
  auto a = model->forward(in).logits;
  for (auto* p : plugs) p->mutable_config().execution = emoe::Execution::kMasked;
  auto b = model->forward(in).logits;
  EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-5));
}

// MoEfication's router as thunlp/MoEfication's MLPCenter: input L2-normalised, Linear(d, E) started
// at the mean of each expert's normalised keys, tanh, Linear(E, E) = identity, no biases; trained
// on relu(x̂ k_i) summed per expert, and the epoch best on the held-out 10 % kept.
TEST(Moefication, RouterIsTheReferencesAndKeepsTheBestHeldOutEpoch) {
  auto model = tiny_llama();
  auto* slot = model->ffn_slots()[0];
  auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kMoefication);
  cfg.experts = 4;
  cfg.topk = 2;
  auto plug = std::make_shared<emoe::ExpertFfnImpl>(cfg, *slot);
  auto& ffn = *plug;
  auto* gate = dynamic_cast<emoe::MlpGateImpl*>(ffn.gate().get());
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->parameters().size(), 2u);  // two weights, no biases
  auto keys = slot->ffn_view().w_in.detach();
  auto nk = keys / keys.norm(2, 1, true);
  const int64_t s = keys.size(0) / 4;
  for (int64_t e = 0; e < 4; ++e)
    EXPECT_LE(emoe::test::max_abs_diff(gate->in_proj->weight[e], nk.narrow(0, e * s, s).mean(0)),
              1e-6);
  EXPECT_TRUE(torch::equal(gate->out_proj->weight, torch::eye(4)));
  auto x = torch::randn({64, keys.size(1)});
  // the input is normalised: the logits do not depend on its length
  EXPECT_LE(emoe::test::max_abs_diff(gate->logits(x, *slot), gate->logits(x * 7.5, *slot)), 1e-5);
  // the scores by hand: relu(x̂ k_i) summed over each expert's neurons, no bias
  auto scores = emoe::moefication_expert_scores(x, keys, 4);
  auto acts = torch::relu((x / x.norm(2, 1, true)).matmul(keys.t()));
  for (int64_t e = 0; e < 4; ++e)
    EXPECT_LE(emoe::test::max_abs_diff(scores.select(1, e), acts.narrow(1, e * s, s).sum(1)), 1e-5);
  // training: 10 % held out, the kept router is the best epoch's (its held-out coverage is the
  // one reported, and at least the untrained router's)
  auto inputs = torch::randn({200, keys.size(1)});
  emoe::RouterTrainOptions o;
  o.epochs = 5;
  o.batch = 64;
  auto r = emoe::train_moefication_router(ffn, *slot, inputs, o);
  EXPECT_EQ(r.held_out, 20);
  EXPECT_GE(r.best_epoch, 1);
  EXPECT_LE(r.best_epoch, 5);
  auto held = inputs.narrow(0, 180, 20);
  auto hs = emoe::moefication_expert_scores(held, keys, 4);
  torch::NoGradGuard g;
  auto top = std::get<1>(gate->logits(held, *slot).topk(1, 1));
  auto any = hs.sum(1) > 0;
  const double cov = (hs.gather(1, top).sum(1).masked_select(any) / hs.sum(1).masked_select(any))
                         .mean()
                         .item<double>();
  EXPECT_NEAR(cov, r.coverage, 1e-5);
  EXPECT_GT(r.coverage, 0.25);  // better than a random expert of 4
}
