// Golden tests: tiny T5 v1.0 (relu, tied) and v1.1 (gated-gelu, untied) against Hugging Face
// transformers' outputs; strict loading, the FFN slots, incremental decoding and generation.
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "emoe/core/error.h"
#include "emoe/io/safetensors.h"
#include "emoe/models/generate.h"
#include "emoe/models/loader.h"
#include "emoe/models/t5.h"
#include "emoe/moe/convert.h"
#include "emoe/peft/peft.h"
#include "support/test_support.h"

using emoe::test::max_abs_diff;
using emoe::test::max_abs_diff_masked;

namespace {

namespace fs = std::filesystem;

nlohmann::json t5_fixture_json(const std::string& dir) {
  std::ifstream in(dir + "/fixture.json");
  return nlohmann::json::parse(in);
}

emoe::ModelInputs t5_fixture_inputs(std::map<std::string, torch::Tensor>& fx) {
  emoe::ModelInputs in;
  in.input_ids = fx["input_ids"];
  in.attention_mask = fx["attention_mask"];
  in.labels = fx["labels"];
  in.output_hidden_states = true;
  in.output_attentions = true;
  return in;
}

// Every tensor of fixture.safetensors, from one forward with labels only (decoder_input_ids
// made by shifting them right) and one with the fixture's decoder_input_ids.
void check_t5_fixture(const std::string& dir) {
  auto fx = emoe::test::load_fixture(dir + "/fixture.safetensors");
  auto model = emoe::test::load_test_model(dir);
  ASSERT_EQ(model->summary().head, emoe::Head::kSeq2SeqLM);
  const auto& s = model->summary();
  EXPECT_EQ(s.model_type, "t5");
  EXPECT_EQ(s.num_layers, 2);
  EXPECT_EQ(s.num_decoder_layers, 2);
  EXPECT_EQ(s.decoder_start_token_id, 0);

  torch::NoGradGuard g;
  auto in = t5_fixture_inputs(fx);
  EXPECT_TRUE(torch::equal(emoe::t5_shift_right(fx["labels"], 0, 0), fx["decoder_input_ids"]));
  auto out = model->forward(in);
  std::string report;
  auto expect_close = [&](const torch::Tensor& got, const torch::Tensor& want,
                          const std::string& what) {
    ASSERT_TRUE(got.defined()) << what;
    ASSERT_EQ(got.sizes(), want.sizes()) << what;
    double d = max_abs_diff(got, want);
    report += fmt::format(" {} {:.2e}", what, d);
    EXPECT_LT(d, emoe::test::kGoldenTol) << what;
  };
  expect_close(out.logits, fx["logits"], "logits");
  expect_close(out.loss, fx["loss"], "loss");
  expect_close(out.encoder_last_hidden_state, fx["encoder_last_hidden_state"],
               "encoder_last_hidden_state");
  expect_close(torch::stack(out.encoder_hidden_states), fx["encoder_hidden_states"],
               "encoder_hidden_states");
  expect_close(torch::stack(out.hidden_states), fx["decoder_hidden_states"],
               "decoder_hidden_states");
  expect_close(torch::stack(out.encoder_attentions), fx["encoder_attentions"],
               "encoder_attentions");
  expect_close(torch::stack(out.attentions), fx["decoder_attentions"], "decoder_attentions");
  expect_close(torch::stack(out.cross_attentions), fx["cross_attentions"], "cross_attentions");
  // the last decoder hidden state is after the final norm (and before any lm_head rescaling)
  expect_close(out.last_hidden_state, fx["decoder_hidden_states"][2], "last_hidden_state");
  std::cout << "[ info ] max |diff| against " << dir << ":" << report << "\n";

  // explicit decoder ids give the same logits
  in.decoder_input_ids = fx["decoder_input_ids"];
  auto out2 = model->forward(in);
  EXPECT_TRUE(torch::equal(out2.logits, out.logits));
  // every tensor described in fixture.json was checked (gen.output_ids below)
  std::set<std::string> described;
  const auto meta = t5_fixture_json(dir);
  for (auto& [k, v] : meta["tensors"].items()) described.insert(k);
  std::set<std::string> stored;
  for (auto& [k, v] : fx) stored.insert(k);
  EXPECT_EQ(described, stored);

  // greedy generation: starts with decoder_start_token_id, pads finished rows
  emoe::GenerateOptions go;
  go.eos_ids = {1};
  go.pad_id = 0;
  go.max_new_tokens = fx["gen.output_ids"].size(1) - 1;
  auto ids = emoe::generate_seq2seq(*model, fx["input_ids"], fx["attention_mask"], go);
  EXPECT_TRUE(torch::equal(ids, fx["gen.output_ids"])) << ids << fx["gen.output_ids"];
  go.use_cache = false;
  auto nocache = emoe::generate_seq2seq(*model, fx["input_ids"], fx["attention_mask"], go);
  EXPECT_TRUE(torch::equal(nocache, fx["gen.output_ids"])) << nocache;
}

}  // namespace

