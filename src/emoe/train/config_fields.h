// Every key of a run configuration in one table: its type, range and meaning. The table checks
// the numeric ranges (RunConfig::validate) and generates docs/config.md (`emoe train --fields`).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace emoe {

struct FieldRange {
  double min, max;  // +-infinity for no bound
  bool min_open = false, max_open = false;
  bool contains(double v) const;
  std::string to_string() const;  // "[0, inf)", "(0, 1]"
};

struct ConfigField {
  std::string key;   // dotted, as written in the YAML ("train.lr", "moe.kmeans.restarts")
  std::string type;  // as the docs say it: "number", "integer", "one of: a, b", "list of ..."
  std::optional<FieldRange> range;  // numeric fields only
  std::string meaning;
};

const std::vector<ConfigField>& run_config_fields();

// The resolved config's value of a dotted key (RunConfig::to_json()), or nullptr when absent.
const nlohmann::json* find_field(const nlohmann::json& resolved, const std::string& key);

// InputError "run config: <key>: expected [0, inf), got -1" for the first value outside its
// field's range (keys absent from `resolved`, e.g. seq2seq's mixture on other objectives, pass).
void check_field_ranges(const nlohmann::json& resolved);

// docs/config.md: every key with its type, default (a default RunConfig's, seq2seq's keys from a
// seq2seq one), range and meaning, as a markdown table.
std::string config_fields_markdown();

}  // namespace emoe
