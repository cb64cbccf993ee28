// Alpaca instruction data: the JSON reader and the Stanford Alpaca prompt templates.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "emoe/core/error.h"
#include "emoe/core/json_depth.h"
#include "emoe/data/dataset.h"
#include "emoe/data/text_table.h"

namespace emoe {

std::vector<InstructionExample> load_alpaca(const std::string& path) {
  nlohmann::json root;
  try {
    root = parse_json_limited(path, read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    EMOE_THROW(InputError, "{}: invalid JSON: {}", path, e.what());
  }
  EMOE_CHECK(root.is_array(), InputError,
             "{}: expected a JSON array of {{instruction, input, output}} objects, found {}", path,
             root.type_name());
  std::vector<InstructionExample> out;
  out.reserve(root.size());
  for (size_t i = 0; i < root.size(); ++i) {
    const auto& item = root[i];
    EMOE_CHECK(item.is_object(), InputError, "{}: item {}: expected an object, found {}", path, i,
               item.type_name());
    // "input" may be absent (or null) when there is none; the other two are required.
    auto field = [&](const char* key, bool required) {
      if (!item.contains(key) || item[key].is_null()) {
        EMOE_CHECK(!required, InputError, "{}: item {}: field '{}' missing", path, i, key);
        return std::string();
      }
      EMOE_CHECK(item[key].is_string(), InputError,
                 "{}: item {}: field '{}': expected a string, "
                 "found {}",
                 path, i, key, item[key].type_name());
      return item[key].get<std::string>();
    };
    InstructionExample e;
    e.instruction = field("instruction", true);
    e.input = field("input", false);
    e.output = field("output", true);
    out.push_back(std::move(e));
  }
  // a response is what the model learns from: without one an item teaches nothing
  const bool any_output = std::any_of(out.begin(), out.end(), [](const InstructionExample& e) {
    return e.output.find_first_not_of(" \t\r\n") != std::string::npos;
  });
  EMOE_CHECK(any_output, InputError, "{}: no training examples ({})", path,
             out.empty() ? "an empty array" : "every item's 'output' is empty");
  return out;
}

// Stanford Alpaca's PROMPT_DICT (train.py), chosen as it does: by whether the input is empty.
std::string alpaca_prompt(const InstructionExample& e) {
  if (!e.input.empty())
    return "Below is an instruction that describes a task, paired with an input that provides "
           "further context. Write a response that appropriately completes the request.\n\n"
           "### Instruction:\n" +
           e.instruction + "\n\n### Input:\n" + e.input + "\n\n### Response:\n";
  return "Below is an instruction that describes a task. Write a response that appropriately "
         "completes the request.\n\n### Instruction:\n" +
         e.instruction + "\n\n### Response:\n";
}

}  // namespace emoe
