// The run configuration's keys in one table (type, range, meaning): the range checks and the
// reference in docs/config.md both read it, so the documented ranges are the enforced ones.
#include "emoe/train/config_fields.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "emoe/core/error.h"
#include "emoe/train/method_table.h"
#include "emoe/train/run_config.h"

namespace emoe {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// [lo, inf), [lo, hi), (lo, hi] ...
FieldRange at_least(double lo) {
  return {lo, kInf, false, true};
}
FieldRange above(double lo) {
  return {lo, kInf, true, true};
}
FieldRange from_to(double lo, double hi) {
  return {lo, hi, false, false};
}
FieldRange from_below(double lo, double hi) {
  return {lo, hi, false, true};
}
FieldRange open_closed(double lo, double hi) {
  return {lo, hi, true, false};
}
FieldRange open_open(double lo, double hi) {
  return {lo, hi, true, true};
}

const std::optional<FieldRange> kNone;

std::vector<ConfigField> make_fields() {
  const std::string num = "number", integer = "integer", text = "string", flag = "true or false";
  const std::string texts = "list of strings";
  return {
      // what to train, on what
      {"model", text, kNone, "Hugging Face model folder (required)"},
      {"objective", "one of: classification, instruction, seq2seq", kNone,
       "what the model learns: a label per example, Alpaca-style responses, or text-to-text (T5)"},
      {"task", text, kNone,
       "GLUE task (cola, sst2, mrpc, qqp, stsb, mnli, mnli-mm, qnli, rte, wnli); with "
       "`dataset:` only the run's name"},
      {"dataset.train", text, kNone, "your own training file (TSV, CSV or JSONL)"},
      {"dataset.dev", text, kNone, "your own dev file (required with dataset.train)"},
      {"dataset.ood", "mapping name: file", kNone, "out-of-domain sets evaluated after training"},
      {"dataset.text_cols", texts, kNone, "one text column, or two for sentence pairs"},
      {"dataset.label_col", text, kNone, "the label column"},
      {"dataset.labels", texts, kNone, "label names in id order (two or more)"},
      {"dataset.regression", flag, kNone, "a real-valued label (one output, MSE loss)"},
      {"dataset.metrics", texts, kNone,
       "metrics reported; the first picks the best epoch (accuracy, f1, mcc, pearson, spearman)"},
      {"data_dir", text, kNone, "folder of the GLUE and out-of-domain data"},
      {"ood", texts, kNone, "out-of-domain set names of the task, or [all]"},
      {"method", fmt::format("one of: {}", fmt::join(method_names(), ", ")), kNone,
       "fine-tuning method (the table below)"},
      {"ablation", "one of: none, train-dense-eval-moe, train-moe-eval-dense", kNone,
       "compute the dense FFN in training or in evaluation (SPEC §3.4)"},
      // MoE conversion (methods that convert FFN layers)
      {"moe.method", "one of: emoe, emoe-learn, gmoe, moefication", kNone,
       "follows `method:` (may be omitted)"},
      {"moe.experts", integer, at_least(1), "experts per converted layer (N)"},
      {"moe.topk", integer, at_least(1), "experts per token (k, at most N)"},
      {"moe.layers", "list of integers (or encoder.N / decoder.N)", kNone,
       "layers to convert (an encoder-decoder's counted over both stacks, or named per stack); "
       "left out: the method's default layers"},
      {"moe.encoder_layers", "list of integers", kNone,
       "an encoder-decoder's encoder blocks to convert (moe.layers' encoder.N)"},
      {"moe.decoder_layers", "list of integers", kNone,
       "an encoder-decoder's decoder blocks to convert (moe.layers' decoder.N)"},
      {"moe.split", "one of: balanced-kmeans, random, contiguous, coactivation", kNone,
       "how neurons are grouped into experts"},
      {"moe.seed", "non-negative integer", kNone, "seed of the split"},
      {"moe.kmeans.restarts", integer, at_least(1), "balanced k-means restarts"},
      {"moe.kmeans.max_iter", integer, at_least(1), "balanced k-means iterations per restart"},
      {"moe.kmeans.tol", num, at_least(0),
       "k-means tolerance, relative to the mean per-dimension variance"},
      {"moe.gate", "one of: avgk, linear, cosine, mlp", kNone, "the router"},
      {"moe.gate_init", "one of: avgk, random", kNone, "initial weights of a learned linear gate"},
      {"moe.execution", "one of: masked, dispatched", kNone,
       "every neuron computed then masked, or only the selected experts' rows"},
      {"moe.weighted", flag, kNone,
       "combine experts by renormalised top-k probabilities (else each counts 1)"},
      {"moe.tutel", flag, kNone, "the authors' tutel regime: sets the five keys below"},
      {"moe.gate_noise", num, at_least(0), "gate logit noise in training (tutel 1.0)"},
      {"moe.softmax_before_topk", flag, kNone, "rank softmax probabilities (tutel)"},
      {"moe.capacity_factor", num, at_least(0), "expert capacity factor; 0: no limit (tutel 1.5)"},
      {"moe.batch_prioritized", flag, kNone, "capacity favours the most confident tokens"},
      {"moe.balance_loss", "one of: none, importance-load, switch, z-loss", kNone,
       "auxiliary balance loss"},
      {"moe.balance_weight", num, at_least(0), "weight of the balance loss"},
      {"moe.preact_dropout", num, from_below(0, 1),
       "dropout on the FFN pre-activation in training (tutel 0.1)"},
      {"moe.cosine_dim", integer, at_least(1), "projection size of the cosine router"},
      {"moe.sample_tokens", integer, at_least(1),
       "tokens gathered for the co-activation split and MoEfication's router"},
      // adapters (methods that add them)
      {"peft.targets", texts, kNone,
       "modules to adapt (name suffixes, `*` for one component); empty: the family's defaults"},
      {"peft.feedforward_targets", texts, kNone,
       "(IA)^3 / MoV: modules scaled at their input; empty: defaults"},
      {"peft.r", integer, at_least(1), "LoRA rank (MoLoRA default 4)"},
      {"peft.alpha", num, above(0), "LoRA alpha (updates scaled by alpha / r)"},
      {"peft.dropout", num, from_below(0, 1), "dropout on the adapter input"},
      {"peft.experts", integer, at_least(1), "MoV / MoLoRA experts"},
      {"peft.topk", integer, at_least(0), "MoLoRA experts per token; 0: soft merging of all"},
      {"peft.balance_weight", num, at_least(0), "MoLoRA top-k balance loss weight"},
      // training
      {"train.lr", num, open_open(0, kInf), "peak learning rate"},
      {"train.head_lr", num, at_least(0), "classifier head learning rate; 0: train.lr"},
      {"train.router_lr", num, at_least(0), "gate and router learning rate; 0: train.lr"},
      {"train.weight_decay", num, at_least(0), "AdamW weight decay (not on biases and norms)"},
      {"train.adam_beta1", num, from_below(0, 1), "AdamW beta1"},
      {"train.adam_beta2", num, from_below(0, 1), "AdamW beta2"},
      {"train.adam_eps", num, open_closed(0, 1), "AdamW epsilon"},
      {"train.batch_size", integer, at_least(1), "examples per micro-batch"},
      {"train.eval_batch_size", integer, at_least(1), "examples per evaluation batch"},
      {"train.grad_accum", integer, at_least(1), "micro-batches per optimiser step"},
      {"train.grad_clip", num, at_least(0), "gradient norm clipping; 0: off"},
      {"train.epochs", integer, at_least(0), "passes over the training data (or train.max_steps)"},
      {"train.max_steps", integer, at_least(0), "optimiser steps; 0: the epochs decide"},
      {"train.schedule", "one of: linear, cosine, constant", kNone, "learning-rate schedule"},
      {"train.warmup_ratio", num, from_below(0, 1), "share of the steps spent warming up"},
      {"train.warmup_steps", integer, at_least(0), "warm-up steps; > 0 overrides warmup_ratio"},
      {"train.max_length", integer, at_least(8),
       "tokens per example (at most the model's positions)"},
      {"train.seed", "non-negative integer", kNone, "seed of data order, dropout and adapters"},
      {"train.early_stopping", integer, at_least(0),
       "evaluations without improvement before stopping; 0: off"},
      {"train.max_train_examples", integer, at_least(0), "training examples used; 0: all"},
      {"train.max_eval_examples", integer, at_least(0),
       "examples per dev and out-of-domain set; 0: all"},
      {"train.log_every", integer, at_least(1), "optimiser steps between log lines"},
      {"train.save_every", integer, at_least(0), "steps between checkpoints; 0: each epoch end"},
      {"train.stop_after_steps", integer, at_least(0),
       "checkpoint and exit after this many steps (to test --resume); 0: off"},
      {"train.usage_interval", integer, at_least(0),
       "steps between expert-usage snapshots; 0: per epoch only"},
      {"train.precision", "one of: fp32, bf16-mixed", kNone,
       "bf16-mixed: matrix products in bfloat16, weights and optimiser state float32"},
      {"train.nonfinite", "one of: stop, skip", kNone,
       "a non-finite loss or gradient: stop the run, or skip the step"},
      {"train.max_consecutive_skips", integer, at_least(1),
       "under skip: steps skipped in a row that stop the run"},
      {"train.max_target_length", integer, at_least(2),
       "seq2seq: decoder target tokens (with eos)"},
      {"train.trainable", "one of: all, moe-layers, gates", kNone,
       "what trains: as the method says, only the converted layers, or only their learned gates "
       "(the task head and adapters always)"},
      {"train.sharding", "one of: none, optimizer, gradients, full", kNone,
       "data parallel: what each rank keeps only its share of (ZeRO 1: AdamW state; 2: also the "
       "reduced gradients; 3, full: also the weights of each transformer block, gathered around "
       "its forward and backward)"},
      {"train.gradient_checkpointing", flag, kNone,
       "activation checkpointing: each transformer block keeps only its input and runs again in "
       "the backward pass (less memory, one more forward of the blocks)"},
      // instruction tuning
      {"instruct_data", text, kNone, "Alpaca-style JSON file (objective instruction)"},
      {"instruct_dev_fraction", num, open_open(0, 1), "share held out for the dev loss"},
      {"mmlu_dir", text, kNone, "MMLU folder evaluated after instruction tuning"},
      {"mmlu_shots", integer, at_least(0), "MMLU examples shown before each question"},
      {"mmlu_max_questions", integer, at_least(0), "MMLU questions per subject; 0: all"},
      // text-to-text
      {"mixture.tasks", texts, kNone, "seq2seq: GLUE tasks of the training mixture"},
      {"mixture.rate", "one of: examples-proportional, temperature", kNone,
       "how tasks are sampled"},
      {"mixture.cap", integer, at_least(0), "examples-proportional cap per task; 0: none"},
      {"mixture.temperature", num, above(0), "temperature-scaled mixing"},
      {"mixture.templates", "one of: all, first", kNone, "prompt templates per task"},
      {"heldout", texts, kNone, "seq2seq: tasks scored zero-shot by rank classification"},
      {"rank_score", "one of: sum, mean", kNone, "a choice's score: sum or mean log-probability"},
      // pruning, outputs, machine
      {"prune_from", text, kNone, "run folder whose training usage picks the experts kept"},
      {"prune_keep", integer, at_least(0), "experts kept per layer with prune_from (>= 1 then)"},
      {"output", text, kNone, "run folder (`-o`)"},
      {"save_best", flag, kNone, "write the best model as a Hugging Face folder (model/)"},
      {"export_dense", flag, kNone, "... recomposed to the dense architecture when possible"},
      {"max_shard_size", "size (500MB, 2GB) or bytes", kNone,
       "split model/ into Hugging Face shards; unset: one model.safetensors"},
      {"device", "cpu, cuda or cuda:N", kNone, "where the run computes"},
      {"dtype", "one of: float32, bfloat16, float16", kNone, "weight dtype (float16 only on CUDA)"},
      {"threads", integer, from_to(0, 4096), "intra-op threads; 0: the number of cores"},
  };
}

std::string format_number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{}", v);
}

