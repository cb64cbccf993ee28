// The part of Hugging Face's slow-tokenizer pipeline that WordPiece, BPE and SentencePiece share.
#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "emoe/tokenizer/added_tokens.h"
#include "emoe/tokenizer/post_template.h"
#include "emoe/tokenizer/tokenizer.h"

namespace emoe {

// The special tokens by role, as resolved from the configuration files.
struct SpecialTokenRoles {
  std::optional<AddedToken> bos, eos, unk, sep, pad, cls, mask;
  std::vector<AddedToken> additional;
};

class TokenizerConfig;
// The roles of a class that wraps plain strings in AddedToken (GPT2Tokenizer, LlamaTokenizer):
// bos, eos and unk fall back to the class's tokens, the others only exist when configured.
SpecialTokenRoles wrapped_special_roles(const TokenizerConfig& config, const std::string& bos,
                                        const std::string& eos, const std::string& unk);

// transformers 4.33 PreTrainedTokenizer: added-token splitting, the template with truncation,
// and _decode (special-token skipping, added tokens kept apart, clean-up of spaces). Subclasses
// supply the model: text -> ids, ids -> string, and the vocabulary.
class PipelineTokenizer : public Tokenizer {
 public:
  int64_t vocab_size() const override;
  std::optional<int64_t> token_to_id(const std::string& token) const override;
  std::string id_to_token(int64_t id) const override;
  const SpecialTokens& special() const override { return special_; }

  std::vector<int64_t> encode_plain(const std::string& text) const override;
  Encoding encode(const std::string& text, bool add_special_tokens = true,
                  int64_t max_length = 0) const override;
  Encoding encode_pair(const std::string& a, const std::string& b, bool add_special_tokens = true,
                       int64_t max_length = 0) const override;
  std::string decode(const std::vector<int64_t>& ids,
                     bool skip_special_tokens = false) const override;

  const PostTemplate& post_template() const { return template_; }

 protected:
  // HF's prepare_for_tokenization, applied to the whole text before added tokens are split out.
  virtual std::string prepare_text(const std::string& text) const { return text; }
  // The model: ids of a text free of added tokens (HF's _tokenize + convert_tokens_to_ids).
  virtual std::vector<int64_t> tokenize_text(const std::string& text) const = 0;
  virtual std::optional<int64_t> model_token_to_id(const std::string& token) const = 0;
  // Only called with 0 <= id < model_vocab_size().
  virtual std::string model_id_to_token(int64_t id) const = 0;
  virtual int64_t model_vocab_size() const = 0;
  // HF's convert_tokens_to_string for a run of model ids (no added-only tokens among them).
  virtual std::string tokens_to_string(const std::vector<int64_t>& ids) const = 0;

  // Registers the tokens that are never split: first `added` (fixed ids or looked up), then the
  // special tokens; a special token missing from the vocabulary gets the next free id, as
  // from_pretrained's sanitize_special_tokens does. `lowercase_outside` is do_lower_case.
  void init_added_tokens(const SpecialTokenRoles& roles, const std::vector<AddedToken>& added,
                         bool lowercase_outside);
  void set_template(PostTemplate t) { template_ = std::move(t); }
  void set_decode_options(bool clean_up_tokenization_spaces, bool spaces_between_special_tokens) {
    clean_up_ = clean_up_tokenization_spaces;
    spaces_between_special_ = spaces_between_special_tokens;
  }
  bool is_special_token_string(const std::string& s) const { return special_strings_.count(s); }
  const AddedTokenSplitter& splitter() const { return splitter_; }

 private:
  int64_t register_token(AddedToken t, bool special);
  bool has_id(int64_t id) const;

  SpecialTokens special_;
  AddedTokenSplitter splitter_;
  std::vector<AddedToken> added_;
  std::map<std::string, int64_t> added_by_content_;
  std::map<int64_t, std::string> added_only_;  // ids the model vocabulary does not have
  std::set<int64_t> special_ids_;
  std::set<std::string> special_strings_;
  int64_t next_id_ = 0;
  PostTemplate template_;
  bool clean_up_ = true;
  bool spaces_between_special_ = true;
};

// transformers' clean_up_tokenization: " ." -> "." and friends, in its order.
std::string clean_up_tokenization(std::string text);

}  // namespace emoe
