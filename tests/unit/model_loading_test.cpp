// Strict loading, legacy key names, config invariants, save/reload and dtype handling.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "emoe/core/error.h"
#include "emoe/io/safetensors.h"
#include "emoe/methods/model_folder.h"
#include "emoe/models/loader.h"
#include "support/test_support.h"

namespace fs = std::filesystem;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const emoe::InputError& e) {
    return e.what();
  }
  return "";
}

// Copies a fixture model folder's config and re-writes its weights through `edit`.
void copy_with_edit(const std::string& src, const std::string& dst,
                    const std::function<void(std::map<std::string, torch::Tensor>&)>& edit) {
  fs::copy_file(src + "/config.json", dst + "/config.json");
  auto w = emoe::load_safetensors(src + "/model.safetensors");
  edit(w);
  std::vector<std::pair<std::string, torch::Tensor>> v(w.begin(), w.end());
  emoe::save_safetensors(dst + "/model.safetensors", v);
}

torch::Tensor logits_of(const std::string& dir, const torch::Tensor& ids) {
  auto m = emoe::load_model(dir);
  emoe::ModelInputs in;
  in.input_ids = ids;
  auto out = m->forward(in);
  return out.logits.defined() ? out.logits : out.last_hidden_state;
}

void write_config(const std::string& dir, const nlohmann::json& j) {
  std::ofstream(dir + "/config.json") << j.dump();
}

}  // namespace