TEST(T5Golden, V10ReluTiedLogitsHiddenStatesAttentionsLossGeneration) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/t5_cg");
  check_t5_fixture(dir);
}

TEST(T5Golden, V11GatedGeluUntiedLogitsHiddenStatesAttentionsLossGeneration) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/t5_v11_cg");
  check_t5_fixture(dir);
}

TEST(T5Golden, IncrementalDecodingMatchesFullForward) {
  for (std::string rel : {"fixtures/tiny/t5_cg", "fixtures/tiny/t5_v11_cg"}) {
    SCOPED_TRACE(rel);
    EMOE_REQUIRE_SHARED(dir, rel);
    auto fx = emoe::test::load_fixture(dir + "/fixture.safetensors");
    auto model = emoe::test::load_test_model(dir);
    torch::NoGradGuard g;
    emoe::ModelInputs in;
    in.input_ids = fx["input_ids"];
    in.attention_mask = fx["attention_mask"];
    in.decoder_input_ids = fx["decoder_input_ids"];
    auto full = model->forward(in).logits;
    emoe::KvCache cache;
    torch::Tensor enc;
    std::vector<torch::Tensor> steps;
    const int64_t t = in.decoder_input_ids.size(1);
    for (int64_t i = 0; i < t; ++i) {
      emoe::ModelInputs step;
      step.input_ids = in.input_ids;
      step.attention_mask = in.attention_mask;
      step.encoder_last_hidden_state = enc;
      step.decoder_input_ids = in.decoder_input_ids.narrow(1, i, 1);
      step.cache = &cache;
      auto r = model->forward(step);
      if (!enc.defined()) enc = r.encoder_last_hidden_state;
      steps.push_back(r.logits);
    }
    EXPECT_EQ(cache.length(), t);
    EXPECT_LT(max_abs_diff(torch::cat(steps, 1), full), 1e-5);
    EXPECT_LT(max_abs_diff(full, fx["logits"]), emoe::test::kGoldenTol);
  }
}

TEST(T5Golden, RelativePositionBucketsMatchHuggingFace) {
  // Hugging Face's _relative_position_bucket (32 buckets, max distance 128), away from the
  // exact log-bucket boundaries where float32 rounding decides
  std::vector<int64_t> rel = {0,   1,  -1,  7,  -7,  9,   -9,   12,  -12,  20,   -20,  31,
                              -31, 45, -45, 90, -90, 127, -127, 200, -200, 1000, -1000};
  std::vector<int64_t> bidir = {0,  17, 1,  23, 7,  24, 8,  25, 9,  26, 10, 27,
                                11, 28, 12, 30, 14, 31, 15, 31, 15, 31, 15};
  std::vector<int64_t> causal = {0,  0, 1,  0, 7,  0, 9,  0, 12, 0, 17, 0,
                                 21, 0, 23, 0, 29, 0, 31, 0, 31, 0, 31};
  auto r = torch::tensor(rel, torch::kLong);
  auto b = emoe::t5_relative_position_bucket(r, true, 32, 128);
  auto c = emoe::t5_relative_position_bucket(r, false, 32, 128);
  EXPECT_TRUE(torch::equal(b, torch::tensor(bidir, torch::kLong))) << b;
  EXPECT_TRUE(torch::equal(c, torch::tensor(causal, torch::kLong))) << c;
}

