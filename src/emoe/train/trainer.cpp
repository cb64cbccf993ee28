// The training loop and the run folder.
#include "emoe/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <thread>

#include "emoe/analysis/flops.h"
#include "emoe/analysis/usage.h"
#include "emoe/core/error.h"
#include "emoe/core/runtime.h"
#include "emoe/data/batching.h"
#include "emoe/data/dataset.h"
#include "emoe/data/mixture.h"
#include "emoe/data/templates.h"
#include "emoe/dist/grad_sync.h"
#include "emoe/eval/evaluate.h"
#include "emoe/eval/rank_classification.h"
#include "emoe/io/atomic_file.h"
#include "emoe/io/safetensors.h"
#include "emoe/train/checkpoint.h"
#include "emoe/train/method.h"
#include "emoe/train/model_io.h"
#include "emoe/train/optim.h"
#include "emoe/train/precision.h"
#include "emoe/train/progress.h"
#include "emoe/train/run_data.h"

namespace emoe {
namespace fs = std::filesystem;

namespace {

struct EvalSet {
  std::string name;  // "dev" or the out-of-domain set's name
  std::vector<EncodedExample> data;
  std::vector<int64_t> prediction_labels;  // see evaluate_classifier
};

// objective seq2seq: a task scored by rank classification over its templates.
struct RankSet {
  std::string name;  // the task
  bool heldout = false;
  std::vector<std::string> template_names;
  std::vector<RankExample> data;
};

// Everything one run works with.
struct TrainContext {
  RunConfig cfg;
  std::string dir;
  c10::Device device = c10::Device(c10::kCPU);
  std::unique_ptr<Tokenizer> tok;
  int64_t pad_id = 0;
  TaskSpec task;
  std::vector<EncodedExample> train;
  std::vector<EvalSet> evals;  // dev first
  std::vector<MultipleChoiceExample> mmlu, mmlu_dev;
  MixturePool mixture;          // seq2seq only
  std::vector<RankSet> ranked;  // seq2seq only: training tasks' dev sets, then held-out tasks
  ModelPtr model;
  MoeState moe;
  PeftConfig peft;
  std::unique_ptr<Communicator> comm;  // data-parallel runs only
  bool main_rank() const { return comm == nullptr || comm->rank() == 0; }
  EvalShard shard() const {
    EvalShard s;
    if (comm == nullptr) return s;
    s.rank = comm->rank(), s.size = comm->size();
    Communicator* cm = comm.get();
    s.all_gather = [cm](const std::vector<double>& v) { return cm->all_gather(v); };
    return s;
  }
};

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

// objective seq2seq: the mixture's training pool, the dev-loss set and the rank-classification sets.
void setup_seq2seq_data(TrainContext& c) {
  const auto& cfg = c.cfg;
  const TextToTextEncoder encoder(*c.tok, cfg.train.max_length, cfg.train.max_target_length,
                                  cfg.model);
  c.mixture = build_mixture(cfg.mixture, encoder, cfg.data_dir, cfg.train.max_train_examples);
  c.train = std::move(c.mixture.examples);
  std::vector<EncodedExample> dev_loss;
  for (const auto& task : cfg.mixture.tasks) {  // the dev loss: first template, correct answer
    const auto& first = task_templates(task, "run config: mixture.tasks").at(0);
    for (const auto& e :
         load_labelled_glue(task, "dev", cfg.data_dir, cfg.train.max_eval_examples).examples)
      dev_loss.push_back(encoder.labelled(first, e));
  }
  // rank classification: the training tasks' dev sets, then the held-out tasks (dev split)
  std::vector<std::pair<std::string, bool>> scored;
  for (const auto& t : cfg.mixture.tasks) scored.emplace_back(t, false);
  for (const auto& t : cfg.heldout) scored.emplace_back(t, true);
  for (const auto& [task, held] : scored) {
    const auto& tpls = task_templates(task, held ? "run config: heldout" : "run config: mixture.tasks");
    auto dev = load_labelled_glue(task, "dev", cfg.data_dir, cfg.train.max_eval_examples);
    RankSet rs;
    rs.name = task;
    rs.heldout = held;
    for (size_t t = 0; t < tpls.size(); ++t) {
      rs.template_names.push_back(tpls[t].name);
      std::vector<std::vector<int64_t>> choices;
      for (const auto& ch : tpls[t].choices) choices.push_back(encoder.target(ch));
      for (const auto& e : dev.examples) {
        RankExample r;
        r.source = encoder.source(tpls[t], e);
        r.choices = choices;
        r.label = std::llround(e.label);
        r.templ = static_cast<int64_t>(t);
        rs.data.push_back(std::move(r));
      }
    }
    c.ranked.push_back(std::move(rs));
  }
  c.evals.push_back({"dev", std::move(dev_loss), {}});
  spdlog::info("seq2seq: {} dev-loss examples; rank classification on {}; held-out: {}", c.evals[0].data.size(),
               fmt::join(cfg.mixture.tasks, ", "),
               cfg.heldout.empty() ? std::string("none") : fmt::format("{}", fmt::join(cfg.heldout, ", ")));
}

// The pool indices of an epoch: the examples in order, or the mixture's draws.
std::vector<int64_t> training_order(const TrainContext& c, int64_t n, int64_t epoch) {
  if (c.mixture.sizes.empty()) return epoch_order(n, c.cfg.train.seed, epoch, true);
  return c.mixture.epoch_order(c.cfg.train.seed, epoch);
}

// What check_objective_fits_model reads, the objective by its config name: the function's body
// stays as it is on main (where its model_type comparison becomes an architecture-traits call).
struct ObjectiveFit {
  std::string model, objective;
};

// seq2seq needs an encoder-decoder model, and the other objectives need one without a decoder.
void check_objective_fits_model(const ObjectiveFit& cfg) {
  const std::string model_type = run_model_type(cfg.model);
  const bool encoder_decoder = model_type == "t5";
  EMOE_CHECK(cfg.objective != "seq2seq" || encoder_decoder || model_type.empty(), InputError,
             "run config: objective: seq2seq needs an encoder-decoder model (model_type t5); {} is a {} model",
             cfg.model, model_type);
  EMOE_CHECK(cfg.objective == "seq2seq" || !encoder_decoder, InputError,
             "run config: objective: {} is not available for the encoder-decoder model {} ({}); use "
             "objective: seq2seq", cfg.objective, cfg.model, model_type);
}

void setup_data(TrainContext& c) {
  const auto& cfg = c.cfg;
  const int64_t max_len = cfg.train.max_length;
  if (cfg.objective == ObjectiveKind::kSeq2Seq) {
    setup_seq2seq_data(c);
  } else if (cfg.objective == ObjectiveKind::kClassification) {
    auto data = load_run_data(cfg);
    c.task = data.task;
    c.train = encode_dataset(data.train, *c.tok, max_len);
    c.evals.push_back({"dev", encode_dataset(data.dev, *c.tok, max_len), data.dev.prediction_labels});
    std::vector<std::string> names;
    for (const auto& [name, d] : data.ood) {
      c.evals.push_back({name, encode_dataset(d, *c.tok, max_len), d.prediction_labels});
      names.push_back(name);
    }
    spdlog::info("task {}: {} training examples, dev {}, out-of-domain: {}", cfg.task, c.train.size(),
                 c.evals[0].data.size(),
                 names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", ")));
  } else {
    auto all = load_alpaca(cfg.instruct_data);
    keep_fixed_subset(all, cfg.train.max_train_examples);
    const auto n_dev = static_cast<size_t>(
        std::max<double>(1.0, cfg.instruct_dev_fraction * static_cast<double>(all.size())));
    EMOE_CHECK(all.size() > n_dev, InputError, "{}: too few examples ({}) for a dev split",
               cfg.instruct_data, all.size());
    std::vector<InstructionExample> dev(all.end() - n_dev, all.end());
    all.resize(all.size() - n_dev);
    // An example whose response max_length cut away entirely teaches nothing: drop it.
    auto with_targets = [&](std::vector<EncodedExample> v, const char* what) {
      const size_t before = v.size();
      v.erase(std::remove_if(v.begin(), v.end(), [](const EncodedExample& e) {
                return std::all_of(e.lm_labels.begin() + (e.lm_labels.empty() ? 0 : 1), e.lm_labels.end(),
                                   [](int64_t l) { return l == -100; });
              }),
              v.end());
      if (v.size() < before)
        spdlog::info("{}: dropped {} of {} examples whose response does not fit in max_length {}",
                     what, before - v.size(), before, max_len);
      return v;
    };
    c.train = with_targets(encode_instructions(all, *c.tok, max_len), "train");
    c.evals.push_back({"dev", with_targets(encode_instructions(dev, *c.tok, max_len), "dev"), {}});
    if (!cfg.mmlu_dir.empty()) {
      c.mmlu = load_mmlu_split((fs::path(cfg.mmlu_dir) / "val").string());
      keep_fixed_subset(c.mmlu, cfg.mmlu_max_questions);
      if (cfg.mmlu_shots > 0) c.mmlu_dev = load_mmlu_split((fs::path(cfg.mmlu_dir) / "dev").string());
    }
    spdlog::info("instruction tuning: {} training examples, {} dev, {} MMLU questions ({}-shot)",
                 c.train.size(), dev.size(), c.mmlu.size(), cfg.mmlu_shots);
  }
  EMOE_CHECK(!c.train.empty(), InputError, "no training examples");
}

