// Run configuration: YAML -> JSON -> typed struct, with overrides and validation.
#include "emoe/train/run_config.h"

#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include "emoe/core/error.h"
#include "emoe/core/runtime.h"
#include "emoe/data/templates.h"
#include "emoe/io/safetensors.h"
#include "emoe/train/config_fields.h"
#include "emoe/train/method_table.h"

namespace emoe {

namespace {

// Well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// A YAML string as a JSON string: JSON text (run.json, error messages) must be UTF-8.
std::string yaml_string(const YAML::Node& n, const std::string& s) {
  if (!valid_utf8(s))
    throw YAML::ParserException(
        n.Mark(),
        "text that is not valid UTF-8: " +
            nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  return s;
}

// Aliases are expanded: an alias inside its own anchor (`a: &x [*x]`) would recurse forever, and
// nested aliases grow exponentially ("billion laughs"). A run configuration is small, so the
// expanded document is bounded in depth and in values.
constexpr int kMaxYamlDepth = 64;
constexpr size_t kMaxYamlValues = 10000;

nlohmann::json yaml_to_json(const YAML::Node& n, int depth, size_t& values) {
  if (depth > kMaxYamlDepth)
    throw YAML::ParserException(n.Mark(),
                                fmt::format("nested deeper than {} levels (or an alias inside "
                                            "its own anchor)",
                                            kMaxYamlDepth));
  if (++values > kMaxYamlValues)
    throw YAML::ParserException(
        n.Mark(), fmt::format("more than {} values once aliases are expanded", kMaxYamlValues));
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Sequence: {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& x : n) a.push_back(yaml_to_json(x, depth + 1, values));
      return a;
    }
    case YAML::NodeType::Map: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& kv : n) {
        const std::string key = yaml_string(kv.first, kv.first.as<std::string>());
        // YAML forbids a key twice in one mapping; yaml-cpp would keep the last one silently
        if (o.contains(key))
          throw YAML::ParserException(kv.first.Mark(),
                                      fmt::format("the key '{}' is given twice", key));
        o[key] = yaml_to_json(kv.second, depth + 1, values);
      }
      return o;
    }
    case YAML::NodeType::Scalar: {
      const std::string s = yaml_string(n, n.Scalar());
      if (n.Tag() == "!") return s;  // quoted: a string
      if (s == "true" || s == "True") return true;
      if (s == "false" || s == "False") return false;
      if (s == "null" || s == "~") return nullptr;
      try {
        size_t used = 0;
        long long v = std::stoll(s, &used);
        if (used == s.size()) return v;
      } catch (const std::exception&) {
      }
      try {
        size_t used = 0;
        double v = std::stod(s, &used);
        if (used == s.size()) return v;
      } catch (const std::exception&) {
      }
      return s;
    }
  }
  return nullptr;
}

nlohmann::json yaml_to_json(const YAML::Node& n) {
  size_t values = 0;
  return yaml_to_json(n, 0, values);
}

// Reads a key of a JSON object into `out`, naming `where.key` in errors; marks the key used.
class Reader {
 public:
  Reader(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {
    EMOE_CHECK(j_.is_object(), InputError, "{}: expected a mapping, got {}", where_,
               j_.type_name());
  }
  template <typename T>
  void get(const char* key, T& out) {
    used_.insert(key);
    if (!j_.contains(key) || j_[key].is_null()) return;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      // A float beyond T's range (1e300) cannot be converted (undefined behaviour): refused.
      const auto& v = j_[key];
      if (v.is_number_float()) {
        // nor is a fraction: epochs=1.7 is not 1 epoch
        const double d = v.get<double>();
        EMOE_CHECK(d >= static_cast<double>(std::numeric_limits<T>::min()) &&
                       d < std::ldexp(1.0, std::numeric_limits<T>::digits) && d == std::trunc(d),
                   InputError, "{}.{}: expected {}, got {}", where_, key, kind<T>(), v.dump());
      }
      // a negative number for an unsigned field (seed) would wrap around
      EMOE_CHECK(std::is_signed_v<T> || !(v.is_number_integer() && v.get<int64_t>() < 0),
                 InputError, "{}.{}: expected {}, got {}", where_, key, kind<T>(), v.dump());
    }
    try {
      out = j_[key].get<T>();
    } catch (const nlohmann::json::exception&) {
      EMOE_THROW(InputError, "{}.{}: expected {}, got {}", where_, key, kind<T>(), j_[key].dump());
    }
  }
  const nlohmann::json* sub(const char* key) {
    used_.insert(key);
    if (!j_.contains(key) || j_[key].is_null()) return nullptr;
    return &j_[key];
  }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      EMOE_CHECK(used_.count(it.key()), InputError, "{}: unknown key '{}' (known: {})", where_,
                 it.key(), fmt::join(used_, ", "));
  }

 private:
  template <typename T>
  static const char* kind() {
    if constexpr (std::is_same_v<T, bool>)
      return "true or false";
    else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>)
      return "a non-negative integer";
    else if constexpr (std::is_integral_v<T>)
      return "an integer";
    else if constexpr (std::is_floating_point_v<T>)
      return "a number";
    else if constexpr (std::is_same_v<T, std::string>)
      return "a string";
    else
      return "a list";
  }
  const nlohmann::json& j_;
  std::string where_;
  std::set<std::string> used_;
};

