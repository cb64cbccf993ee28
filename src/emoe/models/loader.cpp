// Model factory, strict loading with one complete error report, and saving.
#include "emoe/models/loader.h"

#include <torch/torch.h>

#include <filesystem>
#include <set>

#include "emoe/core/error.h"
#include "emoe/io/atomic_file.h"
#include "emoe/models/bert.h"
#include "emoe/models/gpt2.h"
#include "emoe/models/llama.h"
#include "emoe/models/t5.h"

namespace emoe {
namespace fs = std::filesystem;

Head default_head(const JsonFields& config) {
  const std::string type = detect_model_type(config);
  if (type == "bert") return bert_head_from_config(config);
  if (type == "gpt2") return gpt2_head_from_config(config);
  if (type == "llama") return llama_head_from_config(config);
  if (type == "t5") return t5_head_from_config(config);
  config.fail("model_type", fmt::format("model type '{}' is not supported yet", type));
}

ModelPtr create_model(const JsonFields& config, Head head, std::optional<int64_t> num_labels) {
  JsonFields cfg = config;
  if (num_labels) {
    EMOE_CHECK(*num_labels > 0, UsageError, "--num-labels: expected a positive integer, got {}",
               *num_labels);
    auto j = config.raw();
    nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
    for (int64_t i = 0; i < *num_labels; ++i) {
      id2label[std::to_string(i)] = "LABEL_" + std::to_string(i);
      label2id["LABEL_" + std::to_string(i)] = i;
    }
    j["id2label"] = id2label;
    j["label2id"] = label2id;
    j.erase("num_labels");
    cfg = JsonFields(j, config.file());
  }
  const std::string type = detect_model_type(cfg);
  if (type == "bert") return make_bert(cfg, head);
  if (type == "gpt2") return make_gpt2(cfg, head);
  if (type == "llama") return make_llama(cfg, head);
  if (type == "t5") return make_t5(cfg, head);
  cfg.fail("model_type", fmt::format("model type '{}' is not supported yet", type));
}

namespace {
std::string shape_str(at::IntArrayRef s) { return fmt::format("[{}]", fmt::join(s, ", ")); }
}  // namespace

void load_weights(PretrainedModelImpl& model, const CheckpointReader& ckpt, bool allow_new_head) {
  auto params = model.named_parameters(/*recurse=*/true);
  std::map<std::string, torch::Tensor> expected;
  for (const auto& p : params) expected[p.key()] = p.value();

  std::vector<std::string> unexpected, wrong_shape, duplicate, dropped;
  std::set<std::string> loaded;
  std::vector<std::pair<std::string, std::string>> plan;  // module key, file key
  for (const auto& file_key : ckpt.names()) {
    std::string key = model.module_key(file_key);
    if (key.empty()) continue;
    auto it = expected.find(key);
    if (it == expected.end()) {
      if (allow_new_head && model.is_head_key(key)) dropped.push_back(file_key);
      else unexpected.push_back(file_key);
      continue;
    }
    if (!loaded.insert(key).second) {
      duplicate.push_back(file_key);
      continue;
    }
    const auto& e = ckpt.entry(file_key);
    if (at::IntArrayRef(e.shape) != it->second.sizes()) {
      wrong_shape.push_back(fmt::format("{}: expected {}, got {}", file_key,
                                        shape_str(it->second.sizes()), shape_str(e.shape)));
      continue;
    }
    plan.emplace_back(key, file_key);
  }
  std::vector<std::string> missing, initialised;
  for (const auto& [key, t] : expected) {
    if (loaded.count(key)) continue;
    if (allow_new_head && model.is_head_key(key)) initialised.push_back(key);
    else missing.push_back(model.file_key(key));
  }
  if (!missing.empty() || !unexpected.empty() || !wrong_shape.empty() || !duplicate.empty()) {
    std::vector<std::string> parts;
    auto add = [&](const std::string& what, const std::vector<std::string>& v) {
      if (v.empty()) return;
      std::vector<std::string> shown(v.begin(), v.begin() + std::min<size_t>(v.size(), 12));
      std::string s = fmt::format("{} {}: {}", v.size(), what, fmt::join(shown, ", "));
      if (v.size() > shown.size()) s += fmt::format(", ... ({} more)", v.size() - shown.size());
      parts.push_back(s);
    };
    add("missing", missing);
    add("unexpected", unexpected);
    add("wrong-shaped", wrong_shape);
    add("given twice (old and new names)", duplicate);
    EMOE_THROW(InputError, "{}: checkpoint does not match the {} {} model: {}", ckpt.source(),
               model.summary().model_type, head_name(model.summary().head), fmt::join(parts, "; "));
  }
  torch::NoGradGuard no_grad;
  for (const auto& [key, file_key] : plan) {
    auto& dst = expected[key];
    dst.copy_(ckpt.load(file_key, dst.scalar_type(), dst.device()));
  }
  if (!initialised.empty()) {
    model.init_head();
    spdlog::info("new {} head: initialised {} tensor(s) ({})", head_name(model.summary().head),
                 initialised.size(), fmt::join(initialised, ", "));
  }
  if (!dropped.empty())
    spdlog::info("ignored {} tensor(s) of another head ({})", dropped.size(), fmt::join(dropped, ", "));
}

ModelPtr load_model(const std::string& dir, const LoadOptions& options,
                    const std::function<void(PretrainedModelImpl&)>& prepare) {
  JsonFields config = read_model_config(dir);
  Head head = options.head.value_or(default_head(config));
  auto model = create_model(config, head, options.num_labels);
  if (prepare) prepare(*model);
  CheckpointReader ckpt(dir);
  load_weights(*model, ckpt, options.allow_new_head);
  model->to(options.device, options.dtype);
  model->eval();
  return model;
}

std::vector<std::pair<std::string, torch::Tensor>> model_state(PretrainedModelImpl& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : model.named_parameters(true)) out.emplace_back(model.file_key(p.key()), p.value());
  return out;
}

void save_model(PretrainedModelImpl& model, const std::string& dir,
                const std::map<std::string, std::string>& metadata) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  EMOE_CHECK(!ec, RuntimeError, "{}: cannot create directory: {}", dir, ec.message());
  std::map<std::string, std::string> meta = metadata;
  meta["format"] = "pt";
  meta["emoe_version"] = EMOE_VERSION;
  save_safetensors((fs::path(dir) / "model.safetensors").string(), model_state(model), meta);
  auto cfg = model.config_json();
  auto p = model.parameters();
  if (!p.empty()) {
    auto t = p[0].scalar_type();
    cfg["torch_dtype"] = t == torch::kBFloat16 ? "bfloat16" : t == torch::kHalf ? "float16" : "float32";
  }
  write_text_atomic((fs::path(dir) / "config.json").string(), cfg.dump(2) + "\n");
}

ParameterCount count_parameters(torch::nn::Module& module) {
  ParameterCount c;
  for (const auto& p : module.parameters(true)) {
    c.total += p.numel();
    if (p.requires_grad()) c.trainable += p.numel();
  }
  return c;
}

}  // namespace emoe
