// Special and added tokens written inside a text: found and split out as HF's slow tokenize() does.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace emoe {

// One token that is never split (a special token such as "[CLS]", or a user-added token).
struct AddedToken {
  std::string content;
  int64_t id = -1;
  bool special = true;
  // HF's AddedToken flags. A token given as a plain string (not an AddedToken) is instead
  // stripped on both sides, which `plain_string` records.
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool plain_string = false;
};

// A piece of the input: either plain text for the model, or one added token's id.
struct TextSegment {
  std::string text;
  int64_t id = -1;  // >= 0 for an added token
};

// transformers 4.33 PreTrainedTokenizer.tokenize(): optional lower-casing of everything but the
// added tokens (tokenizers with do_lower_case), the added-token trie split (leftmost, longest),
// then the whitespace stripping around each token as its flags say.
class AddedTokenSplitter {
 public:
  AddedTokenSplitter() = default;
  AddedTokenSplitter(std::vector<AddedToken> tokens, bool lowercase_outside_tokens);

  std::vector<TextSegment> split(const std::string& text) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // Longest token matching at code point `pos` of `cps`, or -1.
  int match_at(const std::u32string& cps, size_t pos) const;
  std::string lowercase_outside(const std::string& text) const;

  std::vector<AddedToken> tokens_;
  std::vector<std::u32string> token_cps_;
  bool lowercase_ = false;
};

}  // namespace emoe
