// Model factory, strict loading with one complete error report, and saving.
#include "emoe/models/loader.h"

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "emoe/core/error.h"
#include "emoe/io/atomic_file.h"
#include "emoe/models/architecture.h"

namespace emoe {
namespace fs = std::filesystem;

Head default_head(const JsonFields& config) {
  return architecture_of(config).default_head(config);
}

namespace {

// A config.json (perhaps downloaded) that claims huge sizes is refused before anything is
// allocated: each size field has a bound, and the parameters it implies must fit in memory.
void check_config_sizes(const JsonFields& cfg) {
  struct Bound {
    const char* key;
    int64_t max;
  };
  static const Bound bounds[] = {{"vocab_size", int64_t{1} << 24},
                                 {"hidden_size", int64_t{1} << 17},
                                 {"n_embd", int64_t{1} << 17},
                                 {"d_model", int64_t{1} << 17},
                                 {"d_kv", int64_t{1} << 17},
                                 {"intermediate_size", int64_t{1} << 20},
                                 {"n_inner", int64_t{1} << 20},
                                 {"d_ff", int64_t{1} << 20},
                                 {"num_hidden_layers", 4096},
                                 {"n_layer", 4096},
                                 {"num_layers", 4096},
                                 {"num_decoder_layers", 4096},
                                 {"num_attention_heads", 1 << 14},
                                 {"n_head", 1 << 14},
                                 {"num_heads", 1 << 14},
                                 {"num_key_value_heads", 1 << 14},
                                 {"max_position_embeddings", int64_t{1} << 24},
                                 {"n_positions", int64_t{1} << 24},
                                 {"type_vocab_size", 1 << 16},
                                 {"relative_attention_num_buckets", 1 << 16},
                                 {"num_labels", 1 << 16}};
  auto get = [&](const char* key) -> int64_t {
    // a float counts as from_json reads it (1e9 is 1000000000), so it cannot slip past a bound
    if (!cfg.has(key) || !cfg.raw().at(key).is_number()) return 0;
    return cfg.get_int(key);
  };
  for (const auto& b : bounds) {
    const int64_t v = get(b.key);
    if (v < 0 || v > b.max)
      cfg.fail(b.key, fmt::format("expected 0..{}, got {} (refused before allocating)", b.max, v));
  }
  // without num_labels, id2label's size is the number of labels (a classifier row each)
  int64_t labels = get("num_labels");
  if (cfg.raw().contains("id2label") && cfg.raw().at("id2label").is_object()) {
    const auto n = static_cast<int64_t>(cfg.raw().at("id2label").size());
    if (n > (1 << 16))
      cfg.fail("id2label",
               fmt::format("expected at most {} labels, got {} (refused before allocating)",
                           1 << 16, n));
    labels = std::max(labels, n);
  }
  // a rough upper estimate of the parameter count (embeddings + per-layer attention and FFN)
  const double h =
      static_cast<double>(std::max({get("hidden_size"), get("n_embd"), get("d_model")}));
  const double ff = static_cast<double>(std::max(
      {get("intermediate_size"), get("n_inner"), get("d_ff"), 4 * static_cast<int64_t>(h)}));
  const double layers =
      static_cast<double>(std::max({get("num_hidden_layers"), get("n_layer"), get("num_layers")}) +
                          get("num_decoder_layers"));
  const double vocab = static_cast<double>(get("vocab_size"));
  const double pos =
      static_cast<double>(std::max(get("max_position_embeddings"), get("n_positions")));
  const double params =
      (vocab + pos + static_cast<double>(labels)) * h + layers * (4 * h * h + 3 * h * ff);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const double memory =
      pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
  if (memory > 0 && params * 2 > memory)  // even at 2 bytes per parameter
    cfg.fail("hidden_size",
             fmt::format(
                 "the sizes in this config imply about {:.3g} parameters ({:.1f} GiB in bfloat16), "
                 "more than this machine's {:.1f} GiB of memory (refused before allocating)",
                 params, params * 2 / (1 << 30), memory / (1 << 30)));
}

}  // namespace

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
  check_config_sizes(cfg);
  return architecture_of(cfg).make(cfg, head);
}