// A default value as the docs show it.
std::string format_default(const nlohmann::json* v) {
  if (!v || v->is_null()) return "";
  if (v->is_string()) return v->get<std::string>().empty() ? "\"\"" : v->get<std::string>();
  if (v->is_array() && v->empty()) return "[]";
  return v->dump();
}

// The `method:` values from train/method_table.cpp: what each converts, adds and trains.
std::string methods_markdown() {
  std::string out =
      "\n## Methods\n\n"
      "From the table in `src/emoe/train/method_table.cpp`. Under a PEFT method everything else "
      "is\n"
      "frozen; `train.trainable` (`moe-layers`, `gates`) replaces what the method trains besides\n"
      "the adapters and the task head.\n\n"
      "| method | converts FFN layers | adapters | trains | notes |\n|---|---|---|---|---|\n";
  for (const auto& m : method_table()) {
    std::string trains = "everything";
    if (m.peft != PeftMethod::kNone) {
      trains = "the adapters, the task head";
      if (m.also_trains == "gates") trains += ", the routers of the converted layers";
      if (m.also_trains == "moe-layers") trains += ", the converted layers (whole)";
    }
    out += fmt::format("| `{}` | {} | {} | {} | {} |\n", m.name, m.uses_moe() ? m.moe : "",
                       m.peft == PeftMethod::kNone ? "" : to_string(m.peft), trains, m.description);
  }
  return out;
}

}  // namespace