// First training batches: sample text for the co-activation split and MoEfication's router.
std::vector<ModelInputs> sample_batches(const TrainContext& c) {
  std::vector<ModelInputs> out;
  int64_t tokens = 0;
  const bool lm = c.cfg.objective == ObjectiveKind::kInstruction;
  const bool s2s = c.cfg.objective == ObjectiveKind::kSeq2Seq;
  for (size_t b = 0; b < c.train.size() && tokens < c.cfg.moe.sample_tokens; b += 16) {
    std::vector<const EncodedExample*> ex;
    for (size_t i = b; i < std::min(c.train.size(), b + 16); ++i) ex.push_back(&c.train[i]);
    auto batch = s2s ? collate_seq2seq(ex, c.pad_id) : collate(ex, c.pad_id, c.task.regression, lm);
    ModelInputs in;
    in.input_ids = batch.input_ids;
    in.attention_mask = batch.attention_mask;
    in.token_type_ids = batch.token_type_ids;
    if (s2s) in.labels = batch.labels;  // the decoder's input
    tokens += batch.attention_mask.sum().item<int64_t>();
    out.push_back(in);
  }
  return out;
}

void setup_model(TrainContext& c) {
  const auto& cfg = c.cfg;
  LoadOptions lo;
  lo.dtype = parse_dtype(cfg.dtype);
  if (cfg.objective == ObjectiveKind::kClassification) {
    lo.head = Head::kSequenceClassification;
    lo.num_labels = c.task.num_labels();
  } else if (cfg.objective == ObjectiveKind::kSeq2Seq) {
    lo.head = Head::kSeq2SeqLM;
  } else {
    lo.head = Head::kCausalLM;
  }
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
  auto st = apply_method(*c.model, cfg, cfg.uses_moe() ? sample_batches(c) : std::vector<ModelInputs>());
  if (cfg.uses_moe()) c.moe = st.moe;
  c.peft = st.peft;
  c.model->to(c.device, parse_dtype(cfg.dtype));
  c.model->train();
  auto counts = count_parameters(*c.model);
  spdlog::info("{} on {}: {} parameters, {} trainable ({:.2f} %)", cfg.method, c.model->summary().model_type,
               counts.total, counts.trainable, 100.0 * counts.trainable / std::max<int64_t>(1, counts.total));
}

