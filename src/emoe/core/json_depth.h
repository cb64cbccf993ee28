// Parsing JSON files with a nesting limit.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "emoe/core/error.h"

namespace emoe {

// Deeper nesting is refused while a file is parsed: printing a value (error messages quote the
// offending value), copying and comparing it recurse once per level, so a few hundred kB of '['
// overflowed the stack. Configs, tokenizer files and safetensors headers nest a handful of levels.
constexpr int kMaxJsonDepth = 256;

// Json::parse(input) that throws InputError "<file>: JSON nested deeper than 256 levels" instead;
// malformed JSON still throws nlohmann's parse_error, which callers word themselves.
template <typename Json = nlohmann::json, typename... Input>
Json parse_json_limited(const std::string& file, Input&&... input) {
  return Json::parse(
      std::forward<Input>(input)..., [&file](int depth, typename Json::parse_event_t event, Json&) {
        if ((event == Json::parse_event_t::object_start ||
             event == Json::parse_event_t::array_start) &&
            depth >= kMaxJsonDepth)
          EMOE_THROW(InputError, "{}: JSON nested deeper than {} levels", file, kMaxJsonDepth);
        return true;
      });
}

}  // namespace emoe