// The config names of an option's values: to_string and parse_* read the same table.
template <typename E>
struct OptionName {
  E value;
  const char* name;
};

constexpr OptionName<ObjectiveKind> kObjectiveNames[] = {
    {ObjectiveKind::kClassification, "classification"},
    {ObjectiveKind::kInstruction, "instruction"},
    {ObjectiveKind::kSeq2Seq, "seq2seq"}};
constexpr OptionName<Schedule> kScheduleNames[] = {{Schedule::kLinear, "linear"},
                                                   {Schedule::kCosine, "cosine"},
                                                   {Schedule::kConstant, "constant"}};
constexpr OptionName<Ablation> kAblationNames[] = {
    {Ablation::kNone, "none"},
    {Ablation::kTrainDenseEvalMoe, "train-dense-eval-moe"},
    {Ablation::kTrainMoeEvalDense, "train-moe-eval-dense"}};
constexpr OptionName<NonFinitePolicy> kNonFiniteNames[] = {{NonFinitePolicy::kStop, "stop"},
                                                           {NonFinitePolicy::kSkip, "skip"}};
// A run config takes these two names only (parse_precision also takes the tools' aliases).
constexpr OptionName<Precision> kPrecisionNames[] = {{Precision::kFp32, "fp32"},
                                                     {Precision::kBf16Mixed, "bf16-mixed"}};

template <typename E, size_t N>
std::string option_name(const OptionName<E> (&names)[N], E value) {
  for (const auto& n : names)
    if (n.value == value) return n.name;
  EMOE_THROW(UsageError, "option value {} has no name", static_cast<int>(value));
}

// "run config: <key>: expected a, b or c, got '<name>'" for a name not in the table.
template <typename E, size_t N>
E parse_option(const OptionName<E> (&names)[N], const std::string& name, const char* key) {
  std::string expected;
  for (size_t i = 0; i < N; ++i) {
    if (name == names[i].name) return names[i].value;
    expected += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(names[i].name);
  }
  EMOE_THROW(InputError, "run config: {}: expected {}, got '{}'", key, expected, name);
}

// The sub-mappings of a run config (RunConfig::from_json).
void read_dataset(const nlohmann::json& j, const std::string& where, CustomDataset& d) {
  Reader dr(j, where + ".dataset");
  dr.get("train", d.train);
  dr.get("dev", d.dev);
  if (auto* o = dr.sub("ood")) {
    EMOE_CHECK(o->is_object(), InputError, "{}.dataset.ood: expected a mapping name: file", where);
    for (auto it = o->begin(); it != o->end(); ++it) {
      EMOE_CHECK(it.value().is_string(), InputError, "{}.dataset.ood.{}: expected a file path",
                 where, it.key());
      d.ood.emplace_back(it.key(), it.value().get<std::string>());
    }
  }
  dr.get("text_cols", d.text_cols);
  dr.get("label_col", d.label_col);
  dr.get("labels", d.labels);
  dr.get("regression", d.regression);
  dr.get("metrics", d.metrics);
  dr.finish();
}

void read_mixture(const nlohmann::json& j, const std::string& where, MixtureConfig& m) {
  Reader mr(j, where + ".mixture");
  mr.get("tasks", m.tasks);
  mr.get("rate", m.rate);
  mr.get("cap", m.cap);
  mr.get("temperature", m.temperature);
  mr.get("templates", m.templates);
  mr.finish();
}

