// PEFT adapter folders (peft v0.5.0 format): adapter_config.json + adapter_model.safetensors.
#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "emoe/core/error.h"
#include "emoe/io/atomic_file.h"
#include "emoe/io/hf_config.h"
#include "emoe/io/safetensors.h"
#include "emoe/models/architecture.h"
#include "emoe/peft/ia3.h"
#include "emoe/peft/lora.h"
#include "emoe/peft/peft.h"
#include "emoe/peft/targets.h"

namespace emoe {

namespace {

const std::string kPeftKeyPrefix = "base_model.model.";

bool peft_ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string peft_shape_str(at::IntArrayRef s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

// PEFT's task type for the model's head; null for heads PEFT has no type for (masked LM).
nlohmann::json peft_task_type(Head h) {
  switch (h) {
    case Head::kSequenceClassification:
      return "SEQ_CLS";
    case Head::kCausalLM:
      return "CAUSAL_LM";
    case Head::kSeq2SeqLM:
      return "SEQ_2_SEQ_LM";
    case Head::kBase:
      return "FEATURE_EXTRACTION";
    case Head::kMaskedLM:
      return nullptr;
  }
  return nullptr;
}

// The task head PEFT stores with a SEQ_CLS adapter (its modules_to_save: classifier, score).
bool peft_is_seqcls_head(const std::string& key) {
  return key.rfind("classifier.", 0) == 0 || key.rfind("score.", 0) == 0;
}

// Targets to write: `wanted` when PEFT's suffix rule selects exactly the adapted modules with
// them (matching against every module path, as PEFT does), else the adapted paths themselves.
std::vector<std::string> peft_targets_for_file(PretrainedModelImpl& model,
                                               const std::vector<std::string>& wanted,
                                               const std::vector<std::string>& adapted) {
  bool literal = !wanted.empty();
  for (const auto& t : wanted)
    if (t.find('*') != std::string::npos) literal = false;
  if (literal) {
    std::set<std::string> hit;
    for (const auto& m : model.named_modules("", false)) {
      auto path = hf_module_path(model, m.key());
      for (const auto& t : wanted)
        if (target_matches(t, path)) hit.insert(path);
    }
    if (hit == std::set<std::string>(adapted.begin(), adapted.end())) return wanted;
  }
  return adapted;
}

// What the run changed outside the adapters and the SEQ_CLS head — a head part initialised here
// (BERT's pooler when the checkpoint has none) or trained through also_train — as PEFT's
// modules_to_save: their modules (Hugging Face paths), with their tensors added to `tensors`,
// so that PEFT's model built from the base checkpoint equals ours. A parameter equal to the base
// checkpoint's stays out; without a readable base nothing can be told apart (a warning, none).
std::vector<std::string> peft_changed_modules(
    PretrainedModelImpl& model, const std::string& base_model_path,
    std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  const auto adapter_params = adapter_parameters(model);
  std::unique_ptr<CheckpointReader> base;
  std::map<std::string, std::string> base_key;  // module key -> the base file's key
  try {
    base = std::make_unique<CheckpointReader>(base_model_path);
    for (const auto& name : base->names())
      if (auto mk = model.module_key(name); !mk.empty()) base_key[mk] = name;
  } catch (const std::exception& e) {
    spdlog::warn(
        "{}: cannot read the base checkpoint ({}), so the adapter holds no "
        "modules_to_save: parts the run changed outside the adapters (a new pooler, "
        "also_train) are not in it",
        base_model_path, e.what());
    return {};
  }
  // frozen embeddings say select_trainable ran: then requires_grad marks what trained
  const bool selected = !model.input_embeddings().requires_grad();
  std::set<std::string> modules;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    const auto& k = p.key();
    const auto& v = p.value();
    if (adapter_params.count(v.unsafeGetTensorImpl()) || peft_is_seqcls_head(k)) continue;
    if (!model.is_head_key(k) && !(selected && v.requires_grad())) continue;
    auto it = base_key.find(k);
    if (base && it != base_key.end()) {
      auto ref = base->load(it->second, v.scalar_type());
      if (ref.sizes() == v.sizes() && torch::equal(ref, v.detach().to(torch::kCPU))) continue;
    }
    const std::string path = model.file_key(k);
    tensors.emplace_back(kPeftKeyPrefix + path, v.detach());
    modules.insert(path.substr(0, path.rfind('.')));
  }
  return {modules.begin(), modules.end()};
}

nlohmann::json peft_number_json(double v) {
  // PEFT writes integer alphas as integers (lora_alpha: 8)
  if (v == static_cast<double>(static_cast<int64_t>(v))) return static_cast<int64_t>(v);
  return v;
}

}  // namespace

void save_peft_adapter(PretrainedModelImpl& model, const PeftConfig& cfg, const std::string& dir,
                       const std::string& base_model_path) {
  const bool lora = cfg.method == PeftMethod::kLora;
  EMOE_CHECK(lora || cfg.method == PeftMethod::kIa3, UsageError,
             "save_peft_adapter: PEFT's adapter format holds LoRA and (IA)^3, not {}; save the "
             "whole model instead",
             to_string(cfg.method));
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::vector<std::string> adapted, adapted_ff;
  bool conv1d = false;
  const LoraAdapter* first_lora = nullptr;
  for (const auto& l : named_linears(model)) {
    if (!l.linear->adapter()) continue;
    const std::string path = hf_module_path(model, l.name);
    const std::string key = kPeftKeyPrefix + path;
    if (lora) {
      auto* a = dynamic_cast<const LoraAdapter*>(l.linear->adapter().get());
      EMOE_CHECK(a, UsageError, "save_peft_adapter: {} carries another kind of adapter than LoRA",
                 l.name);
      EMOE_CHECK(!first_lora || (a->options().r == first_lora->options().r &&
                                 a->options().alpha == first_lora->options().alpha),
                 UsageError,
                 "save_peft_adapter: {} has r {} alpha {}, others r {} alpha {}; one "
                 "PEFT file holds one rank and alpha",
                 l.name, a->options().r, a->options().alpha, first_lora->options().r,
                 first_lora->options().alpha);
      if (!first_lora) first_lora = a;
      tensors.emplace_back(key + ".lora_A.weight", a->lora_a->weight.detach());
      tensors.emplace_back(key + ".lora_B.weight", a->lora_b->weight.detach());
    } else {
      auto* a = dynamic_cast<const Ia3Adapter*>(l.linear->adapter().get());
      EMOE_CHECK(a, UsageError, "save_peft_adapter: {} carries another kind of adapter than (IA)^3",
                 l.name);
      tensors.emplace_back(key + ".ia3_l", a->peft_vector(*l.linear).detach());
      if (a->feedforward()) adapted_ff.push_back(path);
    }
    conv1d = conv1d || l.linear->options().transposed;
    adapted.push_back(path);
  }
  EMOE_CHECK(!adapted.empty(), UsageError, "save_peft_adapter: the model carries no {} adapters",
             to_string(cfg.method));

  const auto& summary = model.summary();
  if (summary.head == Head::kSequenceClassification)
    for (const auto& p : model.named_parameters(/*recurse=*/true))
      if (peft_is_seqcls_head(p.key()))
        tensors.emplace_back(kPeftKeyPrefix + model.file_key(p.key()), p.value().detach());
  const auto saved_modules = peft_changed_modules(model, base_model_path, tensors);

  nlohmann::json j;
  j["auto_mapping"] = nullptr;
  j["base_model_name_or_path"] = base_model_path;
  j["fan_in_fan_out"] = conv1d;
  j["inference_mode"] = true;
  j["modules_to_save"] =
      saved_modules.empty() ? nlohmann::json(nullptr) : nlohmann::json(saved_modules);
  j["revision"] = nullptr;
  j["task_type"] = peft_task_type(summary.head);
  auto wanted = cfg.targets.empty() ? default_targets(cfg.method, summary.model_type) : cfg.targets;
  j["target_modules"] = peft_targets_for_file(model, wanted, adapted);
  if (lora) {
    const auto& o = first_lora->options();
    j["peft_type"] = "LORA";
    j["r"] = o.r;
    j["lora_alpha"] = peft_number_json(o.alpha);
    j["lora_dropout"] = o.dropout;
    j["bias"] = "none";
    j["init_lora_weights"] = true;
    j["layers_pattern"] = nullptr;
    j["layers_to_transform"] = nullptr;
  } else {
    j["peft_type"] = "IA3";
    auto ff = cfg.feedforward_targets.empty()
                  ? default_feedforward_targets(cfg.method, summary.model_type)
                  : cfg.feedforward_targets;
    // An empty list must stay a list: PEFT would fill in its defaults for null
    j["feedforward_modules"] = adapted_ff.empty() ? std::vector<std::string>{}
                                                  : peft_targets_for_file(model, ff, adapted_ff);
    j["init_ia3_weights"] = true;
  }

  std::filesystem::create_directories(dir);
  save_safetensors(dir + "/adapter_model.safetensors", tensors,
                   {{"format", "pt"}, {"emoe_version", EMOE_VERSION}});
  write_text_atomic(dir + "/adapter_config.json", j.dump(2) + "\n");
}

namespace {

// PEFT 0.5.0's feed-forward defaults, which it applies when feedforward_modules is null.
nlohmann::json peft_default_feedforward(const ModelSummary& summary) {
  const auto* arch = find_architecture(summary.model_type);
  return arch ? nlohmann::json(arch->peft.library_feedforward) : nlohmann::json::array();
}

// True when the module at `path`, or one above it, is selected by modules_to_save.
bool peft_under_saved_module(const nlohmann::json& modules_to_save, const std::string& path) {
  if (!modules_to_save.is_array()) return false;
  for (size_t end = path.find('.');; end = path.find('.', end + 1)) {
    auto prefix = path.substr(0, end);
    for (const auto& t : modules_to_save)
      if (t.is_string() && target_matches(t.get<std::string>(), prefix)) return true;
    if (end == std::string::npos) return false;
  }
}

// One adapter_config.json read with every problem collected rather than thrown.
struct PeftFileConfig {
  PeftMethod method = PeftMethod::kNone;
  int64_t r = 0;
  double alpha = 0, dropout = 0;
  nlohmann::json targets, feedforward, modules_to_save;
};

PeftFileConfig peft_read_config(const nlohmann::json& j, const PretrainedModelImpl& model,
                                std::vector<std::string>& problems) {
  PeftFileConfig c;
  auto bad = [&](const std::string& field, const std::string& expected, const nlohmann::json& got) {
    problems.push_back(fmt::format("adapter_config.json: field '{}': expected {}, got {}", field,
                                   expected, got.dump()));
  };
  auto get = [&](const std::string& k) { return j.contains(k) ? j.at(k) : nlohmann::json(); };
  auto type = get("peft_type");
  if (type == "LORA")
    c.method = PeftMethod::kLora;
  else if (type == "IA3")
    c.method = PeftMethod::kIa3;
  else
    bad("peft_type", "\"LORA\" or \"IA3\"", type);

  const auto& head = model.summary().head;
  auto task = get("task_type");
  if (task == "SEQ_CLS" && head != Head::kSequenceClassification)
    bad("task_type",
        fmt::format("a task for this {} model (it is not sequence classification)",
                    head_name(head)),
        task);
  else if (task == "CAUSAL_LM" && head != Head::kCausalLM)
    bad("task_type",
        fmt::format("a task for this {} model (it is not a causal LM)", head_name(head)), task);
  else if (task == "SEQ_2_SEQ_LM" && head != Head::kSeq2SeqLM)
    bad("task_type",
        fmt::format("a task for this {} model (it is not a sequence-to-sequence LM)",
                    head_name(head)),
        task);
  else if (!task.is_null() && task != "SEQ_CLS" && task != "CAUSAL_LM" && task != "SEQ_2_SEQ_LM" &&
           task != "FEATURE_EXTRACTION")
    bad("task_type", "null, SEQ_CLS, CAUSAL_LM, SEQ_2_SEQ_LM or FEATURE_EXTRACTION", task);

  auto is_names = [](const nlohmann::json& v) {
    if (v.is_string()) return true;
    if (!v.is_array()) return false;
    return std::all_of(v.begin(), v.end(), [](const nlohmann::json& e) { return e.is_string(); });
  };
  c.targets = get("target_modules");
  if (!is_names(c.targets))
    bad("target_modules", "a list of module names or a regex string", c.targets);
  c.modules_to_save = get("modules_to_save");
  if (!c.modules_to_save.is_null() &&
      !(c.modules_to_save.is_array() && is_names(c.modules_to_save)))
    bad("modules_to_save", "null or a list of module names", c.modules_to_save);
  for (const char* f : {"layers_to_transform", "layers_pattern"})
    if (!get(f).is_null())
      bad(f, "null (layer selection is not supported; list the modules)", get(f));
  if (j.contains("fan_in_fan_out") && !get("fan_in_fan_out").is_boolean())
    bad("fan_in_fan_out", "true or false", get("fan_in_fan_out"));
  if (j.contains("inference_mode") && !get("inference_mode").is_boolean())
    bad("inference_mode", "true or false", get("inference_mode"));

  if (c.method == PeftMethod::kLora) {
    auto r = get("r");
    if (r.is_number_integer() && r.get<int64_t>() >= 1)
      c.r = r.get<int64_t>();
    else
      bad("r", "a positive integer", r);
    auto alpha = get("lora_alpha");
    if (alpha.is_number() && alpha.get<double>() > 0)
      c.alpha = alpha.get<double>();
    else
      bad("lora_alpha", "a positive number", alpha);
    auto dropout = get("lora_dropout");
    if (dropout.is_null())
      c.dropout = 0;
    else if (dropout.is_number() && dropout.get<double>() >= 0 && dropout.get<double>() < 1)
      c.dropout = dropout.get<double>();
    else
      bad("lora_dropout", "a number in [0, 1)", dropout);
    if (get("bias") != "none" && !get("bias").is_null())
      bad("bias", "\"none\" (bias training is not supported)", get("bias"));
    for (const char* f : {"use_rslora", "use_dora"})
      if (j.contains(f) && get(f) != false) bad(f, "false (not supported)", get(f));
    for (const char* f : {"rank_pattern", "alpha_pattern"})
      if (j.contains(f) && !get(f).is_null() && !get(f).empty())
        bad(f, "{} (per-module ranks are not supported)", get(f));
  } else if (c.method == PeftMethod::kIa3) {
    c.feedforward = get("feedforward_modules");
    if (c.feedforward.is_null())
      c.feedforward = peft_default_feedforward(model.summary());
    else if (!is_names(c.feedforward))
      bad("feedforward_modules", "null, a list of module names or a regex string", c.feedforward);
  }
  return c;
}

// Module paths selected by a PEFT target spec: a list (suffix rule) or a regex (full match).
bool peft_selects(const nlohmann::json& spec, const std::string& path) {
  if (spec.is_string()) {
    try {
      return std::regex_match(path, std::regex(spec.get<std::string>()));
    } catch (const std::regex_error&) {
      return false;
    }
  }
  if (!spec.is_array()) return false;
  for (const auto& t : spec)
    if (t.is_string() && target_matches(t.get<std::string>(), path)) return true;
  return false;
}

std::vector<std::string> peft_spec_names(const nlohmann::json& spec,
                                         const std::vector<std::string>& selected) {
  if (spec.is_array()) return spec.get<std::vector<std::string>>();
  return selected;
}

struct PeftPlanned {
  NamedLinear target;
  std::string path;
  bool feedforward = false;
};

}  // namespace

PeftConfig load_peft_adapter(PretrainedModelImpl& model, const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string cfg_path = dir + "/adapter_config.json";
  const std::string weights_path = dir + "/adapter_model.safetensors";
  EMOE_CHECK(fs::exists(cfg_path), InputError,
             "{}: not a PEFT adapter folder (adapter_config.json is missing)", dir);
  EMOE_CHECK(fs::exists(weights_path) || !fs::exists(dir + "/adapter_model.bin"), InputError,
             "{}/adapter_model.bin: pickle files are refused (loading them can run code); save "
             "the adapter with safe_serialization=True",
             dir);
  EMOE_CHECK(fs::exists(weights_path), InputError, "{}: adapter_model.safetensors is missing", dir);
  auto existing = adapted_modules(model);
  EMOE_CHECK(existing.empty(), UsageError,
             "load_peft_adapter: the model already carries adapters ({} ...); remove_peft first",
             existing.front());
  JsonFields fields = JsonFields::from_file(cfg_path);
  const nlohmann::json& j = fields.raw();

  std::vector<std::string> problems;
  PeftFileConfig fc = peft_read_config(j, model, problems);
  SafetensorsFile file(weights_path);

  // Without a known method the tensors cannot be judged: report the configuration alone.
  EMOE_CHECK(fc.method != PeftMethod::kNone, InputError,
             "{}: the PEFT adapter does not fit this "
             "{} model: {}",
             dir, model.summary().model_type, fmt::join(problems, "; "));
  auto linears = named_linears(model);
  std::vector<PeftPlanned> plan;
  std::map<std::string, size_t> plan_index;  // Hugging Face path -> plan entry
  if (fc.targets.is_string() || fc.targets.is_array()) {
    for (const auto& l : linears) {
      auto path = hf_module_path(model, l.name);
      if (!peft_selects(fc.targets, path)) continue;
      plan_index[path] = plan.size();
      plan.push_back(
          {l, path, fc.method == PeftMethod::kIa3 && peft_selects(fc.feedforward, path)});
    }
    if (fc.targets.is_array()) {
      auto hf_linears = linears;  // named as the file names them, for the message
      for (auto& l : hf_linears) l.name = hf_module_path(model, l.name);
      for (const auto& t : fc.targets) {
        bool hit = std::any_of(plan.begin(), plan.end(), [&](const PeftPlanned& p) {
          return target_matches(t.get<std::string>(), p.path);
        });
        if (!hit)
          problems.push_back(fmt::format(
              "adapter_config.json: target_modules: '{}' matches no Linear module of this model "
              "(its Linear modules: {})",
              t.get<std::string>(), linear_names_summary(hf_linears)));
      }
    } else if (plan.empty()) {
      problems.push_back(
          fmt::format("adapter_config.json: target_modules: regex {} matches no "
                      "Linear module of this model",
                      fc.targets.dump()));
    }
  }

  // Every tensor of the file: an adapter weight of a planned module, or a head/saved module.
  const std::vector<std::string> suffixes =
      fc.method == PeftMethod::kIa3 ? std::vector<std::string>{".ia3_l"}
                                    : std::vector<std::string>{".lora_A.weight", ".lora_B.weight"};
  std::map<std::string, torch::Tensor> params;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) params[p.key()] = p.value();
  std::vector<std::pair<torch::Tensor, std::string>> extra;  // model parameter, file key
  auto shape_problem = [&](const std::string& key, at::IntArrayRef want, at::IntArrayRef got) {
    problems.push_back(fmt::format("adapter_model.safetensors: {}: expected {}, got {}", key,
                                   peft_shape_str(want), peft_shape_str(got)));
  };
  for (const auto& e : file.entries()) {
    const std::string& key = e.name;
    if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16") {
      problems.push_back(fmt::format(
          "adapter_model.safetensors: {}: expected a float tensor, got {}", key, e.dtype));
      continue;
    }
    if (key.rfind(kPeftKeyPrefix, 0) != 0) {
      problems.push_back(
          fmt::format("adapter_model.safetensors: {}: unexpected key (PEFT keys start "
                      "with {})",
                      key, kPeftKeyPrefix));
      continue;
    }
    const std::string rest = key.substr(kPeftKeyPrefix.size());
    bool adapter_key = false;
    for (const auto& s : suffixes) {
      if (!peft_ends_with(rest, s)) continue;
      adapter_key = true;
      if (!plan_index.count(rest.substr(0, rest.size() - s.size())))
        problems.push_back(
            fmt::format("adapter_model.safetensors: {}: unexpected (its module is "
                        "not a Linear selected by target_modules)",
                        key));
    }
    if (adapter_key) continue;
    if (rest.find("lora_") != std::string::npos || rest.find("ia3_") != std::string::npos) {
      problems.push_back(fmt::format(
          "adapter_model.safetensors: {}: unexpected adapter tensor for a "
          "{} adapter (only {} are supported)",
          key, fc.method == PeftMethod::kIa3 ? "IA3" : "LORA", fmt::join(suffixes, ", ")));
      continue;
    }
    auto mk = model.module_key(rest);
    auto it = mk.empty() ? params.end() : params.find(mk);
    const bool saved_module = peft_under_saved_module(fc.modules_to_save, rest);
    if (it == params.end() || !(model.is_head_key(mk) || saved_module)) {
      problems.push_back(
          fmt::format("adapter_model.safetensors: {}: unexpected (neither an adapter "
                      "weight, the task head, nor in modules_to_save)",
                      key));
      continue;
    }
    if (it->second.sizes() != at::IntArrayRef(e.shape)) {
      shape_problem(key, it->second.sizes(), e.shape);
      continue;
    }
    extra.emplace_back(it->second, key);
  }
  // Every planned module has its tensors, of the right shapes.
  for (const auto& p : plan) {
    const auto& o = p.target.linear->options();
    std::vector<std::pair<std::string, std::vector<int64_t>>> want;
    const std::string key = kPeftKeyPrefix + p.path;
    if (fc.method == PeftMethod::kLora) {
      want = {{key + ".lora_A.weight", {fc.r, o.in}}, {key + ".lora_B.weight", {o.out, fc.r}}};
    } else {
      want = {{key + ".ia3_l",
               p.feedforward ? std::vector<int64_t>{1, o.in} : std::vector<int64_t>{o.out, 1}}};
    }
    for (const auto& [k, shape] : want) {
      if (!file.contains(k))
        problems.push_back(fmt::format("adapter_model.safetensors: {}: missing", k));
      // (an invalid r is reported once, not as a wrong shape of every tensor)
      else if ((fc.method != PeftMethod::kLora || fc.r > 0) && file.entry(k).shape != shape)
        shape_problem(k, shape, file.entry(k).shape);
    }
  }
  EMOE_CHECK(problems.empty(), InputError,
             "{}: the PEFT adapter does not fit this {} model ({} "
             "problem{}): {}",
             dir, model.summary().model_type, problems.size(), problems.size() == 1 ? "" : "s",
             fmt::join(problems, "; "));

  // Attach: weights are copied onto each layer's device and dtype.
  at::Generator gen = at::detail::createCPUGenerator(0);  // initial values are overwritten
  torch::NoGradGuard no_grad;
  PeftConfig out;
  out.method = fc.method;
  std::vector<std::string> selected, selected_ff;
  for (const auto& p : plan) {
    const std::string key = kPeftKeyPrefix + p.path;
    LinearImpl& linear = *p.target.linear;
    if (fc.method == PeftMethod::kLora) {
      auto a = std::make_shared<LoraAdapter>(linear, LoraOptions{fc.r, fc.alpha, fc.dropout}, gen);
      a->lora_a->weight.copy_(file.load(key + ".lora_A.weight"));
      a->lora_b->weight.copy_(file.load(key + ".lora_B.weight"));
      linear.set_adapter(a);
    } else {
      auto v = file.load(key + ".ia3_l", torch::kFloat);
      ScaledRange range{0, linear.options().out, ""};
      if (!p.feedforward) {
        // GPT-2's c_attn: emoe scales k and v only; a file whose q part is not 1 (PEFT scales
        // all of c_attn) is reproduced with the whole output scaled.
        auto rs = scaled_output_ranges(model, p.target.name, linear);
        ScaledRange kv{rs.front().offset, rs.back().offset + rs.back().length - rs.front().offset,
                       ""};
        auto outside =
            torch::cat({v.narrow(0, 0, kv.offset),
                        v.narrow(0, kv.offset + kv.length, v.size(0) - kv.offset - kv.length)});
        if (outside.numel() == 0 || outside.eq(1).all().item<bool>()) range = kv;
      }
      auto a = std::make_shared<Ia3Adapter>(linear, p.feedforward, range);
      a->ia3_l.copy_(p.feedforward ? v : v.narrow(0, range.offset, range.length));
      linear.set_adapter(a);
      if (p.feedforward) selected_ff.push_back(p.path);
    }
    selected.push_back(p.path);
  }
  for (auto& [param, key] : extra) param.copy_(file.load(key));
  out.targets = peft_spec_names(fc.targets, selected);
  if (fc.method == PeftMethod::kIa3)
    out.feedforward_targets = fc.feedforward.is_null()
                                  ? std::vector<std::string>{}
                                  : peft_spec_names(fc.feedforward, selected_ff);
  out.r = fc.method == PeftMethod::kLora ? fc.r : out.r;
  out.alpha = fc.method == PeftMethod::kLora ? fc.alpha : out.alpha;
  out.dropout = fc.method == PeftMethod::kLora ? fc.dropout : out.dropout;
  return out;
}

}  // namespace emoe
