// llama.cpp's tokenizer test vectors (../shared/tokenizers/gguf) against emoe's tokenizers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "emoe/tokenizer/bpe.h"
#include "emoe/tokenizer/gguf_tokenizer.h"
#include "emoe/tokenizer/gguf_vocab.h"
#include "emoe/tokenizer/wordpiece.h"
#include "support/test_support.h"

namespace {
namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `X.gguf.inp` holds texts separated by "\n__ggml_vocab_test__\n" (also after the last one);
// `X.gguf.out` the ids of each text (add_special_tokens=False), one line per text.
struct Vectors {
  std::vector<std::string> texts;
  std::vector<std::vector<int64_t>> ids;
};

Vectors read_vectors(const std::string& gguf) {
  Vectors v;
  std::string inp = read_file(gguf + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  size_t pos = 0;
  while (pos < inp.size()) {
    size_t hit = inp.find(sep, pos);
    if (hit == std::string::npos) {
      v.texts.push_back(inp.substr(pos));
      break;
    }
    v.texts.push_back(inp.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  std::istringstream out(read_file(gguf + ".out"));
  std::string line;
  while (std::getline(out, line)) {
    std::istringstream fields(line);
    std::vector<int64_t> ids;
    int64_t id = 0;
    while (fields >> id) ids.push_back(id);
    v.ids.push_back(ids);
  }
  return v;
}

std::string show(const std::string& text) {
  return nlohmann::json(text).dump();
}

// Every vector is compared: llama.cpp generated them with Hugging Face's tokenizers and
// add_special_tokens=False, so no BOS is expected, and none of them needed an exclusion.
void check_vectors(const std::string& gguf, const emoe::Tokenizer& tok) {
  Vectors v = read_vectors(gguf);
  ASSERT_EQ(v.texts.size(), v.ids.size()) << gguf;
  ASSERT_GE(v.texts.size(), 40u);
  for (size_t i = 0; i < v.texts.size(); ++i)
    EXPECT_EQ(tok.encode_plain(v.texts[i]), v.ids[i]) << "vector " << i << ": " << show(v.texts[i]);
}

TEST(TokenizerGguf, Gpt2VocabularyEqualsTheFixtureFiles) {
  EMOE_REQUIRE_SHARED(gguf, "tokenizers/gguf/ggml-vocab-gpt-2.gguf");
  EMOE_REQUIRE_SHARED(dir, "fixtures/tokenizers/gpt2");
  emoe::GgufVocab vocab = emoe::read_gguf_vocab(gguf);
  EXPECT_EQ(vocab.model, "gpt2");
  auto files = emoe::read_vocab_json(dir + "/vocab.json");
  ASSERT_EQ(files.size(), vocab.tokens.size());
  for (const auto& [token, id] : files) EXPECT_EQ(vocab.tokens.at(static_cast<size_t>(id)), token);
  auto merges = emoe::read_merges_txt(dir + "/merges.txt");
  ASSERT_EQ(merges.size(), vocab.merges.size());
  for (size_t i = 0; i < merges.size(); ++i)
    EXPECT_EQ(merges[i].first + " " + merges[i].second, vocab.merges[i]);
}

TEST(TokenizerGguf, Gpt2Vectors) {
  EMOE_REQUIRE_SHARED(gguf, "tokenizers/gguf/ggml-vocab-gpt-2.gguf");
  auto tok = emoe::tokenizer_from_gguf(emoe::read_gguf_vocab(gguf));
  EXPECT_EQ(tok->kind(), "bpe");
  check_vectors(gguf, *tok);
}

TEST(TokenizerGguf, BertBgeVectors) {
  EMOE_REQUIRE_SHARED(gguf, "tokenizers/gguf/ggml-vocab-bert-bge.gguf");
  auto tok = emoe::tokenizer_from_gguf(emoe::read_gguf_vocab(gguf));
  EXPECT_EQ(tok->kind(), "wordpiece");
  check_vectors(gguf, *tok);
}

TEST(TokenizerGguf, LlamaSpmVectors) {
  EMOE_REQUIRE_SHARED(gguf, "tokenizers/gguf/ggml-vocab-llama-spm.gguf");
  emoe::GgufVocab vocab = emoe::read_gguf_vocab(gguf);
  EXPECT_EQ(vocab.tokens.size(), 32000u);
  auto tok = emoe::tokenizer_from_gguf(vocab);
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->encode("Hello").ids.front(), 1);  // add_bos_token
  check_vectors(gguf, *tok);
}

}  // namespace
