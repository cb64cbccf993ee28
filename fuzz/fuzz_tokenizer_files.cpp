// Fuzzes every tokenizer file format a model folder can hold: the input picks the format with its
// first byte and holds the files' contents separated by "\n\x01\n":
//   0: tokenizer.json [, tokenizer_config.json]
//   1: vocab.txt [, tokenizer_config.json, special_tokens_map.json]        (WordPiece)
//   2: vocab.json, merges.txt [, tokenizer_config.json]                    (byte-level BPE)
// The files are written into a private folder and loaded with load_tokenizer(); a load that
// succeeds then encodes, pairs, truncates and decodes a few texts. Our typed errors (InputError,
// RuntimeError) are the expected outcome of bad files; anything else escaping is a finding.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "emoe/core/error.h"
#include "emoe/tokenizer/tokenizer.h"
#include "fuzz_util.h"

namespace {

const char* const kTexts[] = {"Hello, world! It's 2026.",
                              "naïve café 東京 \xF0\x9F\x98\x80",
                              " ",
                              "",
                              "[CLS] <s> </s> <|endoftext|> [MASK]",
                              "\xC3\x28 broken utf-8 \xFF"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int kind = data[0] % 3;
  std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::vector<std::string> parts = emoe_fuzz::split_parts(rest);
  emoe_fuzz::clear();
  auto part = [&](size_t i) { return i < parts.size() ? parts[i] : std::string(); };
  if (kind == 0) {
    emoe_fuzz::put("tokenizer.json", part(0));
    if (parts.size() > 1) emoe_fuzz::put("tokenizer_config.json", part(1));
  } else if (kind == 1) {
    emoe_fuzz::put("vocab.txt", part(0));
    if (parts.size() > 1) emoe_fuzz::put("tokenizer_config.json", part(1));
    if (parts.size() > 2) emoe_fuzz::put("special_tokens_map.json", part(2));
  } else {
    emoe_fuzz::put("vocab.json", part(0));
    emoe_fuzz::put("merges.txt", part(1));
    if (parts.size() > 2) emoe_fuzz::put("tokenizer_config.json", part(2));
  }
  try {
    auto tok = emoe::load_tokenizer(emoe_fuzz::folder());
    emoe_fuzz::exercise_tokenizer(*tok, kTexts);
  } catch (const emoe::InputError&) {
  } catch (const emoe::RuntimeError&) {
  }
  return 0;
}
