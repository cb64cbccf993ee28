// A training run's context: set-up before the loop and results.json after it.
#include "emoe/train/run_context.h"

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "emoe/analysis/flops.h"
#include "emoe/core/error.h"
#include "emoe/core/logging.h"
#include "emoe/core/runtime.h"
#include "emoe/io/atomic_file.h"
#include "emoe/methods/model_folder.h"
#include "emoe/models/architecture.h"
#include "emoe/models/routed.h"
#include "emoe/train/checkpoint.h"
#include "emoe/train/method.h"

namespace emoe {
namespace fs = std::filesystem;

namespace {

// The model folder's config.json model_type ("" when it cannot be read: the loader reports it).
std::string run_model_type(const std::string& dir) {
  std::ifstream in((fs::path(dir) / "config.json").string());
  if (!in) return "";
  try {
    auto j = nlohmann::json::parse(in);
    return j.value("model_type", std::string());
  } catch (const nlohmann::json::exception&) {
    return "";
  }
}

// seq2seq needs an encoder-decoder model, and the other objectives need one without a decoder
// (the architecture's traits say which it is; an unreadable config is the loader's to report).
void check_objective_fits_model(const std::string& model, ObjectiveKind objective) {
  const std::string model_type = run_model_type(model);
  const Architecture* arch = find_architecture(model_type);
  const bool encoder_decoder = arch && arch->encoder_decoder;
  const bool seq2seq = objective == ObjectiveKind::kSeq2Seq;
  EMOE_CHECK(!seq2seq || encoder_decoder || model_type.empty(), InputError,
             "run config: objective: seq2seq needs an encoder-decoder model (model_type t5); {} "
             "is a {} model",
             model, model_type);
  EMOE_CHECK(seq2seq || !encoder_decoder, InputError,
             "run config: objective: {} is not available for the encoder-decoder model {} ({}); "
             "use objective: seq2seq",
             to_string(objective), model, model_type);
}

void setup_model(TrainContext& c) {
  const auto& cfg = c.cfg;
  LoadOptions lo;
  lo.dtype = parse_dtype(cfg.dtype);
  c.objective->set_head(lo);
  lo.allow_new_head = true;
  MoeState start_moe;
  PeftConfig start_peft;
  c.model = load_any_model(cfg.model, lo, &start_moe, &start_peft);
  EMOE_CHECK(start_peft.method == PeftMethod::kNone, UsageError,
             "{}: has adapters (peft.json); export it first (emoe export --dense)", cfg.model);
  c.moe = start_moe;
  if (cfg.uses_moe()) {
    EMOE_CHECK(start_moe.empty(), UsageError,
               "{}: is already converted ({}); use method full to fine-tune it as it is", cfg.model,
               to_string(start_moe.config.method));
  }
  // the pad id is not known yet: sample batches are padded with 0
  auto st =
      apply_method(*c.model, cfg,
                   cfg.uses_moe() ? c.objective->sample_inputs(cfg.moe.sample_tokens, c.pad_id)
                                  : std::vector<ModelInputs>());
  if (cfg.uses_moe()) c.moe = st.moe;
  c.peft = st.peft;
  c.model->to(c.device, parse_dtype(cfg.dtype));
  c.model->train();
  c.model->set_gradient_checkpointing(cfg.train.gradient_checkpointing);
  if (cfg.train.gradient_checkpointing)
    spdlog::info(
        "gradient checkpointing: each of the {} transformer blocks keeps only its input "
        "and runs again in the backward pass",
        c.model->blocks().size());
  auto counts = count_parameters(*c.model);
  spdlog::info("{} on {}: {} parameters, {} trainable ({:.2f} %)", cfg.method,
               c.model->summary().model_type, counts.total, counts.trainable,
               100.0 * counts.trainable / std::max<int64_t>(1, counts.total));
}

// The model against the run and its tokenizer, before the run folder is written: positions,
// vocabulary, and weights that are finite to begin with.
void check_model_fits_run(const TrainContext& c) {
  const ModelSummary& s = c.model->summary();
  EMOE_CHECK(
      !s.learned_positions || s.max_positions <= 0 || c.cfg.train.max_length <= s.max_positions,
      InputError,
      "run config: train.max_length: {} exceeds the {} learned positions of {} "
      "(config.json max_position_embeddings); expected at most {}",
      c.cfg.train.max_length, s.max_positions, c.cfg.model, s.max_positions);
  EMOE_CHECK(c.tok->vocab_size() <= s.vocab_size, InputError,
             "{}: the tokenizer has {} tokens but the model's embedding has {} rows (config.json "
             "vocab_size); ids past {} would index nothing",
             c.cfg.model, c.tok->vocab_size(), s.vocab_size, s.vocab_size - 1);
  const std::string bad = first_nonfinite_parameter(*c.model);
  EMOE_CHECK(bad.empty(), InputError,
             "{}: tensor '{}' holds NaN or infinite values; a model with broken weights cannot be "
             "fine-tuned",
             c.cfg.model, bad);
}

// Analytic cost at the run's length bounds (what a padded batch computes per token).
nlohmann::json cost_record(const TrainContext& c) {
  const ModelSummary& sm = c.model->summary();
  MethodCost cost;
  cost.name = c.cfg.method;
  cost.moe = !c.moe.empty();
  cost.moe_config = c.moe.config;
  cost.moe_layers = static_cast<int64_t>(c.moe.splits.size());
  for (const auto& kv : c.moe.splits)
    if (kv.first >= sm.num_layers && sm.encoder_decoder()) ++cost.moe_decoder_layers;
  cost.peft = c.peft;
  cost.trainable_body = c.peft.method == PeftMethod::kNone;
  const int64_t max_length = c.cfg.train.max_length;
  const int64_t seq =
      std::min<int64_t>(max_length, sm.max_positions > 0 ? sm.max_positions : max_length);
  const FlopCount fl = count_flops(sm, cost, seq, c.objective->target_length());
  return {{"seq_len", seq},
          {"forward_gmacs_per_token", fl.forward_total / 1e9},
          {"train_gmacs_per_token", fl.train_total / 1e9}};
}

}  // namespace

void start_train_process(TrainContext& c, const DistOptions& dist) {
  if (!dist.enabled()) {
    configure_threads(c.cfg.threads);
    return;
  }
  // the local ranks share the cores unless train threads were given
  int threads = c.cfg.threads;
  if (threads <= 0)
    threads =
        std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / dist.local_world_size);
  configure_threads(threads);
  c.comm = std::make_unique<Communicator>(dist);
  if (!c.main_rank()) spdlog::set_level(std::max(spdlog::get_level(), spdlog::level::warn));
  spdlog::info("data parallel: {} ranks (c10d Gloo, rendezvous {}:{}), {} threads each",
               dist.world_size, dist.master_addr, dist.master_port, threads);
}

