// GPT-2 byte-level BPE (vocab.json + merges.txt): regex pre-tokenizer, merges by rank, cache.
#pragma once
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "emoe/tokenizer/pipeline_tokenizer.h"

namespace emoe {

class TokenizerConfig;

struct BpeOptions {
  bool add_prefix_space = false;
  bool add_bos_token = false;
  bool clean_up_tokenization_spaces = true;
  bool spaces_between_special_tokens = true;
  // Replaces GPT2Tokenizer's (bos) A ((bos) B) (tokenizer.json's post_processor).
  std::optional<PostTemplate> post_template;
};

using BpeMerge = std::pair<std::string, std::string>;

// transformers 4.33 GPT2Tokenizer (slow). `vocab` maps byte-level token strings to ids; `merges`
// are in rank order (first = applied first).
class BpeTokenizer : public PipelineTokenizer {
 public:
  BpeTokenizer(const std::vector<std::pair<std::string, int64_t>>& vocab,
               const std::vector<BpeMerge>& merges, BpeOptions options,
               const SpecialTokenRoles& roles, const std::vector<AddedToken>& added,
               std::string source);

  std::string kind() const override { return "bpe"; }

  // The BPE pieces of one pre-tokenized word already mapped to byte-level characters.
  std::vector<std::string> bpe(const std::string& word) const;

 protected:
  std::string prepare_text(const std::string& text) const override;
  std::vector<int64_t> tokenize_text(const std::string& text) const override;
  std::optional<int64_t> model_token_to_id(const std::string& token) const override;
  std::string model_id_to_token(int64_t id) const override;
  int64_t model_vocab_size() const override { return static_cast<int64_t>(decoder_.size()); }
  std::string tokens_to_string(const std::vector<int64_t>& ids) const override;

 private:
  std::unordered_map<std::string, int64_t> encoder_;
  std::vector<std::optional<std::string>> decoder_;
  std::unordered_map<std::string, int64_t> ranks_;  // "first second" -> rank
  BpeOptions options_;
  std::string source_;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;
};

// vocab.json: {"token": id, ...}. InputError naming the file and the entry when malformed.
std::vector<std::pair<std::string, int64_t>> read_vocab_json(const std::string& path);
// merges.txt: an optional "#version" first line, then "first second" per line.
std::vector<BpeMerge> read_merges_txt(const std::string& path);

// GPT2Tokenizer's special-token roles (<|endoftext|> as bos, eos and unk; no pad).
SpecialTokenRoles gpt2_special_roles(const TokenizerConfig& config);

// A GPT2Tokenizer from `dir`/vocab.json and `dir`/merges.txt with the folder's configuration.
std::unique_ptr<BpeTokenizer> load_bpe(const std::string& dir, const TokenizerConfig& config);

}  // namespace emoe
