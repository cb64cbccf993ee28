// The tokenizer vocabulary stored in a GGUF file (llama.cpp's format): tokens, scores, merges.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace emoe {

// The tokenizer.ggml.* metadata of a GGUF file (versions 2 and 3).
struct GgufVocab {
  std::string path;
  std::string model;  // tokenizer.ggml.model: "llama" (SentencePiece), "gpt2", "bert", ...
  std::string pre;    // tokenizer.ggml.pre: llama.cpp's pre-tokenizer name
  std::vector<std::string> tokens;
  std::vector<float> scores;         // empty when the file has none
  std::vector<int32_t> token_types;  // llama.cpp's types: 1 normal, 2 unknown, 3 control, 4 user
                                     // defined, 5 unused, 6 byte; empty when absent
  std::vector<std::string> merges;   // "first second", in rank order
  std::optional<int64_t> bos, eos, unk, sep, pad, cls, mask;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
};

// Reads only the metadata (no tensor data). Throws InputError naming the file and the key for
// anything malformed: bad magic, unsupported version, truncated values, wrong value types.
GgufVocab read_gguf_vocab(const std::string& path);

}  // namespace emoe