namespace {

// One run per folder: a second writer stops before it reads or writes anything there.
void lock_run_folder(TrainContext& c) {
  if (c.main_rank() && !c.lock && fs::is_directory(c.dir))
    c.lock = std::make_unique<FolderLock>(c.dir);
}

}  // namespace

void check_resume(TrainContext& c, bool resume) {
  lock_run_folder(c);
  const bool has_checkpoint = !latest_checkpoint(c.dir).empty();
  EMOE_CHECK(resume || !has_checkpoint, UsageError,
             "{}: already holds a run (checkpoints/); pass --resume to continue it or choose "
             "another output",
             c.dir);
  if (resume && fs::exists(fs::path(c.dir) / "config.json")) {
    auto differ = run_config_differences(
        JsonFields::from_file((fs::path(c.dir) / "config.json").string()).raw(), c.cfg);
    EMOE_CHECK(differ.empty(), UsageError,
               "{}: --resume needs the run's own config; config.json differs from the one given "
               "in {}",
               c.dir, fmt::join(differ, ", "));
  }
}

namespace {

// The parameters of each transformer block that sharding full gathers around the block: those
// registered once in the model (not tied to another module) and not read outside their block.
std::vector<std::vector<ParameterShards::Member>> shardable_block_parameters(
    PretrainedModelImpl& model) {
  std::map<const void*, int> seen;
  for (const auto& p : model.named_parameters()) seen[p.value().unsafeGetTensorImpl()] += 1;
  const auto blocks = model.blocks();
  std::vector<std::vector<ParameterShards::Member>> out(blocks.size());
  for (size_t b = 0; b < blocks.size(); ++b)
    for (const auto& p : blocks[b]->named_parameters())
      if (seen[p.value().unsafeGetTensorImpl()] == 1 && !model.read_outside_block(p.key()))
        out[b].push_back({p.value(), 0});
  return out;
}

// sharding full: the trainable parameters outside the blocks and those inside, each balanced by
// size over the ranks, so that every rank holds a like share of the blocks' weights as well as
// of the AdamW state.
std::vector<int> full_sharding_owners(PretrainedModelImpl& model,
                                      const std::vector<torch::Tensor>& params, int world) {
  std::set<const void*> in_blocks;
  for (const auto& block : shardable_block_parameters(model))
    for (const auto& m : block) in_blocks.insert(m.param.unsafeGetTensorImpl());
  std::vector<int64_t> numel[2];
  for (const auto& p : params) numel[in_blocks.count(p.unsafeGetTensorImpl())].push_back(p.numel());
  const std::vector<int> owner[2] = {partition_by_size(numel[0], world),
                                     partition_by_size(numel[1], world)};
  std::vector<int> out;
  size_t next[2] = {0, 0};
  for (const auto& p : params) {
    const size_t side = in_blocks.count(p.unsafeGetTensorImpl());
    out.push_back(owner[side][next[side]++]);
  }
  return out;
}

}  // namespace

