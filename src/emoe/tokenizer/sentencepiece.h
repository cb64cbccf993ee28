// SentencePiece (Llama's tokenizer.model, T5's spiece.model) with the template and decoding of
// HF's LlamaTokenizer or T5Tokenizer.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "emoe/tokenizer/pipeline_tokenizer.h"
#include "emoe/tokenizer/spm_library.h"

namespace emoe {

class TokenizerConfig;

// Which Hugging Face class the tokenizer reproduces.
enum class SpmFlavor { kLlama, kT5 };

struct SentencePieceOptions {
  SpmFlavor flavor = SpmFlavor::kLlama;
  // T5: the sentinels <extra_id_0> ... <extra_id_{n-1}> take the ids after the model's pieces,
  // <extra_id_0> the last one.
  int64_t extra_ids = 0;
  bool add_bos_token = true;
  bool add_eos_token = false;
  bool clean_up_tokenization_spaces = false;
  bool spaces_between_special_tokens = true;
};

// transformers 4.33 LlamaTokenizer with legacy=True: each text piece between special tokens is
// encoded by sentencepiece on its own (so it gets the dummy-prefix "▁"); decoding keeps special
// tokens out of sentencepiece and puts a space before one that follows ordinary pieces.
// T5Tokenizer (4.33, legacy=True) differs: no bos; "A </s>" and "A </s> B </s>" with type ids all
// 0, the eos not added again to a sequence that already ends with it; the sentinel ids; decoding
// puts a space before a special token even at the start and strips the result.
class SentencePieceTokenizer : public PipelineTokenizer {
 public:
  SentencePieceTokenizer(std::shared_ptr<SpmModel> model, SentencePieceOptions options,
                         const SpecialTokenRoles& roles, const std::vector<AddedToken>& added);

  std::string kind() const override { return "sentencepiece"; }
  const SpmModel& model() const { return *model_; }
  SpmFlavor flavor() const { return options_.flavor; }

  Encoding encode(const std::string& text, bool add_special_tokens = true,
                  int64_t max_length = 0) const override;
  Encoding encode_pair(const std::string& a, const std::string& b, bool add_special_tokens = true,
                       int64_t max_length = 0) const override;

 protected:
  std::vector<int64_t> tokenize_text(const std::string& text) const override;
  std::optional<int64_t> model_token_to_id(const std::string& token) const override;
  std::string model_id_to_token(int64_t id) const override;
  int64_t model_vocab_size() const override { return model_->piece_size() + options_.extra_ids; }
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

// A T5Tokenizer from `dir`/spiece.model: eos "</s>", unk "<unk>", pad "<pad>", `extra_ids`
// sentinels (default 100) that are also its additional special tokens.
std::unique_ptr<SentencePieceTokenizer> load_t5_sentencepiece(const std::string& dir,
                                                              const TokenizerConfig& config);

}  // namespace emoe
