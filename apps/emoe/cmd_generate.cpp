// `emoe generate MODEL_DIR --prompt TEXT`: greedy or sampled continuation from a decoder model,
// or the output of an encoder-decoder model (T5) for the prompt.
#include <chrono>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/io/hf_config.h"
#include "emoe/methods/model_folder.h"
#include "emoe/models/generate.h"
#include "emoe/moe/convert.h"
#include "emoe/tokenizer/tokenizer.h"

namespace emoe::cli {
namespace {

struct GenerateArgs {
  std::string model_dir;
  std::optional<std::string> prompt;
  int64_t max_new_tokens = 128;
  double temperature = 0.0, top_p = 1.0;
  int64_t top_k = 0;
  std::optional<int64_t> num_beams;
  uint64_t seed = 0;
  bool ignore_eos = false, no_cache = false, show_special = false;
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
  const bool seq2seq = s.encoder_decoder() && s.head == Head::kSeq2SeqLM;
  EMOE_CHECK(seq2seq || (s.causal && s.head == Head::kCausalLM), UsageError,
             "{}: generate needs a decoder language model (GPT-2 or Llama with an LM head) or "
             "an encoder-decoder one (T5 with its seq2seq-lm head); this is a {} {} model",
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
    if (g.has("decoder_start_token_id")) o.decoder_start_id = g.get_int("decoder_start_token_id");
    if (g.has("num_beams")) o.num_beams = g.get_int("num_beams");
    if (g.has("length_penalty")) o.length_penalty = g.get_double("length_penalty");
    if (g.has("early_stopping")) o.early_stopping = g.get_bool("early_stopping", false);
  }
  if (a.num_beams) o.num_beams = *a.num_beams;
  if (!seq2seq && !a.num_beams) o.num_beams = 1;  // beam search is implemented for T5 only
  o.validate();
  std::vector<int64_t> ids;
  if (a.prompt && !a.prompt->empty()) {
    ids = tok->encode(*a.prompt, /*add_special_tokens=*/true).ids;
  }
  // an encoder-decoder model reads the prompt with its encoder and prints only the new text
  EMOE_CHECK(!seq2seq || !ids.empty(), UsageError,
             "--prompt: a {} model needs input text for its encoder", s.model_type);
  if (ids.empty()) {
    auto start = bos ? bos : tok->special().bos;
    EMOE_CHECK(start.has_value(), InputError,
               "{}: no prompt given and the model has no bos_token_id to start from", a.model_dir);
    ids = {*start};
  }

  // a decoder's prompt takes positions too; refused before any of it is printed
  EMOE_CHECK(seq2seq || s.max_positions <= 0 || static_cast<int64_t>(ids.size()) <= s.max_positions,
             InputError, "--prompt: {} tokens, more than the {} positions of {} (config.json)",
             ids.size(), s.max_positions, a.model_dir);
  if (!a.ignore_eos) o.eos_ids = eos;
  o.pad_id = pad;
  auto prompt = torch::tensor(ids, torch::kLong).unsqueeze(0);
  // Stream: print the newly decoded suffix after each token.
  std::vector<int64_t> all = seq2seq ? std::vector<int64_t>{} : ids;
  const bool skip_special = !a.show_special;
  std::string shown = tok->decode(all, skip_special);
  std::cout << shown << std::flush;
  auto t0 = std::chrono::steady_clock::now();
  int64_t produced = 0;
  auto on_step = [&](int64_t, const at::Tensor& next) {
    all.push_back(next[0].item<int64_t>());
    ++produced;
    std::string text = tok->decode(all, skip_special);
    if (text.size() >= shown.size() && text.compare(0, shown.size(), shown) == 0) {
      std::cout << text.substr(shown.size()) << std::flush;
      shown = text;
    }
  };
  if (seq2seq && o.num_beams > 1) {  // beam search: the best hypothesis at the end
    auto best = generate_seq2seq(*model, prompt, {}, o).to(torch::kCPU);
    for (int64_t i = 1; i < best.size(1); ++i) all.push_back(best[0][i].item<int64_t>());
    produced = best.size(1) - 1;
  } else if (seq2seq) {
    generate_seq2seq(*model, prompt, {}, o, on_step);
  } else {
    generate(*model, prompt, {}, o, on_step);
  }
  std::string final_text = tok->decode(all, skip_special);
  if (final_text != shown && final_text.compare(0, shown.size(), shown) == 0)
    std::cout << final_text.substr(shown.size());
  std::cout << "\n" << std::flush;
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("{} tokens in {:.2f} s ({:.1f} tokens/s)", produced, secs,
               produced / std::max(secs, 1e-9));
}

}  // namespace

void register_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  auto* cmd =
      app.add_subcommand("generate", "Generate text with a language model (GPT-2, Llama, T5)");
  cmd->add_option("MODEL_DIR", a->model_dir, "Model folder")->required();
  cmd->add_option("--prompt", a->prompt, "Prompt text (default: start from BOS; T5: required)");
  cmd->add_option("--max-new-tokens,-n", a->max_new_tokens, "Tokens to generate")
      ->capture_default_str();
  cmd->add_option("--temperature,-t", a->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", a->top_p, "Nucleus sampling mass")->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "Sample from the k best tokens (0 = off)")
      ->capture_default_str();
  cmd->add_option("--num-beams", a->num_beams,
                  "Beam search with N beams (T5; default: generation_config.json, else 1)");
  cmd->add_option("--seed", a->seed, "Sampling seed")
      ->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at the end-of-sequence token");
  cmd->add_flag(
      "--show-special", a->show_special,
      "Print special tokens (e.g. T5's <extra_id_N> sentinels, </s>) instead of skipping them");
  cmd->add_flag("--no-cache", a->no_cache, "Recompute the whole prefix at every step");
  add_run_flags(cmd, a->run);
  cmd->callback([a] { run_generate(*a); });
}

}  // namespace emoe::cli