// Ablations of SPEC §3.4: the MoE plugs compute the dense FFN in one phase.
void set_phase(TrainContext& c, bool evaluating) {
  bool dense = false;
  if (c.cfg.ablation == Ablation::kTrainDenseEvalMoe) dense = !evaluating;
  if (c.cfg.ablation == Ablation::kTrainMoeEvalDense) dense = evaluating;
  for (auto* p : moe_plugs(*c.model)) p->set_dense_override(dense);
}

ModelInputs to_inputs(const Batch& b, const c10::Device& dev) {
  ModelInputs in;
  in.input_ids = b.input_ids.to(dev);
  in.attention_mask = b.attention_mask.to(dev);
  in.token_type_ids = b.token_type_ids.defined() ? b.token_type_ids.to(dev) : torch::Tensor();
  in.labels = b.labels.to(dev);
  return in;
}

// dev + out-of-domain (+ MMLU) results of the current model, as one JSON record.
nlohmann::json evaluate_all(TrainContext& c, UsageRecorder& usage, int64_t step) {
  set_phase(c, true);
  PrecisionScope precision(c.cfg.train.precision, c.device);
  nlohmann::json sets = nlohmann::json::object();
  for (const auto& s : c.evals) {
    usage.discard(false);
    EvalOutput o = c.cfg.objective == ObjectiveKind::kClassification
                       ? evaluate_classifier(*c.model, s.data, c.task, c.cfg.train.eval_batch_size, c.pad_id,
                                             s.prediction_labels, c.shard())
                   : c.cfg.objective == ObjectiveKind::kSeq2Seq
                       ? evaluate_seq2seq_loss(*c.model, s.data, c.cfg.train.eval_batch_size, c.pad_id, c.shard())
                       : evaluate_lm_loss(*c.model, s.data, c.cfg.train.eval_batch_size, c.pad_id, c.shard());
    sets[s.name] = {{"metrics", o.metrics}, {"loss", o.loss}, {"examples", o.examples},
                    {"seconds", o.seconds}};
    usage.snapshot(step, s.name, false);
  }
  std::vector<double> heldout;
  for (const auto& r : c.ranked) {
    usage.discard(false);
    RankOptions ro;
    ro.batch_size = std::max<int64_t>(1, c.cfg.train.eval_batch_size / 4);
    ro.length_normalize = c.cfg.rank_score == "mean";
    auto res = evaluate_rank_classification(*c.model, r.data, static_cast<int64_t>(r.template_names.size()),
                                            c.pad_id, ro, c.shard());
    nlohmann::json metrics = {{"median_accuracy", res.median_accuracy}};
    for (size_t t = 0; t < r.template_names.size(); ++t)
      metrics["accuracy/" + r.template_names[t]] = res.template_accuracy[t];
    sets[r.name] = {{"metrics", metrics}, {"heldout", r.heldout}, {"examples", res.examples},
                    {"seconds", res.seconds}};
    if (r.heldout) heldout.push_back(res.median_accuracy);
    usage.snapshot(step, r.name, false);
  }
  if (!heldout.empty()) {
    const double mean = std::accumulate(heldout.begin(), heldout.end(), 0.0) / static_cast<double>(heldout.size());
    sets["heldout"] = {{"metrics", {{"mean_median_accuracy", mean}}}, {"tasks", c.cfg.heldout}};
  }
  if (!c.mmlu.empty()) {
    usage.discard(false);
    auto r = evaluate_mmlu(*c.model, *c.tok, c.mmlu, c.mmlu_dev, c.cfg.mmlu_shots,
                           std::min<int64_t>(c.cfg.train.max_length, c.model->summary().max_positions));
    sets["mmlu"] = {{"metrics", {{"accuracy", r.accuracy}}}, {"examples", r.questions},
                    {"per_subject", r.per_subject}};
    usage.snapshot(step, "mmlu", false);
  }
  set_phase(c, false);
  return sets;
}

