// Every missing or malformed tokenizer file gives one InputError naming the file (and the field).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>

#include "emoe/core/error.h"
#include "emoe/tokenizer/gguf_vocab.h"
#include "emoe/tokenizer/spm_library.h"
#include "emoe/tokenizer/tokenizer.h"
#include "support/test_support.h"

namespace {

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Runs `fn`, expects an InputError, and checks that its message holds every `needle`.
void expect_input_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an InputError mentioning " << needles.front();
  } catch (const emoe::InputError& e) {
    std::string what = e.what();
    for (const std::string& n : needles)
      EXPECT_NE(what.find(n), std::string::npos) << "message: " << what << "\nmissing: " << n;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected an InputError, got: " << e.what();
  }
}

void expect_load_error(const emoe::test::TempDir& dir, const std::vector<std::string>& needles) {
  expect_input_error([&] { emoe::load_tokenizer(dir.path()); }, needles);
}

const char* kMiniVocabJson = R"({"a": 0, "b": 1, "ab": 2, "\u0120": 3})";

TEST(TokenizerErrors, MissingFolderOrFiles) {
  emoe::test::TempDir dir;
  expect_load_error(dir, {dir.path(), "no tokenizer files found", "tokenizer.json", "vocab.txt",
                          "vocab.json+merges.txt", "tokenizer.model"});
  expect_input_error([&] { emoe::load_tokenizer(dir.file("absent")); },
                     {dir.file("absent"), "not a directory"});
}

TEST(TokenizerErrors, BpeNeedsBothFiles) {
  emoe::test::TempDir only_vocab, only_merges;
  write(only_vocab.file("vocab.json"), kMiniVocabJson);
  expect_load_error(only_vocab, {only_vocab.path(), "merges.txt"});
  write(only_merges.file("merges.txt"), "#version: 0.2\na b\n");
  expect_load_error(only_merges, {only_merges.path(), "vocab.json"});
}

TEST(TokenizerErrors, MalformedVocabJson) {
  emoe::test::TempDir not_json, wrong_type, not_object;
  for (auto* d : {&not_json, &wrong_type, &not_object})
    write(d->file("merges.txt"), "#version: 0.2\na b\n");
  write(not_json.file("vocab.json"), "{\"a\": 0,");
  expect_load_error(not_json, {not_json.file("vocab.json"), "not valid JSON"});
  write(wrong_type.file("vocab.json"), R"({"a": 0, "b": "one"})");
  expect_load_error(wrong_type, {wrong_type.file("vocab.json"), "'b'", "integer"});
  write(not_object.file("vocab.json"), "[1, 2]");
  expect_load_error(not_object, {not_object.file("vocab.json"), "object"});
}

TEST(TokenizerErrors, MalformedMergesTxt) {
  emoe::test::TempDir dir;
  write(dir.file("vocab.json"), kMiniVocabJson);
  write(dir.file("merges.txt"), "#version: 0.2\na b\nab\n");
  expect_load_error(
      dir, {dir.file("merges.txt") + " line 3", "expected two tokens separated by a space"});
  write(dir.file("merges.txt"), "#version: 0.2\na b c\n");
  expect_load_error(dir, {dir.file("merges.txt") + " line 2"});
}

TEST(TokenizerErrors, OtherTokenizerClassIsRefused) {
  emoe::test::TempDir bart, gpt2;
  for (auto* d : {&bart, &gpt2}) {
    write(d->file("vocab.json"), kMiniVocabJson);
    write(d->file("merges.txt"), "#version: 0.2\na b\n");
  }
  write(bart.file("tokenizer_config.json"), R"({"tokenizer_class": "BartTokenizer"})");
  expect_load_error(bart, {bart.file("tokenizer_config.json"), "tokenizer_class", "BartTokenizer",
                           "GPT2Tokenizer"});
  write(gpt2.file("tokenizer_config.json"), R"({"tokenizer_class": "GPT2TokenizerFast"})");
  EXPECT_EQ(emoe::load_tokenizer(gpt2.path())->encode_plain("ab"), (std::vector<int64_t>{2}));
}

TEST(TokenizerErrors, MalformedVocabTxt) {
  emoe::test::TempDir empty, no_unk, bad_utf8;
  write(empty.file("vocab.txt"), "");
  expect_load_error(empty, {empty.file("vocab.txt"), "empty"});
  write(no_unk.file("vocab.txt"), "[PAD]\n[CLS]\n[SEP]\nhello\n");
  expect_load_error(no_unk, {no_unk.file("vocab.txt"), "[UNK]"});
  write(bad_utf8.file("vocab.txt"), "[UNK]\n\xFF\xFE\n");
  expect_load_error(bad_utf8, {bad_utf8.file("vocab.txt") + " line 2", "UTF-8"});
}

