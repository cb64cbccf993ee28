// Mixing rates, the per-epoch draw list and the training pool of a multi-task mixture.
#include "emoe/data/mixture.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "emoe/core/error.h"
#include "emoe/core/logging.h"

namespace emoe {

namespace {

double mixture_capped(int64_t n, int64_t cap) {
  return static_cast<double>(cap > 0 ? std::min(n, cap) : n);
}

// A seed for (seed, epoch, stream): splitmix64 of the three, so streams do not overlap.
uint64_t mixture_seed(uint64_t seed, int64_t epoch, uint64_t stream) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch) * 0xBF58476D1CE4E5B9ULL +
               stream * 0x94D049BB133111EBULL + 0x2545F4914F6CDD1DULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<double> mixing_rates(const std::vector<int64_t>& sizes, const std::string& scheme,
                                 int64_t cap, double temperature) {
  EMOE_CHECK(scheme == "examples-proportional" || scheme == "temperature", InputError,
             "mixture.rate: expected examples-proportional or temperature, got '{}'", scheme);
  EMOE_CHECK(scheme != "temperature" || temperature > 0, InputError,
             "mixture.temperature: expected > 0, got {}", temperature);
  std::vector<double> w;
  for (auto n : sizes) {
    double x = mixture_capped(n, cap);
    w.push_back(scheme == "temperature" ? std::pow(x, 1.0 / temperature) : x);
  }
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  EMOE_CHECK(total > 0, InputError, "mixture: every task is empty");
  for (auto& x : w) x /= total;
  return w;
}

int64_t mixture_epoch_size(const std::vector<int64_t>& sizes, int64_t cap) {
  double s = 0;
  for (auto n : sizes) s += mixture_capped(n, cap);
  return static_cast<int64_t>(s);
}

std::vector<MixtureDraw> mixture_epoch(const std::vector<int64_t>& sizes,
                                       const std::vector<double>& rates,
                                       const std::vector<int64_t>& templates, int64_t epoch_size,
                                       uint64_t seed, int64_t epoch) {
  const size_t k = sizes.size();
  EMOE_CHECK(rates.size() == k && templates.size() == k, UsageError,
             "mixture_epoch: {} sizes, {} rates, {} template counts", k, rates.size(),
             templates.size());
  // task shares: floor of rate * size, the rest to the largest remainders (ties: lower task)
  std::vector<int64_t> count(k);
  std::vector<std::pair<double, size_t>> rem;
  int64_t given = 0;
  for (size_t t = 0; t < k; ++t) {
    const double exact = rates[t] * static_cast<double>(epoch_size);
    count[t] = sizes[t] > 0 ? static_cast<int64_t>(std::floor(exact)) : 0;
    given += count[t];
    if (sizes[t] > 0) rem.emplace_back(exact - std::floor(exact), t);
  }
  std::stable_sort(rem.begin(), rem.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < epoch_size && !rem.empty(); i = (i + 1) % rem.size(), ++given)
    count[rem[i].second] += 1;

  std::vector<MixtureDraw> out;
  out.reserve(static_cast<size_t>(epoch_size));
  for (size_t t = 0; t < k; ++t) {
    std::mt19937_64 rng(mixture_seed(seed, epoch, 1 + t));
    std::vector<int64_t> perm(static_cast<size_t>(sizes[t]));
    for (int64_t drawn = 0; drawn < count[t]; ++drawn) {
      const auto j = static_cast<size_t>(drawn % sizes[t]);
      if (j == 0) {  // a fresh permutation for each pass over the task
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
      }
      const int64_t tpl =
          templates[t] > 1 ? std::uniform_int_distribution<int64_t>(0, templates[t] - 1)(rng) : 0;
      out.push_back({static_cast<int64_t>(t), perm[j], tpl});
    }
  }
  std::mt19937_64 rng(mixture_seed(seed, epoch, 0));
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

TextToTextEncoder::TextToTextEncoder(const Tokenizer& tok, int64_t max_length,
                                     int64_t max_target_length, const std::string& model)
    : tok_(tok), max_length_(max_length), max_target_length_(max_target_length) {
  const auto eos = tok.special().eos;
  EMOE_CHECK(eos.has_value(), InputError,
             "{}: the tokenizer has no eos token (text-to-text targets end with it)", model);
  eos_ = *eos;
}

std::vector<int64_t> TextToTextEncoder::source(const PromptTemplate& t, const Example& e) const {
  return tok_.encode(fill_template(t, e), true, max_length_).ids;
}

std::vector<int64_t> TextToTextEncoder::target(const std::string& text) const {
  auto ids = tok_.encode_plain(text);
  if (static_cast<int64_t>(ids.size()) > max_target_length_ - 1) ids.resize(max_target_length_ - 1);
  ids.push_back(eos_);
  return ids;
}

EncodedExample TextToTextEncoder::labelled(const PromptTemplate& t, const Example& e) const {
  EncodedExample x;
  x.ids = source(t, e);
  x.target_ids = target(t.choices.at(static_cast<size_t>(std::llround(e.label))));
  return x;
}

Dataset load_labelled_glue(const std::string& task, const std::string& split,
                           const std::string& data_root, int64_t max_examples) {
  Dataset d = load_glue(task, split, data_root);
  d.examples.erase(std::remove_if(d.examples.begin(), d.examples.end(),
                                  [](const Example& e) { return !e.has_label; }),
                   d.examples.end());
  keep_fixed_subset(d.examples, max_examples);
  return d;
}

std::vector<int64_t> MixturePool::epoch_order(uint64_t seed, int64_t epoch) const {
  auto draws = mixture_epoch(sizes, rates, templates, epoch_size, seed, epoch);
  std::vector<int64_t> order;
  order.reserve(draws.size());
  for (const auto& d : draws)
    order.push_back(offsets[d.task] + d.example * templates[d.task] + d.templ);
  return order;
}

MixturePool build_mixture(const MixtureConfig& cfg, const TextToTextEncoder& encoder,
                          const std::string& data_root, int64_t max_train_examples) {
  MixturePool pool;
  for (const auto& task : cfg.tasks) {
    const auto& tpls = task_templates(task, "run config: mixture.tasks");
    auto train = load_labelled_glue(task, "train", data_root, max_train_examples);
    const int64_t k = cfg.templates == "all" ? static_cast<int64_t>(tpls.size()) : 1;
    pool.offsets.push_back(static_cast<int64_t>(pool.examples.size()));
    pool.sizes.push_back(static_cast<int64_t>(train.examples.size()));
    pool.templates.push_back(k);
    for (const auto& e : train.examples) {
      for (int64_t t = 0; t < k; ++t) {
        EncodedExample x = encoder.labelled(tpls[t], e);
        x.label = e.label;
        pool.examples.push_back(std::move(x));
      }
    }
  }
  pool.rates = mixing_rates(pool.sizes, cfg.rate, cfg.cap, cfg.temperature);
  pool.epoch_size = mixture_epoch_size(pool.sizes, cfg.cap);
  std::vector<std::string> shown;
  for (size_t t = 0; t < cfg.tasks.size(); ++t)
    shown.push_back(fmt::format("{} {:.4f} ({} examples x {} templates)", cfg.tasks[t],
                                pool.rates[t], pool.sizes[t], pool.templates[t]));
  spdlog::info("mixture ({}, cap {}{}): {}; {} draws per epoch", cfg.rate, cfg.cap,
               cfg.rate == "temperature" ? fmt::format(", T {}", cfg.temperature) : std::string(),
               fmt::join(shown, ", "), pool.epoch_size);
  EMOE_CHECK(pool.epoch_size > 0, InputError, "mixture: no training examples in {}",
             fmt::join(cfg.tasks, ", "));
  return pool;
}

}  // namespace emoe
