// Expert splits: exact balanced assignment, balanced k-means properties, baselines.
#include "emoe/moe/split.h"

#include <functional>
#include <set>

#include "emoe/core/error.h"
#include "emoe/models/loader.h"
#include "support/test_support.h"

namespace {

double assignment_cost(const torch::Tensor& cost, const std::vector<int64_t>& a) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += cost[i][a[i]].item<double>();
  return s;
}

// Exhaustive optimum over all assignments with every column used `cap` times.
double brute_force(const torch::Tensor& cost, int64_t cap) {
  const int64_t p = cost.size(0), k = cost.size(1);
  std::vector<int64_t> a(p), used(k, 0);
  double best = std::numeric_limits<double>::infinity();
  std::function<void(int64_t, double)> rec = [&](int64_t i, double acc) {
    if (acc >= best) return;
    if (i == p) {
      best = acc;
      return;
    }
    for (int64_t j = 0; j < k; ++j) {
      if (used[j] == cap) continue;
      used[j]++;
      rec(i + 1, acc + cost[i][j].item<double>());
      used[j]--;
    }
  };
  rec(0, 0.0);
  return best;
}

void expect_valid_split(const emoe::SplitResult& r, int64_t d_ff, int64_t n) {
  ASSERT_EQ(static_cast<int64_t>(r.assignment.size()), d_ff);
  for (auto s : r.cluster_sizes) EXPECT_EQ(s, d_ff / n);
  std::set<int64_t> seen(r.permutation.begin(), r.permutation.end());
  EXPECT_EQ(static_cast<int64_t>(seen.size()), d_ff);
  // expert e owns positions [e*s, (e+1)*s)
  for (int64_t pos = 0; pos < d_ff; ++pos)
    EXPECT_EQ(r.assignment[r.permutation[pos]], pos / (d_ff / n));
}

}  // namespace

TEST(BalancedAssignment, EqualsBruteForceOptimum) {
  torch::manual_seed(7);
  for (int trial = 0; trial < 20; ++trial) {
    int64_t k = 2 + trial % 3, cap = 1 + trial % 3;
    auto cost = torch::rand({k * cap, k}, torch::kDouble);
    auto a = emoe::balanced_assignment(cost, cap);
    std::vector<int64_t> counts(k, 0);
    for (auto x : a) counts.at(x)++;
    for (auto c : counts) EXPECT_EQ(c, cap);
    EXPECT_NEAR(assignment_cost(cost, a), brute_force(cost, cap), 1e-6) << "trial " << trial;
  }
}

TEST(BalancedKMeans, ExactSizesDeterministicAndBetterThanRandom) {
  torch::manual_seed(0);
  // three well separated directions, 12 points each, split into 3 experts
  auto base = torch::randn({3, 16});
  auto keys = base.repeat_interleave(12, 0) + 0.05 * torch::randn({36, 16});
  keys = keys.index_select(0, torch::randperm(36));
  emoe::KMeansOptions o;
  o.seed = 3;
  auto r = emoe::balanced_kmeans(keys, 3, o);
  expect_valid_split(r, 36, 3);
  auto r2 = emoe::balanced_kmeans(keys, 3, o);
  EXPECT_EQ(r.assignment, r2.assignment);
  EXPECT_EQ(r.inertia, r2.inertia);
  auto rnd = emoe::random_split(keys, 3, 3);
  expect_valid_split(rnd, 36, 3);
  EXPECT_LT(r.inertia, 0.1 * rnd.inertia);
  EXPECT_NEAR(r.inertia, emoe::split_inertia(keys, r.assignment, 3), 1e-9);
}

TEST(BalancedKMeans, Stories260KFfnsClusterMuchBetterThanRandom) {
  EMOE_REQUIRE_SHARED(dir, "models/stories260K/hf");
  auto model = emoe::load_model(dir);
  double km = 0, rnd = 0;
  for (auto* slot : model->ffn_slots()) {
    auto keys = slot->ffn_view().w_in;  // gate_proj rows, [172, 64]
    emoe::KMeansOptions o;
    auto r = emoe::balanced_kmeans(keys, 4, o);
    expect_valid_split(r, 172, 4);
    km += r.inertia;
    rnd += emoe::random_split(keys, 4, 0).inertia;
  }
  EXPECT_LT(km, 0.95 * rnd) << "k-means " << km << " random " << rnd;
}

TEST(Split, ContiguousAndErrors) {
  auto keys = torch::randn({12, 4});
  auto c = emoe::contiguous_split(keys, 4);
  expect_valid_split(c, 12, 4);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(c.permutation[i], i);
  try {
    emoe::balanced_kmeans(keys, 5, {});
    FAIL();
  } catch (const emoe::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("valid N: 1 2 3 4 6 12"), std::string::npos) << e.what();
  }
}

TEST(Split, CoactivationIsBalancedAndGroupsCofiringNeurons) {
  torch::manual_seed(1);
  // 4 groups of 6 neurons; neurons of a group fire together
  auto group_on = torch::rand({400, 4}) < 0.3;
  auto active = group_on.repeat_interleave(6, 1);
  active = torch::logical_and(active, torch::rand({400, 24}) < 0.9);
  auto keys = torch::randn({24, 8});
  auto r = emoe::coactivation_split(active, keys, 4, 0, 8);
  expect_valid_split(r, 24, 4);
  int64_t agree = 0;
  for (int64_t i = 0; i < 24; ++i)
    for (int64_t j = 0; j < 24; ++j)
      if (i / 6 == j / 6) agree += r.assignment[i] == r.assignment[j];
  EXPECT_EQ(agree, 4 * 36) << "each planted group should be one expert";
}