TEST(TokenizerErrors, MalformedConfigFiles) {
  emoe::test::TempDir bad_json, bad_field, bad_token;
  for (auto* d : {&bad_json, &bad_field, &bad_token})
    write(d->file("vocab.txt"), "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n");
  write(bad_json.file("tokenizer_config.json"), "{do_lower_case: true}");
  expect_load_error(bad_json, {bad_json.file("tokenizer_config.json"), "not valid JSON"});
  write(bad_field.file("tokenizer_config.json"), R"({"do_lower_case": "yes"})");
  expect_load_error(bad_field, {bad_field.file("tokenizer_config.json"), "do_lower_case"});
  write(bad_token.file("special_tokens_map.json"), R"({"cls_token": {"lstrip": true}})");
  expect_load_error(bad_token, {bad_token.file("special_tokens_map.json"), "cls_token", "content"});
}

TEST(TokenizerErrors, MalformedTokenizerJson) {
  emoe::test::TempDir not_json, no_model, bad_vocab, bad_merge, bad_added;
  write(not_json.file("tokenizer.json"), "{\"model\": ");
  expect_load_error(not_json, {not_json.file("tokenizer.json"), "not valid JSON"});
  write(no_model.file("tokenizer.json"), R"({"version": "1.0"})");
  expect_load_error(no_model, {no_model.file("tokenizer.json"), "'model'", "missing"});
  const std::string byte_level = R"("pre_tokenizer": {"type": "ByteLevel"})";
  write(bad_vocab.file("tokenizer.json"),
        "{" + byte_level + R"(, "model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}})");
  expect_load_error(bad_vocab, {bad_vocab.file("tokenizer.json"), "model.vocab", "'a'"});
  write(bad_merge.file("tokenizer.json"),
        "{" + byte_level + R"(, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}})");
  expect_load_error(bad_merge, {bad_merge.file("tokenizer.json"), "model.merges[0]"});
  write(bad_added.file("tokenizer.json"),
        "{" + byte_level +
            R"(, "added_tokens": [{"content": "x"}], "model": {"type": "BPE", "vocab": {"a": 0},)" +
            R"( "merges": []}})");
  expect_load_error(bad_added, {bad_added.file("tokenizer.json"), "added_tokens[0].id"});
}

TEST(TokenizerErrors, MalformedTokenizerModel) {
  emoe::test::TempDir garbage, legacy_false;
  write(garbage.file("tokenizer.model"), "this is not a protobuf");
  expect_load_error(garbage, {garbage.file("tokenizer.model"), "SentencePiece"});
  write(legacy_false.file("tokenizer.model"), "unused: the config is refused first");
  write(legacy_false.file("tokenizer_config.json"), R"({"legacy": false})");
  expect_load_error(legacy_false, {legacy_false.file("tokenizer_config.json"), "legacy"});
}

TEST(TokenizerErrors, MalformedGguf) {
  emoe::test::TempDir dir;
  write(dir.file("bad_magic.gguf"), "GGML\x03\0\0\0");
  expect_input_error([&] { emoe::read_gguf_vocab(dir.file("bad_magic.gguf")); },
                     {dir.file("bad_magic.gguf"), "GGUF"});
  std::string header("GGUF\x03\0\0\0", 8);
  header += std::string("\0\0\0\0\0\0\0\0", 8);    // tensor count 0
  header += std::string("\x01\0\0\0\0\0\0\0", 8);  // one key
  header += std::string("\x15\0\0\0\0\0\0\0", 8) + "tokenizer.ggml.tokens";
  header += std::string("\x09\0\0\0\x08\0\0\0", 8);  // array of strings
  header += std::string("\xE8\x03\0\0\0\0\0\0", 8);  // 1000 of them, none present
  write(dir.file("truncated.gguf"), header);
  expect_input_error([&] { emoe::read_gguf_vocab(dir.file("truncated.gguf")); },
                     {dir.file("truncated.gguf"), "tokenizer.ggml.tokens"});
  write(dir.file("old.gguf"), std::string("GGUF\x01\0\0\0", 8));
  expect_input_error([&] { emoe::read_gguf_vocab(dir.file("old.gguf")); },
                     {dir.file("old.gguf"), "version 1"});
}

TEST(TokenizerErrors, ShimLookupOrder) {
  ::setenv("EMOE_SPM_SHIM", "/nonexistent/libemoe_spm.so", 1);
  std::vector<std::string> candidates = emoe::spm_shim_candidates();
  ::unsetenv("EMOE_SPM_SHIM");
  ASSERT_GE(candidates.size(), 2u);
  EXPECT_EQ(candidates.front(), "/nonexistent/libemoe_spm.so");
  EXPECT_NE(candidates.back().find("libemoe_spm.so"), std::string::npos);
}

}  // namespace
