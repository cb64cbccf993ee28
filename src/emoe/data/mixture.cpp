// Mixing rates and the per-epoch draw list of a multi-task mixture.
#include "emoe/data/mixture.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "emoe/core/error.h"

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

std::vector<MixtureDraw> mixture_epoch(const std::vector<int64_t>& sizes, const std::vector<double>& rates,
                                       const std::vector<int64_t>& templates, int64_t epoch_size,
                                       uint64_t seed, int64_t epoch) {
  const size_t k = sizes.size();
  EMOE_CHECK(rates.size() == k && templates.size() == k, UsageError,
             "mixture_epoch: {} sizes, {} rates, {} template counts", k, rates.size(), templates.size());
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
  std::stable_sort(rem.begin(), rem.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
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

}  // namespace emoe