// moe.layers entries "encoder.N" / "decoder.N" -> moe.encoder_layers / moe.decoder_layers.
void read_stack_layers(nlohmann::json& merged, const nlohmann::json& given,
                       const std::string& where) {
  auto listed = [&](const char* key) {
    return given.contains(key) && given[key].is_array() && !given[key].empty();
  };
  const bool named = listed("encoder_layers") || listed("decoder_layers");
  if (given.contains("layers") && given["layers"].is_array()) {
    bool strings = false, ints = false;
    for (const auto& v : given["layers"]) (v.is_string() ? strings : ints) = true;
    EMOE_CHECK(!(strings && ints), InputError,
               "{}.moe.layers: expected integers (both stacks counted together) or names like "
               "encoder.5 and decoder.5, not both",
               where);
    EMOE_CHECK(!named || given["layers"].empty(), InputError,
               "{}.moe: give layers or encoder_layers/decoder_layers, not both", where);
    if (!strings) return;
    std::vector<int64_t> enc, dec;
    for (const auto& v : given["layers"]) {
      const std::string name = v.get<std::string>();
      const bool is_enc = name.rfind("encoder.", 0) == 0, is_dec = name.rfind("decoder.", 0) == 0;
      const std::string digits = name.substr(std::min<size_t>(8, name.size()));
      EMOE_CHECK((is_enc || is_dec) && !digits.empty() && digits.size() <= 9 &&
                     digits.find_first_not_of("0123456789") == std::string::npos,
                 InputError,
                 "{}.moe.layers: expected a layer index, encoder.N or decoder.N, got '{}'", where,
                 name);
      (is_enc ? enc : dec).push_back(std::stoll(digits));
    }
    merged["layers"] = nlohmann::json::array();
    merged["encoder_layers"] = enc;
    merged["decoder_layers"] = dec;
  }
}

// moe: the defaults of the method, then the keys given (moe.json's field names).
MoeConfig read_moe(Reader& r, const std::string& method, const std::string& where) {
  // an unknown method is refused by validate(); its moe: keys are read as EMoE's meanwhile
  const MethodInfo* info = find_method(method);
  const std::string moe_name = info && info->uses_moe() ? info->moe : "emoe";
  const bool learn_init = moe_name == kEmoeLearnInit;
  MoeConfig moe = MoeConfig::for_method_name(moe_name);
  const MoeMethod mm = moe.method;
  moe.layers.clear();
  if (auto* m = r.sub("moe")) {
    EMOE_CHECK(m->is_object(), InputError, "{}.moe: expected a mapping", where);
    nlohmann::json merged = moe.to_json();
    static const std::set<std::string> known = [] {
      std::set<std::string> k;
      const nlohmann::json defaults = MoeConfig().to_json();
      for (auto it = defaults.begin(); it != defaults.end(); ++it) k.insert(it.key());
      k.insert("kmeans");
      return k;
    }();
    for (auto it = m->begin(); it != m->end(); ++it) {
      EMOE_CHECK(known.count(it.key()), InputError, "{}.moe: unknown key '{}' (known: {})", where,
                 it.key(), fmt::join(known, ", "));
      EMOE_CHECK(it.key() != "method" || it.value() == to_string(mm), InputError,
                 "{}.moe.method: the MoE method follows `method:` ({} -> {}), got {}", where,
                 method, to_string(mm), it.value().dump());
      merged[it.key()] = it.value();
    }
    // layers named per stack of an encoder-decoder model ("encoder.5", "decoder.5") go to
    // encoder_layers/decoder_layers; plain integers keep counting both stacks together
    read_stack_layers(merged, *m, where);
    if (m->contains("tutel") && (*m)["tutel"].is_boolean() && (*m)["tutel"].get<bool>()) {
      MoeConfig tmp = MoeConfig::from_json(JsonFields(merged, where + ".moe"));
      tmp.enable_tutel_parity();
      nlohmann::json t = tmp.to_json();
      for (auto& k : {"gate_noise", "softmax_before_topk", "capacity_factor", "batch_prioritized",
                      "balance_loss", "balance_weight", "preact_dropout"})
        if (!m->contains(k)) merged[k] = t[k];
    }
    // an explicit empty list would be replaced by the default while the saved config says []
    EMOE_CHECK(!m->contains("layers") || !(*m)["layers"].is_array() || !(*m)["layers"].empty(),
               InputError,
               "{}.moe.layers: expected at least one layer index (leave the key out for the "
               "method's default layers)",
               where);
    moe = MoeConfig::from_json(JsonFields(merged, where + ".moe"));
    EMOE_CHECK(!learn_init || (moe.gate == GateKind::kLinear && moe.gate_init == "avgk"),
               InputError,
               "{}.moe: emoe-learn-init is the linear gate initialised to avg-k, got gate {} with "
               "gate_init {} (for another gate use the method emoe-learn)",
               where, to_string(moe.gate), moe.gate_init);
    std::set<int64_t> seen;
    for (auto l : moe.layers)  // converted twice would make a model info and eval refuse
      EMOE_CHECK(seen.insert(l).second, InputError, "{}.moe.layers: layer {} is listed twice",
                 where, l);
  }
  moe.origin = where + ".moe.";  // errors name the run config's keys, not convert's flags
  return moe;
}

