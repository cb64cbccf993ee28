// The timed kernel choices as one record (see kernel_choices.h).
#include "emoe/moe/kernel_choices.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include "emoe/core/cpu_info.h"
#include "emoe/core/error.h"
#include "emoe/models/matmul.h"
#include "emoe/models/small_gemm.h"
#include "emoe/moe/expert_ffn.h"

namespace emoe {

namespace {

nlohmann::json cpu_json() {
  const auto cpu = read_cpu_info();
  return {{"model", cpu.model}, {"isa", cpu.isa_text()}};
}

// A map of strings from record[field] (absent: empty); InputError naming where and the field.
std::map<std::string, std::string> string_map(const nlohmann::json& record, const char* field,
                                              const std::string& where) {
  std::map<std::string, std::string> out;
  if (!record.contains(field)) return out;
  const auto& m = record.at(field);
  EMOE_CHECK(m.is_object(), InputError, "{}: '{}': expected an object of strings", where, field);
  for (const auto& [key, value] : m.items()) {
    EMOE_CHECK(value.is_string(), InputError, "{}: '{}.{}': expected a string, got {}", where,
               field, key, value.dump());
    out[key] = value.get<std::string>();
  }
  return out;
}

}  // namespace

nlohmann::json kernel_choices_json() {
  const auto gemm = gemm_choices_made();
  return {{"cpu", cpu_json()},
          {"float32_library", gemm.float32_library},
          {"onednn_implementations", gemm.onednn_implementations},
          {"small_products", small_gemm_choices_made()},
          {"expert_paths", expert_path_choices_made()}};
}

KernelPin pin_kernel_choices(const nlohmann::json& record, const std::string& where) {
  EMOE_CHECK(record.is_object(), InputError, "{}: expected a JSON object", where);
  EMOE_CHECK(record.contains("cpu") && record.at("cpu").is_object() &&
                 record.at("cpu").contains("model") && record.at("cpu").at("model").is_string() &&
                 record.at("cpu").contains("isa") && record.at("cpu").at("isa").is_string(),
             InputError, "{}: 'cpu': expected {{\"model\": string, \"isa\": string}}", where);
  GemmChoiceSet gemm;
  gemm.float32_library = string_map(record, "float32_library", where);
  gemm.onednn_implementations = string_map(record, "onednn_implementations", where);
  const auto small = string_map(record, "small_products", where);
  const auto experts = string_map(record, "expert_paths", where);
  const auto here = cpu_json();
  if (record.at("cpu") != here)
    return {
        false,
        fmt::format(
            "kernels chosen afresh: {} was timed on another CPU ({}; {}), this one is {} ({}); the "
            "resumed run may differ from an uninterrupted one in the last bits",
            where, record["cpu"]["model"].get<std::string>(),
            record["cpu"]["isa"].get<std::string>(), here["model"].get<std::string>(),
            here["isa"].get<std::string>())};
  // each module checks its whole map before pinning any of it; a later module's complaint
  // forgets what the earlier ones pinned (and this process's own choices: timed afresh)
  std::string problem = pin_gemm_choices(gemm);
  if (problem.empty()) problem = pin_small_gemm_choices(small);
  if (problem.empty()) problem = pin_expert_path_choices(experts);
  if (!problem.empty()) {
    forget_kernel_choices();
    EMOE_THROW(InputError, "{}: {}", where, problem);
  }
  const size_t n = gemm.float32_library.size() + gemm.onednn_implementations.size() + small.size() +
                   experts.size();
  return {true, fmt::format("{} kernel choice{} pinned from {}", n, n == 1 ? "" : "s", where)};
}

KernelPin pin_kernel_choices_file(const std::string& path) {
  std::ifstream in(path);
  EMOE_CHECK(in, InputError, "{}: cannot read the kernel choices", path);
  nlohmann::json record;
  try {
    record = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    EMOE_THROW(InputError, "{}: not valid JSON: {}", path, e.what());
  }
  auto pin = pin_kernel_choices(record, path);
  if (pin.pinned)
    spdlog::info("{}", pin.message);
  else
    spdlog::warn("{}", pin.message);
  return pin;
}

void pin_kernel_choices_from_env() {
  const char* env = std::getenv("EMOE_KERNELS");
  if (!env || !*env) return;
  try {
    pin_kernel_choices_file(env);
  } catch (const InputError& e) {
    EMOE_THROW(InputError, "EMOE_KERNELS: {}", e.what());
  }
}

void forget_kernel_choices() {
  forget_gemm_choices();
  forget_small_gemm_choices();
  forget_expert_path_choices();
}

}  // namespace emoe
