// The run configuration of `emoe train`: typed, layered (defaults < YAML file < --set flags),
// validated in one place, and written back resolved next to every output.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "emoe/data/mixture.h"
#include "emoe/moe/moe_config.h"
#include "emoe/peft/peft.h"
#include "emoe/train/precision.h"

namespace emoe {

// The option values of a run, parsed once by RunConfig::from_json; to_string gives the config's
// name back (the resolved config.json), parse_* the value of a name or an InputError
// "run config: <key>: expected ..., got '<name>'".
enum class ObjectiveKind { kClassification, kInstruction, kSeq2Seq };
enum class Schedule { kLinear, kCosine, kConstant };
// SPEC §3.4: the MoE plugs compute the dense FFN while training or while evaluating.
enum class Ablation { kNone, kTrainDenseEvalMoe, kTrainMoeEvalDense };
enum class NonFinitePolicy { kStop, kSkip };

std::string to_string(ObjectiveKind v);
std::string to_string(Schedule v);
std::string to_string(Ablation v);
std::string to_string(NonFinitePolicy v);
ObjectiveKind parse_objective(const std::string& name);
Schedule parse_schedule(const std::string& name);
Ablation parse_ablation(const std::string& name);
NonFinitePolicy parse_nonfinite(const std::string& name);

struct TrainOptions {
  double lr = 5e-5;
  double head_lr = 0;    // 0: same as lr (classifier / pooler / score)
  double router_lr = 0;  // 0: same as lr (MoE gates, MoV/MoLoRA routers)
  double weight_decay = 0.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  int64_t batch_size = 32;
  int64_t eval_batch_size = 64;
  int64_t grad_accum = 1;
  double grad_clip = 1.0;  // 0 = off
  int64_t epochs = 3;
  int64_t max_steps = 0;  // optimiser steps; 0 = epochs decide
  Schedule schedule = Schedule::kLinear;
  double warmup_ratio = 0.0;
  int64_t warmup_steps = 0;  // overrides warmup_ratio when > 0
  int64_t max_length = 128;
  uint64_t seed = 0;
  int64_t early_stopping = 0;      // stop after this many evaluations without improvement; 0 = off
  int64_t max_train_examples = 0;  // 0 = all
  int64_t max_eval_examples = 0;   // 0 = all (applies to dev and out-of-domain sets)
  int64_t log_every = 20;          // optimiser steps between log lines
  int64_t save_every = 0;          // checkpoint every N steps (0: at each epoch end)
  int64_t stop_after_steps = 0;    // checkpoint and exit after N steps (tests of --resume)
  int64_t usage_interval = 10;     // steps between expert-usage snapshots (0 = per epoch only)
  // fp32 | bf16-mixed (matrix multiplies in bfloat16 under autocast, for training and the
  // evaluations of the run; weights, optimiser state, norms and losses stay float32)
  Precision precision = Precision::kFp32;
  // A non-finite loss or gradient norm: "stop" the run with a message, or "skip" the optimiser
  // step (gradients dropped, counted as skipped_steps in the logs); never written to the weights.
  NonFinitePolicy nonfinite = NonFinitePolicy::kStop;
  // Under "skip": this many optimiser steps skipped in a row stop the run (it cannot recover).
  int64_t max_consecutive_skips = 20;
  int64_t max_target_length = 16;  // objective seq2seq: decoder target tokens (with eos)
  // What the run updates (the authors' --tune_moe_layers_only / --tune_gates_only): "all" (the
  // method decides), "moe-layers" (only the converted layers, whole), "gates" (only the learned
  // gates of the converted layers); the task head and any adapters train in every case.
  std::string trainable = "all";
  // Data parallel over several processes: what each rank keeps only its share of (ZeRO stage 1
  // "optimizer": AdamW state; stage 2 "gradients": AdamW state and reduced gradients), or "none"
  // (every rank holds everything). dist/grad_sync.h.
  std::string sharding = "none";
  // Activation checkpointing (models/recompute.h): each transformer block keeps only its input
  // for the backward pass and runs again there (the same gradients; one more forward of the
  // blocks per step, for one block's activations instead of every block's).
  bool gradient_checkpointing = false;
};

// A classification data set from the user's own files (instead of a GLUE task).
struct CustomDataset {
  std::string train, dev;                                // TSV / CSV / JSONL files
  std::vector<std::pair<std::string, std::string>> ood;  // out-of-domain sets: name -> file
  std::vector<std::string> text_cols = {"sentence"};     // one column, or two for pairs
  std::string label_col = "label";
  std::vector<std::string> labels;  // label names in id order
  bool regression = false;
  std::vector<std::string> metrics = {"accuracy"};  // one picks the best epoch; several: their mean
  bool empty() const { return train.empty(); }
};

struct RunConfig {
  std::string model;  // Hugging Face model folder
  ObjectiveKind objective = ObjectiveKind::kClassification;
  std::string task;       // GLUE task name (classification), or a name for `dataset`
  CustomDataset dataset;  // when set: the task's data come from these files
  std::string data_dir = "../shared/data";
  std::vector<std::string> ood;  // out-of-domain set names, or ["all"]
  // a row of method_table() (train/method_table.h): full, lora, emoe, emoe+lora, gmoe, ...
  std::string method = "full";
  MoeConfig moe = MoeConfig::for_method(MoeMethod::kEmoe);
  PeftConfig peft;
  TrainOptions train;
  // none | train-dense-eval-moe (e.g. LoRA -> EMoE) | train-moe-eval-dense (EMoE -> dense)
  Ablation ablation = Ablation::kNone;
  // Instruction tuning: Alpaca JSON, held-out share for the dev loss, MMLU folder and shots.
  std::string instruct_data;
  double instruct_dev_fraction = 0.02;
  std::string mmlu_dir;
  int64_t mmlu_shots = 0;
  int64_t mmlu_max_questions = 0;
  // Text-to-text (objective seq2seq, T5): the training mixture, the held-out tasks scored
  // zero-shot by rank classification (their dev sets), and how a choice is scored: sum or mean
  // of its token log-probabilities.
  MixtureConfig mixture;
  std::vector<std::string> heldout;
  std::string rank_score = "sum";
  // Pruning -> training: keep prune_keep experts per layer, chosen by the training usage of the
  // run in prune_from (same MoE settings, so the fresh split is the same).
  std::string prune_from;
  int64_t prune_keep = 0;
  std::string output = "runs/run";
  bool save_best = true;     // write the best model as a Hugging Face folder
  bool export_dense = true;  // ... recomposed to the dense architecture when possible
  // model/ and model_moe/ split into Hugging Face shards of at most this size ("2GB", "500MB",
  // bytes); "" writes one model.safetensors. max_shard_bytes is its value, parsed once.
  std::string max_shard_size;
  uint64_t max_shard_bytes = 0;
  std::string device = "cpu";
  std::string dtype = "float32";
  int threads = 0;

