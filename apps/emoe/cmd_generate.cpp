// `emoe generate MODEL_DIR --prompt TEXT`: greedy or sampled continuation from a decoder model.
#include <chrono>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/io/hf_config.h"
#include "emoe/models/generate.h"
#include "emoe/moe/convert.h"
#include "emoe/train/model_io.h"
#include "emoe/tokenizer/tokenizer.h"

namespace emoe::cli {
namespace {

struct GenerateArgs {
  std::string model_dir;
  std::optional<std::string> prompt;
  int64_t max_new_tokens = 128;
  double temperature = 0.0, top_p = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;
  bool ignore_eos = false, no_cache = false;
  RunFlags run;
};

void run_generate(const GenerateArgs& a) {
  GenerateOptions o;
  o.max_new_tokens = a.max_new_tokens;
  o.temperature = a.temperature;
  o.top_p = a.top_p;
  o.top_k = a.top_k;
  o.seed = a.seed;
  o.use_cache = !a.no_cache;
  o.validate();
  auto rs = apply_run_flags(a.run);
  LoadOptions lo;
  lo.device = rs.device;
  lo.dtype = rs.dtype;
  auto model = load_any_model(a.model_dir, lo);
  const auto& s = model->summary();
  EMOE_CHECK(s.causal && s.head == Head::kCausalLM, UsageError,
             "{}: generate needs a decoder language model (GPT-2 or Llama with an LM head); this "
             "is a {} {} model",
             a.model_dir, s.model_type, head_name(s.head));
  auto tok = load_tokenizer(a.model_dir);

  // eos/bos: generation_config.json overrides config.json, as in transformers.
  std::vector<int64_t> eos;
  std::optional<int64_t> bos = s.bos_token_id, pad = s.pad_token_id;
  if (s.eos_token_id) eos = {*s.eos_token_id};
  auto gen_cfg = std::filesystem::path(a.model_dir) / "generation_config.json";
  if (std::filesystem::exists(gen_cfg)) {
    auto g = JsonFields::from_file(gen_cfg.string());
    if (g.has("eos_token_id")) eos = g.get_int_list("eos_token_id");
    if (g.has("bos_token_id")) bos = g.get_int("bos_token_id");
    if (g.has("pad_token_id")) pad = g.get_int("pad_token_id");
  }
  std::vector<int64_t> ids;
  if (a.prompt && !a.prompt->empty()) {
    ids = tok->encode(*a.prompt, /*add_special_tokens=*/true).ids;
  }
  if (ids.empty()) {
    auto start = bos ? bos : tok->special().bos;
    EMOE_CHECK(start.has_value(), InputError,
               "{}: no prompt given and the model has no bos_token_id to start from", a.model_dir);
    ids = {*start};
  }

  if (!a.ignore_eos) o.eos_ids = eos;
  o.pad_id = pad;
  auto prompt = torch::tensor(ids, torch::kLong).unsqueeze(0);
  // Stream: print the newly decoded suffix after each token.
  std::vector<int64_t> all = ids;
  std::string shown = tok->decode(all, /*skip_special_tokens=*/true);
  std::cout << shown << std::flush;
  auto t0 = std::chrono::steady_clock::now();
  int64_t produced = 0;
  generate(*model, prompt, {}, o, [&](int64_t, const at::Tensor& next) {
    all.push_back(next[0].item<int64_t>());
    ++produced;
    std::string text = tok->decode(all, true);
    if (text.size() >= shown.size() && text.compare(0, shown.size(), shown) == 0) {
      std::cout << text.substr(shown.size()) << std::flush;
      shown = text;
    }
  });
  std::string final_text = tok->decode(all, true);
  if (final_text != shown && final_text.compare(0, shown.size(), shown) == 0)
    std::cout << final_text.substr(shown.size());
  std::cout << "\n" << std::flush;
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("{} tokens in {:.2f} s ({:.1f} tokens/s)", produced, secs, produced / std::max(secs, 1e-9));
}

}  // namespace

void register_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate text with a decoder model (GPT-2, Llama)");
  cmd->add_option("MODEL_DIR", a->model_dir, "Model folder")->required();
  cmd->add_option("--prompt", a->prompt, "Prompt text (default: start from BOS)");
  cmd->add_option("--max-new-tokens,-n", a->max_new_tokens, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temperature,-t", a->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", a->top_p, "Nucleus sampling mass")->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "Sample from the k best tokens (0 = off)")->capture_default_str();
  cmd->add_option("--seed", a->seed, "Sampling seed")->capture_default_str();
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at the end-of-sequence token");
  cmd->add_flag("--no-cache", a->no_cache, "Recompute the whole prefix at every step");
  add_run_flags(cmd, a->run);
  cmd->callback([a] { run_generate(*a); });
}

}  // namespace emoe::cli