void read_peft(const nlohmann::json& j, const std::string& where, PeftConfig& p) {
  Reader pr(j, where + ".peft");
  pr.get("targets", p.targets);
  pr.get("feedforward_targets", p.feedforward_targets);
  pr.get("r", p.r);
  pr.get("alpha", p.alpha);
  pr.get("dropout", p.dropout);
  pr.get("experts", p.experts);
  pr.get("topk", p.topk);
  pr.get("balance_weight", p.balance_weight);
  pr.finish();
}

// The option names (schedule, precision, nonfinite) are parsed by the caller.
void read_train(const nlohmann::json& j, const std::string& where, TrainOptions& o,
                std::string& schedule, std::string& precision, std::string& nonfinite) {
  Reader tr(j, where + ".train");
  tr.get("lr", o.lr);
  tr.get("head_lr", o.head_lr);
  tr.get("router_lr", o.router_lr);
  tr.get("weight_decay", o.weight_decay);
  tr.get("adam_beta1", o.adam_beta1);
  tr.get("adam_beta2", o.adam_beta2);
  tr.get("adam_eps", o.adam_eps);
  tr.get("batch_size", o.batch_size);
  tr.get("eval_batch_size", o.eval_batch_size);
  tr.get("grad_accum", o.grad_accum);
  tr.get("grad_clip", o.grad_clip);
  tr.get("epochs", o.epochs);
  tr.get("max_steps", o.max_steps);
  tr.get("schedule", schedule);
  tr.get("warmup_ratio", o.warmup_ratio);
  tr.get("warmup_steps", o.warmup_steps);
  tr.get("max_length", o.max_length);
  tr.get("seed", o.seed);
  tr.get("early_stopping", o.early_stopping);
  tr.get("max_train_examples", o.max_train_examples);
  tr.get("max_eval_examples", o.max_eval_examples);
  tr.get("log_every", o.log_every);
  tr.get("save_every", o.save_every);
  tr.get("stop_after_steps", o.stop_after_steps);
  tr.get("usage_interval", o.usage_interval);
  tr.get("precision", precision);
  tr.get("nonfinite", nonfinite);
  tr.get("max_consecutive_skips", o.max_consecutive_skips);
  tr.get("max_target_length", o.max_target_length);
  tr.get("trainable", o.trainable);
  tr.get("sharding", o.sharding);
  tr.get("gradient_checkpointing", o.gradient_checkpointing);
  tr.finish();
}

}  // namespace

std::string to_string(ObjectiveKind v) {
  return option_name(kObjectiveNames, v);
}
std::string to_string(Schedule v) {
  return option_name(kScheduleNames, v);
}
std::string to_string(Ablation v) {
  return option_name(kAblationNames, v);
}
std::string to_string(NonFinitePolicy v) {
  return option_name(kNonFiniteNames, v);
}
ObjectiveKind parse_objective(const std::string& name) {
  return parse_option(kObjectiveNames, name, "objective");
}
Schedule parse_schedule(const std::string& name) {
  return parse_option(kScheduleNames, name, "train.schedule");
}
Ablation parse_ablation(const std::string& name) {
  return parse_option(kAblationNames, name, "ablation");
}
NonFinitePolicy parse_nonfinite(const std::string& name) {
  return parse_option(kNonFiniteNames, name, "train.nonfinite");
}

bool RunConfig::uses_moe() const {
  const MethodInfo* info = find_method(method);
  return (info && info->uses_moe()) || ablation == Ablation::kTrainDenseEvalMoe;
}

PeftMethod RunConfig::peft_method() const {
  const MethodInfo* info = find_method(method);
  return info ? info->peft : PeftMethod::kNone;
}

