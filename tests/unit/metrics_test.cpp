// Metrics against values computed by hand (and matching scikit-learn / SciPy on the same input).
#include "emoe/eval/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "emoe/core/error.h"
#include "emoe/data/dataset.h"

namespace {

using Values = std::vector<double>;

TEST(Metrics, Accuracy) {
  EXPECT_DOUBLE_EQ(emoe::accuracy({1, 0, 1, 1}, {1, 1, 1, 0}), 0.5);
  EXPECT_DOUBLE_EQ(emoe::accuracy({2, 0, 1}, {2, 0, 1}), 1.0);
  EXPECT_DOUBLE_EQ(emoe::accuracy({0}, {1}), 0.0);
}

TEST(Metrics, F1OfThePositiveClass) {
  // tp = 2 (items 0, 4), fp = 1 (item 1), fn = 1 (item 2): P = R = 2/3, F1 = 2/3.
  EXPECT_NEAR(emoe::f1_binary({1, 1, 0, 0, 1}, {1, 0, 1, 0, 1}), 2.0 / 3.0, 1e-12);
  // tp = 1, fp = 0, fn = 2: P = 1, R = 1/3, F1 = 2 * (1/3) / (4/3) = 0.5.
  EXPECT_NEAR(emoe::f1_binary({1, 0, 0}, {1, 1, 1}), 0.5, 1e-12);
  // Only label 1 is positive: class 2 counts as negative on both sides.
  EXPECT_NEAR(emoe::f1_binary({2, 1, 1}, {1, 1, 2}), 0.5, 1e-12);
}

TEST(Metrics, F1WithNoPositivesIsZero) {
  EXPECT_EQ(emoe::f1_binary({0, 0, 0}, {0, 0, 0}), 0.0);  // none predicted, none in gold
  EXPECT_EQ(emoe::f1_binary({0, 0}, {1, 0}), 0.0);        // positives missed
  EXPECT_EQ(emoe::f1_binary({1, 1}, {0, 0}), 0.0);        // only false positives
}

TEST(Metrics, MatthewsBinary) {
  // tp = 2, fp = 1, tn = 2, fn = 1: (2*2 - 1*1) / sqrt(3*3*3*3) = 3/9.
  EXPECT_NEAR(emoe::matthews_corrcoef({1, 1, 0, 0, 1, 0}, {1, 0, 0, 0, 1, 1}), 1.0 / 3.0, 1e-12);
  EXPECT_NEAR(emoe::matthews_corrcoef({0, 1, 0, 1}, {0, 1, 0, 1}), 1.0, 1e-12);
  EXPECT_NEAR(emoe::matthews_corrcoef({1, 0, 1, 0}, {0, 1, 0, 1}), -1.0, 1e-12);
  // scikit-learn's documented example (labels -1/+1): -1/3.
  EXPECT_NEAR(emoe::matthews_corrcoef({1, -1, 1, 1}, {1, 1, 1, -1}), -1.0 / 3.0, 1e-12);
}

TEST(Metrics, MatthewsDegenerateIsZero) {
  // One class predicted for everything: the denominator vanishes, MCC is 0 (as scikit-learn).
  EXPECT_EQ(emoe::matthews_corrcoef({1, 1, 1, 1}, {1, 0, 1, 0}), 0.0);
  EXPECT_EQ(emoe::matthews_corrcoef({0, 1, 0, 1}, {1, 1, 1, 1}), 0.0);
}

TEST(Metrics, MatthewsMultiClass) {
  // Gorodkin's R_K: s = 6, c = 3 correct; pred counts (2, 2, 2), gold counts (2, 2, 2):
  // (3*6 - 12) / sqrt((36 - 12) * (36 - 12)) = 6 / 24 = 0.25.
  EXPECT_NEAR(emoe::matthews_corrcoef({0, 1, 2, 0, 2, 1}, {0, 1, 2, 1, 0, 2}), 0.25, 1e-12);
}

TEST(Metrics, Pearson) {
  // dx = -2..2, dy = (-2, 0, 1, 0, 1): sxy = 6, sxx = 10, syy = 6 -> 6 / sqrt(60).
  Values x = {1, 2, 3, 4, 5}, y = {2, 4, 5, 4, 5};
  EXPECT_NEAR(emoe::pearson(x, y), 6.0 / std::sqrt(60.0), 1e-12);
  EXPECT_NEAR(emoe::pearson(x, {10, 8, 6, 4, 2}), -1.0, 1e-12);
  EXPECT_EQ(emoe::pearson(x, {3, 3, 3, 3, 3}), 0.0);  // constant: no correlation, not NaN
}

TEST(Metrics, SpearmanAveragesTiedRanks) {
  // Ranks of y = (2, 4, 5, 4, 5) with ties averaged: (1, 2.5, 4.5, 2.5, 4.5); against x's ranks
  // 1..5: sxy = 7, sxx = 10, syy = 9 -> 7 / sqrt(90) = 0.7378647873726218 (scipy.stats.spearmanr).
  Values x = {1, 2, 3, 4, 5}, y = {2, 4, 5, 4, 5};
  EXPECT_NEAR(emoe::spearman(x, y), 0.7378647873726218, 1e-12);
  // Without ties it is the Pearson of the ranks: any monotone map gives 1.
  EXPECT_NEAR(emoe::spearman({0.1, 5, 2, 7}, {1, 500, 20, 7000}), 1.0, 1e-12);
  // Ties on both sides, given in shuffled order.
  Values a = {3, 1, 3, 2}, b = {1, 0, 1, 1};
  // ranks a: (3.5, 1, 3.5, 2), ranks b: (3, 1, 3, 3); centred: (1, -1.5, 1, -0.5), (0.5, -1.5,
  // 0.5, 0.5): sxy = 0.5 + 2.25 + 0.5 - 0.25 = 3, sxx = 4.5, syy = 3 -> 3 / sqrt(13.5).
  EXPECT_NEAR(emoe::spearman(a, b), 3.0 / std::sqrt(13.5), 1e-12);
}

TEST(Metrics, ComputeMetricsInPercent) {
  auto m = emoe::compute_metrics({"accuracy", "f1", "mcc"}, {1, 1, 0, 0, 1, 0}, {1, 0, 0, 0, 1, 1},
                                 false);
  ASSERT_EQ(m.size(), 4u);  // the three and their mean
  EXPECT_NEAR(m["accuracy"], 100.0 * 4 / 6, 1e-9);
  EXPECT_NEAR(m["f1"], 100.0 * 2 / 3, 1e-9);
  EXPECT_NEAR(m["mcc"], 100.0 / 3, 1e-9);
  auto r = emoe::compute_metrics({"pearson", "spearman"}, {1, 2, 3, 4, 5}, {2, 4, 5, 4, 5}, true);
  EXPECT_NEAR(r["pearson"], 100 * 6.0 / std::sqrt(60.0), 1e-9);
  EXPECT_NEAR(r["spearman"], 73.78647873726218, 1e-9);
}

TEST(Metrics, SeveralMetricsAddTheirMeanAsTheAuthorsSelect) {
  // MRPC-like: accuracy 4/6, F1 2/3 -> mean 2/3; one metric alone gets no mean
  auto m = emoe::compute_metrics({"accuracy", "f1"}, {1, 1, 0, 0, 1, 0}, {1, 0, 0, 0, 1, 1}, false);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_NEAR(m[emoe::kMeanMetric], (m["accuracy"] + m["f1"]) / 2, 1e-12);
  EXPECT_NEAR(m["mean"], 100.0 * 2 / 3, 1e-9);
  EXPECT_EQ(emoe::compute_metrics({"mcc"}, {1, 0}, {1, 0}, false).count("mean"), 0u);
  // STS-B-like: the mean of Pearson and Spearman
  auto r = emoe::compute_metrics({"pearson", "spearman"}, {1, 2, 3, 4, 5}, {2, 4, 5, 4, 5}, true);
  EXPECT_NEAR(r["mean"], (100 * 6.0 / std::sqrt(60.0) + 73.78647873726218) / 2, 1e-9);
  // the GLUE registry selects these tasks by that mean and still lists every metric
  for (const char* t : {"mrpc", "qqp", "stsb"}) {
    SCOPED_TRACE(t);
    EXPECT_EQ(emoe::glue_task(t).main_metric, emoe::kMeanMetric);
    EXPECT_EQ(emoe::glue_task(t).metrics.size(), 2u);
  }
  EXPECT_EQ(emoe::glue_task("cola").main_metric, "mcc");
  EXPECT_EQ(emoe::glue_task("sst2").main_metric, "accuracy");
}

TEST(Metrics, TableStdIsThePopulationStd) {
  // numpy: np.std([1, 2, 3, 4]) = sqrt(1.25); the sample std would be sqrt(5/3)
  auto s = emoe::mean_population_std({1, 2, 3, 4});
  EXPECT_EQ(s.n, 4);
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_NEAR(s.std, std::sqrt(1.25), 1e-12);
  EXPECT_DOUBLE_EQ(emoe::mean_population_std({7}).std, 0.0);
  EXPECT_EQ(emoe::mean_population_std({}).n, 0);
  // three seeds as the tables: 80, 82, 84 -> sqrt(8/3) = 1.633, not 2
  EXPECT_NEAR(emoe::mean_population_std({80, 82, 84}).std, std::sqrt(8.0 / 3.0), 1e-12);
}

TEST(Metrics, BadInputsAreUsageErrors) {
  EXPECT_THROW(emoe::accuracy({1, 0}, {1}), emoe::UsageError);
  EXPECT_THROW(emoe::pearson({}, {}), emoe::UsageError);
  EXPECT_THROW(emoe::compute_metrics({"bleu"}, {1}, {1}, false), emoe::UsageError);
  EXPECT_THROW(emoe::compute_metrics({"accuracy"}, {0.5}, {0.4}, true), emoe::UsageError);
  try {
    emoe::compute_metrics({"rouge"}, {1}, {1}, false);
    ADD_FAILURE() << "expected a UsageError for an unknown metric";
  } catch (const emoe::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("rouge"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("spearman"), std::string::npos);
  }
}

}  // namespace
