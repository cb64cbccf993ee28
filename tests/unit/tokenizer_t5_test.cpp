// T5Tokenizer (spiece.model): sentinels, the eos template, decoding, and agreement of the plain ids
// with the Llama tokenizer on the same SentencePiece model.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "emoe/core/error.h"
#include "emoe/tokenizer/sentencepiece.h"
#include "emoe/tokenizer/sentencepiece_proto.h"
#include "emoe/tokenizer/tokenizer.h"
#include "support/test_support.h"

namespace {
namespace fs = std::filesystem;
using Ids = std::vector<int64_t>;

const std::string kT5Space = "\xE2\x96\x81";  // "▁"

// A unigram model with T5's layout: <pad> 0, </s> 1, <unk> 2, no <s>.
std::string t5_style_model() {
  emoe::SpmModelSpec spec;
  spec.model_type = 1;
  spec.pad_id = 0;
  spec.eos_id = 1;
  spec.unk_id = 2;
  spec.bos_id = -1;
  spec.pieces = {{"<pad>", 0, 3},
                 {"</s>", 0, 3},
                 {"<unk>", 0, 2},
                 {kT5Space, -3, 1},
                 {kT5Space + "hello", -1, 1},
                 {kT5Space + "world", -1, 1},
                 {kT5Space + "the", -1, 1},
                 {"h", -5, 1},
                 {"e", -5, 1},
                 {"l", -5, 1},
                 {"o", -5, 1},
                 {"w", -5, 1},
                 {"r", -5, 1},
                 {"d", -5, 1},
                 {"t", -5, 1},
                 {".", -5, 1}};
  return emoe::serialize_sentencepiece_model(spec);
}

void write_t5_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(TokenizerT5, SentinelsTemplateAndDecoding) {
  emoe::test::TempDir dir;
  write_t5_file(dir.file("spiece.model"), t5_style_model());
  write_t5_file(dir.file("tokenizer_config.json"),
                R"({"tokenizer_class": "T5Tokenizer", "extra_ids": 3, "model_max_length": 512})");
  auto tok = emoe::load_tokenizer(dir.path());
  EXPECT_EQ(tok->kind(), "sentencepiece");
  ASSERT_EQ(tok->vocab_size(), 16 + 3);
  EXPECT_EQ(tok->special().eos, 1);
  EXPECT_EQ(tok->special().pad, 0);
  EXPECT_EQ(tok->special().unk, 2);
  EXPECT_FALSE(tok->special().bos.has_value());
  // <extra_id_0> is the last id
  EXPECT_EQ(tok->token_to_id("<extra_id_0>"), 18);
  EXPECT_EQ(tok->token_to_id("<extra_id_2>"), 16);
  EXPECT_EQ(tok->id_to_token(16), "<extra_id_2>");
  EXPECT_EQ(tok->id_to_token(4), kT5Space + "hello");

  // X </s>, type ids 0; the sentinel is split out and eats the spaces around it
  emoe::Encoding e = tok->encode("hello <extra_id_0> world");
  EXPECT_EQ(e.ids, (Ids{4, 18, 5, 1}));
  EXPECT_EQ(e.token_type_ids, (Ids{0, 0, 0, 0}));
  EXPECT_EQ(tok->encode("hello world", false).ids, (Ids{4, 5}));
  // no second eos after a written one
  EXPECT_EQ(tok->encode("hello</s>").ids, (Ids{4, 1}));
  // A </s> B </s>, type ids 0
  e = tok->encode_pair("hello", "the world");
  EXPECT_EQ(e.ids, (Ids{4, 1, 6, 5, 1}));
  EXPECT_EQ(e.token_type_ids, (Ids{0, 0, 0, 0, 0}));
  // truncation leaves room for the eos
  EXPECT_EQ(tok->encode("hello world the", true, 3).ids, (Ids{4, 5, 1}));
  EXPECT_EQ(tok->encode_pair("hello world the", "world", true, 4).ids, (Ids{4, 1, 5, 1}));

  // T5Tokenizer.convert_tokens_to_string: a space before each special token that follows a
  // piece, then the whole string stripped
  EXPECT_EQ(tok->decode({4, 18, 5, 1}), "hello<extra_id_0> world</s>");
  EXPECT_EQ(tok->decode({18, 4, 17, 1}), "<extra_id_0> hello<extra_id_1></s>");
  EXPECT_EQ(tok->decode({4, 18, 5, 1}, true), "hello world");
  EXPECT_EQ(tok->decode({0, 0}, true), "");
  EXPECT_THROW(tok->decode({19}), emoe::InputError);
}

TEST(TokenizerT5, ConfigurationErrors) {
  emoe::test::TempDir dir;
  write_t5_file(dir.file("spiece.model"), t5_style_model());
  auto expect_error = [&](const std::string& config, const std::string& part) {
    write_t5_file(dir.file("tokenizer_config.json"), config);
    try {
      emoe::load_tokenizer(dir.path());
      ADD_FAILURE() << "no error for " << config;
    } catch (const emoe::InputError& err) {
      EXPECT_NE(std::string(err.what()).find(part), std::string::npos) << err.what();
    }
  };
  expect_error(R"({"tokenizer_class": "LlamaTokenizer"})", "T5Tokenizer");
  expect_error(R"({"extra_ids": -1})", "field 'extra_ids'");
  expect_error(R"({"extra_ids": 2, "additional_special_tokens": ["<extra_id_0>"]})",
               "field 'additional_special_tokens'");
  expect_error(R"({"legacy": false})", "field 'legacy'");
  // extra_ids 0: no sentinels, the model's own pieces only
  write_t5_file(dir.file("tokenizer_config.json"), R"({"extra_ids": 0})");
  auto tok = emoe::load_tokenizer(dir.path());
  EXPECT_EQ(tok->vocab_size(), 16);
  EXPECT_FALSE(tok->token_to_id("<extra_id_0>").has_value());
}

// The real llama-tok512 SentencePiece model read as a spiece.model: T5's ids are the Llama
// tokenizer's plain ids (Hugging Face's, checked by the golden tokenizer tests) plus </s>.
TEST(TokenizerT5, PlainIdsEqualTheLlamaTokenizerOnTheSameModel) {
  EMOE_REQUIRE_SHARED(llama_dir, "fixtures/tokenizers/llama-tok512");
  EMOE_REQUIRE_SHARED(cases, "fixtures/tokenizers/llama-tok512.json");
  emoe::test::TempDir dir;
  fs::copy_file(fs::path(llama_dir) / "tokenizer.model", dir.file("spiece.model"));
  auto t5 = emoe::load_tokenizer(dir.path());
  auto llama = emoe::load_tokenizer(llama_dir);
  // llama-tok512 has no <pad>: like from_pretrained, it is added after the 100 sentinels
  EXPECT_EQ(t5->vocab_size(), 512 + 100 + 1);
  EXPECT_EQ(t5->special().pad, 612);
  EXPECT_EQ(t5->special().eos, 2);
  nlohmann::json j;
  std::ifstream(cases) >> j;
  int checked = 0;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& text = it.key();
    if (text.find('<') != std::string::npos) continue;  // special-token strings strip differently
    SCOPED_TRACE(text);
    Ids want = llama->encode_plain(text);
    EXPECT_EQ(t5->encode(text, false).ids, want);
    want.push_back(2);
    EXPECT_EQ(t5->encode(text).ids, want);
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

}  // namespace
