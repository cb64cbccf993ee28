// WordPiece (BERT, vocab.txt): BasicTokenizer, then greedy longest-match-first with "##".
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "emoe/tokenizer/basic_tokenizer.h"
#include "emoe/tokenizer/pipeline_tokenizer.h"

namespace emoe {

class TokenizerConfig;

struct WordPieceOptions {
  BasicTokenizerOptions basic;
  bool do_basic_tokenize = true;
  std::string unk_token = "[UNK]";
  std::string continuing_prefix = "##";
  int64_t max_input_chars_per_word = 100;
  bool clean_up_tokenization_spaces = true;
  // Replaces BERT's [CLS] A [SEP] (B [SEP]) (tokenizer.json's post_processor).
  std::optional<PostTemplate> post_template;
};

// HF's BertTokenizer (slow). `vocab[i]` is the token of id i; a token listed twice keeps its
// later id for token -> id, as HF's vocabulary dict does.
class WordPieceTokenizer : public PipelineTokenizer {
 public:
  WordPieceTokenizer(std::vector<std::string> vocab, WordPieceOptions options,
                     const SpecialTokenRoles& roles, const std::vector<AddedToken>& added);

  std::string kind() const override { return "wordpiece"; }

  // The greedy WordPiece split of one word (code points), as token ids.
  void wordpiece(const std::u32string& word, std::vector<int64_t>& out) const;

 protected:
  std::vector<int64_t> tokenize_text(const std::string& text) const override;
  std::optional<int64_t> model_token_to_id(const std::string& token) const override;
  std::string model_id_to_token(int64_t id) const override;
  int64_t model_vocab_size() const override { return static_cast<int64_t>(vocab_.size()); }
  std::string tokens_to_string(const std::vector<int64_t>& ids) const override;

 private:
  std::vector<std::string> vocab_;
  std::unordered_map<std::string, int64_t> ids_;
  WordPieceOptions options_;
  BasicTokenizer basic_;
  int64_t unk_id_ = -1;
  std::set<std::string> never_split_;  // the special tokens, passed to BasicTokenizer
};

// Reads vocab.txt: one token per line (Python's universal newlines: \n, \r\n or \r).
std::vector<std::string> read_vocab_txt(const std::string& path);

// A BertTokenizer from `dir`/vocab.txt with the folder's configuration files.
std::unique_ptr<WordPieceTokenizer> load_wordpiece(const std::string& dir,
                                                   const TokenizerConfig& config);

// The BERT special-token roles with their defaults ([UNK], [SEP], [PAD], [CLS], [MASK]).
SpecialTokenRoles bert_special_roles(const TokenizerConfig& config);

}  // namespace emoe
