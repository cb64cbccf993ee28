// Typed reading of JSON config files (config.json, moe.json, ...) with file+field error messages.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace emoe {

// A JSON object plus the file it came from, so every error names the file and the field.
class JsonFields {
 public:
  JsonFields(nlohmann::json j, std::string file);
  static JsonFields from_file(const std::string& path);

  bool has(const std::string& key) const;  // present and not null
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_double(const std::string& key) const;
  double get_double(const std::string& key, double fallback) const;
  // A dropout probability: a number in [0, 1) (1 would zero every activation).
  double get_probability(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  // An int or the first int of a list (e.g. eos_token_id may be [2, 32000]).
  std::vector<int64_t> get_int_list(const std::string& key) const;

  const nlohmann::json& raw() const { return j_; }
  const std::string& file() const { return file_; }

  // Throws InputError "<file>: field '<key>': <what>".
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

 private:
  const nlohmann::json& at(const std::string& key) const;
  nlohmann::json j_;
  std::string file_;
};

// Reads MODEL_DIR/config.json (InputError if missing or malformed).
JsonFields read_model_config(const std::string& model_dir);

// architectures[0] of config.json, or "" when absent.
std::string first_architecture(const JsonFields& cfg);

}  // namespace emoe
