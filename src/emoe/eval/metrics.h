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

// Computes the named metrics ("accuracy", "f1", "mcc", "pearson", "spearman") from predictions:
// class ids for classification, values for regression. Values are in percent (x100), as the
// papers report them.
std::map<std::string, double> compute_metrics(const std::vector<std::string>& names,
                                              const std::vector<double>& pred,
                                              const std::vector<double>& gold, bool regression);

}  // namespace emoe
