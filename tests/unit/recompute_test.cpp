// Activation checkpointing (models/recompute.h, train.gradient_checkpointing): a training step
// with every block checkpointed gives the loss, the balance losses, every gradient and the
// expert usage of the step without it — on each architecture, with dropout, noisy gates,
// adapters over frozen embeddings and balance losses, in float32 and under bf16 autocast — and
// holds less activation memory.
#include "emoe/models/recompute.h"

#include <nlohmann/json.hpp>

#include "emoe/core/runtime.h"
#include "emoe/io/hf_config.h"
#include "emoe/models/routed.h"
#include "emoe/train/method.h"
#include "emoe/train/precision.h"
#include "emoe/train/run_config.h"
#include "support/test_support.h"

namespace {

struct Case {
  std::string name;
  nlohmann::json config;
  emoe::Head head;
  std::vector<std::string> sets;  // run-config settings (method and its keys)
  bool bf16 = false;
};

nlohmann::json bert_config() {
  return {{"model_type", "bert"},
          {"hidden_size", 16},
          {"intermediate_size", 32},
          {"num_hidden_layers", 3},
          {"num_attention_heads", 2},
          {"vocab_size", 60},
          {"max_position_embeddings", 32},
          {"hidden_dropout_prob", 0.1},
          {"attention_probs_dropout_prob", 0.1}};
}

nlohmann::json llama_config() {
  return {{"model_type", "llama"},    {"hidden_size", 16},
          {"intermediate_size", 32},  {"num_hidden_layers", 3},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"vocab_size", 60},         {"max_position_embeddings", 64},
          {"attention_dropout", 0.1}};
}

nlohmann::json gpt2_config() {
  return {{"model_type", "gpt2"}, {"n_embd", 16},      {"n_layer", 3},
          {"n_head", 2},          {"vocab_size", 60},  {"n_positions", 32},
          {"resid_pdrop", 0.1},   {"attn_pdrop", 0.1}, {"embd_pdrop", 0.1}};
}

