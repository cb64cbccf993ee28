// tokenizer.json files written as HF writes them for BertTokenizerFast / GPT2TokenizerFast must
// give the slow tokenizers' golden ids; SentencePiece-style files defer to tokenizer.model.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "emoe/core/error.h"
#include "emoe/tokenizer/bpe.h"
#include "emoe/tokenizer/tokenizer.h"
#include "emoe/tokenizer/wordpiece.h"
#include "support/test_support.h"
#include "tokenizer_golden_check.h"

namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using emoe::test::check_tokenizer_details;

json added_token(int64_t id, const std::string& content, bool normalized) {
  return {{"id", id},        {"content", content},       {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", normalized}, {"special", true}};
}

json special_piece(const std::string& name, int64_t type_id) {
  return {{"SpecialToken", {{"id", name}, {"type_id", type_id}}}};
}
json sequence_piece(const std::string& name, int64_t type_id) {
  return {{"Sequence", {{"id", name}, {"type_id", type_id}}}};
}

// What BertTokenizerFast.save_pretrained writes for bert-base-uncased (tokenizers 0.13).
json bert_tokenizer_json(const std::string& vocab_txt, bool legacy_bert_processing) {
  std::vector<std::string> lines = emoe::read_vocab_txt(vocab_txt);
  json vocab = json::object();
  for (size_t i = 0; i < lines.size(); ++i) vocab[lines[i]] = i;
  json post;
  if (legacy_bert_processing) {
    post = {{"type", "BertProcessing"},
            {"sep", json::array({"[SEP]", 102})},
            {"cls", json::array({"[CLS]", 101})}};
  } else {
    post = {
        {"type", "TemplateProcessing"},
        {"single", {special_piece("[CLS]", 0), sequence_piece("A", 0), special_piece("[SEP]", 0)}},
        {"pair",
         {special_piece("[CLS]", 0), sequence_piece("A", 0), special_piece("[SEP]", 0),
          sequence_piece("B", 1), special_piece("[SEP]", 1)}},
        {"special_tokens",
         {{"[CLS]", {{"id", "[CLS]"}, {"ids", {101}}, {"tokens", {"[CLS]"}}}},
          {"[SEP]", {{"id", "[SEP]"}, {"ids", {102}}, {"tokens", {"[SEP]"}}}}}}};
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens",
           {added_token(0, "[PAD]", false), added_token(100, "[UNK]", false),
            added_token(101, "[CLS]", false), added_token(102, "[SEP]", false),
            added_token(103, "[MASK]", false)}},
          {"normalizer",
           {{"type", "BertNormalizer"},
            {"clean_text", true},
            {"handle_chinese_chars", true},
            {"strip_accents", nullptr},
            {"lowercase", true}}},
          {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
          {"post_processor", post},
          {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
          {"model",
           {{"type", "WordPiece"},
            {"unk_token", "[UNK]"},
            {"continuing_subword_prefix", "##"},
            {"max_input_chars_per_word", 100},
            {"vocab", vocab}}}};
}

// What GPT2TokenizerFast.save_pretrained writes for gpt2; newer tokenizers releases store each
// merge as a pair instead of "a b".
json gpt2_tokenizer_json(const std::string& dir, bool merges_as_pairs) {
  json vocab = json::object();
  for (const auto& [token, id] : emoe::read_vocab_json(dir + "/vocab.json")) vocab[token] = id;
  json merges = json::array();
  for (const auto& [a, b] : emoe::read_merges_txt(dir + "/merges.txt"))
    merges.push_back(merges_as_pairs ? json::array({a, b}) : json(a + " " + b));
  json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", true},
                     {"use_regex", true}};
  json post = byte_level;
  post["add_prefix_space"] = true;
  post["trim_offsets"] = false;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", {added_token(50256, "<|endoftext|>", true)}},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", post},
          {"decoder", post},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", ""},
            {"end_of_word_suffix", ""},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", merges}}}};
}

// The shape LlamaTokenizerFast writes (SentencePiece-style BPE with byte fallback), trimmed to
// its three special pieces: emoe must not guess its behaviour from this file.
json llama_tokenizer_json() {
  return {
      {"version", "1.0"},
      {"added_tokens",
       {added_token(0, "<unk>", true), added_token(1, "<s>", true), added_token(2, "</s>", true)}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}}},
      {"pre_tokenizer", nullptr},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}}},
        {"merges", json::array()}}}};
}