nlohmann::json RunConfig::to_json() const {
  const auto& t = train;
  nlohmann::json tj = {{"lr", t.lr},
                       {"head_lr", t.head_lr},
                       {"router_lr", t.router_lr},
                       {"weight_decay", t.weight_decay},
                       {"adam_beta1", t.adam_beta1},
                       {"adam_beta2", t.adam_beta2},
                       {"adam_eps", t.adam_eps},
                       {"batch_size", t.batch_size},
                       {"eval_batch_size", t.eval_batch_size},
                       {"grad_accum", t.grad_accum},
                       {"grad_clip", t.grad_clip},
                       {"epochs", t.epochs},
                       {"max_steps", t.max_steps},
                       {"schedule", to_string(t.schedule)},
                       {"warmup_ratio", t.warmup_ratio},
                       {"warmup_steps", t.warmup_steps},
                       {"max_length", t.max_length},
                       {"seed", t.seed},
                       {"early_stopping", t.early_stopping},
                       {"max_train_examples", t.max_train_examples},
                       {"max_eval_examples", t.max_eval_examples},
                       {"log_every", t.log_every},
                       {"save_every", t.save_every},
                       {"stop_after_steps", t.stop_after_steps},
                       {"usage_interval", t.usage_interval},
                       {"precision", option_name(kPrecisionNames, t.precision)},
                       {"nonfinite", to_string(t.nonfinite)},
                       {"max_consecutive_skips", t.max_consecutive_skips}};
  nlohmann::json pj = {{"targets", peft.targets},
                       {"feedforward_targets", peft.feedforward_targets},
                       {"r", peft.r},
                       {"alpha", peft.alpha},
                       {"dropout", peft.dropout},
                       {"experts", peft.experts},
                       {"topk", peft.topk},
                       {"balance_weight", peft.balance_weight}};
  auto mj = moe.to_json();
  // no layers given: the method's default layers (chosen at conversion, recorded in moe.json);
  // an empty list is not written, so that a saved config reads back (moe.layers: [] is refused)
  if (moe.layers.empty()) mj.erase("layers");
  for (const char* k : {"encoder_layers", "decoder_layers"})
    if (mj[k].empty()) mj.erase(k);
  nlohmann::json dj = nullptr;
  if (!dataset.empty()) {
    nlohmann::json ood = nlohmann::json::object();
    for (const auto& [name, file] : dataset.ood) ood[name] = file;
    dj = {{"train", dataset.train},
          {"dev", dataset.dev},
          {"ood", ood},
          {"text_cols", dataset.text_cols},
          {"label_col", dataset.label_col},
          {"labels", dataset.labels},
          {"regression", dataset.regression},
          {"metrics", dataset.metrics}};
  }
  nlohmann::json out = {{"model", model},
                        {"objective", to_string(objective)},
                        {"task", task},
                        {"dataset", dj},
                        {"data_dir", data_dir},
                        {"ood", ood},
                        {"method", method},
                        {"moe", mj},
                        {"peft", pj},
                        {"train", tj},
                        {"ablation", to_string(ablation)},
                        {"instruct_data", instruct_data},
                        {"instruct_dev_fraction", instruct_dev_fraction},
                        {"mmlu_dir", mmlu_dir},
                        {"mmlu_shots", mmlu_shots},
                        {"mmlu_max_questions", mmlu_max_questions},
                        {"prune_from", prune_from},
                        {"prune_keep", prune_keep},
                        {"output", output},
                        {"save_best", save_best},
                        {"export_dense", export_dense},
                        {"device", device},
                        {"dtype", dtype},
                        {"threads", threads}};
  // only when given: the config.json of other runs stays as it was (and --resume accepts it)
  if (!max_shard_size.empty()) out["max_shard_size"] = max_shard_size;
  if (t.trainable != "all") out["train"]["trainable"] = t.trainable;
  if (t.sharding != "none") out["train"]["sharding"] = t.sharding;
  if (t.gradient_checkpointing) out["train"]["gradient_checkpointing"] = true;
  // only for seq2seq: the config.json of other runs stays as it was
  if (objective == ObjectiveKind::kSeq2Seq) {
    out["train"]["max_target_length"] = t.max_target_length;
    out["mixture"] = {{"tasks", mixture.tasks},
                      {"rate", mixture.rate},
                      {"cap", mixture.cap},
                      {"temperature", mixture.temperature},
                      {"templates", mixture.templates}};
    out["heldout"] = heldout;
    out["rank_score"] = rank_score;
  }
  return out;
}

// "reviews" for reviews/train.tsv or reviews.tsv: the file's name, or its folder's when the file
// is called train.
std::string dataset_name(const std::string& train_file) {
  const std::filesystem::path p(train_file);
  const std::string stem = p.stem().string();
  const std::string folder = p.parent_path().filename().string();
  if ((stem == "train" || stem == "training") && !folder.empty() && folder != "." && folder != "..")
    return folder;
  return stem.empty() ? "dataset" : stem;
}