TEST(T5Loading, ParameterNamesAreTheCheckpointKeysAndRoundTrip) {
  for (std::string rel : {"fixtures/tiny/t5_cg", "fixtures/tiny/t5_v11_cg"}) {
    SCOPED_TRACE(rel);
    EMOE_REQUIRE_SHARED(dir, rel);
    auto model = emoe::load_model(dir);
    std::set<std::string> params, file, saved_keys;
    for (const auto& p : model->named_parameters()) params.insert(model->file_key(p.key()));
    auto w = emoe::load_safetensors(dir + "/model.safetensors");
    for (const auto& [k, t] : w) file.insert(k);
    const auto meta = t5_fixture_json(dir);
    for (const auto& k : meta["saved_weight_keys"]) saved_keys.insert(k.get<std::string>());
    EXPECT_EQ(params, file);
    EXPECT_EQ(params, saved_keys);
    const bool tied = rel == "fixtures/tiny/t5_cg";
    EXPECT_EQ(params.count("lm_head.weight"), tied ? 0u : 1u);
    EXPECT_EQ(model->input_embeddings().data_ptr(),
              model->named_parameters()["shared.weight"].data_ptr());
    EXPECT_TRUE(model->is_head_key("lm_head.weight"));
    EXPECT_FALSE(model->is_head_key("shared.weight"));

    // save, reload: the same keys, the same tensors
    emoe::test::TempDir tmp;
    emoe::save_model(*model, tmp.path());
    auto again = emoe::load_safetensors(tmp.file("model.safetensors"));
    ASSERT_EQ(again.size(), w.size());
    for (const auto& [k, t] : w) EXPECT_TRUE(torch::equal(again.at(k), t)) << k;
    auto reloaded = emoe::load_model(tmp.path());
    EXPECT_EQ(reloaded->summary().head, emoe::Head::kSeq2SeqLM);

    // old checkpoints also store tied copies (encoder/decoder.embed_tokens, lm_head): ignored
    emoe::test::TempDir old;
    fs::copy_file(dir + "/config.json", old.file("config.json"));
    auto wo = w;
    wo["encoder.embed_tokens.weight"] = w["shared.weight"];
    wo["decoder.embed_tokens.weight"] = w["shared.weight"];
    if (tied) wo["lm_head.weight"] = w["shared.weight"];
    emoe::save_safetensors(
        old.file("model.safetensors"),
        std::vector<std::pair<std::string, torch::Tensor>>(wo.begin(), wo.end()));
    EXPECT_NO_THROW(emoe::load_model(old.path()));
  }
}

TEST(T5Loading, OneErrorNamesMissingUnexpectedAndWrongShapedKeys) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/t5_v11_cg");
  emoe::test::TempDir tmp;
  fs::copy_file(dir + "/config.json", tmp.file("config.json"));
  auto w = emoe::load_safetensors(dir + "/model.safetensors");
  w.erase("decoder.block.1.layer.2.DenseReluDense.wi_1.weight");
  w["encoder.block.0.layer.1.DenseReluDense.wi_0.weight"] =
      w["encoder.block.0.layer.1.DenseReluDense.wi_0.weight"].t().contiguous();
  w["encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"] = torch::zeros({32, 4});
  emoe::save_safetensors(tmp.file("model.safetensors"),
                         std::vector<std::pair<std::string, torch::Tensor>>(w.begin(), w.end()));
  std::string msg;
  try {
    emoe::load_model(tmp.path());
  } catch (const emoe::InputError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("1 missing: decoder.block.1.layer.2.DenseReluDense.wi_1.weight"),
            std::string::npos)
      << msg;
  EXPECT_NE(
      msg.find(
          "1 unexpected: encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"),
      std::string::npos)
      << msg;
  EXPECT_NE(
      msg.find(
          "encoder.block.0.layer.1.DenseReluDense.wi_0.weight: expected [64, 32], got [32, 64]"),
      std::string::npos)
      << msg;
  EXPECT_NE(msg.find("t5 seq2seq-lm"), std::string::npos) << msg;
}

