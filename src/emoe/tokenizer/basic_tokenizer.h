// BERT's BasicTokenizer: clean text, split CJK, lower-case/strip accents, split on punctuation.
#pragma once
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace emoe {

struct BasicTokenizerOptions {
  bool do_lower_case = true;
  // HF's strip_accents: unset means "strip when lower-casing".
  std::optional<bool> strip_accents;
  bool tokenize_chinese_chars = true;
  std::set<std::string> never_split;
};

// transformers 4.33 BasicTokenizer.tokenize, code point for code point.
class BasicTokenizer {
 public:
  explicit BasicTokenizer(BasicTokenizerOptions options) : options_(std::move(options)) {}
  // `never_split` adds to the options' set (the slow tokenizer passes its special tokens).
  std::vector<std::u32string> tokenize(const std::string& text,
                                       const std::set<std::string>& never_split = {}) const;
  const BasicTokenizerOptions& options() const { return options_; }

 private:
  BasicTokenizerOptions options_;
};

// BERT's character classes (tokenization_bert.py _is_whitespace/_is_control/_is_punctuation).
bool bert_is_whitespace(char32_t cp);
bool bert_is_control(char32_t cp);
bool bert_is_punctuation(char32_t cp);
bool bert_is_chinese_char(char32_t cp);

}  // namespace emoe