std::unique_ptr<GradientSync> start_gradient_sync(TrainContext& c, Optimizer& opt) {
  if (!c.comm) {
    if (c.cfg.train.sharding != "none")
      spdlog::info("train.sharding {}: one process, nothing to share (it holds everything)",
                   c.cfg.train.sharding);
    return nullptr;
  }
  // identical weights everywhere (rank 0's), then gradients averaged over the ranks
  std::vector<torch::Tensor> all;
  for (auto& p : c.model->parameters()) all.push_back(p);
  for (auto& b : c.model->buffers()) all.push_back(b);
  {
    torch::NoGradGuard g;
    c.comm->broadcast(all, 0);
  }
  const ShardingLevel level = parse_sharding(c.cfg.train.sharding, "run config: train.sharding");
  auto sync = std::make_unique<GradientSync>(
      *c.comm, opt.parameters(), level,
      level == ShardingLevel::kFull
          ? full_sharding_owners(*c.model, opt.parameters(), c.comm->size())
          : std::vector<int>{});
  if (sync->sharded())
    spdlog::info(
        "sharding {} (ZeRO stage {}): this rank owns {} of {} trainable parameters; "
        "gradients {} in {} bucket(s)",
        to_string(level),
        level == ShardingLevel::kOptimizer ? 1 : (level == ShardingLevel::kGradients ? 2 : 3),
        sync->owned_numel(),
        [&] {
          int64_t n = 0;
          for (auto& p : opt.parameters()) n += p.numel();
          return n;
        }(),
        level == ShardingLevel::kOptimizer ? "all-reduced" : "reduced to their owner",
        sync->buckets());
  else
    spdlog::info("gradients all-reduced in {} bucket(s)", sync->buckets());
  return sync;
}

std::unique_ptr<ParameterShards> start_parameter_shards(TrainContext& c, Optimizer& opt,
                                                        GradientSync& sync) {
  if (!c.comm || sync.level() != ShardingLevel::kFull) return nullptr;
  std::map<const void*, size_t> trainable;
  const auto params = opt.parameters();
  for (size_t k = 0; k < params.size(); ++k) trainable[params[k].unsafeGetTensorImpl()] = k;
  auto members = shardable_block_parameters(*c.model);
  // trainable: owned as the gradients are; frozen (adapters' base weights): balanced by size
  std::vector<ParameterShards::Member*> frozen;
  std::vector<int64_t> frozen_numel;
  std::vector<char> left_to_owner(params.size(), 0);
  for (auto& block : members)
    for (auto& m : block) {
      const auto t = trainable.find(m.param.unsafeGetTensorImpl());
      if (t != trainable.end()) {
        m.owner = sync.owner(t->second);
        left_to_owner[t->second] = 1;
      } else {
        frozen.push_back(&m);
        frozen_numel.push_back(m.param.numel());
      }
    }
  const auto frozen_owner = partition_by_size(frozen_numel, c.comm->size());
  for (size_t i = 0; i < frozen.size(); ++i) frozen[i]->owner = frozen_owner[i];
  sync.leave_to_owners(std::move(left_to_owner));
  auto shards = std::make_unique<ParameterShards>(*c.comm, std::move(members));
  int64_t total = 0;
  for (const auto& p : c.model->parameters()) total += p.numel();
  spdlog::info(
      "sharding full: {} of the {} blocks' {} parameters live on this rank between uses ({} of "
      "the model's {} are outside the blocks and stay whole)",
      shards->owned_numel(), shards->blocks(), shards->sharded_numel(),
      total - shards->sharded_numel(), total);
  c.model->set_block_hooks(shards.get());
  return shards;
}

