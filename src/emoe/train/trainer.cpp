// The training loop and the run folder; what differs per objective is an Objective (objective.h).
#include "emoe/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "emoe/core/bf16_shadow.h"
#include "emoe/core/error.h"
#include "emoe/core/logging.h"
#include "emoe/core/runtime.h"
#include "emoe/io/atomic_file.h"
#include "emoe/io/safetensors.h"
#include "emoe/methods/model_folder.h"
#include "emoe/models/routed.h"
#include "emoe/moe/kernel_choices.h"
#include "emoe/moe/usage.h"
#include "emoe/train/checkpoint.h"
#include "emoe/train/objective.h"
#include "emoe/train/optim.h"
#include "emoe/train/precision.h"
#include "emoe/train/progress.h"
#include "emoe/train/run_context.h"

namespace emoe {
namespace fs = std::filesystem;

namespace {

// Ablations of SPEC §3.4: the MoE plugs compute the dense FFN in one phase.
void set_phase(TrainContext& c, bool evaluating) {
  bool dense = false;
  if (c.cfg.ablation == Ablation::kTrainDenseEvalMoe) dense = !evaluating;
  if (c.cfg.ablation == Ablation::kTrainMoeEvalDense) dense = evaluating;
  set_routed_dense_override(*c.model, dense);
}

ModelInputs to_inputs(const Batch& b, const c10::Device& dev) {
  ModelInputs in;
  in.input_ids = b.input_ids.to(dev);
  in.attention_mask = b.attention_mask.to(dev);
  in.token_type_ids = b.token_type_ids.defined() ? b.token_type_ids.to(dev) : torch::Tensor();
  in.labels = b.labels.to(dev);
  return in;
}

// Every evaluation set of the objective, as one JSON record.
nlohmann::json evaluate_all(TrainContext& c, UsageRecorder& usage, int64_t step) {
  set_phase(c, true);
  PrecisionScope precision(c.cfg.train.precision, c.device);
  EvalContext e{*c.model, *c.tok, c.pad_id, c.shard(), usage, step};
  nlohmann::json sets = c.objective->evaluate(e);
  set_phase(c, false);
  return sets;
}

// Every evaluation set once more with each routed layer forced to route (dense = false) or to
// compute its whole FFN (dense = true: what the recomposed model/ computes). Rank 0 alone, on
// every example; the run's usage record is left as training made it.
nlohmann::json evaluate_forced(TrainContext& c, bool dense, int64_t step) {
  set_routed_dense_override(*c.model, dense);
  UsageRecorder none;
  PrecisionScope precision(c.cfg.train.precision, c.device);
  EvalContext e{*c.model, *c.tok, c.pad_id, EvalShard{}, none, step};
  nlohmann::json sets = c.objective->evaluate(e);
  set_routed_dense_override(*c.model, false);
  return sets;
}

void append_metrics(const std::string& path, const nlohmann::json& record) {
  std::ofstream out(path, std::ios::app);
  out << record.dump() << "\n";
  EMOE_CHECK(out.good(), RuntimeError, "{}: write failed", path);
}

// One micro-batch on this rank, its logged numbers summed over the ranks of a data-parallel job.
struct MicroBatch {
  torch::Tensor loss;     // the task loss plus the balance losses (undefined without examples)
  double loss_value = 0;  // of `loss`; NaN when any rank's loss was not finite
  double mean_loss = 0, aux_loss = 0;  // the task loss and, apart, the balance losses
  double count = 0;    // what this rank's loss is the mean of (examples or target tokens)
  double tokens = 0;   // input tokens
  double scale = 1.0;  // this rank's share of the global mean
};

// The training loop over epochs, micro-batches and accumulation windows, with its checkpoints,
// evaluations and logs.
class TrainLoop {
 public:
  TrainLoop(TrainContext& c, bool resume);
  ~TrainLoop();
  TrainLoop(const TrainLoop&) = delete;
  TrainLoop& operator=(const TrainLoop&) = delete;
  TrainResult run();

