// Training memory per method: parameters counted on the model with the method applied, bytes
// from the dtype, activations from Korthikanti et al.'s per-layer estimate.
#include "emoe/train/memory.h"

#include <torch/torch.h>

#include <cmath>

#include "emoe/core/error.h"
#include "emoe/dist/grad_sync.h"
#include "emoe/io/hf_config.h"
#include "emoe/models/loader.h"
#include "emoe/train/method.h"

namespace emoe {

int64_t activation_bytes(const ModelSummary& s, int64_t batch, int64_t seq_len,
                         c10::ScalarType dtype) {
  const double sq = static_cast<double>(seq_len), b = static_cast<double>(batch);
  const double h = static_cast<double>(s.hidden_size), a = static_cast<double>(s.num_heads);
  const double per_layer_16bit = sq * b * h * (34.0 + 5.0 * a * sq / h);
  const double scale = static_cast<double>(c10::elementSize(dtype)) / 2.0;
  return static_cast<int64_t>(per_layer_16bit * scale * static_cast<double>(s.ffn_layers()));
}

int64_t checkpointed_activation_bytes(const ModelSummary& s, int64_t batch, int64_t seq_len,
                                      c10::ScalarType dtype) {
  const int64_t layers = s.ffn_layers();
  if (layers == 0) return 0;
  const int64_t inputs =
      layers * batch * seq_len * s.hidden_size * static_cast<int64_t>(c10::elementSize(dtype));
  return inputs + activation_bytes(s, batch, seq_len, dtype) / layers;
}

namespace {

// The largest expert count up to the default that divides d_ff (the run config's default of
// 64 does not divide every model's).
int64_t dividing_experts(int64_t wanted, int64_t d_ff) {
  for (int64_t n = std::min(wanted, d_ff); n > 1; --n)
    if (d_ff % n == 0) return n;
  return 1;
}

}  // namespace

TrainingMemory training_memory(const std::string& model_dir, const std::string& method,
                               int64_t batch, int64_t seq_len, c10::ScalarType dtype) {
  const JsonFields config = read_model_config(model_dir);
  torch::manual_seed(0);
  auto model = create_model(config, default_head(config));
  const ModelSummary& s = model->summary();
  std::vector<std::string> sets = {"model=" + model_dir, "task=sst2", "method=" + method};
  RunConfig cfg = load_run_config("", sets);
  std::vector<ModelInputs> sample;
  if (cfg.uses_moe()) {
    const int64_t n = dividing_experts(cfg.moe.experts, s.intermediate_size);
    sets.push_back("moe.experts=" + std::to_string(n));
    sets.push_back("moe.topk=" + std::to_string(std::min(cfg.moe.topk, n)));
    // the counts do not depend on which neurons go where: the cheapest split
    sets.push_back("moe.split=random");
    cfg = load_run_config("", sets);
    // MoEfication's router learns from activations: a few random tokens give its shape
    ModelInputs in;
    in.input_ids = torch::randint(0, std::max<int64_t>(1, s.vocab_size), {2, 16}, torch::kLong);
    in.attention_mask = torch::ones({2, 16}, torch::kLong);
    sample.push_back(in);
  }
  apply_method(*model, cfg, sample);  // (MoEfication trains its router here: autograd on)
  const auto counts = count_parameters(*model);
  TrainingMemory m;
  m.method = method;
  m.parameters = counts.total;
  m.trainable = counts.trainable;
  const int64_t bytes = static_cast<int64_t>(c10::elementSize(dtype));
  m.weights = counts.total * bytes;
  m.gradients = counts.trainable * bytes;
  m.optimizer = counts.trainable * 2 * 4;
  m.activations = activation_bytes(s, batch, seq_len, dtype);
  m.checkpointed_activations = checkpointed_activation_bytes(s, batch, seq_len, dtype);
  return m;
}

TrainingMemory per_rank_memory(const TrainingMemory& whole, int64_t batch, int world,
                               const std::string& sharding) {
  EMOE_CHECK(world >= 1 && batch >= 1, UsageError,
             "memory per rank: expected ranks >= 1 and batch >= 1, got {} and {}", world, batch);
  const ShardingLevel level = parse_sharding(sharding, "train.sharding");
  const auto share = [world](int64_t bytes) { return (bytes + world - 1) / world; };
  TrainingMemory m = whole;
  const int64_t per_rank_batch = (batch + world - 1) / world;
  const double batch_share = static_cast<double>(per_rank_batch) / static_cast<double>(batch);
  m.activations = std::llround(static_cast<double>(whole.activations) * batch_share);
  m.checkpointed_activations =
      std::llround(static_cast<double>(whole.checkpointed_activations) * batch_share);
  if (level != ShardingLevel::kNone) m.optimizer = share(whole.optimizer);
  if (level == ShardingLevel::kGradients || level == ShardingLevel::kFull)
    m.gradients = share(whole.gradients);
  // full: the blocks' weights on their owners (plus the one block in use, not counted here)
  if (level == ShardingLevel::kFull) m.weights = share(whole.weights);
  return m;
}

}  // namespace emoe