bool FieldRange::contains(double v) const {
  if (std::isnan(v)) return false;
  const bool low = min_open ? v > min : v >= min;
  const bool high = max_open ? v < max : v <= max;
  return low && high;
}

std::string FieldRange::to_string() const {
  return fmt::format("{}{}, {}{}", min_open ? "(" : "[", format_number(min), format_number(max),
                     max_open ? ")" : "]");
}

const std::vector<ConfigField>& run_config_fields() {
  static const std::vector<ConfigField> fields = make_fields();
  return fields;
}

const nlohmann::json* find_field(const nlohmann::json& resolved, const std::string& key) {
  const nlohmann::json* node = &resolved;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? dot : dot - start);
    if (!node->is_object() || !node->contains(part)) return nullptr;
    node = &(*node)[part];
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

void check_field_ranges(const nlohmann::json& resolved) {
  for (const auto& f : run_config_fields()) {
    if (!f.range) continue;
    const nlohmann::json* v = find_field(resolved, f.key);
    if (!v || !v->is_number()) continue;  // absent here; types are checked when read
    const double d = v->get<double>();
    EMOE_CHECK(f.range->contains(d), InputError, "run config: {}: expected {}, got {}", f.key,
               f.range->to_string(), format_number(d));
  }
}

std::string config_fields_markdown() {
  RunConfig plain;
  nlohmann::json defaults = plain.to_json();
  RunConfig s2s;
  s2s.objective = ObjectiveKind::kSeq2Seq;
  const nlohmann::json s = s2s.to_json();
  for (const char* k : {"mixture", "heldout", "rank_score"}) defaults[k] = s[k];
  defaults["train"]["max_target_length"] = s["train"]["max_target_length"];
  defaults["train"]["trainable"] = plain.train.trainable;  // written only when not "all"
  for (const char* k : {"layers", "encoder_layers", "decoder_layers"})
    defaults["moe"][k] = nlohmann::json::array();
  RunConfig own_data;  // dataset: is null unless given; its keys' defaults
  own_data.dataset.train = "x";
  defaults["dataset"] = own_data.to_json()["dataset"];
  defaults["dataset"]["train"] = defaults["dataset"]["dev"] = "";
  std::string out =
      "# Run configuration: every key\n\n"
      "Generated by `build/emoe train --fields > docs/config.md` from the table in\n"
      "`src/emoe/train/config_fields.cpp`, the same table that refuses a value outside its range\n"
      "before anything is written (`run config: <key>: expected [0, inf), got -1`, exit 2);\n"
      "`tests/unit/config_fields_test.cpp` checks that this file is current, that every key of a\n"
      "resolved `config.json` is in the table, and that each range refuses its first value\n"
      "outside it. A key is written in YAML as nested mappings (`train: {lr: 3e-5}`) or with\n"
      "`--set train.lr=3e-5`. Defaults of `moe.*` are EMoE's (each MoE method has its own:\n"
      "GMoE 8 experts top 2, cosine gate; EMoE-learn the cosine router; EMoE-learn-init a linear\n"
      "gate started at avg-k); `peft.*` are LoRA's\n"
      "(MoLoRA r 4). A range written [a, b) includes a and excludes b.\n\n"
      "| key | type | default | range | meaning |\n|---|---|---|---|---|\n";
  for (const auto& f : run_config_fields()) {
    std::string def = format_default(find_field(defaults, f.key));
    out += fmt::format("| `{}` | {} | {} | {} | {} |\n", f.key, f.type,
                       def.empty() ? "" : "`" + def + "`", f.range ? f.range->to_string() : "",
                       f.meaning);
  }
  return out + methods_markdown();
}

}  // namespace emoe
