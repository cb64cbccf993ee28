// LoRA against peft 0.5.0 (fixtures/lora): unmerged and merged outputs, merged weights, our files.
#include <fstream>
#include <set>

#include "emoe/io/safetensors.h"
#include "emoe/models/loader.h"
#include "emoe/peft/peft.h"
#include "support/test_support.h"

namespace {

struct LoraFixtureCase {
  std::string root;      // fixtures/lora/<name>
  std::string base_dir;  // the base model (adapter_config's base_model_name_or_path)
  nlohmann::json info;   // fixture.json
  std::map<std::string, torch::Tensor> tensors;
  bool seqcls = false;
};

LoraFixtureCase lora_read_fixture(const std::string& root) {
  LoraFixtureCase f;
  f.root = root;
  f.info = nlohmann::json::parse(std::ifstream(root + "/fixture.json"));
  f.tensors = emoe::test::load_fixture(root + "/fixture.safetensors");
  // relative to the fixtures folder: "tiny/bert_model"
  f.base_dir = emoe::test::shared_path(
      "fixtures/" + f.info["lora_config"]["base_model_name_or_path"].get<std::string>());
  f.seqcls = f.tensors.count("lora.logits") > 0;
  return f;
}

emoe::ModelOutputs lora_run(emoe::PretrainedModelImpl& m, const LoraFixtureCase& f) {
  torch::NoGradGuard g;
  emoe::ModelInputs in;
  in.input_ids = f.tensors.at("input_ids");
  in.attention_mask = f.tensors.at("attention_mask");
  in.token_type_ids = f.tensors.at("token_type_ids");
  return m.forward(in);
}

// Max |Δ| of every `<prefix>.*` output the fixture has.
double lora_max_diff(const emoe::ModelOutputs& out, const LoraFixtureCase& f,
                     const std::string& prefix) {
  double worst = 0;
  int compared = 0;
  for (const auto& [name, t] : {std::pair{"logits", out.logits},
                                {"last_hidden_state", out.last_hidden_state},
                                {"pooler_output", out.pooler_output}}) {
    auto it = f.tensors.find(prefix + "." + name);
    if (it == f.tensors.end()) continue;
    EXPECT_TRUE(t.defined()) << prefix << "." << name;
    if (!t.defined()) return 1e9;
    worst = std::max(worst, emoe::test::max_abs_diff(t, it->second));
    ++compared;
  }
  EXPECT_GT(compared, 0) << "no " << prefix << ".* tensors in " << f.root;
  return worst;
}

std::vector<std::string> lora_file_keys(const std::string& path) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : emoe::load_safetensors(path)) keys.push_back(k);
  return keys;
}

void lora_check_fixture(const std::string& root) {
  auto f = lora_read_fixture(root);
  ASSERT_FALSE(f.base_dir.empty()) << "base model of " << root << " not found";
  auto model = emoe::test::load_test_model(f.base_dir);
  model->eval();
  auto cfg = emoe::load_peft_adapter(*model, root + "/adapter");
  EXPECT_EQ(cfg.method, emoe::PeftMethod::kLora);
  EXPECT_EQ(cfg.r, 4);
  EXPECT_EQ(cfg.alpha, 8);
  EXPECT_EQ(cfg.targets, (std::vector<std::string>{"query", "value"}));
  EXPECT_EQ(emoe::adapted_modules(*model).size(), 4u);

  // Unmerged: base + (alpha/r) B A x
  double d_lora = lora_max_diff(lora_run(*model, f), f, "lora");
  std::printf("[ %s ] lora (unmerged) max |diff| = %.3g\n", root.c_str(), d_lora);
  EXPECT_LE(d_lora, emoe::test::kGoldenTol);

  // Our files: the fixture's keys; reloading them reproduces the outputs exactly
  emoe::test::TempDir tmp;
  emoe::save_peft_adapter(*model, cfg, tmp.path(),
                          f.info["lora_config"]["base_model_name_or_path"].get<std::string>());
  std::vector<std::string> want_keys = f.info["adapter_keys"];
  EXPECT_EQ(lora_file_keys(tmp.file("adapter_model.safetensors")), want_keys);
  auto ours = nlohmann::json::parse(std::ifstream(tmp.file("adapter_config.json")));
  auto theirs = nlohmann::json::parse(std::ifstream(root + "/adapter/adapter_config.json"));
  for (const char* field :
       {"peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "fan_in_fan_out", "bias",
        "modules_to_save", "base_model_name_or_path", "inference_mode"})
    EXPECT_EQ(ours[field], theirs[field]) << field;
  EXPECT_EQ(ours["task_type"], f.seqcls ? "SEQ_CLS" : "FEATURE_EXTRACTION");
  auto reloaded = emoe::test::load_test_model(f.base_dir);
  reloaded->eval();
  emoe::load_peft_adapter(*reloaded, tmp.path());
  auto a = lora_run(*model, f), b = lora_run(*reloaded, f);
  EXPECT_EQ(emoe::test::max_abs_diff(f.seqcls ? a.logits : a.last_hidden_state,
                                     f.seqcls ? b.logits : b.last_hidden_state),
            0.0);

  // Adapter removed: the base model's outputs
  EXPECT_EQ(emoe::remove_peft(*reloaded), 4);
  double d_base = lora_max_diff(lora_run(*reloaded, f), f, "base");
  std::printf("[ %s ] base (adapter removed) max |diff| = %.3g\n", root.c_str(), d_base);
  EXPECT_LE(d_base, emoe::test::kGoldenTol);

  // Merged: outputs, and every weight of peft's merge_and_unload() model
  emoe::merge_lora(*model);
  EXPECT_TRUE(emoe::adapted_modules(*model).empty());
  double d_merged = lora_max_diff(lora_run(*model, f), f, "merged");
  std::printf("[ %s ] merged max |diff| = %.3g\n", root.c_str(), d_merged);
  EXPECT_LE(d_merged, emoe::test::kGoldenTol);
  auto merged = emoe::load_safetensors(root + "/merged/model.safetensors");
  auto state = emoe::model_state(*model);
  EXPECT_EQ(state.size(), merged.size());
  double d_weights = 0;
  for (const auto& [key, t] : state) {
    auto it = merged.find(key);
    EXPECT_NE(it, merged.end()) << key;
    if (it != merged.end())
      d_weights = std::max(d_weights, emoe::test::max_abs_diff(t, it->second));
  }
  std::printf("[ %s ] merged weights max |diff| = %.3g\n", root.c_str(), d_weights);
  EXPECT_LE(d_weights, 1e-6);
}

}  // namespace