RunConfig RunConfig::from_json(const nlohmann::json& j, const std::string& where) {
  RunConfig c;
  Reader r(j, where);
  // option names: read here, parsed once every key is known (type errors and unknown keys first)
  std::string objective = to_string(c.objective), ablation = to_string(c.ablation);
  std::string schedule = to_string(c.train.schedule), nonfinite = to_string(c.train.nonfinite);
  std::string precision = option_name(kPrecisionNames, c.train.precision);
  r.get("model", c.model);
  r.get("objective", objective);
  r.get("task", c.task);
  if (auto* d = r.sub("dataset")) read_dataset(*d, where, c.dataset);
  r.get("data_dir", c.data_dir);
  if (auto* o = r.sub("ood")) {
    if (o->is_string())
      c.ood = {o->get<std::string>()};
    else {
      try {
        c.ood = o->get<std::vector<std::string>>();
      } catch (const nlohmann::json::exception&) {
        EMOE_THROW(InputError, "{}.ood: expected a list of set names, got {}", where, o->dump());
      }
    }
  }
  r.get("method", c.method);
  r.get("ablation", ablation);
  r.get("instruct_data", c.instruct_data);
  r.get("instruct_dev_fraction", c.instruct_dev_fraction);
  r.get("mmlu_dir", c.mmlu_dir);
  r.get("mmlu_shots", c.mmlu_shots);
  r.get("mmlu_max_questions", c.mmlu_max_questions);
  if (auto* m = r.sub("mixture")) read_mixture(*m, where, c.mixture);
  r.get("heldout", c.heldout);
  r.get("rank_score", c.rank_score);
  r.get("prune_from", c.prune_from);
  r.get("prune_keep", c.prune_keep);
  r.get("output", c.output);
  r.get("save_best", c.save_best);
  r.get("export_dense", c.export_dense);
  if (const auto* m = r.sub("max_shard_size")) {
    // YAML reads a plain byte count as a number
    EMOE_CHECK(m->is_string() || m->is_number_unsigned(), InputError,
               "{}.max_shard_size: expected a size such as 500MB, 2GB or a number of bytes, got {}",
               where, m->dump());
    c.max_shard_size = m->is_string() ? m->get<std::string>() : std::to_string(m->get<uint64_t>());
    c.max_shard_bytes = parse_byte_size(c.max_shard_size, where + ".max_shard_size");
  }
  r.get("device", c.device);
  r.get("dtype", c.dtype);
  r.get("threads", c.threads);

  c.moe = read_moe(r, c.method, where);
  c.peft = PeftConfig::for_method(c.peft_method(), "");
  if (auto* p = r.sub("peft")) read_peft(*p, where, c.peft);
  c.peft.method = c.peft_method();
  if (auto* t = r.sub("train")) read_train(*t, where, c.train, schedule, precision, nonfinite);
  r.finish();
  c.objective = parse_objective(objective);
  c.ablation = parse_ablation(ablation);
  c.train.schedule = parse_schedule(schedule);
  c.train.nonfinite = parse_nonfinite(nonfinite);
  c.train.precision = parse_option(kPrecisionNames, precision, "train.precision");
  // settings a method does not read are said so, not dropped silently (a sweep's shared base
  // config may carry them for its other methods)
  if (r.sub("moe") && !c.uses_moe())
    spdlog::warn("{}: moe: settings are not used by method {} (it converts no FFN layer)", where,
                 c.method);
  if (r.sub("peft") && c.peft_method() == PeftMethod::kNone)
    spdlog::warn("{}: peft: settings are not used by method {} (it adds no adapters)", where,
                 c.method);
  // a run on the user's own files needs no GLUE task: it is named after its data
  if (c.task.empty() && !c.dataset.empty()) c.task = dataset_name(c.dataset.train);
  return c;
}