TEST(TokenizerJson, BertTemplateProcessing) {
  EMOE_REQUIRE_SHARED(details, "fixtures/tokenizers/bert-base-uncased.details.json");
  emoe::test::TempDir dir;
  std::string vocab = fs::path(details).parent_path() / "bert-base-uncased" / "vocab.txt";
  emoe::test::write_json_file(dir.file("tokenizer.json"), bert_tokenizer_json(vocab, false));
  auto tok = emoe::load_tokenizer(dir.path());
  EXPECT_EQ(tok->kind(), "wordpiece");
  check_tokenizer_details(details, *tok);
  emoe::Encoding pair = tok->encode_pair("hello world", "how are you");
  EXPECT_EQ(pair.ids, (std::vector<int64_t>{101, 7592, 2088, 102, 2129, 2024, 2017, 102}));
  EXPECT_EQ(pair.token_type_ids, (std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1, 1}));
}

TEST(TokenizerJson, BertLegacyBertProcessing) {
  EMOE_REQUIRE_SHARED(details, "fixtures/tokenizers/bert-base-uncased.details.json");
  emoe::test::TempDir dir;
  std::string vocab = fs::path(details).parent_path() / "bert-base-uncased" / "vocab.txt";
  emoe::test::write_json_file(dir.file("tokenizer.json"), bert_tokenizer_json(vocab, true));
  check_tokenizer_details(details, *emoe::load_tokenizer(dir.path()));
}

TEST(TokenizerJson, Gpt2StringMerges) {
  EMOE_REQUIRE_SHARED(details, "fixtures/tokenizers/gpt2.details.json");
  emoe::test::TempDir dir;
  emoe::test::write_json_file(dir.file("tokenizer.json"),
                              gpt2_tokenizer_json(fs::path(details).parent_path() / "gpt2", false));
  auto tok = emoe::load_tokenizer(dir.path());
  EXPECT_EQ(tok->kind(), "bpe");
  check_tokenizer_details(details, *tok);
}

TEST(TokenizerJson, Gpt2PairMerges) {
  EMOE_REQUIRE_SHARED(details, "fixtures/tokenizers/gpt2.details.json");
  emoe::test::TempDir dir;
  emoe::test::write_json_file(dir.file("tokenizer.json"),
                              gpt2_tokenizer_json(fs::path(details).parent_path() / "gpt2", true));
  check_tokenizer_details(details, *emoe::load_tokenizer(dir.path()));
}

TEST(TokenizerJson, SentencePieceStyleNeedsTokenizerModel) {
  emoe::test::TempDir dir;
  emoe::test::write_json_file(dir.file("tokenizer.json"), llama_tokenizer_json());
  try {
    emoe::load_tokenizer(dir.path());
    FAIL() << "a SentencePiece-style tokenizer.json alone must be refused";
  } catch (const emoe::InputError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(dir.file("tokenizer.json")), std::string::npos) << what;
    EXPECT_NE(what.find("model.type"), std::string::npos) << what;
    EXPECT_NE(what.find("tokenizer.model"), std::string::npos) << what;
  }
}

TEST(TokenizerJson, SentencePieceStyleUsesTokenizerModel) {
  EMOE_REQUIRE_SHARED(details, "fixtures/tokenizers/llama-tok512.details.json");
  emoe::test::TempDir dir;
  emoe::test::write_json_file(dir.file("tokenizer.json"), llama_tokenizer_json());
  fs::copy_file(fs::path(details).parent_path() / "llama-tok512" / "tokenizer.model",
                dir.file("tokenizer.model"));
  auto tok = emoe::load_tokenizer(dir.path());
  EXPECT_EQ(tok->kind(), "sentencepiece");
  check_tokenizer_details(details, *tok);
}

TEST(TokenizerJson, UnsupportedComponentsAreRefused) {
  EMOE_REQUIRE_SHARED(gpt2, "fixtures/tokenizers/gpt2");
  json base = gpt2_tokenizer_json(gpt2, false);
  std::vector<emoe::test::RefusedPatch> cases = {
      {"normalizer", {{"normalizer", {{"type", "Lowercase"}}}}},
      {"model.dropout", {{"model", {{"dropout", 0.1}}}}},
      {"model.type", {{"model", {{"type", "WordLevel"}}}}},
      {"post_processor.cls", {{"post_processor", {{"type", "RobertaProcessing"}}}}},
      {"post_processor.type", {{"post_processor", {{"type", "Whatever"}}}}},
  };
  emoe::test::expect_patches_refused(base, cases);
}

}  // namespace
