// Unicode regular expressions for pre-tokenizers, through PCRE2 (UTF + Unicode properties, JIT).
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace emoe {

// A compiled pattern with the semantics Hugging Face's tokenizers get from Oniguruma for the
// patterns tokenizer.json files use: UTF-8 subjects, \p{L}/\p{N} Unicode properties, \s as
// Unicode white space, (?i:...) with Unicode case folding, look-ahead. Thread-safe: matching
// allocates its own match data.
class Regex {
 public:
  // Throws InputError "`where`: cannot compile the regular expression ...: <PCRE2's message> at
  // offset N" when the pattern is invalid.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The byte spans [begin, end) of every non-overlapping match, left to right, as Rust's
  // find_iter: an empty match advances by one character. `text` must be valid UTF-8.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

}  // namespace emoe