 private:
  void restore(bool resume);
  void start_sync_and_usage();
  bool run_epochs();  // false: stopped after train.stop_after_steps
  bool train_batch(int64_t epoch, int64_t b, const std::vector<int64_t>& order);
  MicroBatch forward(const std::vector<const EncodedExample*>& ex);
  void sum_over_ranks(MicroBatch& m);
  bool optimizer_step(int64_t epoch, int64_t b);
  void log_step(int64_t epoch, double lr);
  void end_epoch(int64_t epoch);
  void checkpoint();
  void gather_optimizer_state();
  void share_kernel_choices();
  void drop_unowned_optimizer_state();
  double clip_sharded_gradients();
  nlohmann::json memory_record();
  // While it lives, the memory held is not the training's (a checkpoint's, gathered weights):
  // the peak so far is noted first, and the allocator's peak restarts when it goes.
  struct Unmeasured {
    explicit Unmeasured(TrainLoop& loop);
    ~Unmeasured();
    TrainLoop& loop;
  };
  // train.sharding full: the blocks' weights gathered (on every rank, or on `keep` alone) while
  // it lives, unmeasured. Nothing at the other levels.
  struct WholeWeights {
    WholeWeights(TrainLoop& loop, int keep);
    ~WholeWeights();
    TrainLoop& loop;
    std::optional<Unmeasured> unmeasured;
  };

