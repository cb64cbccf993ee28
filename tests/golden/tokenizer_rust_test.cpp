// tokenizer.json files served by the Rust `tokenizers` pipeline (FastBpeTokenizer): the real
// Llama 3 and Qwen3 files against goldens from Hugging Face's Rust library, and a RoBERTa
// tokenizer (GPT-2's files + RoBERTa's specials; goldens made by tests/data/tokenizers/
// make_roberta_golden.js) in both its tokenizer.json and its vocab.json + merges.txt forms.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "emoe/core/error.h"
#include "emoe/tokenizer/fast_bpe.h"
#include "emoe/tokenizer/tokenizer.h"
#include "support/test_support.h"
#include "tokenizer_golden_check.h"

namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using emoe::test::as_json_string;
using emoe::test::read_json_file;

// Every case of a details file. `decoded`/`decoded_skip` name the golden decodes that
// transformers returns for this folder (with or without its clean-up of spaces).
void check_cases(const json& details, const emoe::Tokenizer& tok, const std::string& decoded,
                 const std::string& decoded_skip) {
  const auto* fast = dynamic_cast<const emoe::FastBpeTokenizer*>(&tok);
  ASSERT_NE(fast, nullptr) << "expected the Rust pipeline, got kind " << tok.kind();
  const json& cases = details.at("cases");
  ASSERT_GE(cases.size(), 70u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    std::string text = c.at("text").get<std::string>();
    SCOPED_TRACE("case " + std::to_string(i) + " text " + as_json_string(text));
    auto ids = c.at("ids").get<std::vector<int64_t>>();
    auto plain = c.at("ids_no_special").get<std::vector<int64_t>>();
    EXPECT_EQ(tok.encode(text).ids, ids);
    EXPECT_EQ(tok.encode_plain(text), plain);
    EXPECT_EQ(tok.encode(text, false).ids, plain);
    if (c.contains("type_ids"))
      EXPECT_EQ(tok.encode(text).token_type_ids, c.at("type_ids").get<std::vector<int64_t>>());
    // Encoding.tokens: byte-level strings; an added token shows the span it matched
    std::vector<std::string> tokens = fast->tokens(text);
    std::vector<std::string> golden = c.at("tokens").get<std::vector<std::string>>();
    if (ids.size() == plain.size())
      EXPECT_EQ(tokens, golden);
    else  // the golden tokens include the template's; compare the text's own
      EXPECT_EQ(tokens, std::vector<std::string>(golden.begin() + 1, golden.end() - 1));
    EXPECT_EQ(tok.decode(ids), c.at(decoded).get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c.at(decoded_skip).get<std::string>());
  }
}

TEST(TokenizerRust, Llama3) {
  EMOE_REQUIRE_SHARED(dir, "tokenizers/llama3");
  EMOE_REQUIRE_SHARED(details, "fixtures/tokenizers/llama3.details.json");
  auto tok = emoe::load_tokenizer(dir);
  EXPECT_EQ(tok->kind(), "bpe");
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->special().bos, 128000);
  EXPECT_EQ(tok->special().eos, 128001);
  EXPECT_FALSE(tok->special().pad);
  // tokenizer_config.json: clean_up_tokenization_spaces true, so transformers cleans the decode
  check_cases(read_json_file(details), *tok, "decoded_hf_python", "decoded_skip_special_hf_python");
}

TEST(TokenizerRust, Qwen3) {
  EMOE_REQUIRE_SHARED(dir, "tokenizers/qwen3");
  EMOE_REQUIRE_SHARED(details, "fixtures/tokenizers/qwen3.details.json");
  auto tok = emoe::load_tokenizer(dir);
  EXPECT_EQ(tok->vocab_size(), 151669);
  EXPECT_FALSE(tok->special().bos);
  EXPECT_EQ(tok->special().eos, 151645);  // <|im_end|>
  EXPECT_EQ(tok->special().pad, 151643);  // <|endoftext|>
  check_cases(read_json_file(details), *tok, "decoded", "decoded_skip_special");
}

// The RoBERTa tokenizer.json: the Rust library's own serialisation (the golden's skeleton) with
// GPT-2's vocabulary and merges put back.
void write_roberta_folder(const std::string& dir, const json& details, const std::string& gpt2,
                          bool tokenizer_json) {
  json vocab = read_json_file(gpt2 + "/encoder.json");
  std::ifstream in(gpt2 + "/vocab.bpe");
  std::string line;
  json merges = json::array();
  std::vector<std::string> lines;
  for (size_t n = 0; std::getline(in, line); ++n)
    if (!line.empty() && !(n == 0 && line.rfind("#version", 0) == 0)) merges.push_back(line);
  json config = {{"tokenizer_class", "RobertaTokenizer"}, {"clean_up_tokenization_spaces", false}};
  if (tokenizer_json) {
    json j = details.at("skeleton");
    j["model"]["vocab"] = vocab;
    j["model"]["merges"] = merges;
    emoe::test::write_json_file(dir + "/tokenizer.json", j);
    config["tokenizer_class"] = "RobertaTokenizerFast";
  } else {
    emoe::test::write_json_file(dir + "/vocab.json", vocab);
    std::ofstream m(dir + "/merges.txt", std::ios::binary);
    m << "#version: 0.2\n";
    for (const json& merge : merges) m << merge.get<std::string>() << "\n";
    json decoder = json::object();
    for (const json& t : details.at("skeleton").at("added_tokens")) {
      json entry = t;
      entry.erase("id");
      decoder[std::to_string(t.at("id").get<int64_t>())] = entry;
    }
    config["added_tokens_decoder"] = decoder;
  }
  emoe::test::write_json_file(dir + "/tokenizer_config.json", config);
}

