// Golden tokenizer ids and decodes against Hugging Face's slow tokenizers (../shared/fixtures).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "emoe/io/safetensors.h"
#include "emoe/tokenizer/sentencepiece.h"
#include "emoe/tokenizer/tokenizer.h"
#include "support/test_support.h"
#include "tokenizer_golden_check.h"

namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

using emoe::test::as_json_string;
using emoe::test::check_tokenizer_details;
using emoe::test::read_json_file;

std::vector<int64_t> row(const at::Tensor& t, int64_t i) {
  at::Tensor r = t[i].to(at::kLong).contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

TEST(TokenizerFixtures, BertBaseUncased) {
  EMOE_REQUIRE_SHARED(details, "fixtures/tokenizers/bert-base-uncased.details.json");
  auto tok = emoe::load_tokenizer(fs::path(details).parent_path() / "bert-base-uncased");
  EXPECT_EQ(tok->kind(), "wordpiece");
  EXPECT_EQ(tok->vocab_size(), 30522);
  EXPECT_EQ(tok->special().cls, 101);
  EXPECT_EQ(tok->special().sep, 102);
  EXPECT_EQ(tok->special().mask, 103);
  EXPECT_EQ(tok->special().pad, 0);
  EXPECT_EQ(tok->special().unk, 100);
  check_tokenizer_details(details, *tok);
}

TEST(TokenizerFixtures, Gpt2) {
  EMOE_REQUIRE_SHARED(details, "fixtures/tokenizers/gpt2.details.json");
  auto tok = emoe::load_tokenizer(fs::path(details).parent_path() / "gpt2");
  EXPECT_EQ(tok->kind(), "bpe");
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->special().eos, 50256);
  EXPECT_FALSE(tok->special().pad.has_value());
  check_tokenizer_details(details, *tok);
}

TEST(TokenizerFixtures, LlamaTok512) {
  EMOE_REQUIRE_SHARED(details, "fixtures/tokenizers/llama-tok512.details.json");
  auto tok = emoe::load_tokenizer(fs::path(details).parent_path() / "llama-tok512");
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->special().bos, 1);
  EXPECT_EQ(tok->special().eos, 2);
  EXPECT_EQ(tok->special().unk, 0);
  check_tokenizer_details(details, *tok);
  // The raw sentencepiece ids (no template, no special-token splitting).
  const auto& spm = dynamic_cast<const emoe::SentencePieceTokenizer&>(*tok).model();
  const json all = read_json_file(details);  // a range-for over a temporary's member dangles
  for (const json& c : all.at("cases")) {
    std::string text = c.at("text").get<std::string>();
    std::vector<int> got = spm.encode(text);
    EXPECT_EQ(std::vector<int64_t>(got.begin(), got.end()),
              c.at("sentencepiece_ids").get<std::vector<int64_t>>())
        << as_json_string(text);
  }
}

TEST(TokenizerFixtures, BertMiniBatchAndPair) {
  EMOE_REQUIRE_SHARED(fixture_dir, "fixtures/bert-mini");
  EMOE_REQUIRE_SHARED(model_dir, "models/bert-mini");
  json meta = read_json_file(fixture_dir + "/fixture.json");
  auto tensors = emoe::load_safetensors(fixture_dir + "/fixture.safetensors");
  auto tok = emoe::load_tokenizer(model_dir);
  EXPECT_EQ(tok->vocab_size(), 8192);
  const at::Tensor& input_ids = tensors.at("input_ids");
  const at::Tensor& type_ids = tensors.at("token_type_ids");
  const at::Tensor& mask = tensors.at("attention_mask");
  const int64_t width = input_ids.size(1);
  const json& texts = meta.at("texts");
  ASSERT_EQ(static_cast<int64_t>(texts.size()), input_ids.size(0));
  for (size_t i = 0; i < texts.size(); ++i) {
    std::string text = texts[i].get<std::string>();
    emoe::Encoding enc = tok->encode(text, true, 48);
    ASSERT_LE(static_cast<int64_t>(enc.ids.size()), width) << text;
    std::vector<int64_t> padded = enc.ids, padded_types = enc.token_type_ids, ones;
    ones.assign(enc.ids.size(), 1);
    padded.resize(static_cast<size_t>(width), 0);
    padded_types.resize(static_cast<size_t>(width), 0);
    ones.resize(static_cast<size_t>(width), 0);
    EXPECT_EQ(padded, row(input_ids, static_cast<int64_t>(i))) << text;
    EXPECT_EQ(padded_types, row(type_ids, static_cast<int64_t>(i))) << text;
    EXPECT_EQ(ones, row(mask, static_cast<int64_t>(i))) << text;
  }
  const json& pair = meta.at("pair");
  emoe::Encoding enc =
      tok->encode_pair(pair[0].get<std::string>(), pair[1].get<std::string>(), true, 48);
  EXPECT_EQ(enc.ids, row(tensors.at("pair.input_ids"), 0));
  EXPECT_EQ(enc.token_type_ids, row(tensors.at("pair.token_type_ids"), 0));
}

TEST(TokenizerFixtures, Stories260KPrompts) {
  EMOE_REQUIRE_SHARED(fixture_dir, "fixtures/stories260K");
  EMOE_REQUIRE_SHARED(model_dir, "models/stories260K/hf");
  json meta = read_json_file(fixture_dir + "/fixture.json");
  auto tensors = emoe::load_safetensors(fixture_dir + "/fixture.safetensors");
  auto tok = emoe::load_tokenizer(model_dir);
  for (int i = 0; i < 5; ++i) {
    std::string key = fmt::format("p{}", i);
    std::string prompt = meta.at(key).at("prompt").get<std::string>();
    std::vector<int64_t> expected = row(tensors.at(key + ".input_ids"), 0);
    EXPECT_EQ(tok->encode(prompt).ids, expected) << prompt;
    EXPECT_EQ(static_cast<int64_t>(expected.size()),
              meta.at(key).at("n_prompt_tokens_incl_bos").get<int64_t>());
    // The greedy continuation decodes to the text HF printed.
    EXPECT_EQ(tok->decode(row(tensors.at(key + ".greedy_ids"), 0), true),
              meta.at(key).at("greedy_text").get<std::string>())
        << prompt;
  }
}

}  // namespace
