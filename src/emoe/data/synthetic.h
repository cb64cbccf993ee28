// The demo's own data: a small synthetic review language with two domains (film reviews in
// domain, restaurant reviews out of domain), labelled by sentiment with negation and contrast,
// plus an unlabelled corpus of both domains for pretraining. Deterministic for a seed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace emoe {

struct SyntheticReview {
  std::string text;
  int64_t label = 0;  // 0 negative, 1 positive
};

struct SyntheticData {
  std::vector<std::string> corpus;          // unlabelled, both domains
  std::vector<SyntheticReview> train, dev;  // in domain (films)
  std::vector<SyntheticReview> ood;         // out of domain (restaurants)
};

struct SyntheticOptions {
  int64_t corpus_sentences = 30000;
  int64_t train = 4000, dev = 600, ood = 1000;
  double label_noise = 0.05;
  uint64_t seed = 0;
};

SyntheticData make_synthetic_reviews(const SyntheticOptions& o);

// Writes corpus.txt and train.tsv / dev.tsv / ood.tsv (columns sentence, label) into dir.
void write_synthetic_reviews(const SyntheticData& d, const std::string& dir);

}  // namespace emoe
