// `emoe tokenize DIR`: text lines on stdin -> JSON id arrays on stdout (or back with --decode).
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/tokenizer/tokenizer.h"

namespace emoe::cli {
namespace {

struct TokenizeArgs {
  std::string dir;
  bool pair = false, no_special = false, decode = false, skip_special = false;
  int64_t max_length = 0;
};

void run_tokenize(const TokenizeArgs& a) {
  auto tok = load_tokenizer(a.dir);
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
    std::cout << nlohmann::json(e.ids).dump() << "\n";
  }
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
  cmd->callback([a] { run_tokenize(*a); });
}

}  // namespace emoe::cli
