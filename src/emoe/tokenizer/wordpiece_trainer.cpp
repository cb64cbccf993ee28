// WordPiece vocabulary training.
#include "emoe/tokenizer/wordpiece_trainer.h"

#include <algorithm>
#include <map>
#include <set>

#include "emoe/core/error.h"
#include "emoe/tokenizer/basic_tokenizer.h"
#include "emoe/tokenizer/unicode.h"

namespace emoe {

std::vector<std::string> train_wordpiece_vocab(const std::vector<std::string>& texts,
                                               const WordPieceTrainerOptions& o) {
  BasicTokenizerOptions bo;
  bo.do_lower_case = o.lower_case;
  BasicTokenizer basic(bo);
  std::map<std::string, int64_t> words;
  std::set<std::string> chars;
  for (const auto& t : texts)
    for (const auto& w : basic.tokenize(t)) {
      words[unicode::encode_utf8(w)] += 1;
      for (char32_t cp : w) chars.insert(unicode::encode_utf8(std::u32string(1, cp)));
    }
  std::vector<std::string> vocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  for (const auto& c : chars) vocab.push_back(c);
  for (const auto& c : chars) vocab.push_back("##" + c);
  EMOE_CHECK(static_cast<int64_t>(vocab.size()) <= o.vocab_size, UsageError,
             "vocab_size {} is smaller than the {} special tokens and characters of the corpus",
             o.vocab_size, vocab.size());
  std::vector<std::pair<std::string, int64_t>> by_count(words.begin(), words.end());
  std::stable_sort(by_count.begin(), by_count.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::set<std::string> have(vocab.begin(), vocab.end());
  for (const auto& [w, n] : by_count) {
    if (static_cast<int64_t>(vocab.size()) >= o.vocab_size || n < o.min_frequency) break;
    if (have.insert(w).second) vocab.push_back(w);
  }
  return vocab;
}

}  // namespace emoe
