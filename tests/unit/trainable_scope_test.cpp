// train.trainable: the converted layers only, or their gates only (the authors'
// --tune_moe_layers_only / --tune_gates_only), with the task head always training.
#include "emoe/core/error.h"
#include "emoe/train/method.h"
#include "support/test_support.h"

namespace {

emoe::RunConfig scope_config(const std::string& method, const std::string& trainable) {
  return emoe::load_run_config(
      "", {"model=m", "task=sst2", "method=" + method, "moe.experts=4", "moe.topk=2",
           "moe.layers=[1]", "train.trainable=" + trainable});
}

// Which parameters train, by a part of their name.
std::map<std::string, bool> scope_trains(emoe::PretrainedModelImpl& m) {
  std::map<std::string, bool> out = {{"embeddings", false}, {"layer.0.", false},
                                     {"layer.1.", false},   {"gate", false},
                                     {"classifier", false}, {"layer.1.attention", false}};
  for (const auto& p : m.named_parameters())
    for (auto& [part, any] : out)
      if (p.key().find(part) != std::string::npos && p.value().requires_grad()) any = true;
  return out;
}

}  // namespace

TEST(TrainableScope, MoeLayersOrGatesOnlyAndTheHeadAlways) {
  {
    auto model = emoe::test::tiny_bert_classifier();
    emoe::apply_method(*model, scope_config("gmoe", "gates"), {});
    auto t = scope_trains(*model);
    EXPECT_TRUE(t["gate"]);
    EXPECT_TRUE(t["classifier"]);
    EXPECT_FALSE(t["embeddings"]);
    EXPECT_FALSE(t["layer.0."]);
    EXPECT_FALSE(t["layer.1.attention"]);
    for (const auto& p : model->named_parameters())  // layer 1 trains only its gate
      if (p.key().find("layer.1.") != std::string::npos)
        EXPECT_EQ(p.value().requires_grad(), p.key().find("gate") != std::string::npos) << p.key();
  }
  {
    auto model = emoe::test::tiny_bert_classifier();
    emoe::apply_method(*model, scope_config("emoe", "moe-layers"), {});
    auto t = scope_trains(*model);
    EXPECT_TRUE(t["layer.1."]);
    EXPECT_TRUE(t["layer.1.attention"]);
    EXPECT_TRUE(t["classifier"]);
    EXPECT_FALSE(t["layer.0."]);
    EXPECT_FALSE(t["embeddings"]);
  }
  {  // with LoRA: the adapters train wherever they are, the MoE layer whole
    auto model = emoe::test::tiny_bert_classifier();
    emoe::apply_method(*model, scope_config("emoe+lora", "moe-layers"), {});
    bool lora0 = false, dense1 = false, dense0 = false;
    for (const auto& p : model->named_parameters()) {
      const auto& k = p.key();
      if (k.find("layer.0.") != std::string::npos && k.find("lora") != std::string::npos)
        lora0 = lora0 || p.value().requires_grad();
      if (k.find("layer.1.output.dense.weight") != std::string::npos)
        dense1 = p.value().requires_grad();
      if (k.find("layer.0.output.dense.weight") != std::string::npos)
        dense0 = p.value().requires_grad();
    }
    EXPECT_TRUE(lora0);
    EXPECT_TRUE(dense1);
    EXPECT_FALSE(dense0);
  }
  // refused before anything runs: a method without MoE layers, an avg-k gate (no parameters)
  auto msg = [](const std::string& method, const std::string& trainable) {
    try {
      scope_config(method, trainable);
    } catch (const emoe::InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg("full", "moe-layers").find("train.trainable: moe-layers needs a method"),
            std::string::npos);
  EXPECT_NE(msg("emoe", "gates").find("the avg-k gate has no parameters"), std::string::npos);
  EXPECT_NE(msg("emoe", "everything").find("expected all, moe-layers or gates"), std::string::npos);
}
