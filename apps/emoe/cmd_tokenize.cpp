// `emoe tokenize DIR`: text lines on stdin -> JSON id arrays on stdout (or back with --decode), or
// a padded batch in a safetensors file that `emoe forward -i` reads (-o).
#include <torch/torch.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/io/safetensors.h"
#include "emoe/tokenizer/tokenizer.h"

namespace emoe::cli {
namespace {

struct TokenizeArgs {
  std::string dir, output;
  bool pair = false, no_special = false, decode = false, skip_special = false;
  int64_t max_length = 0;
};

// The encodings as one right-padded batch for `emoe forward -i`: input_ids, attention_mask (and
// token_type_ids for pairs), padded with the tokenizer's pad id (else its eos, else 0).
void write_batch(const TokenizeArgs& a, const Tokenizer& tok, const std::vector<Encoding>& rows) {
  EMOE_CHECK(!rows.empty(), InputError, "-o {}: no text on stdin", a.output);
  size_t width = 0;
  for (const auto& e : rows) width = std::max(width, e.ids.size());
  EMOE_CHECK(width > 0, InputError, "-o {}: every line tokenized to no ids", a.output);
  const int64_t b = static_cast<int64_t>(rows.size()), t = static_cast<int64_t>(width);
  const int64_t pad = tok.special().pad.value_or(tok.special().eos.value_or(0));
  auto ids = torch::full({b, t}, pad, torch::kLong), mask = torch::zeros({b, t}, torch::kLong);
  auto types = torch::zeros({b, t}, torch::kLong);
  for (int64_t i = 0; i < b; ++i) {
    const auto& e = rows[static_cast<size_t>(i)];
    for (size_t j = 0; j < e.ids.size(); ++j) {
      ids[i][static_cast<int64_t>(j)] = e.ids[j];
      mask[i][static_cast<int64_t>(j)] = 1;
      if (j < e.token_type_ids.size()) types[i][static_cast<int64_t>(j)] = e.token_type_ids[j];
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors = {{"input_ids", ids},
                                                             {"attention_mask", mask}};
  if (a.pair) tensors.emplace_back("token_type_ids", types);
  save_safetensors(a.output, tensors);
  std::cout << fmt::format("{}: input_ids [{}, {}]{}\n", a.output, b, t,
                           a.pair ? ", attention_mask, token_type_ids" : ", attention_mask");
}

void run_tokenize(const TokenizeArgs& a) {
  EMOE_CHECK(a.output.empty() || !a.decode, UsageError,
             "-o {}: writes token ids; --decode prints text (give one of them)", a.output);
  auto tok = load_tokenizer(a.dir);
  std::vector<Encoding> rows;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(std::cin, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (a.decode) {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception&) {
        EMOE_THROW(InputError, "stdin line {}: expected a JSON array of token ids", lineno);
      }
      EMOE_CHECK(j.is_array(), InputError, "stdin line {}: expected a JSON array of token ids",
                 lineno);
      std::vector<int64_t> ids;
      for (const auto& x : j) {
        EMOE_CHECK(x.is_number_integer(), InputError, "stdin line {}: expected integer ids, got {}",
                   lineno, x.dump());
        int64_t id = x.get<int64_t>();
        EMOE_CHECK(id >= 0 && id < tok->vocab_size(), InputError,
                   "stdin line {}: id {} is outside the vocabulary of {} tokens", lineno, id,
                   tok->vocab_size());
        ids.push_back(id);
      }
      std::cout << nlohmann::json(tok->decode(ids, a.skip_special)).dump() << "\n";
      continue;
    }
    Encoding e;
    if (a.pair) {
      auto tab = line.find('\t');
      EMOE_CHECK(tab != std::string::npos, InputError,
                 "stdin line {}: --pair expects two texts separated by a tab", lineno);
      e = tok->encode_pair(line.substr(0, tab), line.substr(tab + 1), !a.no_special, a.max_length);
    } else {
      e = tok->encode(line, !a.no_special, a.max_length);
    }
    if (a.output.empty())
      std::cout << nlohmann::json(e.ids).dump() << "\n";
    else
      rows.push_back(std::move(e));
  }
  if (!a.output.empty()) write_batch(a, *tok, rows);
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  auto* cmd =
      app.add_subcommand("tokenize", "Tokenize stdin lines into JSON id arrays (or decode)");
  cmd->add_option("DIR", a->dir, "Model or tokenizer folder")->required();
  cmd->add_flag("--pair", a->pair, "Each line is a tab-separated sentence pair");
  cmd->add_flag("--no-special", a->no_special, "Do not add the template's special tokens");
  cmd->add_option("--max-length", a->max_length, "Truncate to this many ids (0 = no limit)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd->add_flag("--decode", a->decode, "Read JSON id arrays, print decoded text as JSON strings");
  cmd->add_flag("--skip-special", a->skip_special, "With --decode: drop special tokens");
  cmd->add_option("-o,--output", a->output,
                  "Write the lines as one padded batch (input_ids, attention_mask; token_type_ids "
                  "with --pair) to this safetensors file, the input of emoe forward -i");
  cmd->callback([a] { run_tokenize(*a); });
}

}  // namespace emoe::cli