namespace {
std::string shape_str(at::IntArrayRef s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}
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
      if (allow_new_head && model.is_head_key(key))
        dropped.push_back(file_key);
      else
        unexpected.push_back(file_key);
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
    if (allow_new_head && model.is_head_key(key))
      initialised.push_back(key);
    else
      missing.push_back(model.file_key(key));
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
  // one tensor at a time straight from the mapping into the parameter: the peak is the model
  // plus one tensor's pages, whatever the dtypes
  for (const auto& [key, file_key] : plan) ckpt.load_into(file_key, expected[key]);
  if (!initialised.empty()) {
    model.init_head();
    spdlog::info("new {} head: initialised {} tensor(s) ({})", head_name(model.summary().head),
                 initialised.size(), fmt::join(initialised, ", "));
  }
  if (!dropped.empty())
    spdlog::info("ignored {} tensor(s) of another head ({})", dropped.size(),
                 fmt::join(dropped, ", "));
}

namespace {

// Tensors made without an explicit dtype take this one while the guard lives.
class DefaultDtypeGuard {
 public:
  explicit DefaultDtypeGuard(c10::ScalarType t) : old_(c10::get_default_dtype()) {
    c10::set_default_dtype(c10::scalarTypeToTypeMeta(t));
  }
  ~DefaultDtypeGuard() { c10::set_default_dtype(old_); }
  DefaultDtypeGuard(const DefaultDtypeGuard&) = delete;
  DefaultDtypeGuard& operator=(const DefaultDtypeGuard&) = delete;

 private:
  caffe2::TypeMeta old_;
};

}  // namespace

ModelPtr load_model(const std::string& dir, const LoadOptions& options,
                    const std::function<void(PretrainedModelImpl&)>& prepare) {
  JsonFields config = read_model_config(dir);
  Head head = options.head.value_or(default_head(config));
  ModelPtr model;
  {
    // built in the compute dtype, so a bfloat16 load never holds a float32 copy of the model
    DefaultDtypeGuard dtype(options.dtype);
    model = create_model(config, head, options.num_labels);
    if (prepare) prepare(*model);
  }
  CheckpointReader ckpt(dir);
  load_weights(*model, ckpt, options.allow_new_head);
  model->to(options.device, options.dtype);  // buffers made with an explicit dtype; the device
  model->eval();
  return model;
}

std::vector<std::pair<std::string, torch::Tensor>> model_state(PretrainedModelImpl& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : model.named_parameters(true))
    out.emplace_back(model.file_key(p.key()), p.value());
  return out;
}

std::vector<std::string> write_model_files(PretrainedModelImpl& model, const std::string& dir,
                                           const std::map<std::string, std::string>& metadata,
                                           uint64_t max_shard_bytes) {
  std::map<std::string, std::string> meta = metadata;
  meta["format"] = "pt";
  meta["emoe_version"] = EMOE_VERSION;
  auto written = save_safetensors_folder(dir, model_state(model), meta, max_shard_bytes);
  auto cfg = model.config_json();
  auto p = model.parameters();
  if (!p.empty()) {
    auto t = p[0].scalar_type();
    cfg["torch_dtype"] = t == torch::kBFloat16 ? "bfloat16"
                         : t == torch::kHalf   ? "float16"
                                               : "float32";
  }
  write_text_atomic((fs::path(dir) / "config.json").string(), cfg.dump(2) + "\n");
  return written;
}

void save_model(PretrainedModelImpl& model, const std::string& dir,
                const std::map<std::string, std::string>& metadata, uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  EMOE_CHECK(!ec, RuntimeError, "{}: cannot create directory: {}", dir, ec.message());
  const auto written = write_model_files(model, dir, metadata, max_shard_bytes);
  const std::set<std::string> keep(written.begin(), written.end());
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    if (is_weights_file_name(name) && !keep.count(name)) fs::remove(e.path(), ec);
  }
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