  TrainContext& c_;
  const TrainOptions& o_;
  Optimizer opt_;
  const StepPlan plan_;
  const std::string metrics_path_, best_path_;
  int64_t kernel_shares_ = 0;  // checkpoints that shared rank 0's kernel choices (the first logs)
  TrainState st_;
  std::unique_ptr<GradientSync> sync_;
  std::unique_ptr<ParameterShards> shards_;  // train.sharding full
  UsageRecorder usage_;
  Progress progress_;
  bool done_ = false;
  bool skip_window_ = false;  // the accumulation window in progress saw a non-finite loss
  int64_t skips_in_a_row_ = 0;
  bool has_aux_ = false;
  double loss_acc_ = 0, aux_acc_ = 0;  // logged: the task loss and, apart, the balance losses
  int64_t loss_count_ = 0, tokens_acc_ = 0;
  // the most CPU tensor memory held outside checkpoint writing (which gathers the whole AdamW
  // state on rank 0 under sharding)
  int64_t peak_bytes_ = 0;
  int unmeasured_ = 0;  // Unmeasured scopes open
  // peak_bytes_ takes the allocator's peak so far (outside Unmeasured scopes)
  void note_peak() {
    if (unmeasured_ == 0) peak_bytes_ = std::max(peak_bytes_, cpu_tensor_peak_bytes());
  }
  std::chrono::steady_clock::time_point window_start_;
};

TrainLoop::TrainLoop(TrainContext& c, bool resume)
    : c_(c),
      o_(c.cfg.train),
      opt_(*c.model, c.cfg.train),
      plan_(plan_steps(c.cfg.train, c.objective->epoch_size())),
      metrics_path_((fs::path(c.dir) / "metrics.jsonl").string()),
      best_path_((fs::path(c.dir) / "best_state.safetensors").string()),
      progress_(plan_.total_steps, "train", c.cfg.train.log_every) {
  restore(resume);
  start_sync_and_usage();
  if (!c_.moe.empty() && c_.main_rank())
    write_text_atomic((fs::path(c_.dir) / "moe.json").string(),
                      moe_state_to_json(c_.moe).dump(1) + "\n");
  // The steps that will run: with train.max_steps that is not epochs x steps per epoch.
  const std::string steps =
      o_.max_steps > 0 ? fmt::format("{} steps (train.max_steps; an epoch is {} steps)",
                                     plan_.total_steps, plan_.steps_per_epoch)
                       : fmt::format("{} {} x {} steps", plan_.epochs,
                                     plan_.epochs == 1 ? "epoch" : "epochs", plan_.steps_per_epoch);
  spdlog::info("{} ({} examples, batch {} x {} accumulation), warm-up {}, {} schedule", steps,
               plan_.n, o_.batch_size, o_.grad_accum, plan_.warmup, to_string(o_.schedule));
  done_ = st_.step >= plan_.total_steps;
  window_start_ = std::chrono::steady_clock::now();
}

TrainLoop::~TrainLoop() {
  if (shards_) c_.model->set_block_hooks(nullptr);
}

TrainLoop::Unmeasured::Unmeasured(TrainLoop& l) : loop(l) {
  loop.note_peak();
  loop.unmeasured_ += 1;
}

TrainLoop::Unmeasured::~Unmeasured() {
  loop.unmeasured_ -= 1;
  reset_cpu_tensor_peak();
}

TrainLoop::WholeWeights::WholeWeights(TrainLoop& l, int keep) : loop(l) {
  if (!loop.shards_) return;
  unmeasured.emplace(loop);
  loop.shards_->gather_all(keep);
}

TrainLoop::WholeWeights::~WholeWeights() {
  if (loop.shards_) loop.shards_->release_all();
}

void TrainLoop::restore(bool resume) {
  if (resume && load_checkpoint(c_.dir, *c_.model, opt_, st_)) {
    spdlog::info("resumed {} at step {} (epoch {}, batch {})", c_.dir, st_.step, st_.epoch + 1,
                 st_.batch_in_epoch);
    if (c_.main_rank() && fs::exists(metrics_path_))
      fs::resize_file(metrics_path_, static_cast<uintmax_t>(st_.metrics_bytes));
  } else {
    if (resume) spdlog::info("{}: no checkpoint yet; starting from the beginning", c_.dir);
    if (c_.main_rank()) std::ofstream(metrics_path_, std::ios::trunc);
  }
}

void TrainLoop::start_sync_and_usage() {
  sync_ = start_gradient_sync(c_, opt_);
  if (sync_) shards_ = start_parameter_shards(c_, opt_, *sync_);
  drop_unowned_optimizer_state();  // a resumed checkpoint holds every rank's share
  usage_ = UsageRecorder(*c_.model);
  if (c_.comm) {
    Communicator* cm = c_.comm.get();
    usage_.set_reduce([cm](const std::vector<double>& v) { return cm->all_reduce_sum(v); });
  }
  usage_.discard(true);
  usage_.discard(false);
  usage_.restore(st_.usage);
}

void TrainLoop::checkpoint() {
  Unmeasured unmeasured(*this);  // the checkpoint's own memory is not the training's
  share_kernel_choices();
  // sharded: every rank sends its share of the optimiser state to rank 0 first, so that the
  // checkpoint is whole and resumes at any world size and sharding level
  if (sync_ && sync_->sharded()) gather_optimizer_state();
  WholeWeights weights(*this, 0);  // full: the blocks' weights on rank 0
  if (!c_.main_rank()) return;     // rank 0 writes; every rank resumes from it
  st_.metrics_bytes = static_cast<int64_t>(fs::file_size(metrics_path_));
  st_.usage = usage_.to_json();
  save_checkpoint(c_.dir, *c_.model, opt_, st_);
  usage_.save(c_.dir);
  if (sync_ && sync_->sharded()) drop_unowned_optimizer_state();
}

// Data parallel: every rank takes rank 0's timed kernel choices from here on (each rank timed its
// own on first sight, and may have chosen differently), so that the record the checkpoint keeps
// is what every rank computes with, in this run after the checkpoint as in a resumed one.
void TrainLoop::share_kernel_choices() {
  if (!c_.comm || c_.comm->size() < 2) return;
  std::vector<double> bytes;
  if (c_.main_rank()) {
    const auto text = kernel_choices_json().dump();
    for (unsigned char ch : text) bytes.push_back(static_cast<double>(ch));
  }
  const auto rows = c_.comm->all_gather(bytes);
  const bool first = kernel_shares_++ == 0;
  if (c_.main_rank()) {
    if (first)
      spdlog::info(
          "data parallel: every rank computes on rank 0's timed kernels from step {} on (the "
          "record a checkpoint keeps)",
          st_.step);
    return;
  }
  std::string text;
  text.reserve(rows[0].size());
  for (double b : rows[0]) text.push_back(static_cast<char>(static_cast<unsigned char>(b)));
  const auto pin = pin_kernel_choices(nlohmann::json::parse(text), "rank 0's record");
  if (!pin.pinned && first) spdlog::warn("rank {}: {}", c_.comm->rank(), pin.message);
}

// Parameter by parameter (bounded memory), its owner broadcasts [has state, step] and then the
// two moments; rank 0 keeps them until the checkpoint is written, the others let them go.
void TrainLoop::gather_optimizer_state() {
  torch::NoGradGuard no_grad;
  const auto params = opt_.parameters();
  const int me = c_.comm->rank();
  for (size_t k = 0; k < params.size(); ++k) {
    const int owner = sync_->owner(k);
    Optimizer::ParamState s = me == owner ? opt_.state_of(params[k]) : Optimizer::ParamState{};
    std::vector<torch::Tensor> head = {torch::tensor(
        {s.exp_avg.defined() ? 1.0 : 0.0, static_cast<double>(s.step)}, torch::kFloat64)};
    c_.comm->broadcast(head, owner);
    if (head[0][0].item<double>() == 0 || me == owner) {
      if (me == owner && s.exp_avg.defined()) {
        std::vector<torch::Tensor> moments = {s.exp_avg, s.exp_avg_sq};
        c_.comm->broadcast(moments, owner);
      }
      continue;
    }
    std::vector<torch::Tensor> moments = {torch::empty_like(params[k]),
                                          torch::empty_like(params[k])};
    c_.comm->broadcast(moments, owner);
    if (c_.main_rank())
      opt_.set_state(params[k],
                     {static_cast<int64_t>(head[0][1].item<double>()), moments[0], moments[1]});
  }
}

void TrainLoop::drop_unowned_optimizer_state() {
  if (!sync_ || !sync_->sharded()) return;
  const auto params = opt_.parameters();
  for (size_t k = 0; k < params.size(); ++k)
    if (!sync_->owns(k)) opt_.drop_state(params[k]);
}

// The global gradient norm from each rank's own gradients, and the owned gradients clipped as
// torch::nn::utils::clip_grad_norm_ clips them (max_norm / (norm + 1e-6) when below 1).
double TrainLoop::clip_sharded_gradients() {
  const double norm = std::sqrt(sync_->global_grad_norm_sq());
  if (o_.grad_clip <= 0 || !std::isfinite(norm)) return norm;
  const double coef = o_.grad_clip / (norm + 1e-6);
  if (coef < 1) {
    torch::NoGradGuard no_grad;
    for (auto& p : opt_.parameters())
      if (p.grad().defined()) p.mutable_grad().mul_(coef);
  }
  return norm;
}

// The largest tensor memory each rank held (CPU tensors, counted by the allocator; the moments
// of writing a checkpoint left out), with the sharding level: results.json's "memory" and a log
// line.
nlohmann::json TrainLoop::memory_record() {
  note_peak();
  std::vector<double> mine = {static_cast<double>(peak_bytes_),
                              static_cast<double>(opt_.state_bytes()),
                              static_cast<double>(bf16_shadow_bytes())};
  std::vector<std::vector<double>> all = {mine};
  if (c_.comm) all = c_.comm->all_gather(mine);
  std::vector<double> peak, state, copies;
  for (const auto& r : all) {
    peak.push_back(r[0] / (1024.0 * 1024.0));
    state.push_back(r[1] / (1024.0 * 1024.0));
    copies.push_back(r[2] / (1024.0 * 1024.0));
  }
  // (the bfloat16 copies of the parameters that the optimiser writes under bf16 autocast:
  // core/bf16_shadow.h)
  nlohmann::json j = {{"sharding", sync_ ? to_string(sync_->level()) : std::string("none")},
                      {"world_size", static_cast<int64_t>(all.size())},
                      {"peak_tensor_mib_per_rank", peak},
                      {"optimizer_state_mib_per_rank", state},
                      {"bf16_copies_mib_per_rank", copies}};
  std::vector<std::string> shown;
  for (size_t r = 0; r < peak.size(); ++r)
    shown.push_back(copies[r] > 0 ? fmt::format("rank {} {:.0f} MiB (AdamW state {:.0f} MiB, "
                                                "bf16 copies of the weights {:.0f} MiB)",
                                                r, peak[r], state[r], copies[r])
                                  : fmt::format("rank {} {:.0f} MiB (AdamW state {:.0f} MiB)", r,
                                                peak[r], state[r]));
  if (c_.main_rank()) spdlog::info("peak CPU tensor memory: {}", fmt::join(shown, ", "));
  return j;
}

bool TrainLoop::run_epochs() {
  set_phase(c_, false);
  for (int64_t epoch = st_.epoch; epoch < plan_.epochs && !done_; ++epoch) {
    st_.epoch = epoch;
    auto order = c_.objective->training_order(epoch);
    auto epoch_start = std::chrono::steady_clock::now();
    c_.model->train();
    for (int64_t b = st_.batch_in_epoch; b < plan_.batches_per_epoch && !done_; ++b)
      if (train_batch(epoch, b, order)) return false;
    st_.train_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
    if (c_.main_rank()) progress_.finish();
    if (o_.usage_interval == 0 || st_.step % o_.usage_interval != 0)
      usage_.snapshot(st_.step, "train", true);
    end_epoch(epoch);
  }
  return true;
}

// Micro-batch b of the epoch, and at an accumulation boundary the optimiser step; true when the
// run stops there (train.stop_after_steps).
bool TrainLoop::train_batch(int64_t epoch, int64_t b, const std::vector<int64_t>& order) {
  // the global batch b; in a data-parallel job this rank takes its members rank, rank + size, ...
  const int64_t first = b * o_.batch_size, last = std::min(plan_.n, (b + 1) * o_.batch_size);
  const int64_t stride = c_.comm ? c_.comm->size() : 1, offset = c_.comm ? c_.comm->rank() : 0;
  const auto& pool = c_.objective->train();
  std::vector<const EncodedExample*> ex;
  for (int64_t i = first + offset; i < last; i += stride) ex.push_back(&pool[order[i]]);
  const bool boundary = (b + 1) % o_.grad_accum == 0 || b + 1 == plan_.batches_per_epoch;
  if (sync_ && boundary) sync_->arm();
  MicroBatch m = forward(ex);
  if (c_.comm) sum_over_ranks(m);
  if (!std::isfinite(m.loss_value)) {
    EMOE_CHECK(o_.nonfinite == NonFinitePolicy::kSkip, RuntimeError,
               "non-finite loss at step {} (epoch {}, batch {}); lower the learning rate "
               "(or set train.nonfinite: skip)",
               st_.step, epoch + 1, b);
    skip_window_ = true;
  }
  if (!skip_window_ && !ex.empty() && m.count > 0)
    (m.loss * (m.scale / static_cast<double>(o_.grad_accum))).backward();
  if (shards_) shards_->release_all();  // the block backward reached last
  if (std::isfinite(m.loss_value))
    loss_acc_ += m.mean_loss, aux_acc_ += m.aux_loss, loss_count_ += 1;
  tokens_acc_ += static_cast<int64_t>(m.tokens);
  return boundary && optimizer_step(epoch, b);
}

MicroBatch TrainLoop::forward(const std::vector<const EncodedExample*>& ex) {
  MicroBatch m;
  if (ex.empty()) return m;
  torch::Tensor task_loss;
  {
    ModelInputs in = to_inputs(c_.objective->collate(ex, c_.pad_id), c_.device);
    in.output_logits = false;  // a training step needs the loss only (chunked LM head: lm_loss.h)
    PrecisionScope scope(o_.precision, c_.device);  // forward and loss; backward follows the graph
    task_loss = c_.model->forward(in).loss;
    m.loss = task_loss;
    if (const auto aux = routed_aux_loss(*c_.model); aux.defined()) {
      m.loss = m.loss + aux;
      has_aux_ = true;
    }
    m.count = c_.objective->loss_count(in, ex.size());
    m.tokens = in.attention_mask.sum().item<double>();
  }
  m.loss_value = m.loss.item<double>();
  m.mean_loss = task_loss.item<double>();
  m.aux_loss = m.loss_value - m.mean_loss;  // the balance losses (MoE, MoV/MoLoRA routers)
  return m;
}

// One small all-reduce: the global count (to weight this rank's mean), the logged loss, the
// tokens, and whether any rank saw a non-finite loss.
void TrainLoop::sum_over_ranks(MicroBatch& m) {
  const bool finite = std::isfinite(m.loss_value);
  const bool counted = m.count > 0 && finite;
  auto g = c_.comm->all_reduce_sum({m.count, counted ? m.mean_loss * m.count : 0.0, m.tokens,
                                    finite ? 0.0 : 1.0, counted ? m.aux_loss * m.count : 0.0});
  m.scale = g[0] > 0 ? m.count * static_cast<double>(c_.comm->size()) / g[0] : 0.0;
  m.mean_loss = g[0] > 0 ? g[1] / g[0] : 0.0;
  m.aux_loss = g[0] > 0 ? g[4] / g[0] : 0.0;  // the ranks' balance losses, weighted as the loss
  m.tokens = g[2];
  if (g[3] > 0) m.loss_value = std::numeric_limits<double>::quiet_NaN();
}

// The end of an accumulation window: gradients checked and clipped, the step taken (or skipped),
// logs and checkpoints. True when the run stops here (train.stop_after_steps).
bool TrainLoop::optimizer_step(int64_t epoch, int64_t b) {
  const bool skip_nonfinite = o_.nonfinite == NonFinitePolicy::kSkip;
  if (sync_) sync_->finish();
  if (!skip_window_ && (o_.grad_clip > 0 || skip_nonfinite)) {
    // infinity: the norm alone (checked), nothing clipped
    const double norm =
        sync_ && sync_->sharded()
            ? clip_sharded_gradients()
            : torch::nn::utils::clip_grad_norm_(
                  opt_.parameters(),
                  o_.grad_clip > 0 ? o_.grad_clip : std::numeric_limits<double>::infinity());
    // stop before the optimiser writes NaN into the weights (and into a checkpoint)
    EMOE_CHECK(std::isfinite(norm) || skip_nonfinite, RuntimeError,
               "non-finite gradient norm at step {} (epoch {}, batch {}); lower the learning rate "
               "(or set train.nonfinite: skip)",
               st_.step, epoch + 1, b);
    skip_window_ = !std::isfinite(norm);
  }
  opt_.set_lr_factor(schedule_factor(o_.schedule, st_.step, plan_.total_steps, plan_.warmup));
  const double lr = opt_.current_lr();
  if (skip_window_) {
    st_.skipped_steps += 1;
    skips_in_a_row_ += 1;
    spdlog::warn("step {}: non-finite loss or gradient; optimiser step skipped ({} so far)",
                 st_.step + 1, st_.skipped_steps);
    // skipping cannot recover weights that are already broken, nor a rate that always explodes
    EMOE_CHECK(skips_in_a_row_ < o_.max_consecutive_skips, RuntimeError,
               "{} optimiser steps in a row skipped for a non-finite loss or gradient (up to step "
               "{}); the run cannot recover and stops without saving more (train."
               "max_consecutive_skips {}); lower train.lr",
               skips_in_a_row_, st_.step + 1, o_.max_consecutive_skips);
  } else {
    opt_.step();
    if (sync_) sync_->broadcast_parameters();  // sharded: each owner's updated weights to all
    skips_in_a_row_ = 0;
  }
  opt_.zero_grad();
  skip_window_ = false;
  st_.step += 1;
  st_.batch_in_epoch = b + 1;
  if (o_.usage_interval > 0 && st_.step % o_.usage_interval == 0)
    usage_.snapshot(st_.step, "train", true);
  log_step(epoch, lr);
  if (st_.step >= plan_.total_steps) done_ = true;
  if (o_.save_every > 0 && st_.step % o_.save_every == 0 && !done_) checkpoint();
  if (o_.stop_after_steps > 0 && st_.step == o_.stop_after_steps && !done_) {
    if (c_.main_rank()) progress_.finish();
    checkpoint();
    if (c_.comm) c_.comm->barrier();  // the checkpoint is complete before any rank exits
    spdlog::info("stopped after {} steps as asked; continue with --resume", st_.step);
    return true;
  }
  return false;
}

// The progress line, and every log_every steps a "train" record in metrics.jsonl.
void TrainLoop::log_step(int64_t epoch, double lr) {
  if (!c_.main_rank()) return;
  const auto mean = [&] { return loss_acc_ / static_cast<double>(loss_count_); };
  progress_.update(
      st_.step,
      fmt::format("epoch {}/{} loss {} lr {:.2e}", epoch + 1, plan_.epochs,
                  loss_count_ > 0 ? fmt::format("{:.4f}", mean()) : std::string("n/a"), lr));
  if (st_.step % o_.log_every != 0 && st_.step != plan_.total_steps) return;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start_).count();
  nlohmann::json record = {{"type", "train"},
                           {"step", st_.step},
                           {"epoch", epoch + 1},
                           {"loss", loss_count_ > 0 ? nlohmann::json(mean()) : nlohmann::json()},
                           {"skipped_steps", st_.skipped_steps},
                           {"lr", lr},
                           {"tokens_per_s", tokens_acc_ / std::max(secs, 1e-9)},
                           {"batches_per_s", loss_count_ / std::max(secs, 1e-9)}};
  // the balance losses apart from the task loss (over all ranks in a data-parallel run)
  if (has_aux_ && loss_count_ > 0) record["aux_loss"] = aux_acc_ / static_cast<double>(loss_count_);
  append_metrics(metrics_path_, record);
  loss_acc_ = 0, aux_acc_ = 0, loss_count_ = 0, tokens_acc_ = 0;
  window_start_ = std::chrono::steady_clock::now();
}

// Evaluation at the end of every epoch; the best one by the objective's main score is kept.
void TrainLoop::end_epoch(int64_t epoch) {
  // full: the evaluation runs on every rank over its share of the examples (different counts of
  // forwards per rank), so the weights are gathered whole for it
  WholeWeights weights(*this, -1);
  auto sets = evaluate_all(c_, usage_, st_.step);
  const double score = c_.objective->main_score(sets);
  nlohmann::json record = {
      {"type", "eval"}, {"step", st_.step}, {"epoch", epoch + 1}, {"sets", sets}};
  if (c_.main_rank()) append_metrics(metrics_path_, record);
  st_.history.push_back(record);
  std::vector<std::string> shown;
  for (auto& [name, v] : sets.items())
    for (auto& [m, x] : v["metrics"].items())
      shown.push_back(fmt::format("{} {} {:.2f}", name, m, x.get<double>()));
  spdlog::info("epoch {}: {}", epoch + 1, fmt::join(shown, ", "));
  if (score > st_.best_metric) {
    st_.best_metric = score;
    st_.best_epoch = epoch + 1;
    st_.evals_without_gain = 0;
    if (c_.main_rank()) {
      require_finite_weights(*c_.model, best_path_);
      std::vector<std::pair<std::string, torch::Tensor>> params;
      for (const auto& p : c_.model->named_parameters()) params.emplace_back(p.key(), p.value());
      save_safetensors(best_path_, params,
                       {{"format", "emoe-best"}, {"epoch", std::to_string(epoch + 1)}});
    }
  } else {
    st_.evals_without_gain += 1;
  }
  st_.epoch = epoch + 1;
  st_.batch_in_epoch = 0;
  if (o_.early_stopping > 0 && st_.evals_without_gain >= o_.early_stopping) {
    spdlog::info("early stopping: {} evaluations without improvement", st_.evals_without_gain);
    done_ = true;
  }
  checkpoint();
}

TrainResult TrainLoop::run() {
  TrainResult result;
  result.run_dir = c_.dir;
  if (!run_epochs()) {
    result.stopped_early = true;
    return result;
  }
  const nlohmann::json memory = memory_record();
  if (shards_) {  // full: the whole model on rank 0, which writes the deliverables
    shards_->gather_all(0);
    shards_->detach_all();
    c_.model->set_block_hooks(nullptr);
  }
  if (c_.comm) {
    c_.comm->barrier();  // every rank finished; rank 0 alone writes the deliverables
    if (!c_.main_rank()) return result;
  }
  // restore the best epoch's weights and write the deliverables
  if (fs::exists(best_path_)) {
    SafetensorsFile best(best_path_);
    torch::NoGradGuard g;
    for (const auto& p : c_.model->named_parameters())
      p.value().copy_(best.load(p.key(), p.value().scalar_type(), p.value().device()));
  }
  // a converted model's two forms: routed (model_moe/) and recomposed to dense (model/); they
  // differ when fewer experts than all are chosen per token
  RunForms forms;
  forms.recomposed = c_.cfg.export_dense && !c_.moe.empty() && recomposable(c_.moe);
  if (forms.recomposed) {
    forms.routed = c_.cfg.ablation == Ablation::kTrainMoeEvalDense
                       ? evaluate_forced(c_, false, st_.step)
                       : nlohmann::json();  // the epochs' evaluations were routed
    forms.dense = evaluate_forced(c_, true, st_.step);
  }
  result.results = run_results(c_, st_, forms);
  result.results["memory"] = memory;
  usage_.save(c_.dir);
  if (c_.cfg.save_best) {
    require_finite_weights(*c_.model, (fs::path(c_.dir) / "model").string());
    export_run_model(*c_.model, c_.moe, c_.peft, c_.dir, c_.cfg.model, c_.cfg.export_dense,
                     c_.cfg.max_shard_bytes);
  }
  // the kernels this run chose by timing: EMOE_KERNELS=<this file> repeats them (kernel_choices.h)
  write_text_atomic((fs::path(c_.dir) / "kernels.json").string(),
                    kernel_choices_json().dump(1) + "\n");
  write_text_atomic((fs::path(c_.dir) / "results.json").string(), result.results.dump(2) + "\n");
  return result;
}

}  // namespace

TrainResult run_training(const RunConfig& config, bool resume, const DistOptions& dist) {
  TrainContext c;
  c.cfg = config;
  c.cfg.validate();
  c.dir = c.cfg.output;
  c.device = parse_device(c.cfg.device, "run config: device");
  start_train_process(c, dist);
  check_resume(c, resume);
  prepare_run(c);
  TrainLoop loop(c, resume);
  return loop.run();
}

}  // namespace emoe