void RunConfig::validate() const {
  auto bad = [](const std::string& key, const std::string& what) {
    EMOE_THROW(InputError, "run config: {}: {}", key, what);
  };
  if (model.empty()) bad("model", "required (a Hugging Face model folder)");
  const MethodInfo& info = method_info(method, "run config: method");
  if (objective == ObjectiveKind::kSeq2Seq) {
    if (mixture.tasks.empty())
      bad("mixture.tasks", "required for seq2seq (e.g. [sst2, cola, mrpc])");
    std::set<std::string> seen;
    for (const auto& t : mixture.tasks) {
      task_templates(t, "run config: mixture.tasks");
      if (!seen.insert(t).second) bad("mixture.tasks", fmt::format("task '{}' is listed twice", t));
    }
    for (const auto& t : heldout) {
      task_templates(t, "run config: heldout");
      if (seen.count(t))
        bad("heldout", fmt::format("task '{}' is also a training task (mixture.tasks)", t));
    }
    if (mixture.rate != "examples-proportional" && mixture.rate != "temperature")
      bad("mixture.rate",
          fmt::format("expected examples-proportional or temperature, got '{}'", mixture.rate));
    if (mixture.templates != "all" && mixture.templates != "first")
      bad("mixture.templates", fmt::format("expected all or first, got '{}'", mixture.templates));
    if (rank_score != "sum" && rank_score != "mean")
      bad("rank_score", fmt::format("expected sum or mean, got '{}'", rank_score));
    if (!dataset.empty()) bad("dataset", "not used by seq2seq (the mixture reads GLUE tasks)");
    if (!ood.empty()) bad("ood", "not used by seq2seq (use heldout)");
  } else {
    const std::string only =
        fmt::format("only for objective seq2seq, got objective '{}'", to_string(objective));
    if (!mixture.tasks.empty()) bad("mixture", only);
    if (!heldout.empty()) bad("heldout", only);
  }
  if (objective == ObjectiveKind::kClassification && task.empty())
    bad("task", "required for classification");
  if (!dataset.empty()) {
    if (dataset.dev.empty()) bad("dataset.dev", "required with dataset.train");
    if (!dataset.regression && dataset.labels.size() < 2)
      bad("dataset.labels", "expected two or more label names");
    if (dataset.metrics.empty()) bad("dataset.metrics", "expected at least one metric");
    if (dataset.text_cols.empty() || dataset.text_cols.size() > 2)
      bad("dataset.text_cols", "expected one or two columns");
  }
  if (objective == ObjectiveKind::kInstruction && instruct_data.empty())
    bad("instruct_data", "required for instruction tuning (an Alpaca JSON file)");
  if (ablation == Ablation::kTrainMoeEvalDense && !info.is_emoe()) {
    std::vector<std::string> emoe_methods;
    for (const auto& m : method_table())
      if (m.is_emoe()) emoe_methods.push_back(m.name);
    bad("ablation", fmt::format("train-moe-eval-dense needs an EMoE method ({}), got method {}",
                                fmt::join(emoe_methods, ", "), method));
  }
  const auto& t = train;
  // every numeric key against its range in one table (config_fields.cpp, docs/config.md): a
  // value outside it is refused before anything is written (log_every 0 divided by zero;
  // threads without bound started that many threads)
  check_field_ranges(to_json());
  if (t.epochs < 1 && t.max_steps < 1) bad("train.epochs", "expected >= 1 (or train.max_steps)");
  // the name here (a run config names its key, not --device); CUDA's presence when the run starts
  parse_device(device, "run config: device");
  if (dtype != "float32" && dtype != "bfloat16" && dtype != "float16")
    bad("dtype", fmt::format("expected float32, bfloat16 or float16, got '{}'", dtype));
  // refused here: on the CPU libtorch would fail mid-run, after the run folder exists
  // ("LayerNormKernelImpl" not implemented for 'Half')
  if (dtype == "float16" && device.rfind("cuda", 0) != 0)
    bad("dtype", fmt::format("float16 needs a CUDA device (the CPU has no float16 kernels for "
                             "layer norms and softmax); on device '{}' use bfloat16",
                             device));
  if (t.precision == Precision::kBf16Mixed && dtype != "float32")
    bad("train.precision",
        fmt::format("bf16-mixed needs float32 weights (dtype), got dtype '{}'", dtype));
  if (output.empty()) bad("output", "required");
  if (t.trainable != "all" && t.trainable != "moe-layers" && t.trainable != "gates")
    bad("train.trainable", fmt::format("expected all, moe-layers or gates, got '{}'", t.trainable));
  if (t.trainable != "all" && !uses_moe())
    bad("train.trainable",
        fmt::format("{} needs a method that converts FFN layers (emoe, gmoe, ...), got method {}",
                    t.trainable, method));
  if (t.trainable == "gates" && moe.gate == GateKind::kAvgK)
    bad("train.trainable",
        "gates: the avg-k gate has no parameters of its own (it is the mean of the keys); use a "
        "learned gate (emoe-learn, gmoe, moe.gate: linear or cosine) or moe-layers");
  if (t.sharding != "none" && t.sharding != "optimizer" && t.sharding != "gradients" &&
      t.sharding != "full")
    bad("train.sharding",
        fmt::format("expected none, optimizer, gradients or full, got '{}'", t.sharding));
  if (!prune_from.empty() && !uses_moe())
    bad("prune_from", "needs an MoE method (emoe, emoe+lora, ...)");
  if (!prune_from.empty() && prune_keep < 1) bad("prune_keep", "expected >= 1 with prune_from");
}