void prepare_run(TrainContext& c) {
  torch::manual_seed(static_cast<uint64_t>(c.cfg.train.seed));
  check_objective_fits_model(c.cfg.model, c.cfg.objective);
  c.tok = load_tokenizer(c.cfg.model);
  c.objective = make_objective(c.cfg);
  c.objective->load_data(*c.tok);
  EMOE_CHECK(!c.objective->train().empty(), InputError, "no training examples");
  setup_model(c);
  check_model_fits_run(c);
  if (c.main_rank()) {
    std::error_code ec;
    fs::create_directories(c.dir, ec);
    EMOE_CHECK(!ec, RuntimeError, "{}: cannot create the run folder: {}", c.dir, ec.message());
    lock_run_folder(c);
    c.lock->record_pid();
    write_text_atomic((fs::path(c.dir) / "config.json").string(), c.cfg.to_json().dump(2) + "\n");
  }
  const auto& s = c.model->summary();
  c.pad_id = c.tok->special().pad.value_or(s.pad_token_id.value_or(s.eos_token_id.value_or(0)));
}

StepPlan plan_steps(const TrainOptions& o, int64_t n) {
  StepPlan p;
  p.n = n;
  p.batches_per_epoch = (n + o.batch_size - 1) / o.batch_size;
  p.steps_per_epoch = (p.batches_per_epoch + o.grad_accum - 1) / o.grad_accum;
  p.total_steps = o.max_steps > 0 ? o.max_steps : o.epochs * p.steps_per_epoch;
  p.epochs =
      o.max_steps > 0 ? (p.total_steps + p.steps_per_epoch - 1) / p.steps_per_epoch : o.epochs;
  p.warmup = o.warmup_steps > 0
                 ? o.warmup_steps
                 : static_cast<int64_t>(o.warmup_ratio * static_cast<double>(p.total_steps));
  return p;
}

nlohmann::json run_results(TrainContext& c, const TrainState& st, const RunForms& forms) {
  nlohmann::json best_sets;
  for (const auto& h : st.history)
    if (h["epoch"].get<int64_t>() == st.best_epoch) best_sets = h["sets"];
  const auto& cfg = c.cfg;
  auto counts = count_parameters(*c.model);
  nlohmann::json res = {{"model", cfg.model},
                        {"method", cfg.method},
                        {"objective", to_string(cfg.objective)},
                        {"task", cfg.task},
                        {"seed", cfg.train.seed},
                        {"lr", cfg.train.lr},
                        {"ablation", to_string(cfg.ablation)},
                        {"best_epoch", st.best_epoch},
                        {"best", best_sets},
                        {"main_metric", c.objective->main_metric()},
                        {"epochs_run", st.epoch},
                        {"steps", st.step},
                        {"skipped_steps", st.skipped_steps},
                        {"train_seconds", st.train_seconds},
                        {"parameters", {{"total", counts.total}, {"trainable", counts.trainable}}},
                        {"history", st.history}};
  res["cost"] = cost_record(c);
  // which form each folder computes: recomposed (dense), or routed as trained
  const bool routed = !routed_modules(*c.model).empty();
  res["model_computes"] = forms.recomposed ? "dense" : routed ? "routed" : "dense";
  if (!c.moe.empty()) res["model_moe_computes"] = "routed";
  if (forms.recomposed) {
    res["best_routed"] = forms.routed.is_null() ? best_sets : forms.routed;
    res["best_dense"] = forms.dense;
  }
  c.objective->add_results(res, best_sets);
  return res;
}

}  // namespace emoe
