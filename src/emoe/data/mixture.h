// Multi-task mixtures (Raffel et al. 2020, §3.5.2): mixing rates per task and a deterministic,
// shuffled list of (task, example, template) draws per epoch, the same for every run with a seed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace emoe {

// "examples-proportional": rate_t ∝ min(n_t, cap); "temperature": rate_t ∝ min(n_t, cap)^(1/T).
// cap <= 0 means no cap. InputError for an unknown scheme or a non-positive temperature.
std::vector<double> mixing_rates(const std::vector<int64_t>& sizes, const std::string& scheme,
                                 int64_t cap, double temperature);

struct MixtureDraw {
  int64_t task = 0, example = 0, templ = 0;
};

// The examples of one epoch: epoch_size draws, task t's share rounded from rate_t * epoch_size
// (largest remainders), its examples taken in a seeded permutation (repeated when the share
// exceeds the task's size), each with a template drawn uniformly from templates[t]; the whole
// list shuffled. Depends only on the arguments.
std::vector<MixtureDraw> mixture_epoch(const std::vector<int64_t>& sizes, const std::vector<double>& rates,
                                       const std::vector<int64_t>& templates, int64_t epoch_size,
                                       uint64_t seed, int64_t epoch);

// Σ min(n_t, cap) (Σ n_t without a cap): the examples of one mixture epoch.
int64_t mixture_epoch_size(const std::vector<int64_t>& sizes, int64_t cap);

}  // namespace emoe
