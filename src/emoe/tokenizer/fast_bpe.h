// Byte-level BPE as Hugging Face's Rust `tokenizers` computes it from a tokenizer.json (what
// PreTrainedTokenizerFast returns): Llama 3, Qwen2/Qwen3, RoBERTa and other files whose
// pre-tokenizer is a Split regex and/or ByteLevel, with ignore_merges and a Unicode normalizer.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "emoe/tokenizer/bpe.h"
#include "emoe/tokenizer/post_template.h"
#include "emoe/tokenizer/regex.h"
#include "emoe/tokenizer/tokenizer.h"

namespace emoe {

// tokenizer.json's added_tokens entry (the Rust library's AddedToken).
struct FastAddedToken {
  std::string content;
  int64_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;  // matched in the normalized text rather than the raw text
};

// The Rust AddedToken of a configured token; `normalized` as the Rust default (not special).
FastAddedToken to_fast_added_token(const AddedToken& a);

enum class FastNormalizer { kNone, kNfc, kNfd };

// Rust's SplitDelimiterBehavior.
enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One pre-tokenizer of a Sequence: a Split on a pattern, or ByteLevel (which must come last).
struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel };
  Kind kind = Kind::kSplit;
  std::shared_ptr<const Regex> regex;  // Split's pattern; ByteLevel's GPT-2 pattern if use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
};

struct FastBpeSpec {
  std::vector<std::pair<std::string, int64_t>> vocab;  // byte-level token strings
  std::vector<BpeMerge> merges;                        // rank order
  bool ignore_merges = false;
  std::vector<FastAddedToken> added;
  FastNormalizer normalizer = FastNormalizer::kNone;
  std::vector<PreTokenizerStep> pre_tokenizer;
  PostTemplate post;  // the post-processor
  // RobertaProcessing with the resolved cls/sep roles instead of `post` (vocab.json folders)
  bool roberta_template = false;
  // The tokenizer_config.json roles (bos_token, ...), resolved to ids by content.
  std::vector<std::pair<std::string, std::string>> roles;  // role name -> token content
  bool clean_up_tokenization_spaces = false;               // transformers' decode clean-up
  std::string source;                                      // the file, for messages
};

class FastBpeTokenizer : public Tokenizer {
 public:
  explicit FastBpeTokenizer(FastBpeSpec spec);

  std::string kind() const override { return "bpe"; }
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int64_t> token_to_id(const std::string& token) const override;
  std::string id_to_token(int64_t id) const override;
  const SpecialTokens& special() const override { return special_; }

  std::vector<int64_t> encode_plain(const std::string& text) const override;
  Encoding encode(const std::string& text, bool add_special_tokens = true,
                  int64_t max_length = 0) const override;
  Encoding encode_pair(const std::string& a, const std::string& b, bool add_special_tokens = true,
                       int64_t max_length = 0) const override;
  // The Rust library's decode (ByteLevel decoder), then transformers' clean-up when configured.
  std::string decode(const std::vector<int64_t>& ids,
                     bool skip_special_tokens = false) const override;

  // The byte-level token strings of `text` (Encoding.tokens), for tests and `emoe tokenize`.
  std::vector<std::string> tokens(const std::string& text) const;

 private:
  struct Piece {
    int64_t added_id = -1;  // >= 0: an added token
    std::string_view text;  // otherwise: raw UTF-8 bytes for the model
  };
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  // Leftmost-longest matches of the added tokens with `normalized` == `which` in `text`.
  void split_added(std::string_view text, bool which, std::vector<Piece>& out) const;
  // Normalizer + pre-tokenizer of one text segment; owned strings go to `storage`.
  void pre_tokenize(std::string_view segment, std::vector<Piece>& out,
                    std::vector<std::unique_ptr<std::string>>& storage) const;
  void split_step(const PreTokenizerStep& step, std::string_view text,
                  std::vector<std::string_view>& out) const;
  std::vector<Piece> pieces(const std::string& text,
                            std::vector<std::unique_ptr<std::string>>& storage) const;
  void bpe_word(std::string_view word, std::vector<int64_t>& out) const;
  void merge_symbols(std::vector<int32_t>& symbols) const;

  std::unordered_map<std::string, int64_t> vocab_;      // byte-level string -> id
  std::unordered_map<std::string, int32_t> raw_vocab_;  // raw bytes -> id (ignore_merges)
  std::vector<std::string> id_to_vocab_;
  std::vector<int32_t> byte_ids_;  // id of each byte's one-character token, or -1
  std::unordered_map<uint64_t, Merge> merges_;
  bool ignore_merges_ = false;
  std::vector<FastAddedToken> added_;
  std::unordered_map<std::string, size_t> added_by_content_;
  std::unordered_map<int64_t, size_t> added_by_id_;
  // Per first byte, the added tokens (indices into added_) that start with it, longest first.
  std::vector<std::vector<size_t>> added_by_first_byte_[2];
  bool has_added_[2] = {false, false};
  FastNormalizer normalizer_;
  std::vector<PreTokenizerStep> pre_;
  PostTemplate post_;
  SpecialTokens special_;
  bool clean_up_ = false;
  int64_t vocab_size_ = 0;
  std::string source_;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

class TokenizerConfig;
// RobertaTokenizer(Fast) from `dir`/vocab.json + merges.txt, as transformers converts it for the
// Rust library: ByteLevel (add_prefix_space from the config, default false), <mask> with lstrip,
// RobertaProcessing (<s> A </s> and <s> A </s></s> B </s>, type ids 0), the ByteLevel decoder.
std::unique_ptr<FastBpeTokenizer> load_roberta_bpe(const std::string& dir,
                                                   const TokenizerConfig& config);

// GPT-2's pre-tokenizer pattern, which ByteLevel applies when use_regex is true.
const std::string& gpt2_split_pattern();

}  // namespace emoe
