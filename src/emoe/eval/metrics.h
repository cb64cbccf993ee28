// Task metrics: accuracy, F1, Matthews correlation, Pearson and Spearman correlation.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace emoe {

double accuracy(const std::vector<int64_t>& pred, const std::vector<int64_t>& gold);
// Binary F1 of the positive class (label 1), as GLUE reports for MRPC/QQP.
double f1_binary(const std::vector<int64_t>& pred, const std::vector<int64_t>& gold);
double matthews_corrcoef(const std::vector<int64_t>& pred, const std::vector<int64_t>& gold);
double pearson(const std::vector<double>& x, const std::vector<double>& y);
// Spearman: Pearson of the ranks, ties given their average rank (as scipy).
double spearman(const std::vector<double>& x, const std::vector<double>& y);

// The mean of a task's metrics, which selects and reports a task that has several (MRPC and QQP:
// accuracy and F1; STS-B: Pearson and Spearman), as the EMoE authors' GLUE script does.
inline constexpr const char* kMeanMetric = "mean";

// Computes the named metrics ("accuracy", "f1", "mcc", "pearson", "spearman") from predictions:
// class ids for classification, values for regression. Values are in percent (x100), as the
// papers report them. With two or more names, "mean" (kMeanMetric) is their mean, added beside
// them.
std::map<std::string, double> compute_metrics(const std::vector<std::string>& names,
                                              const std::vector<double>& pred,
                                              const std::vector<double>& gold, bool regression);

// Mean and standard deviation over seeds as the papers' tables give them: the population std
// (divided by n, numpy's np.std default, which the authors' scripts call), 0 for one value.
struct MeanStd {
  double mean = 0, std = 0;
  int64_t n = 0;
};
MeanStd mean_population_std(const std::vector<double>& values);

}  // namespace emoe
