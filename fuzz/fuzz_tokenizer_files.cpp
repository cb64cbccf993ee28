// Fuzzes every tokenizer file format a model folder can hold: the input picks the format with its
// first byte and holds the files' contents separated by "\n\x01\n":
//   0: tokenizer.json [, tokenizer_config.json]
//   1: vocab.txt [, tokenizer_config.json, special_tokens_map.json]        (WordPiece)
//   2: vocab.json, merges.txt [, tokenizer_config.json]                    (byte-level BPE)
// The files are written into a private folder and loaded with load_tokenizer(); a load that
// succeeds then encodes, pairs, truncates and decodes a few texts. Our typed errors (InputError,
// RuntimeError) are the expected outcome of bad files; anything else escaping is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "emoe/core/error.h"
#include "emoe/tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace {

const std::string& folder() {
  static const std::string dir = [] {
    auto d = fs::temp_directory_path() / ("emoe-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d.string();
  }();
  return dir;
}

void put(const std::string& name, const std::string& text) {
  std::ofstream(folder() + "/" + name, std::ios::binary | std::ios::trunc) << text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int kind = data[0] % 3;
  std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<std::string> parts;
  const std::string sep = "\n\x01\n";
  for (size_t at = 0;;) {
    size_t next = rest.find(sep, at);
    parts.push_back(rest.substr(at, next == std::string::npos ? std::string::npos : next - at));
    if (next == std::string::npos) break;
    at = next + sep.size();
  }
  for (const char* f : {"tokenizer.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer_config.json",
                        "special_tokens_map.json"})
    fs::remove(folder() + "/" + f);
  auto part = [&](size_t i) { return i < parts.size() ? parts[i] : std::string(); };
  if (kind == 0) {
    put("tokenizer.json", part(0));
    if (parts.size() > 1) put("tokenizer_config.json", part(1));
  } else if (kind == 1) {
    put("vocab.txt", part(0));
    if (parts.size() > 1) put("tokenizer_config.json", part(1));
    if (parts.size() > 2) put("special_tokens_map.json", part(2));
  } else {
    put("vocab.json", part(0));
    put("merges.txt", part(1));
    if (parts.size() > 2) put("tokenizer_config.json", part(2));
  }
  try {
    auto tok = emoe::load_tokenizer(folder());
    for (const std::string text : {"Hello, world! It's 2026.", "naïve café 東京 \xF0\x9F\x98\x80", " ", "",
                                   "[CLS] <s> </s> <|endoftext|> [MASK]", "\xC3\x28 broken utf-8 \xFF"}) {
      auto e = tok->encode(text, true, 16);
      auto p = tok->encode_pair(text, "second segment", true, 12);
      (void)tok->decode(e.ids, false);
      (void)tok->decode(p.ids, true);
      for (int64_t id : e.ids) (void)tok->id_to_token(id);
    }
    (void)tok->decode({-1, 0, tok->vocab_size(), tok->vocab_size() + 7}, false);
  } catch (const emoe::InputError&) {
  } catch (const emoe::RuntimeError&) {
  }
  return 0;
}
