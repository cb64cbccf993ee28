// Synthetic two-domain review data.
#include "emoe/data/synthetic.h"

#include <filesystem>
#include <random>
#include <sstream>

#include "emoe/core/error.h"
#include "emoe/io/atomic_file.h"

namespace emoe {

namespace {

using Words = std::vector<std::string>;

struct Domain {
  Words subjects, own_positive, own_negative, openers_pos, openers_neg, extras;
};

const Words kPositive = {"great",     "wonderful", "delightful", "superb",
                         "excellent", "charming",  "brilliant",  "lovely",
                         "fantastic", "enjoyable", "impressive", "pleasant"};
const Words kNegative = {"terrible",      "awful",    "boring", "dreadful",
                         "disappointing", "mediocre", "poor",   "horrible",
                         "dull",          "annoying", "weak",   "unpleasant"};
const Words kIntensifiers = {"really", "truly", "quite", "very", "so", "rather", "pretty"};
const Words kVerbs = {"was", "is", "felt", "seemed", "looked"};

const Domain kFilms = {
    {"the film", "this movie", "the plot", "the acting", "the director", "the soundtrack",
     "the ending", "the cast", "the script", "the story", "the dialogue", "the camera work"},
    {"gripping", "moving", "hilarious", "touching", "riveting", "stunning"},
    {"predictable", "clumsy", "tedious", "forgettable", "confusing", "overlong"},
    {"i loved it", "a must see", "i would watch it again", "the audience cheered"},
    {"i walked out", "a waste of two hours", "i fell asleep", "the audience groaned"},
    {"it opened last week", "it runs two hours", "it was shot in winter", "the sequel is coming"}};

const Domain kRestaurants = {
    {"the food", "this place", "the service", "the waiter", "the pasta", "the dessert", "the menu",
     "the staff", "the atmosphere", "the wine", "the soup", "the kitchen"},
    {"delicious", "tasty", "fresh", "friendly", "cozy", "flavorful"},
    {"stale", "greasy", "rude", "bland", "overpriced", "cold"},
    {"i loved it", "we will come back", "highly recommended", "the guests smiled"},
    {"we left early", "never again", "i would avoid it", "the guests complained"},
    {"it opened last week", "it seats forty people", "they take reservations",
     "parking is nearby"}};

template <typename T>
const T& pick(const std::vector<T>& v, std::mt19937_64& rng) {
  return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
}

bool coin(std::mt19937_64& rng, double p) {
  return std::uniform_real_distribution<double>(0, 1)(rng) < p;
}

// "the plot was not really gripping" with its polarity (1 = positive).
std::pair<std::string, int64_t> clause(const Domain& d, std::mt19937_64& rng) {
  int64_t polarity = coin(rng, 0.5) ? 1 : 0;
  const bool own = coin(rng, 0.4);
  const std::string& adj = polarity ? (own ? pick(d.own_positive, rng) : pick(kPositive, rng))
                                    : (own ? pick(d.own_negative, rng) : pick(kNegative, rng));
  std::ostringstream s;
  s << pick(d.subjects, rng) << " " << pick(kVerbs, rng);
  const bool negated = coin(rng, 0.25);
  if (negated) s << " not";
  if (coin(rng, 0.4)) s << " " << pick(kIntensifiers, rng);
  s << " " << adj;
  return {s.str(), negated ? 1 - polarity : polarity};
}

SyntheticReview review(const Domain& d, std::mt19937_64& rng) {
  auto [first, label] = clause(d, rng);
  std::string text = first;
  const double kind = std::uniform_real_distribution<double>(0, 1)(rng);
  if (kind < 0.3) {
    // contrast: the clause after "but" decides
    auto [second, l2] = clause(d, rng);
    text += " but " + second;
    label = l2;
  } else if (kind < 0.5) {
    auto [second, l2] = clause(d, rng);
    if (l2 == label) text += " and " + second;
  } else if (kind < 0.7) {
    text += " , " + (label ? pick(d.openers_pos, rng) : pick(d.openers_neg, rng));
  } else if (kind < 0.8) {
    text = pick(d.extras, rng) + " ; " + text;
  }
  return {text + " .", label};
}

}  // namespace

SyntheticData make_synthetic_reviews(const SyntheticOptions& o) {
  std::mt19937_64 rng(o.seed * 7919 + 17);
  SyntheticData d;
  for (int64_t i = 0; i < o.corpus_sentences; ++i)
    d.corpus.push_back(review(coin(rng, 0.5) ? kFilms : kRestaurants, rng).text);
  auto labelled = [&](const Domain& dom, int64_t n, std::vector<SyntheticReview>& out) {
    for (int64_t i = 0; i < n; ++i) {
      auto r = review(dom, rng);
      if (coin(rng, o.label_noise)) r.label = 1 - r.label;
      out.push_back(r);
    }
  };
  labelled(kFilms, o.train, d.train);
  labelled(kFilms, o.dev, d.dev);
  labelled(kRestaurants, o.ood, d.ood);
  return d;
}

void write_synthetic_reviews(const SyntheticData& d, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  EMOE_CHECK(!ec, RuntimeError, "{}: cannot create: {}", dir, ec.message());
  std::ostringstream corpus;
  for (const auto& s : d.corpus) corpus << s << "\n";
  write_text_atomic(dir + "/corpus.txt", corpus.str());
  auto table = [&](const std::vector<SyntheticReview>& v, const std::string& name) {
    std::ostringstream t;
    t << "sentence\tlabel\n";
    for (const auto& r : v) t << r.text << "\t" << r.label << "\n";
    write_text_atomic(dir + "/" + name, t.str());
  };
  table(d.train, "train.tsv");
  table(d.dev, "dev.tsv");
  table(d.ood, "ood.tsv");
}

}  // namespace emoe