void apply_overrides(nlohmann::json& j, const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) {
    auto eq = o.find('=');
    EMOE_CHECK(eq != std::string::npos && eq > 0, UsageError,
               "--set {}: expected key=value (e.g. train.lr=3e-5)", o);
    std::string key = o.substr(0, eq), value = o.substr(eq + 1);
    nlohmann::json parsed;
    try {
      parsed = yaml_to_json(YAML::Load(value));
    } catch (const YAML::Exception& e) {
      EMOE_THROW(UsageError, "--set {}: value is not valid YAML: {}", o, e.what());
    }
    nlohmann::json* node = &j;
    size_t start = 0;
    while (true) {
      auto dot = key.find('.', start);
      std::string part =
          key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      EMOE_CHECK(!part.empty(), UsageError, "--set {}: empty key part", o);
      if (dot == std::string::npos) {
        (*node)[part] = parsed;
        break;
      }
      if (!node->contains(part) || !(*node)[part].is_object())
        (*node)[part] = nlohmann::json::object();
      node = &(*node)[part];
      start = dot + 1;
    }
  }
}

nlohmann::json load_yaml_file(const std::string& path) {
  EMOE_CHECK(std::filesystem::exists(path), InputError, "{}: no such config file", path);
  nlohmann::json j;
  try {
    j = yaml_to_json(YAML::LoadFile(path));
  } catch (const YAML::Exception& e) {
    EMOE_THROW(InputError, "{}: not valid YAML: {}", path, e.what());
  }
  if (j.is_null()) j = nlohmann::json::object();
  EMOE_CHECK(j.is_object(), InputError, "{}: expected a mapping of keys at the top level, got {}",
             path, j.is_array() ? "a list" : "a single value");
  return j;
}

nlohmann::json load_layered_config(const std::string& path,
                                   const std::vector<std::string>& overrides, std::string& where) {
  nlohmann::json j = nlohmann::json::object();
  if (!path.empty()) {
    j = load_yaml_file(path);
    where = path;
  }
  apply_overrides(j, overrides);
  return j;
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::string where = "run config";
  auto j = load_layered_config(path, overrides, where);
  RunConfig c = RunConfig::from_json(j, where);
  c.validate();
  return c;
}

namespace {

// The keys whose values differ between a saved and a given run config ("train.lr: 3e-05 in
// config.json, 0.0001 given"), recursively.
void config_differences(const nlohmann::json& saved, const nlohmann::json& now,
                        const std::string& prefix, std::vector<std::string>& out) {
  if (saved.is_object() && now.is_object()) {
    std::set<std::string> keys;
    for (auto it = saved.begin(); it != saved.end(); ++it) keys.insert(it.key());
    for (auto it = now.begin(); it != now.end(); ++it) keys.insert(it.key());
    for (const std::string& k : keys) {
      const nlohmann::json none;
      config_differences(saved.contains(k) ? saved.at(k) : none, now.contains(k) ? now.at(k) : none,
                         prefix.empty() ? k : prefix + "." + k, out);
    }
    return;
  }
  if (saved != now)
    out.push_back(fmt::format("{}: {} in config.json, {} given", prefix, saved.dump(), now.dump()));
}

}  // namespace

std::vector<std::string> run_config_differences(nlohmann::json saved, const RunConfig& cfg) {
  auto now = cfg.to_json();
  // where a run stops early, how the ranks share the optimiser state and whether activations are
  // recomputed are not part of the run (a checkpoint holds the state whole, gathered; the
  // recomputation gives the same gradients)
  for (const char* key : {"stop_after_steps", "sharding", "gradient_checkpointing"}) {
    if (saved.contains("train")) saved["train"].erase(key);
    now["train"].erase(key);
  }
  // where the folder lives and how many threads compute it are not part of the run: a copied
  // or moved run folder resumes, on another machine as well
  for (const char* key : {"output", "threads"}) {
    saved.erase(key);
    now.erase(key);
  }
  std::vector<std::string> differ;
  config_differences(saved, now, "", differ);
  return differ;
}

}  // namespace emoe
