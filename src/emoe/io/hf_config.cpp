// JSON config access with one clear error per bad field.
#include "emoe/io/hf_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "emoe/core/error.h"
#include "emoe/core/json_depth.h"

namespace emoe {
using json = nlohmann::json;

JsonFields::JsonFields(json j, std::string file) : j_(std::move(j)), file_(std::move(file)) {
  EMOE_CHECK(j_.is_object(), InputError, "{}: expected a JSON object at the top level, got {}",
             file_, j_.type_name());
}

JsonFields JsonFields::from_file(const std::string& path) {
  std::ifstream in(path);
  EMOE_CHECK(in.good(), InputError, "{}: cannot open (missing file?)", path);
  json j;
  try {
    j = parse_json_limited(path, in);
  } catch (const json::exception& e) {
    EMOE_THROW(InputError, "{}: not valid JSON: {}", path, e.what());
  }
  return JsonFields(std::move(j), path);
}

void JsonFields::fail(const std::string& key, const std::string& what) const {
  EMOE_THROW(InputError, "{}: field '{}': {}", file_, key, what);
}

bool JsonFields::has(const std::string& key) const {
  return j_.contains(key) && !j_.at(key).is_null();
}

const json& JsonFields::at(const std::string& key) const {
  if (!has(key)) fail(key, "required but missing");
  return j_.at(key);
}

int64_t JsonFields::get_int(const std::string& key) const {
  const json& v = at(key);
  if (v.is_number_integer()) return v.get<int64_t>();
  // A float with an integral value counts (2.0, 1e3); one outside int64's range (1e38) does not:
  // converting it would be undefined behaviour.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d >= -0x1p63 && d < 0x1p63 && d == std::trunc(d)) return static_cast<int64_t>(d);
  }
  fail(key, fmt::format("expected an integer, got {} {}", v.type_name(), v.dump()));
}

int64_t JsonFields::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double JsonFields::get_double(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_number())
    fail(key, fmt::format("expected a number, got {} {}", v.type_name(), v.dump()));
  return v.get<double>();
}

double JsonFields::get_double(const std::string& key, double fallback) const {
  return has(key) ? get_double(key) : fallback;
}

double JsonFields::get_probability(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  const double v = get_double(key);
  if (!(v >= 0 && v < 1)) fail(key, fmt::format("expected a probability in [0, 1), got {}", v));
  return v;
}

bool JsonFields::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const json& v = j_.at(key);
  if (!v.is_boolean()) fail(key, fmt::format("expected true or false, got {}", v.dump()));
  return v.get<bool>();
}

std::string JsonFields::get_string(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_string())
    fail(key, fmt::format("expected a string, got {} {}", v.type_name(), v.dump()));
  return v.get<std::string>();
}

std::string JsonFields::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

std::vector<int64_t> JsonFields::get_int_list(const std::string& key) const {
  if (!has(key)) return {};
  const json& v = j_.at(key);
  std::vector<int64_t> out;
  if (v.is_number_integer()) return {v.get<int64_t>()};
  if (!v.is_array())
    fail(key, fmt::format("expected an integer or a list of integers, got {}", v.dump()));
  for (const auto& x : v) {
    if (!x.is_number_integer()) fail(key, fmt::format("expected integers, got {}", x.dump()));
    out.push_back(x.get<int64_t>());
  }
  return out;
}

JsonFields read_model_config(const std::string& model_dir) {
  namespace fs = std::filesystem;
  EMOE_CHECK(fs::is_directory(model_dir), InputError, "{}: not a model directory", model_dir);
  auto path = (fs::path(model_dir) / "config.json").string();
  EMOE_CHECK(fs::exists(path), InputError,
             "{}: missing config.json (not a Hugging Face model folder?)", model_dir);
  return JsonFields::from_file(path);
}

std::string first_architecture(const JsonFields& cfg) {
  const auto& j = cfg.raw();
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    return j["architectures"][0].get<std::string>();
  return "";
}

}  // namespace emoe
