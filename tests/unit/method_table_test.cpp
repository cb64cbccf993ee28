// The method table drives every method: its parameters train as the table says (for X+lora the
// authors' selection: the adapters and the head, plus the routers of EMoE-learn or the converted
// layers of GMoE), each has its example config, and the README and docs list each.
#include "emoe/train/method_table.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "emoe/core/error.h"
#include "emoe/train/config_fields.h"
#include "emoe/train/method.h"
#include "support/test_support.h"

namespace fs = std::filesystem;

namespace {

class MethodTableRow : public ::testing::TestWithParam<std::string> {};

std::string config_name_of(const std::string& method) {
  std::string s = method;
  for (auto& c : s)
    if (c == '+') c = '-';
  return "configs/bert-mini-sst2-" + s + ".yaml";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

// On the tiny BERT with layer 1 converted: which parameters train, parameter by parameter.
TEST_P(MethodTableRow, TrainsWhatTheTableSays) {
  const emoe::MethodInfo& info = emoe::method_info(GetParam());
  auto cfg =
      emoe::load_run_config("", {"model=m", "task=sst2", "method=" + info.name, "moe.experts=4",
                                 "moe.topk=2", "moe.layers=[1]", "peft.experts=2"});
  EXPECT_EQ(cfg.uses_moe(), info.uses_moe());
  EXPECT_EQ(cfg.peft_method(), info.peft);
  auto model = emoe::test::tiny_bert_classifier();
  torch::manual_seed(0);
  emoe::ModelInputs in;  // MoEfication's router learns from activations
  in.input_ids = torch::randint(1, 50, {2, 6}, torch::kLong);
  in.attention_mask = torch::ones({2, 6}, torch::kLong);
  emoe::apply_method(*model, cfg, {in});
  int64_t adapters = 0, gates = 0;
  for (const auto& p : model->named_parameters()) {
    const std::string& k = p.key();
    SCOPED_TRACE(k);
    const bool trains = p.value().requires_grad();
    const bool adapter = k.find("lora_") != std::string::npos;
    const bool gate = k.find("gate") != std::string::npos;
    const bool layer1 = k.find("layer.1.") != std::string::npos;
    adapters += adapter;
    gates += gate;
    if (info.peft == emoe::PeftMethod::kNone) {
      EXPECT_TRUE(trains);  // every parameter, through the converted layers where there are some
      continue;
    }
    if (info.peft != emoe::PeftMethod::kLora) continue;  // (IA)^3, MoV, MoLoRA: peft_test.cpp
    if (adapter || k.rfind("classifier.", 0) == 0) {
      EXPECT_TRUE(trains);
    } else if (gate && layer1) {
      EXPECT_EQ(trains, info.also_trains == "gates" || info.also_trains == "moe-layers");
    } else if (layer1) {  // the experts, the layer's attention and norms
      EXPECT_EQ(trains, info.also_trains == "moe-layers");
    } else if (k.find("pooler") == std::string::npos) {  // embeddings, layer 0
      EXPECT_FALSE(trains);
    }
  }
  if (info.peft == emoe::PeftMethod::kLora) EXPECT_GT(adapters, 0);
  if (info.peft == emoe::PeftMethod::kNone) EXPECT_EQ(adapters, 0);
  if (info.also_trains == "gates") EXPECT_GT(gates, 0);
}

// configs/bert-mini-sst2-METHOD.yaml: one per method ("+" written "-"), which loads and names it.
TEST_P(MethodTableRow, HasItsExampleConfig) {
  const std::string rel = config_name_of(GetParam());
  const std::string path = emoe::test::source_dir() + "/" + rel;
  ASSERT_TRUE(fs::exists(path)) << rel << " is missing (README: one config per method)";
  auto cfg = emoe::load_run_config(path, {});
  EXPECT_EQ(cfg.method, GetParam()) << rel;
  cfg.validate();
}

// The README's method table and docs/config.md's have a row per method.
TEST_P(MethodTableRow, ReadmeAndConfigReferenceListIt) {
  const std::string row = "| `" + GetParam() + "` |";
  EXPECT_NE(read_text(emoe::test::source_dir() + "/README.md").find("\n" + row), std::string::npos)
      << "README.md has no method row " << row;
  EXPECT_NE(emoe::config_fields_markdown().find("\n" + row), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Methods, MethodTableRow, ::testing::ValuesIn(emoe::method_names()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string s;
                           for (char c : p.param)
                             s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return s;
                         });

TEST(MethodTable, UnknownMethodNamesEveryMethod) {
  try {
    emoe::load_run_config("", {"model=m", "task=sst2", "method=adapterz"});
    FAIL() << "method adapterz was accepted";
  } catch (const emoe::InputError& e) {
    const std::string what = e.what();
    for (const auto& m : emoe::method_names()) EXPECT_NE(what.find(m), std::string::npos) << m;
    EXPECT_NE(what.find("got 'adapterz'"), std::string::npos) << what;
  }
  // X+lora is X's conversion with LoRA
  EXPECT_EQ(emoe::method_info("gmoe+lora").moe, "gmoe");
  EXPECT_EQ(emoe::method_info("emoe-learn+lora").moe, "emoe-learn");
  EXPECT_EQ(emoe::method_info("emoe-learn+lora").peft, emoe::PeftMethod::kLora);
  EXPECT_TRUE(emoe::method_info("emoe-learn+lora").is_emoe());
  EXPECT_FALSE(emoe::method_info("gmoe+lora").is_emoe());
}