void check_roberta(bool tokenizer_json) {
  EMOE_REQUIRE_SHARED(gpt2, "tokenizers/gpt2");
  std::string details_path =
      emoe::test::source_dir() + "/tests/data/tokenizers/roberta.details.json";
  json details = read_json_file(details_path);
  emoe::test::TempDir dir;
  write_roberta_folder(dir.path(), details, gpt2, tokenizer_json);
  auto tok = emoe::load_tokenizer(dir.path());
  EXPECT_EQ(tok->special().cls, 50257);
  EXPECT_EQ(tok->special().sep, 50259);
  EXPECT_EQ(tok->special().pad, 50258);
  EXPECT_EQ(tok->special().mask, 50261);
  check_cases(details, *tok, "decoded", "decoded_skip_special");
  for (const json& p : details.at("pairs")) {
    std::string a = p.at("a").get<std::string>(), b = p.at("b").get<std::string>();
    SCOPED_TRACE("pair " + as_json_string(a) + " / " + as_json_string(b));
    emoe::Encoding enc = tok->encode_pair(a, b);
    EXPECT_EQ(enc.ids, p.at("ids").get<std::vector<int64_t>>());
    EXPECT_EQ(enc.token_type_ids, p.at("type_ids").get<std::vector<int64_t>>());
  }
}

TEST(TokenizerRust, RobertaTokenizerJson) {
  check_roberta(true);
}

TEST(TokenizerRust, RobertaVocabAndMerges) {
  check_roberta(false);
}

// Split behaviours, on a tiny byte-level vocabulary with the merges a+-, -+b and -+-: which
// merges can apply shows where the pre-tokenizer cut "a-b" and "a--b".
TEST(TokenizerRust, SplitBehaviours) {
  json vocab = json::object();
  for (int b = 0x21; b <= 0x7e; ++b) vocab[std::string(1, static_cast<char>(b))] = b;
  vocab["\xC4\xA0"] = 0x20;  // "Ġ", the byte-level image of a space
  vocab["a-"] = 1001;
  vocab["-b"] = 1002;
  vocab["--"] = 1003;
  struct Case {
    const char* behavior;
    std::vector<int64_t> one, two;  // ids of "a-b" and "a--b"
  };
  const std::vector<Case> cases = {
      {"Isolated", {'a', '-', 'b'}, {'a', '-', '-', 'b'}},
      {"Removed", {'a', 'b'}, {'a', 'b'}},
      {"MergedWithPrevious", {1001, 'b'}, {1001, '-', 'b'}},
      {"MergedWithNext", {'a', 1002}, {'a', '-', 1002}},
      {"Contiguous", {'a', '-', 'b'}, {'a', 1003, 'b'}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.behavior);
    json j = {{"version", "1.0"},
              {"added_tokens", json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"},
                   {"pattern", {{"String", "-"}}},
                   {"behavior", c.behavior},
                   {"invert", false}},
                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
              {"post_processor", nullptr},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a -", "- b", "- -"}}}}};
    emoe::test::TempDir dir;
    emoe::test::write_json_file(dir.file("tokenizer.json"), j);
    auto tok = emoe::load_tokenizer(dir.path());
    EXPECT_EQ(tok->encode_plain("a-b"), c.one);
    EXPECT_EQ(tok->encode_plain("a--b"), c.two);
    if (std::string(c.behavior) != "Removed")
      EXPECT_EQ(tok->decode(tok->encode_plain("x-ab -")), "x-ab -");
  }
}

TEST(TokenizerRust, BadComponentsNameTheField) {
  EMOE_REQUIRE_SHARED(gpt2, "tokenizers/gpt2");
  json details =
      read_json_file(emoe::test::source_dir() + "/tests/data/tokenizers/roberta.details.json");
  emoe::test::TempDir base_dir;
  write_roberta_folder(base_dir.path(), details, gpt2, true);
  json base = read_json_file(base_dir.file("tokenizer.json"));
  json split_then = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
        {{"type", "ByteLevel"}}}}};
  json bad_behaviour = split_then;
  bad_behaviour["pretokenizers"][0]["pattern"] = {{"Regex", "\\s+"}};
  bad_behaviour["pretokenizers"][0]["behavior"] = "Sideways";
  json byte_level_first = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "ByteLevel"}},
        {{"type", "Split"}, {"pattern", {{"Regex", "\\s"}}}, {"behavior", "Isolated"}}}}};
  std::vector<emoe::test::RefusedPatch> cases = {
      {"pre_tokenizer.pretokenizers[0].pattern", {{"pre_tokenizer", split_then}}},
      {"pre_tokenizer.pretokenizers[0].behavior", {{"pre_tokenizer", bad_behaviour}}},
      {"pre_tokenizer.pretokenizers[1]", {{"pre_tokenizer", byte_level_first}}},
      {"normalizer.type", {{"normalizer", {{"type", "Lowercase"}}}}},
      {"decoder", {{"decoder", {{"type", "WordPiece"}}}}},
      {"post_processor.sep", {{"post_processor", {{"sep", "</s>"}}}}},
      {"model.merges[0]", {{"model", {{"merges", {"Ġ zzzzzz"}}}}}},
  };
  emoe::test::expect_patches_refused(base, cases);
}

}  // namespace
