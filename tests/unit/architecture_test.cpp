// Architecture traits: every registered family declares each trait, and the traits describe the
// models the family builds (targets exist, fused projections and layers are where they say).
#include "emoe/models/architecture.h"

#include <gtest/gtest.h>

#include <set>

#include "emoe/core/error.h"
#include "emoe/io/hf_config.h"
#include "emoe/models/loader.h"
#include "emoe/peft/peft.h"
#include "emoe/peft/targets.h"

namespace {

emoe::PretrainShape tiny_shape() {
  emoe::PretrainShape s;
  s.vocab_size = 64;
  s.hidden = 16;
  s.layers = 2;
  s.heads = 2;
  s.intermediate = 32;
  s.max_positions = 32;
  return s;
}

emoe::ModelPtr tiny_model(const emoe::Architecture& a) {
  emoe::JsonFields cfg(a.pretrain_config(tiny_shape()), a.model_type + " template");
  return emoe::create_model(cfg, a.default_head(cfg));
}

bool matches_some_linear(const std::string& target, const std::vector<emoe::NamedLinear>& ls) {
  for (const auto& l : ls)
    if (emoe::target_matches(target, l.name)) return true;
  return false;
}

}  // namespace

TEST(Architecture, EveryRegisteredFamilyDeclaresEachTrait) {
  ASSERT_FALSE(emoe::architectures().empty());
  std::set<std::string> types;
  for (const auto* a : emoe::architectures()) {
    SCOPED_TRACE(a->model_type);
    EXPECT_FALSE(a->model_type.empty());
    EXPECT_TRUE(types.insert(a->model_type).second) << "model_type registered twice";
    EXPECT_FALSE(a->display_name.empty());
    EXPECT_FALSE(a->class_prefixes.empty());
    EXPECT_FALSE(a->ffn_keys.empty());
    EXPECT_FALSE(a->peft.lora.empty());
    EXPECT_FALSE(a->peft.scaling.empty());
    EXPECT_FALSE(a->peft.feedforward.empty());
    EXPECT_FALSE(a->peft.library_feedforward.empty());
    for (const auto& f : a->peft.feedforward)
      EXPECT_NE(std::find(a->peft.scaling.begin(), a->peft.scaling.end(), f), a->peft.scaling.end())
          << "feed-forward target " << f << " is not a scaling target";
    EXPECT_FALSE(a->pretrained_head_prefixes.empty());
    ASSERT_NE(a->pretrain_config, nullptr);
    ASSERT_NE(a->default_head, nullptr);
    ASSERT_NE(a->make, nullptr);
    EXPECT_EQ(a->pretrain_config(tiny_shape()).value("model_type", ""), a->model_type);
    EXPECT_EQ(emoe::find_architecture(a->model_type), a);
  }
  EXPECT_EQ(emoe::find_architecture("xlnet"), nullptr);
}

TEST(Architecture, TraitsDescribeTheModelsTheFamilyBuilds) {
  for (const auto* a : emoe::architectures()) {
    SCOPED_TRACE(a->model_type);
    auto model = tiny_model(*a);
    const auto& s = model->summary();
    EXPECT_EQ(s.model_type, a->model_type);
    EXPECT_EQ(&emoe::architecture_of(s), a);
    EXPECT_EQ(s.encoder_decoder(), a->encoder_decoder);
    const auto linears = emoe::named_linears(*model);
    for (const auto* list : {&a->peft.lora, &a->peft.molora, &a->peft.scaling})
      for (const auto& t : *list) EXPECT_TRUE(matches_some_linear(t, linears)) << t;
    for (const auto& f : a->fused) EXPECT_TRUE(matches_some_linear(f.module, linears)) << f.module;
    const std::string keys = a->ffn_keys.substr(0, a->ffn_keys.find(' '));
    EXPECT_TRUE(matches_some_linear(keys, linears)) << keys;
    bool conv1d = false;
    for (const auto& l : linears) conv1d = conv1d || l.linear->options().transposed;
    EXPECT_EQ(conv1d, a->conv1d_weights);
    // every FFN slot lives under its layer's prefix
    ASSERT_FALSE(model->ffn_slots().empty());
    for (auto* slot : model->ffn_slots())
      EXPECT_EQ(slot->ffn_prefix().rfind(slot->layer_prefix(), 0), 0u) << slot->ffn_prefix();
    // the defaults attach for every PEFT method
    for (auto m : {emoe::PeftMethod::kLora, emoe::PeftMethod::kIa3, emoe::PeftMethod::kMov,
                   emoe::PeftMethod::kMolora}) {
      auto fresh = tiny_model(*a);
      EXPECT_FALSE(emoe::apply_peft(*fresh, emoe::PeftConfig::for_method(m, a->model_type)).empty())
          << emoe::to_string(m);
    }
  }
}

TEST(Architecture, DetectedFromTheClassNameWithoutModelType) {
  for (const auto* a : emoe::architectures()) {
    SCOPED_TRACE(a->model_type);
    auto j = a->pretrain_config(tiny_shape());
    j.erase("model_type");
    EXPECT_EQ(&emoe::architecture_of(emoe::JsonFields(j, "config.json")), a);
  }
  nlohmann::json unknown = {{"model_type", "xlnet"}};
  try {
    emoe::architecture_of(emoe::JsonFields(unknown, "config.json"));
    FAIL() << "xlnet was accepted";
  } catch (const emoe::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: field 'model_type': expected one of " +
                                         emoe::known_model_types() + ", got 'xlnet'"),
              std::string::npos)
        << e.what();
  }
}