TEST(ModelLoading, OneErrorListsMissingUnexpectedAndWrongShaped) {
  EMOE_REQUIRE_SHARED(src, "fixtures/tiny/llama_lm");
  emoe::test::TempDir tmp;
  copy_with_edit(src, tmp.path(), [](auto& w) {
    w.erase("model.layers.1.mlp.up_proj.weight");
    w["model.layers.0.extra.weight"] = torch::zeros({2});
    w["model.layers.0.mlp.gate_proj.weight"] =
        w["model.layers.0.mlp.gate_proj.weight"].t().contiguous();
  });
  std::string msg = error_of([&] { emoe::load_model(tmp.path()); });
  EXPECT_NE(msg.find("1 missing: model.layers.1.mlp.up_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1 unexpected: model.layers.0.extra.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.layers.0.mlp.gate_proj.weight: expected [88, 32], got [32, 88]"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

TEST(ModelLoading, LegacyBertNamesAndMissingPrefix) {
  EMOE_REQUIRE_SHARED(src, "fixtures/tiny/bert_seqcls");
  emoe::test::TempDir tmp;
  copy_with_edit(src, tmp.path(), [](auto& w) {
    std::map<std::string, torch::Tensor> renamed;
    for (auto& [k, v] : w) {
      std::string n = k;
      if (n.rfind("bert.", 0) == 0) n = n.substr(5);
      auto pos = n.find("LayerNorm.weight");
      if (pos != std::string::npos) n = n.substr(0, pos) + "LayerNorm.gamma";
      pos = n.find("LayerNorm.bias");
      if (pos != std::string::npos) n = n.substr(0, pos) + "LayerNorm.beta";
      renamed[n] = v;
    }
    renamed["embeddings.position_ids"] = torch::arange(64).unsqueeze(0);
    w = renamed;
  });
  auto ids = torch::randint(3, 100, {2, 7}, torch::kLong);
  EXPECT_TRUE(torch::allclose(logits_of(tmp.path(), ids), logits_of(src, ids)));
}

TEST(ModelLoading, Gpt2WithoutPrefixAndWithMaskBuffersAndTiedCopy) {
  EMOE_REQUIRE_SHARED(src, "fixtures/tiny/gpt2_lm");
  emoe::test::TempDir tmp;
  copy_with_edit(src, tmp.path(), [](auto& w) {
    std::map<std::string, torch::Tensor> renamed;
    for (auto& [k, v] : w) renamed[k.substr(std::string("transformer.").size())] = v;
    renamed["h.0.attn.bias"] = torch::ones({1, 1, 64, 64});
    renamed["h.1.attn.masked_bias"] = torch::tensor(-1e4);
    renamed["lm_head.weight"] = renamed["wte.weight"];
    w = renamed;
  });
  auto ids = torch::randint(3, 100, {1, 9}, torch::kLong);
  EXPECT_TRUE(torch::allclose(logits_of(tmp.path(), ids), logits_of(src, ids)));
}

TEST(ModelLoading, SaveAndReloadReproducesLogits) {
  for (const char* name :
       {"tiny/bert_seqcls", "tiny/gpt2_lm", "tiny/llama_lm", "tiny/bert_model"}) {
    SCOPED_TRACE(name);
    EMOE_REQUIRE_SHARED(src, std::string("fixtures/") + name);
    emoe::test::TempDir tmp;
    auto model = emoe::load_model(src);
    emoe::save_model(*model, tmp.path());
    // keys written are exactly Hugging Face's
    auto fx = nlohmann::json::parse(std::ifstream(src + "/fixture.json"));
    std::set<std::string> want, got;
    for (const auto& k : fx["saved_weight_keys"]) want.insert(k.get<std::string>());
    emoe::SafetensorsFile saved(tmp.file("model.safetensors"));
    for (const auto& e : saved.entries()) got.insert(e.name);
    EXPECT_EQ(got, want);
    auto ids = torch::randint(3, 100, {2, 6}, torch::kLong);
    EXPECT_TRUE(torch::equal(logits_of(tmp.path(), ids), logits_of(src, ids)));
  }
}

// Issue 24: a model saved in Hugging Face shards reads back bit-identical and gives the same
// logits; a later save into the same folder leaves no stale weights file beside its own.
TEST(ModelLoading, ShardedSaveRoundTripsAndReplacesStaleWeights) {
  EMOE_REQUIRE_SHARED(src, "fixtures/tiny/llama_lm");
  emoe::test::TempDir tmp;
  auto model = emoe::load_model(src);
  const auto dir = tmp.file("model");
  emoe::save_any_model(*model, {}, {}, dir, src, /*max_shard_bytes=*/20000);
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  ASSERT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  int shards = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("model-", 0) == 0) {
      ++shards;
      EXPECT_LE(fs::file_size(e.path()), 20000u + 4096) << e.path();  // + header
    }
  EXPECT_GT(shards, 1);
  emoe::CheckpointReader original(src), sharded(dir);
  ASSERT_EQ(sharded.names(), original.names());
  for (const auto& name : original.names())
    EXPECT_TRUE(torch::equal(sharded.load(name), original.load(name))) << name;
  auto ids = torch::randint(3, 100, {2, 6}, torch::kLong);
  EXPECT_TRUE(torch::equal(logits_of(dir, ids), logits_of(src, ids)));

  // one file again: the index and the shards go
  emoe::save_any_model(*model, {}, {}, dir, "");
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    EXPECT_EQ(name.find("model-"), std::string::npos) << name;
    EXPECT_NE(name, "model.safetensors.index.json");
  }
  EXPECT_TRUE(torch::equal(logits_of(dir, ids), logits_of(src, ids)));
  // and sharded again over it: model.safetensors goes (save_model, file by file, too)
  emoe::save_model(*model, dir, {}, 20000);
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  EXPECT_TRUE(torch::equal(logits_of(dir, ids), logits_of(src, ids)));
  // no staging folder is left beside the model
  for (const auto& e : fs::directory_iterator(tmp.path()))
    EXPECT_EQ(e.path().filename().string(), "model");
}

TEST(ModelLoading, NewHeadIsInitialisedOnlyWhenAllowed) {
  EMOE_REQUIRE_SHARED(src, "models/bert-mini");
  emoe::LoadOptions o;
  o.head = emoe::Head::kSequenceClassification;
  o.num_labels = 3;
  EXPECT_THROW(emoe::load_model(src, o), emoe::InputError);  // classifier missing, cls.* unexpected
  o.allow_new_head = true;
  auto m = emoe::load_model(src, o);
  EXPECT_EQ(m->summary().num_labels, 3);
  emoe::ModelInputs in;
  in.input_ids = torch::tensor({{2L, 50L, 60L, 3L}});
  EXPECT_EQ(m->forward(in).logits.sizes(), (std::vector<int64_t>{1, 3}));
}

TEST(ModelLoading, Bfloat16ComputeStaysCloseToFloat32) {
  EMOE_REQUIRE_SHARED(src, "models/stories260K/hf");
  emoe::LoadOptions o;
  o.dtype = torch::kBFloat16;
  auto m16 = emoe::load_model(src, o);
  auto m32 = emoe::load_model(src);
  EXPECT_EQ(m16->parameters()[0].scalar_type(), torch::kBFloat16);
  emoe::ModelInputs in;
  in.input_ids = torch::tensor({{1L, 403L, 407L, 261L, 378L}});
  auto a = m16->forward(in).logits.to(torch::kFloat);
  auto b = m32->forward(in).logits;
  EXPECT_LT(emoe::test::max_abs_diff(a, b), 0.5);
  EXPECT_TRUE(torch::equal(a.argmax(-1), b.argmax(-1)));
}

// Issue 24: a bfloat16 checkpoint loaded with dtype bfloat16 is built and filled in bfloat16 (no
// float32 model first), keeps its values bit for bit, saves as bfloat16, and computes what a
// float32 load of the same weights computes within bfloat16's precision.
TEST(ModelLoading, Bfloat16WeightsKeepTheirDtype) {
  EMOE_REQUIRE_SHARED(src, "fixtures/tiny/llama_lm");
  emoe::test::TempDir tmp;
  {
    auto m = emoe::load_model(src);
    m->to(torch::kBFloat16);
    emoe::save_model(*m, tmp.file("bf16"));
  }
  emoe::CheckpointReader stored(tmp.file("bf16"));
  for (const auto& name : stored.names()) EXPECT_EQ(stored.entry(name).dtype, "BF16") << name;
  auto cfg = nlohmann::json::parse(std::ifstream(tmp.file("bf16/config.json")));
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");

  emoe::LoadOptions o;
  o.dtype = torch::kBFloat16;
  // every tensor the model makes while it is built is bfloat16 already
  bool all_bf16 = true;
  auto m16 = emoe::load_model(tmp.file("bf16"), o, [&](emoe::PretrainedModelImpl& m) {
    for (const auto& p : m.parameters()) all_bf16 = all_bf16 && p.scalar_type() == torch::kBFloat16;
  });
  EXPECT_TRUE(all_bf16);
  for (const auto& p : m16->named_parameters()) {
    EXPECT_EQ(p.value().scalar_type(), torch::kBFloat16) << p.key();
    EXPECT_TRUE(torch::equal(p.value(), stored.load(m16->file_key(p.key())))) << p.key();
  }
  EXPECT_EQ(c10::get_default_dtype(), caffe2::TypeMeta::Make<float>());  // restored
  // saved again: still bfloat16, bit-identical
  emoe::save_model(*m16, tmp.file("again"));
  emoe::CheckpointReader again(tmp.file("again"));
  for (const auto& name : stored.names()) {
    EXPECT_EQ(again.entry(name).dtype, "BF16") << name;
    EXPECT_TRUE(torch::equal(again.load(name), stored.load(name))) << name;
  }
  // the float32 load of the same weights: logits within bfloat16's tolerance
  auto m32 = emoe::load_model(tmp.file("bf16"));
  EXPECT_EQ(m32->parameters()[0].scalar_type(), torch::kFloat);
  emoe::ModelInputs in;
  in.input_ids = torch::randint(3, 100, {2, 8}, torch::kLong);
  torch::NoGradGuard g;
  auto a = m16->forward(in).logits.to(torch::kFloat);
  auto b = m32->forward(in).logits;
  EXPECT_LT(emoe::test::max_abs_diff(a, b), 0.05 * std::max(1.0, b.abs().max().item<double>()));
  // load_into converts on the way: a float32 destination from the bfloat16 file
  auto dst = torch::empty(stored.entry("lm_head.weight").shape, torch::kFloat);
  stored.load_into("lm_head.weight", dst);
  EXPECT_TRUE(torch::equal(dst, stored.load("lm_head.weight").to(torch::kFloat)));
}

TEST(ConfigValidation, InvariantsNameBothValues) {
  EMOE_REQUIRE_SHARED(src, "fixtures/tiny/llama_lm");
  emoe::test::TempDir tmp;
  auto base = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  fs::copy_file(src + "/model.safetensors", tmp.file("model.safetensors"));
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string expect;
  };
  std::vector<Case> cases = {
      {[](auto& j) { j["hidden_size"] = 30; },
       "hidden_size 30 is not a multiple of num_attention_heads 4"},
      {[](auto& j) { j["num_key_value_heads"] = 3; },
       "num_attention_heads 4 is not a multiple of num_key_value_heads 3"},
      {[](auto& j) { j["hidden_size"] = "big"; }, "field 'hidden_size': expected an integer"},
      {[](auto& j) { j["num_hidden_layers"] = 0; },
       "field 'num_hidden_layers': expected a positive integer, got 0"},
      {[](auto& j) { j["hidden_act"] = "swiglu9"; }, "field 'hidden_act'"},
      {[](auto& j) { j["model_type"] = "mamba"; }, "field 'model_type'"},
      // dynamic, linear and llama3 scaling are supported; YaRN is not
      {[](auto& j) {
         j["rope_scaling"] = {{"type", "yarn"}, {"factor", 2.0}};
       },
       "field 'rope_scaling'"},
      {[](auto& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
       },
       "llama3 scaling needs \"low_freq_factor\""},
      {[](auto& j) { j["eos_token_id"] = 1000; },
       "eos_token_id 1000 is outside the vocabulary of 100 tokens"},
  };
  for (const auto& c : cases) {
    auto j = base;
    c.edit(j);
    write_config(tmp.path(), j);
    std::string msg = error_of([&] { emoe::load_model(tmp.path()); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
  }
  std::ofstream(tmp.file("config.json")) << "{\"model_type\": ";
  EXPECT_NE(error_of([&] { emoe::load_model(tmp.path()); }).find("not valid JSON"),
            std::string::npos);
  fs::remove(tmp.file("config.json"));
  EXPECT_NE(error_of([&] { emoe::load_model(tmp.path()); }).find("missing config.json"),
            std::string::npos);
}

TEST(ConfigValidation, BertAndGpt2Invariants) {
  EMOE_REQUIRE_SHARED(bert, "fixtures/tiny/bert_model");
  EMOE_REQUIRE_SHARED(gpt2, "fixtures/tiny/gpt2_lm");
  auto jb = nlohmann::json::parse(std::ifstream(bert + "/config.json"));
  jb["num_attention_heads"] = 5;
  std::string msg = error_of(
      [&] { emoe::create_model(emoe::JsonFields(jb, "b/config.json"), emoe::Head::kBase); });
  EXPECT_NE(msg.find("hidden_size 32 is not a multiple of num_attention_heads 5"),
            std::string::npos)
      << msg;
  auto jg = nlohmann::json::parse(std::ifstream(gpt2 + "/config.json"));
  jg["n_head"] = 3;
  msg = error_of(
      [&] { emoe::create_model(emoe::JsonFields(jg, "g/config.json"), emoe::Head::kCausalLM); });
  EXPECT_NE(msg.find("n_embd 32 is not a multiple of n_head 3"), std::string::npos) << msg;
}

// The golden tests' device (EMOE_TEST_DEVICE, scripts/device_check.sh): CPU by default, an error
// naming the variable for a device this machine cannot use, never a silent fall back to the CPU.
TEST(TestSupport, TestDeviceDefaultsToCpuAndNamesTheVariableWhenUnusable) {
  using emoe::test::parse_test_device;
  EXPECT_EQ(parse_test_device(nullptr), torch::Device(torch::kCPU));
  EXPECT_EQ(parse_test_device(""), torch::Device(torch::kCPU));
  EXPECT_EQ(parse_test_device("cpu"), torch::Device(torch::kCPU));
  for (const char* bad : {"tpu", torch::cuda::is_available() ? "cuda:x" : "cuda"}) {
    try {
      parse_test_device(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("EMOE_TEST_DEVICE=") + bad),
                std::string::npos)
          << e.what();
    }
  }
  // the helpers put the model and the fixture's tensors on that device
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/bert_model");
  auto model = emoe::test::load_test_model(dir);
  for (const auto& p : model->parameters()) EXPECT_EQ(p.device(), emoe::test::test_device());
  for (const auto& [name, t] : emoe::test::load_fixture(dir + "/fixture.safetensors"))
    EXPECT_EQ(t.device(), emoe::test::test_device()) << name;
}
