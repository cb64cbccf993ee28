// Training a WordPiece vocabulary (BERT vocab.txt) on a text corpus: special tokens, every
// character seen (alone and as a "##" continuation), then the most frequent words.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace emoe {

struct WordPieceTrainerOptions {
  int64_t vocab_size = 8000;
  int64_t min_frequency = 2;  // words seen fewer times are spelled with characters
  bool lower_case = true;
};

// Vocabulary in id order: [PAD] [UNK] [CLS] [SEP] [MASK], characters, ##characters, words.
std::vector<std::string> train_wordpiece_vocab(const std::vector<std::string>& texts,
                                               const WordPieceTrainerOptions& options);

}  // namespace emoe