TEST(T5Config, InvariantsAndHeads) {
  auto base =
      nlohmann::json{{"model_type", "t5"}, {"vocab_size", 100}, {"d_model", 16}, {"d_kv", 4},
                     {"d_ff", 32},         {"num_layers", 2},   {"num_heads", 2}};
  auto error_of = [](const nlohmann::json& j) -> std::string {
    try {
      emoe::T5Config::from_json(emoe::JsonFields(j, "config.json"));
    } catch (const emoe::InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error_of(base), "");
  auto c = emoe::T5Config::from_json(emoe::JsonFields(base, "config.json"));
  EXPECT_EQ(c.num_decoder_layers, 2);  // defaults to num_layers
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.act, emoe::Activation::kRelu);
  auto with = [&](const char* k, nlohmann::json v) {
    auto j = base;
    j[k] = v;
    return j;
  };
  auto v11 =
      emoe::T5Config::from_json(emoe::JsonFields(with("feed_forward_proj", "gated-gelu"), "c"));
  EXPECT_TRUE(v11.gated);
  EXPECT_EQ(v11.act, emoe::Activation::kGeluTanh);  // gelu_new, as Hugging Face maps it
  EXPECT_EQ(emoe::T5Config::from_json(emoe::JsonFields(with("feed_forward_proj", "gelu"), "c")).act,
            emoe::Activation::kGeluErf);
  EXPECT_NE(error_of(with("feed_forward_proj", "gated-")).find("feed_forward_proj"),
            std::string::npos);
  EXPECT_NE(
      error_of(with("feed_forward_proj", "double-gated-gelu")).find("expected ACT or gated-ACT"),
      std::string::npos);
  EXPECT_NE(error_of(with("feed_forward_proj", "tanh")).find("feed_forward_proj"),
            std::string::npos);
  EXPECT_NE(error_of(with("d_kv", 0)).find("field 'd_kv': expected a positive integer, got 0"),
            std::string::npos);
  EXPECT_NE(error_of(with("relative_attention_num_buckets", 2)).find("at least 4"),
            std::string::npos);
  EXPECT_NE(error_of(with("relative_attention_max_distance", 16))
                .find("relative_attention_max_distance 16 must exceed "
                      "relative_attention_num_buckets / 2 = 16"),
            std::string::npos);
  EXPECT_NE(error_of(with("eos_token_id", 100))
                .find("eos_token_id 100 is outside the vocabulary of 100 tokens"),
            std::string::npos);
  EXPECT_NE(error_of(with("dropout_rate", 1.0)).find("dropout_rate"), std::string::npos);

  // heads from architectures
  auto head_of = [](nlohmann::json j) {
    return emoe::default_head(emoe::JsonFields(j, "config.json"));
  };
  EXPECT_EQ(head_of(with("architectures", {"T5ForConditionalGeneration"})), emoe::Head::kSeq2SeqLM);
  EXPECT_EQ(head_of(with("architectures", {"T5WithLMHeadModel"})), emoe::Head::kSeq2SeqLM);
  EXPECT_EQ(head_of(with("architectures", {"T5Model"})), emoe::Head::kBase);
  EXPECT_THROW(head_of(with("architectures", {"T5EncoderModel"})), emoe::InputError);
  EXPECT_THROW(emoe::create_model(emoe::JsonFields(base, "c"), emoe::Head::kCausalLM),
               emoe::UsageError);
  EXPECT_EQ(emoe::parse_head("s2s"), emoe::Head::kSeq2SeqLM);
  EXPECT_EQ(emoe::parse_head(emoe::head_name(emoe::Head::kSeq2SeqLM)), emoe::Head::kSeq2SeqLM);
}

