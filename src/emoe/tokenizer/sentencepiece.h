// SentencePiece (Llama's tokenizer.model) with HF LlamaTokenizer's template and decoding.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "emoe/tokenizer/pipeline_tokenizer.h"
#include "emoe/tokenizer/spm_library.h"

namespace emoe {

class TokenizerConfig;

struct SentencePieceOptions {
  bool add_bos_token = true;
  bool add_eos_token = false;
  bool clean_up_tokenization_spaces = false;
  bool spaces_between_special_tokens = true;
};

// transformers 4.33 LlamaTokenizer with legacy=True: each text piece between special tokens is
// encoded by sentencepiece on its own (so it gets the dummy-prefix "▁"); decoding keeps special
// tokens out of sentencepiece and puts a space before one that follows ordinary pieces.
class SentencePieceTokenizer : public PipelineTokenizer {
 public:
  SentencePieceTokenizer(std::shared_ptr<SpmModel> model, SentencePieceOptions options,
                         const SpecialTokenRoles& roles, const std::vector<AddedToken>& added);

  std::string kind() const override { return "sentencepiece"; }
  const SpmModel& model() const { return *model_; }

 protected:
  std::vector<int64_t> tokenize_text(const std::string& text) const override;
  std::optional<int64_t> model_token_to_id(const std::string& token) const override;
  std::string model_id_to_token(int64_t id) const override;
  int64_t model_vocab_size() const override { return model_->piece_size(); }
  std::string tokens_to_string(const std::vector<int64_t>& ids) const override;

 private:
  std::shared_ptr<SpmModel> model_;
  SentencePieceOptions options_;
};

// LlamaTokenizer's special-token roles (<unk>, <s>, </s>, no pad) from the configuration.
SpecialTokenRoles llama_special_roles(const TokenizerConfig& config);

// A LlamaTokenizer from `dir`/tokenizer.model with the folder's configuration files.
std::unique_ptr<SentencePieceTokenizer> load_sentencepiece(const std::string& dir,
                                                           const TokenizerConfig& config);

}  // namespace emoe
