// Reading tokenizer_config.json / special_tokens_map.json / added_tokens.json as from_pretrained.
#include "emoe/tokenizer/tokenizer_config.h"

#include <filesystem>
#include <fstream>

#include "emoe/core/error.h"
#include "emoe/core/json_depth.h"

namespace emoe {
namespace fs = std::filesystem;
using json = nlohmann::json;

json read_json_object(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EMOE_CHECK(in.good(), InputError, "{}: cannot open the file", path);
  json j;
  try {
    j = parse_json_limited(path, in);
  } catch (const json::exception& e) {
    EMOE_THROW(InputError, "{}: not valid JSON ({})", path, e.what());
  }
  EMOE_CHECK(j.is_object(), InputError, "{}: expected a JSON object at the top level, got {}", path,
             j.type_name());
  return j;
}

TokenizerConfig TokenizerConfig::read(const std::string& dir) {
  TokenizerConfig c;
  std::string config = (fs::path(dir) / "tokenizer_config.json").string();
  std::string map = (fs::path(dir) / "special_tokens_map.json").string();
  std::string added = (fs::path(dir) / "added_tokens.json").string();
  if (fs::exists(config)) {
    c.config_ = read_json_object(config);
    c.config_file_ = config;
  }
  if (fs::exists(map)) {
    c.map_ = read_json_object(map);
    c.map_file_ = map;
  }
  if (fs::exists(added)) {
    json j = read_json_object(added);
    for (auto it = j.begin(); it != j.end(); ++it) {
      EMOE_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0, InputError,
                 "{}: field '{}': expected a non-negative integer id, got {}", added, it.key(),
                 it.value().dump());
      AddedToken t;
      t.content = it.key();
      t.id = it.value().get<int64_t>();
      t.special = false;
      t.plain_string = true;  // from_pretrained adds them as plain strings
      c.added_json_.push_back(t);
    }
  }
  return c;
}

AddedToken TokenizerConfig::parse_token(const json& value, const std::string& file,
                                        const std::string& field, bool plain_string) const {
  AddedToken t;
  if (value.is_string()) {
    t.content = value.get<std::string>();
    t.plain_string = plain_string;
    return t;
  }
  EMOE_CHECK(value.is_object(), InputError,
             "{}: field '{}': expected a string or an AddedToken object, got {}", file, field,
             value.dump());
  EMOE_CHECK(value.contains("content") && value.at("content").is_string(), InputError,
             "{}: field '{}': an AddedToken object needs a string 'content', got {}", file, field,
             value.dump());
  t.content = value.at("content").get<std::string>();
  auto flag = [&](const char* key, bool* out) {
    if (!value.contains(key) || value.at(key).is_null()) return;
    EMOE_CHECK(value.at(key).is_boolean(), InputError,
               "{}: field '{}.{}': expected true or false, got {}", file, field, key,
               value.at(key).dump());
    *out = value.at(key).get<bool>();
  };
  flag("lstrip", &t.lstrip);
  flag("rstrip", &t.rstrip);
  flag("single_word", &t.single_word);
  flag("special", &t.special);
  return t;
}

std::optional<AddedToken> TokenizerConfig::special_token(const std::string& name,
                                                         const std::optional<std::string>& fallback,
                                                         bool class_wraps_strings) const {
  if (map_.contains(name)) {
    if (map_.at(name).is_null()) return std::nullopt;
    return parse_token(map_.at(name), map_file_, name, /*plain_string=*/true);
  }
  if (config_.contains(name)) {
    if (config_.at(name).is_null()) return std::nullopt;
    return parse_token(config_.at(name), config_file_, name, !class_wraps_strings);
  }
  if (!fallback) return std::nullopt;
  AddedToken t;
  t.content = *fallback;
  t.plain_string = !class_wraps_strings;
  return t;
}

std::vector<AddedToken> TokenizerConfig::additional_special_tokens(bool class_wraps_strings) const {
  const char* key = "additional_special_tokens";
  const json* list = nullptr;
  const std::string* file = nullptr;
  bool plain = true;
  if (map_.contains(key) && !map_.at(key).is_null()) {
    list = &map_.at(key);
    file = &map_file_;
  } else if (config_.contains(key) && !config_.at(key).is_null()) {
    list = &config_.at(key);
    file = &config_file_;
    plain = !class_wraps_strings;
  }
  std::vector<AddedToken> out;
  if (!list) return out;
  EMOE_CHECK(list->is_array(), InputError, "{}: field '{}': expected a list, got {}", *file, key,
             list->dump());
  for (size_t i = 0; i < list->size(); ++i)
    out.push_back(parse_token(list->at(i), *file, fmt::format("{}[{}]", key, i), plain));
  return out;
}

std::vector<AddedToken> TokenizerConfig::added_tokens() const {
  std::vector<AddedToken> out = added_json_;
  const char* key = "added_tokens_decoder";
  if (config_.contains(key) && !config_.at(key).is_null()) {
    const json& d = config_.at(key);
    EMOE_CHECK(d.is_object(), InputError, "{}: field '{}': expected an object, got {}",
               config_file_, key, d.type_name());
    for (auto it = d.begin(); it != d.end(); ++it) {
      std::string field = fmt::format("{}.{}", key, it.key());
      AddedToken t = parse_token(it.value(), config_file_, field, false);
      EMOE_CHECK(t.content.size() > 0, InputError, "{}: field '{}': empty token", config_file_,
                 field);
      try {
        size_t used = 0;
        t.id = std::stoll(it.key(), &used);
        if (used != it.key().size() || t.id < 0) throw std::invalid_argument(it.key());
      } catch (const std::exception&) {
        EMOE_THROW(InputError, "{}: field '{}': expected a non-negative integer id as the key",
                   config_file_, field);
      }
      out.push_back(t);
    }
  }
  return out;
}

std::optional<bool> TokenizerConfig::get_bool(const std::string& key) const {
  if (!config_.contains(key) || config_.at(key).is_null()) return std::nullopt;
  EMOE_CHECK(config_.at(key).is_boolean(), InputError,
             "{}: field '{}': expected true or false, got {}", config_file_, key,
             config_.at(key).dump());
  return config_.at(key).get<bool>();
}

std::optional<int64_t> TokenizerConfig::get_int(const std::string& key, int64_t lo,
                                                int64_t hi) const {
  if (!config_.contains(key) || config_.at(key).is_null()) return std::nullopt;
  const json& v = config_.at(key);
  EMOE_CHECK(v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi, InputError,
             "{}: field '{}': expected an integer in [{}, {}], got {}", config_file_, key, lo, hi,
             v.dump());
  return v.get<int64_t>();
}

std::optional<std::string> TokenizerConfig::get_string(const std::string& key) const {
  if (!config_.contains(key) || config_.at(key).is_null()) return std::nullopt;
  EMOE_CHECK(config_.at(key).is_string(), InputError, "{}: field '{}': expected a string, got {}",
             config_file_, key, config_.at(key).dump());
  return config_.at(key).get<std::string>();
}

std::vector<std::string> TokenizerConfig::get_string_list(const std::string& key) const {
  std::vector<std::string> out;
  if (!config_.contains(key) || config_.at(key).is_null()) return out;
  const json& v = config_.at(key);
  EMOE_CHECK(v.is_array(), InputError, "{}: field '{}': expected a list of strings, got {}",
             config_file_, key, v.dump());
  for (const json& s : v) {
    EMOE_CHECK(s.is_string(), InputError, "{}: field '{}': expected a list of strings, got {}",
               config_file_, key, v.dump());
    out.push_back(s.get<std::string>());
  }
  return out;
}

}  // namespace emoe