TEST(T5Model, ShapesOfAnUnevenModelAndTrainingMode) {
  // 3 encoder and 1 decoder blocks, inner dim 3 * 8 != d_model, untied, gated-silu
  auto j = nlohmann::json{{"model_type", "t5"},
                          {"architectures", {"T5ForConditionalGeneration"}},
                          {"vocab_size", 50},
                          {"d_model", 16},
                          {"d_kv", 8},
                          {"d_ff", 24},
                          {"num_layers", 3},
                          {"num_decoder_layers", 1},
                          {"num_heads", 3},
                          {"feed_forward_proj", "gated-silu"},
                          {"tie_word_embeddings", false}};
  torch::manual_seed(0);
  auto model = emoe::create_model(emoe::JsonFields(j, "config.json"), emoe::Head::kSeq2SeqLM);
  const auto& s = model->summary();
  EXPECT_EQ(s.ffn_layers(), 4);
  auto slots = model->ffn_slots();
  ASSERT_EQ(slots.size(), 4u);
  for (size_t i = 0; i < slots.size(); ++i) {
    EXPECT_EQ(slots[i]->layer_index(), static_cast<int64_t>(i));
    auto v = slots[i]->ffn_view();
    EXPECT_TRUE(v.gated());
    EXPECT_EQ(v.d_ff(), 24);
    EXPECT_EQ(v.d_model(), 16);
    EXPECT_EQ(v.act, emoe::Activation::kSilu);
  }
  EXPECT_EQ(slots[1]->ffn_prefix(), "encoder.block.1.layer.1.DenseReluDense");
  EXPECT_EQ(slots[3]->ffn_prefix(), "decoder.block.0.layer.2.DenseReluDense");
  auto params = model->named_parameters();
  EXPECT_TRUE(params.contains("decoder.block.0.layer.1.EncDecAttention.q.weight"));
  EXPECT_EQ(params["encoder.block.0.layer.0.SelfAttention.q.weight"].sizes(),
            (at::IntArrayRef{24, 16}));
  EXPECT_FALSE(
      params.contains("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"));
  EXPECT_TRUE(params.contains("decoder.block.0.layer.2.DenseReluDense.wi_1.weight"));

  emoe::ModelInputs in;
  in.input_ids = torch::randint(2, 50, {2, 7}, torch::kLong);
  in.attention_mask = torch::ones({2, 7}, torch::kLong);
  in.attention_mask[1].narrow(0, 4, 3).zero_();
  in.labels = torch::randint(2, 50, {2, 5}, torch::kLong);
  in.labels[1][4] = -100;
  auto eval_out = model->forward(in);
  EXPECT_EQ(eval_out.logits.sizes(), (at::IntArrayRef{2, 5, 50}));
  EXPECT_EQ(eval_out.encoder_last_hidden_state.sizes(), (at::IntArrayRef{2, 7, 16}));
  // training: dropout acts, and every parameter gets a gradient
  model->train();
  auto train_out = model->forward(in);
  EXPECT_GT(max_abs_diff(train_out.logits, eval_out.logits), 1e-4);
  train_out.loss.backward();
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0) << p.key();
  }
  // no decoder input at all is a clear error
  model->eval();
  emoe::ModelInputs bare;
  bare.input_ids = in.input_ids;
  EXPECT_THROW(model->forward(bare), emoe::InputError);
}

TEST(T5Model, EmoeWithKEqualsNOnEncoderAndDecoderReproducesDense) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/t5_v11_cg");
  emoe::LoadOptions o;
  o.dtype = torch::kDouble;
  auto model = emoe::test::load_test_model(dir, o);
  auto fx = emoe::test::load_fixture(dir + "/fixture.safetensors");
  emoe::ModelInputs in;
  in.input_ids = fx["input_ids"];
  in.attention_mask = fx["attention_mask"];
  in.decoder_input_ids = fx["decoder_input_ids"];
  torch::NoGradGuard g;
  auto dense = model->forward(in).logits;
  auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  cfg.experts = 4;
  cfg.topk = 4;
  cfg.layers = {0, 1, 2, 3};  // both encoder blocks, both decoder blocks
  cfg.kmeans.restarts = 2;
  auto before = emoe::count_parameters(*model).total;
  auto state = emoe::convert_to_moe(*model, cfg);
  EXPECT_EQ(emoe::moe_plugs(*model).size(), 4u);
  EXPECT_EQ(emoe::count_parameters(*model).total, before);
  EXPECT_LT(max_abs_diff(model->forward(in).logits, dense), 1e-6);
  // recomposition restores the dense weights
  emoe::recompose_dense(*model, state);
  EXPECT_LT(max_abs_diff(model->forward(in).logits, dense), 1e-9);
}