// The number that picks the best epoch: the task's main metric, or -loss for instruction tuning.
double main_score(const TrainContext& c, const nlohmann::json& sets) {
  if (c.cfg.objective == ObjectiveKind::kClassification)
    return sets["dev"]["metrics"][c.task.main_metric].get<double>();
  if (c.cfg.objective == ObjectiveKind::kSeq2Seq && sets.contains("heldout"))
    return sets["heldout"]["metrics"]["mean_median_accuracy"].get<double>();
  return -sets["dev"]["loss"].get<double>();
}

void append_metrics(const std::string& path, const nlohmann::json& record) {
  std::ofstream out(path, std::ios::app);
  out << record.dump() << "\n";
  EMOE_CHECK(out.good(), RuntimeError, "{}: write failed", path);
}

// The best model as the run's deliverables: model/ (folded to dense when possible), model_moe/
// (the MoE form, when the method converted layers) and adapter/ (PEFT format).
void export_model(TrainContext& c) {
  const auto model_dir = (fs::path(c.dir) / "model").string();
  const auto adapter_dir = (fs::path(c.dir) / "adapter").string();
  MoeState moe = c.moe;
  PeftConfig peft = c.peft;
  if (peft.method == PeftMethod::kLora || peft.method == PeftMethod::kIa3)
    save_peft_adapter(*c.model, peft, adapter_dir, fs::absolute(c.cfg.model).string());
  if (!moe.empty()) {
    // the MoE form as trained (for pruning and analysis), before any recomposition
    save_any_model(*c.model, moe, peft, (fs::path(c.dir) / "model_moe").string(), c.cfg.model);
  }
  if (c.cfg.export_dense) {
    if (peft.method == PeftMethod::kLora) {
      merge_lora(*c.model);
      peft = PeftConfig();
    }
    if (!moe.empty() && moe.config.method != MoeMethod::kGmoe) recompose_dense(*c.model, moe);
  }
  save_any_model(*c.model, moe, peft, model_dir, c.cfg.model);
  spdlog::info("best model written to {}{}", model_dir,
               moe.empty() && peft.method == PeftMethod::kNone ? " (plain Hugging Face checkpoint)" : "");
}

}  // namespace