nlohmann::json t5_config() {
  return {{"model_type", "t5"},
          {"d_model", 16},
          {"d_ff", 32},
          {"d_kv", 8},
          {"num_layers", 2},
          {"num_decoder_layers", 2},
          {"num_heads", 2},
          {"vocab_size", 60},
          {"dropout_rate", 0.1},
          {"relative_attention_num_buckets", 8},
          {"decoder_start_token_id", 0},
          {"pad_token_id", 0},
          {"eos_token_id", 1}};
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

std::vector<Case> cases() {
  using H = emoe::Head;
  const H cls = H::kSequenceClassification;
  return {
      {"BertFull", bert_config(), cls, {"method=full"}},
      {"BertFullBf16", bert_config(), cls, {"method=full"}, true},
      // a gate with noise (tutel) and a balance loss: the generator and the loss's gradient
      {"BertGmoeNoisyBalanced",
       bert_config(),
       cls,
       {"method=gmoe", "moe.experts=4", "moe.topk=2", "moe.layers=[0,2]", "moe.tutel=true",
        "moe.balance_loss=switch", "moe.balance_weight=0.1"}},
      {"BertEmoeDispatched",
       bert_config(),
       cls,
       {"method=emoe", "moe.experts=4", "moe.topk=1", "moe.layers=[0,1,2]",
        "moe.execution=dispatched"}},
      // frozen embeddings: no block input needs a gradient, the adapters do
      {"BertLora", bert_config(), cls, {"method=lora"}},
      {"BertMoloraBalancedBf16",
       bert_config(),
       cls,
       {"method=molora", "peft.experts=2", "peft.topk=1", "peft.balance_weight=0.1"},
       true},
      {"LlamaEmoe",
       llama_config(),
       H::kCausalLM,
       {"method=emoe", "moe.experts=4", "moe.topk=2", "moe.layers=[0,1,2]"}},
      {"LlamaFullBf16", llama_config(), H::kCausalLM, {"method=full"}, true},
      {"Gpt2Full", gpt2_config(), H::kCausalLM, {"method=full"}},
      // the position bias (a parameter read outside the blocks) and the encoder's output are
      // block inputs that need gradients
      {"T5Full", t5_config(), H::kSeq2SeqLM, {"method=full"}},
  };
}

class Recompute : public ::testing::TestWithParam<Case> {};

struct Step {
  double loss = 0, aux = 0;
  std::map<std::string, torch::Tensor> grads;
  std::vector<torch::Tensor> usage;
  int64_t peak = 0;
};

emoe::ModelInputs inputs_for(const Case& c, int64_t b, int64_t t) {
  torch::manual_seed(3);
  emoe::ModelInputs in;
  in.input_ids = torch::randint(2, 60, {b, t}, torch::kLong);
  in.attention_mask = torch::ones({b, t}, torch::kLong);
  in.attention_mask.index_put_({1, torch::indexing::Slice(t - 3, torch::indexing::None)}, 0);
  if (c.head == emoe::Head::kSequenceClassification)
    in.labels = torch::randint(0, 2, {b}, torch::kLong);
  else if (c.head == emoe::Head::kSeq2SeqLM)
    in.labels = torch::randint(2, 60, {b, 5}, torch::kLong);
  else
    in.labels = in.input_ids.clone();
  in.output_logits = false;
  return in;
}

Step train_step(emoe::PretrainedModelImpl& model, const Case& c, const emoe::ModelInputs& in,
                bool checkpoint) {
  model.set_gradient_checkpointing(checkpoint);
  model.zero_grad();
  for (auto& r : emoe::routed_modules(model)) r.routed->take_usage(true);
  torch::manual_seed(11);  // dropout seeds and gate noise
  emoe::reset_cpu_tensor_peak();
  Step s;
  torch::Tensor loss;
  {
    emoe::PrecisionScope scope(c.bf16 ? emoe::Precision::kBf16Mixed : emoe::Precision::kFp32,
                               torch::kCPU);
    loss = model.forward(in).loss;
    if (auto aux = emoe::routed_aux_loss(model); aux.defined()) {
      s.aux = aux.item<double>();
      loss = loss + aux;
    }
  }
  s.loss = loss.item<double>();
  loss.backward();
  s.peak = emoe::cpu_tensor_peak_bytes();
  for (const auto& p : model.named_parameters())
    if (p.value().grad().defined()) s.grads[p.key()] = p.value().grad().clone();
  for (auto& r : emoe::routed_modules(model)) s.usage.push_back(r.routed->take_usage(true));
  return s;
}

TEST_P(Recompute, GivesTheStepWithoutIt) {
  const Case& c = GetParam();
  emoe::tune_allocator();
  torch::manual_seed(0);
  auto model = emoe::create_model(emoe::JsonFields(c.config, "config.json"), c.head, 2);
  std::vector<std::string> sets = {"model=m", "task=sst2"};
  sets.insert(sets.end(), c.sets.begin(), c.sets.end());
  auto cfg = emoe::load_run_config("", sets);
  const auto in = inputs_for(c, 3, 12);
  emoe::apply_method(*model, cfg, {in});
  model->train();

  const auto plain = train_step(*model, c, in, false);
  const int64_t runs = emoe::checkpointed_block_runs(), again = emoe::recomputed_block_runs();
  const auto ckpt = train_step(*model, c, in, true);
  const auto blocks = static_cast<int64_t>(model->blocks().size());
  EXPECT_EQ(emoe::checkpointed_block_runs() - runs, blocks);
  EXPECT_EQ(emoe::recomputed_block_runs() - again, blocks);
  EXPECT_FALSE(emoe::recomputing());

  EXPECT_EQ(plain.loss, ckpt.loss);
  EXPECT_EQ(plain.aux, ckpt.aux);
  if (c.name.find("Balanced") != std::string::npos) EXPECT_GT(plain.aux, 0.0);
  ASSERT_FALSE(plain.grads.empty());
  ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
  size_t nonzero = 0;
  for (const auto& [key, g] : plain.grads) {
    SCOPED_TRACE(key);
    ASSERT_TRUE(ckpt.grads.count(key));
    // the same operations on the same values; only where a gradient is summed over several
    // blocks (T5's position bias) may the order of the sum differ
    const double scale = std::max(1.0, g.abs().max().item<double>());
    EXPECT_LE(emoe::test::max_abs_diff(g, ckpt.grads.at(key)), 1e-6 * scale);
    nonzero += g.abs().sum().item<double>() > 0;  // (not LoRA's A: B starts at zero)
  }
  EXPECT_GT(nonzero * 2, plain.grads.size());
  ASSERT_EQ(plain.usage.size(), ckpt.usage.size());
  for (size_t i = 0; i < plain.usage.size(); ++i)
    EXPECT_TRUE(torch::equal(plain.usage[i], ckpt.usage[i])) << "routed module " << i;
}

INSTANTIATE_TEST_SUITE_P(Architectures, Recompute, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Where the memory goes: a 6-layer model at a length where activations dominate holds less at
// its peak with every block checkpointed (the counting allocator's peak over forward+backward).
TEST(Recompute, HoldsLessActivationMemory) {
  emoe::tune_allocator();
  auto config = llama_config();
  config["num_hidden_layers"] = 6;
  config["hidden_size"] = 64;
  config["intermediate_size"] = 128;
  Case c{"", config, emoe::Head::kCausalLM, {"method=full"}};
  torch::manual_seed(0);
  auto model = emoe::create_model(emoe::JsonFields(config, "config.json"), c.head, 2);
  model->train();
  const auto in = inputs_for(c, 4, 64);
  const auto plain = train_step(*model, c, in, false);
  const auto ckpt = train_step(*model, c, in, true);
  EXPECT_EQ(plain.loss, ckpt.loss);
  EXPECT_LT(ckpt.peak, plain.peak * 3 / 4) << "peak " << ckpt.peak << " vs " << plain.peak;
}

// Evaluation and generation never checkpoint: a forward in eval mode, or with grad mode off,
// runs each block once.
TEST(Recompute, OnlyTrainingForwardsCheckpoint) {
  torch::manual_seed(0);
  auto model =
      emoe::create_model(emoe::JsonFields(llama_config(), "config.json"), emoe::Head::kCausalLM, 2);
  Case c{"", llama_config(), emoe::Head::kCausalLM, {"method=full"}};
  auto in = inputs_for(c, 2, 8);
  model->set_gradient_checkpointing(true);
  const int64_t runs = emoe::checkpointed_block_runs();
  model->eval();
  model->forward(in);
  model->train();
  {
    torch::NoGradGuard g;
    model->forward(in);
  }
  EXPECT_EQ(emoe::checkpointed_block_runs(), runs);
  model->forward(in);
  EXPECT_EQ(emoe::checkpointed_block_runs() - runs, 3);
}

// A routed module holds its balance loss, which a checkpointed block hands out as an output of
// its recomputation node: the node's forward closure must not keep the block alive, or a model
// trained with balance losses would never be freed.
TEST(Recompute, AModelTrainedWithBalanceLossesIsFreed) {
  std::vector<std::weak_ptr<torch::nn::Module>> weak;  // the model and every module in it
  {
    Case c{"", bert_config(), emoe::Head::kSequenceClassification, {}};
    torch::manual_seed(0);
    auto model = emoe::create_model(emoe::JsonFields(c.config, "config.json"), c.head, 2);
    auto cfg = emoe::load_run_config(
        "", {"model=m", "task=sst2", "method=gmoe", "moe.experts=4", "moe.topk=2",
             "moe.layers=[0,1,2]", "moe.balance_loss=switch", "moe.balance_weight=0.1"});
    const auto in = inputs_for(c, 2, 8);
    emoe::apply_method(*model, cfg, {in});
    model->train();
    const auto step = train_step(*model, c, in, true);
    EXPECT_GT(step.aux, 0.0);
    for (const auto& m : model->modules()) weak.push_back(m);
  }
  ASSERT_GT(weak.size(), 10u);
  for (size_t i = 0; i < weak.size(); ++i) EXPECT_TRUE(weak[i].expired()) << "module " << i;
}

}  // namespace
