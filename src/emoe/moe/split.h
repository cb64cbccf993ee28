// Splitting an FFN's neurons into N equal experts: balanced k-means, random, contiguous,
// co-activation.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace emoe {

struct SplitResult {
  std::string method;
  int64_t experts = 0;
  std::vector<int64_t> assignment;  // original neuron -> expert
  // position -> original neuron: expert e owns positions [e*s, (e+1)*s), members in original order.
  std::vector<int64_t> permutation;
  std::vector<int64_t> cluster_sizes;
  double inertia = 0;  // sum of squared distances of the L2-normalised keys to their expert's mean
  double random_inertia = 0;  // the same for a random split (the reference it should beat)
  double seconds = 0;
  int64_t iterations = 0;  // balanced k-means: iterations of the best restart
  int64_t restarts = 0;
  std::vector<int64_t> allowed;  // experts left after pruning (empty: all)
};

struct KMeansOptions {
  int64_t restarts = 10;
  int64_t max_iter = 1000;
  double tol = 1e-4;  // relative to the mean per-dimension variance, as scikit-learn
  uint64_t seed = 0;
};

// Throws InputError "<what>: d_ff D is not divisible by N experts; valid N: ..." when needed.
void check_expert_count(int64_t d_ff, int64_t experts, const std::string& what);

// Balanced k-means on the L2-normalised rows of keys [d_ff, d]: every cluster has exactly
// d_ff/N members; the assignment step is an exact min-cost flow (LEMON network simplex),
// k-means++ initialisation, best restart by inertia. Deterministic for a seed.
SplitResult balanced_kmeans(const at::Tensor& keys, int64_t experts, const KMeansOptions& options);

// The exact balanced assignment: minimises sum cost[i, assign[i]] with every column used
// exactly `capacity` times. cost: [P, N] with P = N * capacity.
std::vector<int64_t> balanced_assignment(const at::Tensor& cost, int64_t capacity);

SplitResult random_split(const at::Tensor& keys, int64_t experts, uint64_t seed);
SplitResult contiguous_split(const at::Tensor& keys, int64_t experts);

// MoEfication / LLaMA-MoE co-activation split: `active` [tokens, d_ff] (nonzero = active).
// Edge weight of (i, j) = tokens where both fire; the graph (each neuron's strongest
// `neighbours` edges) is cut into N parts by METIS, then rebalanced to exactly d_ff/N.
SplitResult coactivation_split(const at::Tensor& active, const at::Tensor& keys, int64_t experts,
                               uint64_t seed, int64_t neighbours = 64);

// Builds permutation/cluster sizes/inertia from an assignment (keys used for the inertia).
SplitResult split_from_assignment(const std::vector<int64_t>& assignment, int64_t experts,
                                  const at::Tensor& keys, const std::string& method);
double split_inertia(const at::Tensor& keys, const std::vector<int64_t>& assignment,
                     int64_t experts);

}  // namespace emoe