TrainResult run_training(const RunConfig& config, bool resume, const DistOptions& dist) {
  TrainContext c;
  c.cfg = config;
  c.cfg.validate();
  c.dir = c.cfg.output;
  c.device = parse_device(c.cfg.device);
  if (dist.enabled()) {
    // the local ranks share the cores unless train threads were given
    int threads = c.cfg.threads;
    if (threads <= 0)
      threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / dist.local_world_size);
    configure_threads(threads);
    c.comm = std::make_unique<Communicator>(dist);
    if (!c.main_rank()) spdlog::set_level(std::max(spdlog::get_level(), spdlog::level::warn));
    spdlog::info("data parallel: {} ranks (c10d Gloo, rendezvous {}:{}), {} threads each", dist.world_size,
                 dist.master_addr, dist.master_port, threads);
  } else {
    configure_threads(c.cfg.threads);
  }
  const auto& o = c.cfg.train;
  const bool has_checkpoint = !latest_checkpoint(c.dir).empty();
  EMOE_CHECK(resume || !has_checkpoint, UsageError,
             "{}: already holds a run (checkpoints/); pass --resume to continue it or choose "
             "another output", c.dir);
  if (resume && fs::exists(fs::path(c.dir) / "config.json")) {
    auto saved = JsonFields::from_file((fs::path(c.dir) / "config.json").string()).raw();
    auto now = c.cfg.to_json();
    saved["train"].erase("stop_after_steps");
    now["train"].erase("stop_after_steps");
    EMOE_CHECK(saved == now, UsageError,
               "{}: --resume needs the run's own config; config.json differs from the one given",
               c.dir);
  }

  // tokenizer, data and model are checked before the run folder is written: bad input leaves
  // nothing behind
  torch::manual_seed(static_cast<uint64_t>(o.seed));
  check_objective_fits_model({c.cfg.model, to_string(c.cfg.objective)});
  c.tok = load_tokenizer(c.cfg.model);
  setup_data(c);
  setup_model(c);
  if (c.main_rank()) {
    std::error_code ec;
    fs::create_directories(c.dir, ec);
    EMOE_CHECK(!ec, RuntimeError, "{}: cannot create the run folder: {}", c.dir, ec.message());
    write_text_atomic((fs::path(c.dir) / "config.json").string(), c.cfg.to_json().dump(2) + "\n");
  }
  const auto& s = c.model->summary();
  c.pad_id = c.tok->special().pad.value_or(s.pad_token_id.value_or(s.eos_token_id.value_or(0)));

  Optimizer opt(*c.model, o);
  // a mixture's epoch is its draw list (seq2seq); otherwise every training example once
  const int64_t n = c.mixture.sizes.empty() ? static_cast<int64_t>(c.train.size()) : c.mixture.epoch_size;
  const int64_t batches_per_epoch = (n + o.batch_size - 1) / o.batch_size;
  const int64_t steps_per_epoch = (batches_per_epoch + o.grad_accum - 1) / o.grad_accum;
  const int64_t total_steps = o.max_steps > 0 ? o.max_steps : o.epochs * steps_per_epoch;
  const int64_t epochs = o.max_steps > 0 ? (total_steps + steps_per_epoch - 1) / steps_per_epoch : o.epochs;
  const int64_t warmup = o.warmup_steps > 0 ? o.warmup_steps
                                            : static_cast<int64_t>(o.warmup_ratio * static_cast<double>(total_steps));

  const auto metrics_path = (fs::path(c.dir) / "metrics.jsonl").string();
  TrainState st;
  if (resume && load_checkpoint(c.dir, *c.model, opt, st)) {
    spdlog::info("resumed {} at step {} (epoch {}, batch {})", c.dir, st.step, st.epoch + 1, st.batch_in_epoch);
    if (c.main_rank() && fs::exists(metrics_path))
      fs::resize_file(metrics_path, static_cast<uintmax_t>(st.metrics_bytes));
  } else {
    if (resume) spdlog::info("{}: no checkpoint yet; starting from the beginning", c.dir);
    if (c.main_rank()) std::ofstream(metrics_path, std::ios::trunc);
  }
  std::unique_ptr<GradientSync> sync;
  if (c.comm) {
    // identical weights everywhere (rank 0's), then gradients averaged over the ranks
    std::vector<torch::Tensor> all;
    for (auto& p : c.model->parameters()) all.push_back(p);
    for (auto& b : c.model->buffers()) all.push_back(b);
    {
      torch::NoGradGuard g;
      c.comm->broadcast(all, 0);
    }
    sync = std::make_unique<GradientSync>(*c.comm, opt.parameters());
    spdlog::info("gradients all-reduced in {} bucket(s)", sync->buckets());
  }
  UsageRecorder usage(*c.model);
  if (c.comm) {
    Communicator* cm = c.comm.get();
    usage.set_reduce([cm](const std::vector<double>& v) { return cm->all_reduce_sum(v); });
  }
  usage.discard(true);
  usage.discard(false);
  usage.restore(st.usage);
  if (!c.moe.empty() && c.main_rank())
    write_text_atomic((fs::path(c.dir) / "moe.json").string(), moe_state_to_json(c.moe).dump(1) + "\n");
  const auto best_path = (fs::path(c.dir) / "best_state.safetensors").string();
  spdlog::info("{} epochs x {} steps ({} examples, batch {} x {} accumulation), warm-up {}, {} schedule",
               epochs, steps_per_epoch, n, o.batch_size, o.grad_accum, warmup, to_string(o.schedule));

  const bool lm = c.cfg.objective == ObjectiveKind::kInstruction;
  const bool s2s = c.cfg.objective == ObjectiveKind::kSeq2Seq;
  TrainResult result;
  result.run_dir = c.dir;
  bool done = st.step >= total_steps;
  Progress progress(total_steps, "train", o.log_every);
  double loss_acc = 0, aux_acc = 0;  // logged: the task loss and, apart, the balance losses
  bool has_aux = false;
  int64_t loss_count = 0, tokens_acc = 0;
  auto window_start = std::chrono::steady_clock::now();
  auto checkpoint = [&] {
    if (!c.main_rank()) return;  // rank 0 writes; every rank resumes from it
    st.metrics_bytes = static_cast<int64_t>(fs::file_size(metrics_path));
    st.usage = usage.to_json();
    save_checkpoint(c.dir, *c.model, opt, st);
    usage.save(c.dir);
  };
  const Precision precision = o.precision;
  const bool skip_nonfinite = o.nonfinite == NonFinitePolicy::kSkip;
  bool skip_window = false;  // the accumulation window in progress saw a non-finite loss
  set_phase(c, false);
  for (int64_t epoch = st.epoch; epoch < epochs && !done; ++epoch) {
    st.epoch = epoch;
    auto order = training_order(c, n, epoch);
    auto epoch_start = std::chrono::steady_clock::now();
    c.model->train();
    for (int64_t b = st.batch_in_epoch; b < batches_per_epoch && !done; ++b) {
      // the global batch b; in a data-parallel job this rank takes its members rank, rank + size, ...
      const int64_t first = b * o.batch_size, last = std::min(n, (b + 1) * o.batch_size);
      const int64_t stride = c.comm ? c.comm->size() : 1, offset = c.comm ? c.comm->rank() : 0;
      std::vector<const EncodedExample*> ex;
      for (int64_t i = first + offset; i < last; i += stride) ex.push_back(&c.train[order[i]]);
      const bool boundary = (b + 1) % o.grad_accum == 0 || b + 1 == batches_per_epoch;
      if (sync && boundary) sync->arm();
      ModelOutputs out;
      torch::Tensor loss;
      ModelInputs in;
      double count = 0, tokens = 0;  // examples (or target tokens for LM) and input tokens here
      if (!ex.empty()) {
        in = to_inputs(s2s ? collate_seq2seq(ex, c.pad_id) : collate(ex, c.pad_id, c.task.regression, lm), c.device);
        in.output_logits = false;  // a training step needs the loss only (chunked LM head: lm_loss.h)
        PrecisionScope scope(precision, c.device);  // forward and loss; backward follows the graph
        out = c.model->forward(in);
        loss = out.loss;
        for (const auto& aux : {collect_aux_loss(*c.model), collect_peft_aux_loss(*c.model)})
          if (aux.defined()) {
            loss = loss + aux;
            has_aux = true;
          }
        count = lm    ? (in.labels.narrow(1, 1, in.labels.size(1) - 1) != -100).sum().item<double>()
                : s2s ? (in.labels != -100).sum().item<double>()  // the loss is a token mean
                      : static_cast<double>(ex.size());
        tokens = in.attention_mask.sum().item<double>();
      }
      double loss_value = ex.empty() ? 0.0 : loss.item<double>();
      double mean_loss = ex.empty() ? 0.0 : out.loss.item<double>();
      double aux_loss = loss_value - mean_loss;  // the balance losses (MoE, MoV/MoLoRA routers)
      double scale = 1.0;  // this rank's share of the global mean
      if (c.comm) {
        // one small all-reduce: the global count (to weight this rank's mean), the logged loss,
        // the tokens, and whether any rank saw a non-finite loss
        const bool finite = std::isfinite(loss_value);
        auto g = c.comm->all_reduce_sum({count, count > 0 && finite ? mean_loss * count : 0.0, tokens,
                                         finite ? 0.0 : 1.0, count > 0 && finite ? aux_loss * count : 0.0});
        scale = g[0] > 0 ? count * static_cast<double>(c.comm->size()) / g[0] : 0.0;
        mean_loss = g[0] > 0 ? g[1] / g[0] : 0.0;
        aux_loss = g[0] > 0 ? g[4] / g[0] : 0.0;  // the ranks' balance losses, weighted as the loss
        tokens = g[2];
        if (g[3] > 0) loss_value = std::numeric_limits<double>::quiet_NaN();
      }
      if (!std::isfinite(loss_value)) {
        EMOE_CHECK(skip_nonfinite, RuntimeError,
                   "non-finite loss at step {} (epoch {}, batch {}); lower the learning rate "
                   "(or set train.nonfinite: skip)", st.step, epoch + 1, b);
        skip_window = true;
      }
      if (!skip_window && !ex.empty() && count > 0) (loss * (scale / static_cast<double>(o.grad_accum))).backward();
      if (std::isfinite(loss_value)) loss_acc += mean_loss, aux_acc += aux_loss, loss_count += 1;
      tokens_acc += static_cast<int64_t>(tokens);
      if (!boundary) continue;
      if (sync) sync->finish();
      if (!skip_window && (o.grad_clip > 0 || skip_nonfinite)) {
        // infinity: the norm alone (checked), nothing clipped
        const double norm = torch::nn::utils::clip_grad_norm_(
            opt.parameters(), o.grad_clip > 0 ? o.grad_clip : std::numeric_limits<double>::infinity());
        // stop before the optimiser writes NaN into the weights (and into a checkpoint)
        EMOE_CHECK(std::isfinite(norm) || skip_nonfinite, RuntimeError,
                   "non-finite gradient norm at step {} (epoch {}, batch {}); lower the learning rate "
                   "(or set train.nonfinite: skip)", st.step, epoch + 1, b);
        skip_window = !std::isfinite(norm);
      }
      opt.set_lr_factor(schedule_factor(o.schedule, st.step, total_steps, warmup));
      const double lr = opt.current_lr();
      if (skip_window) {
        st.skipped_steps += 1;
        spdlog::warn("step {}: non-finite loss or gradient; optimiser step skipped ({} so far)", st.step + 1,
                     st.skipped_steps);
      } else {
        opt.step();
      }
      opt.zero_grad();
      skip_window = false;
      st.step += 1;
      st.batch_in_epoch = b + 1;
      if (o.usage_interval > 0 && st.step % o.usage_interval == 0) usage.snapshot(st.step, "train", true);
      if (c.main_rank())
        progress.update(st.step, fmt::format("epoch {}/{} loss {} lr {:.2e}", epoch + 1, epochs,
                                             loss_count > 0 ? fmt::format("{:.4f}", loss_acc / static_cast<double>(loss_count))
                                                            : std::string("n/a"),
                                             lr));
      if (c.main_rank() && (st.step % o.log_every == 0 || st.step == total_steps)) {
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count();
        nlohmann::json record = {
            {"type", "train"}, {"step", st.step}, {"epoch", epoch + 1},
            {"loss", loss_count > 0 ? nlohmann::json(loss_acc / static_cast<double>(loss_count)) : nlohmann::json()},
            {"skipped_steps", st.skipped_steps}, {"lr", lr},
            {"tokens_per_s", tokens_acc / std::max(secs, 1e-9)}, {"batches_per_s", loss_count / std::max(secs, 1e-9)}};
        // the balance losses apart from the task loss (over all ranks in a data-parallel run)
        if (has_aux && loss_count > 0) record["aux_loss"] = aux_acc / static_cast<double>(loss_count);
        append_metrics(metrics_path, record);
        loss_acc = 0, aux_acc = 0, loss_count = 0, tokens_acc = 0;
        window_start = std::chrono::steady_clock::now();
      }
      if (st.step >= total_steps) done = true;
      if (o.save_every > 0 && st.step % o.save_every == 0 && !done) checkpoint();
      if (o.stop_after_steps > 0 && st.step == o.stop_after_steps && !done) {
        if (c.main_rank()) progress.finish();
        checkpoint();
        if (c.comm) c.comm->barrier();  // the checkpoint is complete before any rank exits
        spdlog::info("stopped after {} steps as asked; continue with --resume", st.step);
        result.stopped_early = true;
        return result;
      }
    }
    st.train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
    if (c.main_rank()) progress.finish();
    if (o.usage_interval == 0 || st.step % o.usage_interval != 0) usage.snapshot(st.step, "train", true);
    // evaluation at the end of every epoch; the best one by the task's main metric is kept
    auto sets = evaluate_all(c, usage, st.step);
    const double score = main_score(c, sets);
    nlohmann::json record = {{"type", "eval"}, {"step", st.step}, {"epoch", epoch + 1}, {"sets", sets}};
    if (c.main_rank()) append_metrics(metrics_path, record);
    st.history.push_back(record);
    std::vector<std::string> shown;
    for (auto& [name, v] : sets.items())
      for (auto& [m, x] : v["metrics"].items()) shown.push_back(fmt::format("{} {} {:.2f}", name, m, x.get<double>()));
    spdlog::info("epoch {}: {}", epoch + 1, fmt::join(shown, ", "));
    if (score > st.best_metric) {
      st.best_metric = score;
      st.best_epoch = epoch + 1;
      st.evals_without_gain = 0;
      if (c.main_rank()) {
        std::vector<std::pair<std::string, torch::Tensor>> params;
        for (const auto& p : c.model->named_parameters()) params.emplace_back(p.key(), p.value());
        save_safetensors(best_path, params, {{"format", "emoe-best"}, {"epoch", std::to_string(epoch + 1)}});
      }
    } else {
      st.evals_without_gain += 1;
    }
    st.epoch = epoch + 1;
    st.batch_in_epoch = 0;
    if (o.early_stopping > 0 && st.evals_without_gain >= o.early_stopping) {
      spdlog::info("early stopping: {} evaluations without improvement", st.evals_without_gain);
      done = true;
    }
    checkpoint();
  }

  if (c.comm) {
    c.comm->barrier();  // every rank finished; rank 0 alone writes the deliverables
    if (!c.main_rank()) return result;
  }
  // restore the best epoch's weights and write the deliverables
  if (fs::exists(best_path)) {
    SafetensorsFile best(best_path);
    torch::NoGradGuard g;
    for (const auto& p : c.model->named_parameters())
      p.value().copy_(best.load(p.key(), p.value().scalar_type(), p.value().device()));
  }
  nlohmann::json best_sets;
  for (const auto& h : st.history)
    if (h["epoch"].get<int64_t>() == st.best_epoch) best_sets = h["sets"];
  auto counts = count_parameters(*c.model);
  nlohmann::json res = {{"model", c.cfg.model}, {"method", c.cfg.method}, {"objective", to_string(c.cfg.objective)},
                        {"task", c.cfg.task}, {"seed", o.seed}, {"lr", o.lr}, {"ablation", to_string(c.cfg.ablation)},
                        {"best_epoch", st.best_epoch}, {"best", best_sets},
                        {"main_metric", c.cfg.objective == ObjectiveKind::kClassification ? c.task.main_metric
                                        : s2s && !c.cfg.heldout.empty() ? "heldout_mean_median_accuracy"
                                                                        : "dev_loss"},
                        {"epochs_run", st.epoch}, {"steps", st.step}, {"skipped_steps", st.skipped_steps},
                        {"train_seconds", st.train_seconds},
                        {"parameters", {{"total", counts.total}, {"trainable", counts.trainable}}},
                        {"history", st.history}};
  {
    // analytic cost at the run's length bounds (what a padded batch computes per token)
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
    const int64_t seq = std::min<int64_t>(c.cfg.train.max_length, sm.max_positions > 0 ? sm.max_positions : c.cfg.train.max_length);
    const int64_t target = s2s ? c.cfg.train.max_target_length : 0;
    const FlopCount fl = count_flops(sm, cost, seq, target);
    res["cost"] = {{"seq_len", seq}, {"forward_gmacs_per_token", fl.forward_total / 1e9},
                   {"train_gmacs_per_token", fl.train_total / 1e9}};
    if (s2s) res["cost"]["target_len"] = target;
  }
  if (s2s) {
    nlohmann::json mix = nlohmann::json::object();
    for (size_t t = 0; t < c.cfg.mixture.tasks.size(); ++t)
      mix[c.cfg.mixture.tasks[t]] = {{"rate", c.mixture.rates[t]}, {"examples", c.mixture.sizes[t]},
                                     {"templates", c.mixture.templates[t]}};
    res["mixture"] = {{"rate", c.cfg.mixture.rate}, {"cap", c.cfg.mixture.cap}, {"tasks", mix},
                      {"epoch_size", c.mixture.epoch_size}};
    res["heldout"] = c.cfg.heldout;
    if (best_sets.is_object() && best_sets.contains("heldout"))
      res["heldout_mean_median_accuracy"] = best_sets["heldout"]["metrics"]["mean_median_accuracy"];
    if (best_sets.is_object() && best_sets.contains("dev")) res["dev_loss"] = best_sets["dev"]["loss"];
    res["parameters"]["trainable_percent"] =
        100.0 * static_cast<double>(counts.trainable) / static_cast<double>(std::max<int64_t>(1, counts.total));
  }
  usage.save(c.dir);
  if (c.cfg.save_best) export_model(c);
  write_text_atomic((fs::path(c.dir) / "results.json").string(), res.dump(2) + "\n");
  result.results = res;
  return result;
}

}  // namespace emoe
