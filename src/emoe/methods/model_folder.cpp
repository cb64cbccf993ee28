// Model folders: config, weights, moe.json, peft.json and tokenizer files, loaded and saved
// together; the deliverables of a finished run.
#include "emoe/methods/model_folder.h"

#include <algorithm>
#include <filesystem>

#include "emoe/core/error.h"
#include "emoe/core/logging.h"
#include "emoe/io/atomic_file.h"
#include "emoe/tokenizer/tokenizer.h"

namespace emoe {
namespace fs = std::filesystem;

nlohmann::json peft_config_to_json(const PeftConfig& c) {
  return {{"format", "emoe-peft"},
          {"version", 1},
          {"method", to_string(c.method)},
          {"targets", c.targets},
          {"feedforward_targets", c.feedforward_targets},
          {"r", c.r},
          {"alpha", c.alpha},
          {"dropout", c.dropout},
          {"experts", c.experts},
          {"topk", c.topk},
          {"balance_weight", c.balance_weight},
          {"seed", c.seed}};
}

PeftConfig peft_config_from_json(const JsonFields& j) {
  EMOE_CHECK(j.get_string("format", "") == "emoe-peft", InputError,
             "{}: field 'format': expected \"emoe-peft\"", j.file());
  PeftConfig c;
  try {
    c.method = parse_peft_method(j.get_string("method"));
  } catch (const UsageError& e) {
    EMOE_THROW(InputError, "{}: {}", j.file(), e.what());
  }
  auto strings = [&](const char* key) {
    std::vector<std::string> out;
    if (!j.has(key)) return out;
    const auto& v = j.raw()[key];
    if (!v.is_array()) j.fail(key, "expected a list of module names");
    for (const auto& x : v) {
      if (!x.is_string()) j.fail(key, "expected strings");
      out.push_back(x.get<std::string>());
    }
    return out;
  };
  c.targets = strings("targets");
  c.feedforward_targets = strings("feedforward_targets");
  c.r = j.get_int("r", c.r);
  c.alpha = j.get_double("alpha", c.alpha);
  c.dropout = j.get_double("dropout", c.dropout);
  c.experts = j.get_int("experts", c.experts);
  c.topk = j.get_int("topk", c.topk);
  c.balance_weight = j.get_double("balance_weight", c.balance_weight);
  c.seed = static_cast<uint64_t>(j.get_int("seed", 0));
  return c;
}

ModelPtr load_any_model(const std::string& dir, const LoadOptions& options, MoeState* moe_out,
                        PeftConfig* peft_out) {
  MoeState moe;
  PeftConfig peft;
  auto moe_path = fs::path(dir) / "moe.json";
  auto peft_path = fs::path(dir) / "peft.json";
  if (fs::exists(moe_path)) moe = moe_state_from_json(JsonFields::from_file(moe_path.string()));
  if (fs::exists(peft_path))
    peft = peft_config_from_json(JsonFields::from_file(peft_path.string()));
  auto model = load_model(dir, options, [&](PretrainedModelImpl& m) {
    if (!moe.empty()) attach_moe(m, moe);
    if (peft.method != PeftMethod::kNone) apply_peft(m, peft);
  });
  if (moe_out) *moe_out = moe;
  if (peft_out) *peft_out = peft;
  return model;
}

void save_any_model(PretrainedModelImpl& model, const MoeState& moe, const PeftConfig& peft,
                    const std::string& dir, const std::string& tokenizer_dir,
                    uint64_t max_shard_bytes) {
  const auto tokenizer_names = tokenizer_file_names();
  const auto write = [&](const std::string& staging) {
    write_model_files(model, staging,
                      {{"emoe_moe", moe.empty() ? "none" : to_string(moe.config.method)}},
                      max_shard_bytes);
    if (!moe.empty())
      write_text_atomic((fs::path(staging) / "moe.json").string(),
                        moe_state_to_json(moe).dump(1) + "\n");
    if (peft.method != PeftMethod::kNone)
      write_text_atomic((fs::path(staging) / "peft.json").string(),
                        peft_config_to_json(peft).dump(1) + "\n");
    if (!tokenizer_dir.empty()) copy_tokenizer_files(tokenizer_dir, staging);
  };
  // what a save owns: an earlier save's weights, moe.json and peft.json go even when the new
  // one has none; a new tokenizer replaces the old one's files whole
  const auto replaced = [&](const std::string& name) {
    if (is_weights_file_name(name) || name == "config.json" || name == "moe.json" ||
        name == "peft.json")
      return true;
    return !tokenizer_dir.empty() &&
           std::find(tokenizer_names.begin(), tokenizer_names.end(), name) != tokenizer_names.end();
  };
  write_folder_atomic(dir, write, replaced);
}

void copy_tokenizer_files(const std::string& from, const std::string& to) {
  for (const auto& f : tokenizer_file_names()) {
    auto src = fs::path(from) / f;
    if (!fs::exists(src)) continue;
    auto dst = fs::path(to) / f;
    if (fs::exists(dst) && fs::equivalent(src, dst)) continue;
    std::error_code ec;
    fs::copy_file(src, dst, fs::copy_options::overwrite_existing, ec);
    EMOE_CHECK(!ec, RuntimeError, "{}: cannot copy to {}: {}", src.string(), dst.string(),
               ec.message());
  }
}

void save_moe_model(PretrainedModelImpl& model, const MoeState& state, const std::string& dir,
                    const std::string& tokenizer_dir, uint64_t max_shard_bytes) {
  save_any_model(model, state, PeftConfig(), dir, tokenizer_dir, max_shard_bytes);
}

bool recomposable(const MoeState& moe) {
  return !moe.empty() && moe.config.method != MoeMethod::kGmoe;
}

void export_run_model(PretrainedModelImpl& model, MoeState moe, PeftConfig peft,
                      const std::string& run_dir, const std::string& base_model, bool export_dense,
                      uint64_t max_shard_bytes) {
  const auto model_dir = (fs::path(run_dir) / "model").string();
  const auto adapter_dir = (fs::path(run_dir) / "adapter").string();
  if (peft.method == PeftMethod::kLora || peft.method == PeftMethod::kIa3)
    save_peft_adapter(model, peft, adapter_dir, fs::absolute(base_model).string());
  if (!moe.empty()) {
    // the MoE form as trained (for pruning and analysis), before any recomposition
    save_any_model(model, moe, peft, (fs::path(run_dir) / "model_moe").string(), base_model,
                   max_shard_bytes);
  }
  if (export_dense) {
    if (peft.method == PeftMethod::kLora) {
      merge_lora(model);
      peft = PeftConfig();
    }
    if (!moe.empty() && recomposable(moe)) recompose_dense(model, moe);
  }
  save_any_model(model, moe, peft, model_dir, base_model, max_shard_bytes);
  spdlog::info(
      "best model written to {}{}", model_dir,
      moe.empty() && peft.method == PeftMethod::kNone ? " (plain Hugging Face checkpoint)" : "");
}

}  // namespace emoe