  bool uses_moe() const;  // the method converts FFN layers
  PeftMethod peft_method() const;

  nlohmann::json to_json() const;
  // Reads JSON produced by to_json() or written by hand; unknown keys are errors.
  static RunConfig from_json(const nlohmann::json& j, const std::string& where);
  void validate() const;
};

// The name of a `dataset:` run without a `task:` ("reviews" for reviews/train.tsv or reviews.tsv).
std::string dataset_name(const std::string& train_file);

// YAML (or JSON) file -> config, with `key=value` overrides applied on top ("train.lr=3e-5",
// "moe.layers=[2,3]", "method=lora"). Errors name the file and the key.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The keys whose values differ between a run folder's saved config.json and `cfg` ("train.lr:
// 3e-05 in config.json, 0.0001 given"), leaving out what is not part of the run: the output
// folder, threads, train.stop_after_steps and train.sharding. Empty: the same run.
std::vector<std::string> run_config_differences(nlohmann::json saved, const RunConfig& cfg);
// A YAML (or JSON) file as JSON, scalars typed as YAML reads them (InputError naming the file).
nlohmann::json load_yaml_file(const std::string& path);
// The YAML file (or {} without a path) with the overrides applied; `where` becomes the path.
nlohmann::json load_layered_config(const std::string& path,
                                   const std::vector<std::string>& overrides, std::string& where);

// Applies overrides to a JSON config (dotted keys; values parsed as YAML scalars/lists).
void apply_overrides(nlohmann::json& j, const std::vector<std::string>& overrides);

}  // namespace emoe
