// tokenizer_config.json, special_tokens_map.json and added_tokens.json of a tokenizer folder.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "emoe/tokenizer/added_tokens.h"

namespace emoe {

// The settings Hugging Face's from_pretrained reads besides the vocabulary files. Missing files
// are simply empty; malformed ones throw InputError naming the file and the field.
class TokenizerConfig {
 public:
  static TokenizerConfig read(const std::string& dir);

  // The special token `name` ("bos_token", "unk_token", ...), resolved as transformers 4.33 does:
  // special_tokens_map.json wins over tokenizer_config.json, which wins over `fallback`; an
  // explicit null means "no such token". A token given as a plain string is an AddedToken without
  // stripping when `class_wraps_strings` (GPT2Tokenizer, LlamaTokenizer) and otherwise a plain
  // string that eats the whitespace around it (BertTokenizer, and any value that comes from
  // special_tokens_map.json, which is set after construction).
  std::optional<AddedToken> special_token(const std::string& name,
                                          const std::optional<std::string>& fallback,
                                          bool class_wraps_strings) const;
  // additional_special_tokens, same resolution.
  std::vector<AddedToken> additional_special_tokens(bool class_wraps_strings) const;
  // Tokens with fixed ids: added_tokens.json ({"token": id}) and a newer tokenizer_config.json's
  // added_tokens_decoder ({"id": {"content": ...}}).
  std::vector<AddedToken> added_tokens() const;

  std::optional<bool> get_bool(const std::string& key) const;
  std::optional<std::string> get_string(const std::string& key) const;
  // An integer within [lo, hi].
  std::optional<int64_t> get_int(const std::string& key, int64_t lo, int64_t hi) const;
  // A list of strings (never_split).
  std::vector<std::string> get_string_list(const std::string& key) const;

  const std::string& config_file() const { return config_file_; }

 private:
  AddedToken parse_token(const nlohmann::json& value, const std::string& file,
                         const std::string& field, bool plain_string) const;

  nlohmann::json config_ = nlohmann::json::object();
  nlohmann::json map_ = nlohmann::json::object();
  std::vector<AddedToken> added_json_;
  std::string config_file_, map_file_;
};

// Reads a JSON file that must hold an object; InputError naming the file otherwise.
nlohmann::json read_json_object(const std::string& path);

}  // namespace emoe
