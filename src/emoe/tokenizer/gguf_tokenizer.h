// Builds emoe's tokenizers from a GGUF vocabulary (to check them against llama.cpp's vectors).
#pragma once
#include <memory>

#include "emoe/tokenizer/gguf_vocab.h"
#include "emoe/tokenizer/tokenizer.h"

namespace emoe {

// tokenizer.ggml.model "bert" -> WordPiece (uncased, as llama.cpp's WPM), "gpt2" -> byte-level
// BPE from tokens + merges, "llama" -> a SentencePiece BPE model written from tokens, scores and
// types (dummy prefix as add_space_prefix, no whitespace clean-up: llama.cpp's SPM). Anything
// else is an InputError.
std::unique_ptr<Tokenizer> tokenizer_from_gguf(const GgufVocab& vocab);

}  // namespace emoe
