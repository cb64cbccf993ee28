// tokenizer.json (Hugging Face fast-tokenizer file) mapped onto the WordPiece/BPE/SentencePiece
// implementations.
#pragma once
#include <memory>
#include <string>

#include "emoe/tokenizer/tokenizer.h"

namespace emoe {

class TokenizerConfig;

// Reads `dir`/tokenizer.json. Supported: BERT's WordPiece (BertNormalizer + BertPreTokenizer),
// GPT-2's byte-level BPE (ByteLevel pre-tokenizer), each with TemplateProcessing/BertProcessing/
// ByteLevel post-processors and added tokens. A SentencePiece-style model (Unigram, or BPE without
// ByteLevel) is served by the folder's tokenizer.model (what the slow tokenizer uses); without
// one it is refused with an InputError, as is any component that cannot be reproduced exactly.
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& dir,
                                               const TokenizerConfig& config);

}  // namespace emoe