namespace {

// Hugging Face's beam score of one generated row: the sum of the token log-probabilities
// (through the eos that ends it, when one does) over the length of the hypothesis, which
// counts the start token and not the eos.
double t5_beam_score(emoe::PretrainedModelImpl& model, const torch::Tensor& input_ids,
                     const torch::Tensor& seq, int64_t eos) {
  emoe::ModelInputs in;
  in.input_ids = input_ids.unsqueeze(0);
  in.decoder_input_ids = seq.narrow(0, 0, seq.size(0) - 1).unsqueeze(0);
  auto logp = torch::log_softmax(model.forward(in).logits[0], -1);
  double sum = 0;
  for (int64_t i = 1; i < seq.size(0); ++i) {
    const int64_t t = seq[i].item<int64_t>();
    sum += logp[i - 1][t].item<double>();
    if (t == eos) return sum / static_cast<double>(i);
  }
  return sum / static_cast<double>(seq.size(0));
}

}  // namespace

// No Hugging Face reference output for beam search is stored: these are its invariants. The
// second eos (a token the model favours) makes hypotheses finish early.
TEST(T5Generate, BeamSearchIsConsistentAndScoresAtLeastAsWellAsGreedy) {
  for (auto [rel, frequent] : {std::pair<std::string, int64_t>{"fixtures/tiny/t5_cg", 51},
                               {"fixtures/tiny/t5_v11_cg", 11}}) {
    EMOE_REQUIRE_SHARED(dir, rel);
    auto fx = emoe::test::load_fixture(dir + "/fixture.safetensors");
    auto model = emoe::test::load_test_model(dir);
    torch::NoGradGuard g;
    auto ids = fx["input_ids"], mask = fx["attention_mask"];
    for (int64_t eos : {int64_t{1}, frequent}) {
      SCOPED_TRACE(rel + " eos " + std::to_string(eos));
      emoe::GenerateOptions go;
      go.eos_ids = {eos};
      go.pad_id = 0;
      go.max_new_tokens = 8;
      auto greedy = emoe::generate_seq2seq(*model, ids, mask, go);
      go.num_beams = 4;
      auto beam = emoe::generate_seq2seq(*model, ids, mask, go);
      ASSERT_EQ(beam.size(0), 2);
      EXPECT_LE(beam.size(1), 9);
      EXPECT_TRUE(torch::equal(beam.select(1, 0), torch::zeros({2}, ids.options())));
      go.use_cache = false;
      EXPECT_TRUE(torch::equal(emoe::generate_seq2seq(*model, ids, mask, go), beam));
      go.use_cache = true;
      for (int64_t r = 0; r < 2; ++r) {
        const int64_t len = mask[r].sum().item<int64_t>();
        auto row_ids = ids[r].narrow(0, 0, len);
        auto one = emoe::generate_seq2seq(*model, row_ids.unsqueeze(0), {}, go)[0];
        // a row's result does not depend on the batch, which pads shorter rows
        ASSERT_LE(one.size(0), beam.size(1));
        EXPECT_TRUE(torch::equal(beam[r].narrow(0, 0, one.size(0)), one)) << one << beam[r];
        EXPECT_EQ(
            beam[r].narrow(0, one.size(0), beam.size(1) - one.size(0)).abs().sum().item<int64_t>(),
            0);
        double b = t5_beam_score(*model, row_ids, one, eos);
        double gr = t5_beam_score(*model, row_ids, greedy[r], eos);
        EXPECT_GE(b, gr - 1e-6) << "row " << r;
        auto v = one.contiguous();
        std::cout << fmt::format(
            "[ info ] eos {} row {}: beam [{}] score {:.5f}, greedy score {:.5f}\n", eos, r,
            fmt::join(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + v.numel(), " "), b, gr);
      }
    }
  }
}

