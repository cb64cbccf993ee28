// Shared check for the tokenizer golden tests: every case of a <name>.details.json fixture.
#pragma once
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "emoe/core/error.h"
#include "emoe/tokenizer/tokenizer.h"
#include "support/test_support.h"

namespace emoe::test {

inline nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// A text as a JSON string literal, so control characters show in failure messages.
inline std::string as_json_string(const std::string& text) {
  return nlohmann::json(text).dump();
}

// Checks every case of a details file: ids with and without the template, the token strings,
// and both decodes (with and without special tokens). Failures name the case and its text.
inline void check_tokenizer_details(const std::string& details_path, const Tokenizer& tok) {
  nlohmann::json details = read_json_file(details_path);
  const nlohmann::json& cases = details.at("cases");
  ASSERT_GE(cases.size(), 50u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const nlohmann::json& c = cases[i];
    std::string text = c.at("text").get<std::string>();
    SCOPED_TRACE("case " + std::to_string(i) + " text " + as_json_string(text));
    auto ids = c.at("ids").get<std::vector<int64_t>>();
    auto plain = c.at("ids_no_special").get<std::vector<int64_t>>();
    EXPECT_EQ(tok.encode(text).ids, ids);
    EXPECT_EQ(tok.encode_plain(text), plain);
    EXPECT_EQ(tok.encode(text, false).ids, plain);
    std::vector<std::string> tokens;
    for (int64_t id : plain) tokens.push_back(tok.id_to_token(id));
    EXPECT_EQ(tokens, c.at("tokens").get<std::vector<std::string>>());
    EXPECT_EQ(tok.decode(ids), c.at("decoded").get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c.at("decoded_skip_special").get<std::string>());
  }
}

inline void write_json_file(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path, std::ios::binary);
  out << j.dump();
}

// A tokenizer.json `base` with one change that must be refused: one InputError naming the file
// and `field`.
struct RefusedPatch {
  const char* field;
  nlohmann::json patch;
};
inline void expect_patches_refused(const nlohmann::json& base,
                                   const std::vector<RefusedPatch>& cases) {
  for (const RefusedPatch& c : cases) {
    SCOPED_TRACE(c.field);
    TempDir dir;
    nlohmann::json j = base;
    j.merge_patch(c.patch);
    write_json_file(dir.file("tokenizer.json"), j);
    try {
      load_tokenizer(dir.path());
      ADD_FAILURE() << c.field << ": expected an InputError";
    } catch (const InputError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("tokenizer.json"), std::string::npos) << what;
      EXPECT_NE(what.find(c.field), std::string::npos) << what;
    }
  }
}

}  // namespace emoe::test