TEST(LoraFixture, BertModel) {
  EMOE_REQUIRE_SHARED(root, "fixtures/lora/bert_model_lora");
  lora_check_fixture(root);
}

TEST(LoraFixture, BertSequenceClassification) {
  EMOE_REQUIRE_SHARED(root, "fixtures/lora/bert_seqcls_lora");
  lora_check_fixture(root);
}

// An adapter must rebuild our model on the base checkpoint as PEFT does: bert-mini has no
// pooler, so the run initialises one; a LayerNorm trained through also_train changes too. Both
// go into the file as modules_to_save, and nothing the run left equal to the base does.
TEST(LoraAdapterFile, CarriesEveryModuleTheRunChangedOutsideTheAdapters) {
  EMOE_REQUIRE_SHARED(dir, "models/bert-mini");
  emoe::LoadOptions lo;
  lo.head = emoe::Head::kSequenceClassification;
  lo.num_labels = 2;
  lo.allow_new_head = true;
  torch::manual_seed(1);
  auto model = emoe::load_model(dir, lo);
  ASSERT_TRUE(model->named_parameters().contains("bert.pooler.dense.weight"));
  auto cfg = emoe::PeftConfig::for_method(emoe::PeftMethod::kLora, "bert");
  emoe::apply_peft(*model, cfg);
  emoe::select_trainable(*model, cfg, {"LayerNorm"});
  {
    torch::NoGradGuard g;
    for (auto& p : model->named_parameters()) {
      if (p.key().find("lora_B") != std::string::npos) p.value().fill_(0.05);
      if (p.key() == "bert.encoder.layer.0.output.LayerNorm.weight") p.value().add_(0.1);
    }
  }
  emoe::test::TempDir tmp;
  emoe::save_peft_adapter(*model, cfg, tmp.path(), dir);
  auto j = nlohmann::json::parse(std::ifstream(tmp.file("adapter_config.json")));
  std::set<std::string> saved(j["modules_to_save"].begin(), j["modules_to_save"].end());
  EXPECT_EQ(saved,
            (std::set<std::string>{"bert.encoder.layer.0.output.LayerNorm", "bert.pooler.dense"}))
      << j["modules_to_save"];

  torch::manual_seed(2);  // another fresh pooler and classifier, as a new PEFT user would get
  auto rebuilt = emoe::load_model(dir, lo);
  emoe::load_peft_adapter(*rebuilt, tmp.path());
  model->eval();
  rebuilt->eval();
  emoe::ModelInputs in;
  in.input_ids = torch::randint(5, 100, {2, 9}, torch::kLong);
  torch::NoGradGuard g;
  EXPECT_LT(emoe::test::max_abs_diff(rebuilt->forward(in).logits, model->forward(in).logits), 1e-6);
}