// With as many beams as the vocabulary has tokens, two steps of beam search cannot miss: every
// first token stays open, so the result must be the best of all 1- and 2-token continuations
// under Hugging Face's scoring (sum of log-probabilities over the hypothesis length, eos ending
// a hypothesis), found here by scoring every one of them.
TEST(T5Generate, BeamSearchWithAllTokensAsBeamsFindsTheExhaustiveBest) {
  for (auto [rel, frequent] : {std::pair<std::string, int64_t>{"fixtures/tiny/t5_cg", 51},
                               {"fixtures/tiny/t5_v11_cg", 11}}) {
    EMOE_REQUIRE_SHARED(dir, rel);
    auto fx = emoe::test::load_fixture(dir + "/fixture.safetensors");
    auto model = emoe::test::load_test_model(dir);
    torch::NoGradGuard g;
    auto ids = fx["input_ids"], mask = fx["attention_mask"];
    const int64_t vocab = model
                              ->forward([&] {
                                emoe::ModelInputs in;
                                in.input_ids = ids.narrow(0, 0, 1);
                                in.decoder_input_ids = torch::zeros({1, 1}, ids.options());
                                return in;
                              }())
                              .logits.size(-1);
    for (int64_t eos : {int64_t{1}, frequent}) {
      for (int64_t r = 0; r < ids.size(0); ++r) {
        SCOPED_TRACE(rel + " eos " + std::to_string(eos) + " row " + std::to_string(r));
        const int64_t len = mask[r].sum().item<int64_t>();
        auto row_ids = ids[r].narrow(0, 0, len);
        // every [start, a] at once: position 0 gives the first token's, position 1 the second's
        emoe::ModelInputs in;
        in.input_ids = row_ids.unsqueeze(0).expand({vocab, len}).contiguous();
        in.decoder_input_ids = torch::stack(
            {torch::zeros({vocab}, ids.options()), torch::arange(vocab, ids.options())}, 1);
        auto logp = torch::log_softmax(model->forward(in).logits.to(torch::kDouble), -1);
        auto lp1 = logp[0][0];
        auto lp2 = logp.select(1, 1);           // [a, b]
        double best = lp1[eos].item<double>();  // [start, eos]: length 1
        for (int64_t a = 0; a < vocab; ++a) {
          if (a == eos) continue;
          const double first = lp1[a].item<double>();
          best = std::max(best, (first + lp2[a][eos].item<double>()) / 2.0);
          auto open = lp2[a].clone();
          open[eos] = -std::numeric_limits<double>::infinity();
          best = std::max(best, (first + open.max().item<double>()) / 3.0);
        }
        emoe::GenerateOptions go;
        go.eos_ids = {eos};
        go.pad_id = 0;
        go.max_new_tokens = 2;
        go.num_beams = vocab;
        auto out = emoe::generate_seq2seq(*model, row_ids.unsqueeze(0), {}, go)[0];
        const double got = t5_beam_score(*model, row_ids, out, eos);
        EXPECT_NEAR(got, best, 1e-5) << out;
      }
    }
  }
}

TEST(T5Model, PeftDefaultsAdaptSelfAndCrossAttentionAndTheFfnOutput) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/t5_v11_cg");
  auto fx = emoe::test::load_fixture(dir + "/fixture.safetensors");
  emoe::ModelInputs in;
  in.input_ids = fx["input_ids"];
  in.attention_mask = fx["attention_mask"];
  in.decoder_input_ids = fx["decoder_input_ids"];
  for (auto m : {emoe::PeftMethod::kLora, emoe::PeftMethod::kIa3, emoe::PeftMethod::kMov,
                 emoe::PeftMethod::kMolora}) {
    SCOPED_TRACE(emoe::to_string(m));
    auto model = emoe::test::load_test_model(dir);
    auto adapted = emoe::apply_peft(*model, emoe::PeftConfig::for_method(m, "t5"));
    // 2 encoder self-attentions, 2 decoder self- and 2 cross-attentions: 2 Linear each; (IA)^3
    // and MoV also scale the 4 FFN outputs (wo); MoLoRA adapts q, k, v, o of the 6 attentions
    // and wi_0, wi_1, wo of the 4 FFNs
    EXPECT_EQ(adapted.size(), m == emoe::PeftMethod::kLora     ? 12u
                              : m == emoe::PeftMethod::kMolora ? 36u
                                                               : 16u)
        << fmt::format("{}", fmt::join(adapted, " "));
    if (m == emoe::PeftMethod::kMolora)
      EXPECT_NE(
          std::find(adapted.begin(), adapted.end(), "encoder.block.0.layer.1.DenseReluDense.wi_1"),
          adapted.end());
    EXPECT_NE(
        std::find(adapted.begin(), adapted.end(), "decoder.block.1.layer.1.EncDecAttention.v"),
        adapted.end());
    // freshly initialised adapters leave the function unchanged (LoRA's and MoLoRA's B = 0,
    // (IA)^3 and MoV's vectors = 1)
    torch::NoGradGuard g;
    EXPECT_LT(max_abs_diff(model->forward(in).logits, fx["logits"]), emoe::test::kGoldenTol);
  }
}
