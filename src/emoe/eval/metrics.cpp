// Task metrics as scikit-learn / SciPy compute them for GLUE (accuracy, F1, MCC, correlations).
#include "emoe/eval/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

#include "emoe/core/error.h"

namespace emoe {

namespace {

template <typename T>
void metrics_check_sizes(const char* what, const std::vector<T>& a, const std::vector<T>& b) {
  EMOE_CHECK(a.size() == b.size(), UsageError, "{}: {} predictions for {} gold labels", what,
             a.size(), b.size());
  EMOE_CHECK(!a.empty(), UsageError, "{}: no predictions", what);
}

// 1-based ranks; tied values share the mean of the ranks they span (SciPy's "average").
std::vector<double> metrics_average_ranks(const std::vector<double>& x) {
  std::vector<size_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
  std::vector<double> rank(x.size());
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && x[idx[j + 1]] == x[idx[i]]) ++j;
    const double r = (static_cast<double>(i) + static_cast<double>(j)) / 2.0 + 1.0;
    for (size_t k = i; k <= j; ++k) rank[idx[k]] = r;
    i = j + 1;
  }
  return rank;
}

std::vector<int64_t> metrics_to_ids(const std::vector<double>& v) {
  std::vector<int64_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<int64_t>(std::llround(v[i]));
  return out;
}

}  // namespace

double accuracy(const std::vector<int64_t>& pred, const std::vector<int64_t>& gold) {
  metrics_check_sizes("accuracy", pred, gold);
  size_t right = 0;
  for (size_t i = 0; i < pred.size(); ++i) right += pred[i] == gold[i];
  return static_cast<double>(right) / static_cast<double>(pred.size());
}

double f1_binary(const std::vector<int64_t>& pred, const std::vector<int64_t>& gold) {
  metrics_check_sizes("f1", pred, gold);
  double tp = 0, fp = 0, fn = 0;
  for (size_t i = 0; i < pred.size(); ++i) {
    const bool p = pred[i] == 1, g = gold[i] == 1;
    tp += p && g;
    fp += p && !g;
    fn += !p && g;
  }
  // No positive predicted and none in the gold: precision and recall are 0/0, and scikit-learn
  // scores F1 as 0 (zero_division's default), as here.
  if (tp == 0) return 0.0;
  const double precision = tp / (tp + fp), recall = tp / (tp + fn);
  return 2 * precision * recall / (precision + recall);
}

double matthews_corrcoef(const std::vector<int64_t>& pred, const std::vector<int64_t>& gold) {
  metrics_check_sizes("mcc", pred, gold);
  // The multi-class form (Gorodkin 2004) that scikit-learn uses; it equals the binary formula.
  std::vector<int64_t> classes(pred);
  classes.insert(classes.end(), gold.begin(), gold.end());
  std::sort(classes.begin(), classes.end());
  classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
  auto at = [&](int64_t c) {
    return std::lower_bound(classes.begin(), classes.end(), c) - classes.begin();
  };
  std::vector<double> pred_count(classes.size()), gold_count(classes.size());
  double correct = 0;
  for (size_t i = 0; i < pred.size(); ++i) {
    pred_count[at(pred[i])] += 1;
    gold_count[at(gold[i])] += 1;
    correct += pred[i] == gold[i];
  }
  const double s = static_cast<double>(pred.size());
  double pt = 0, pp = 0, tt = 0;
  for (size_t k = 0; k < classes.size(); ++k) {
    pt += pred_count[k] * gold_count[k];
    pp += pred_count[k] * pred_count[k];
    tt += gold_count[k] * gold_count[k];
  }
  const double denom = std::sqrt(s * s - pp) * std::sqrt(s * s - tt);
  // One class predicted (or present) for everything: no correlation to measure, 0 as sklearn.
  if (denom == 0) return 0.0;
  return (correct * s - pt) / denom;
}

double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  metrics_check_sizes("pearson", x, y);
  const double n = static_cast<double>(x.size());
  const double mx = std::accumulate(x.begin(), x.end(), 0.0) / n;
  const double my = std::accumulate(y.begin(), y.end(), 0.0) / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double dx = x[i] - mx, dy = y[i] - my;
    sxy += dx * dy;
    sxx += dx * dx;
    syy += dy * dy;
  }
  // A constant input correlates with nothing: 0 where SciPy gives NaN, so that choosing the best
  // epoch by this metric still works.
  if (sxx == 0 || syy == 0) return 0.0;
  return std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0);
}

double spearman(const std::vector<double>& x, const std::vector<double>& y) {
  metrics_check_sizes("spearman", x, y);
  return pearson(metrics_average_ranks(x), metrics_average_ranks(y));
}

std::map<std::string, double> compute_metrics(const std::vector<std::string>& names,
                                              const std::vector<double>& pred,
                                              const std::vector<double>& gold, bool regression) {
  std::map<std::string, double> out;
  for (const auto& name : names) {
    double v = 0;
    if (name == "pearson") {
      v = pearson(pred, gold);
    } else if (name == "spearman") {
      v = spearman(pred, gold);
    } else if (name == "accuracy" || name == "f1" || name == "mcc") {
      EMOE_CHECK(!regression, UsageError,
                 "metric '{}' needs class predictions, but the task is a regression", name);
      auto p = metrics_to_ids(pred), g = metrics_to_ids(gold);
      v = name == "accuracy" ? accuracy(p, g)
          : name == "f1"     ? f1_binary(p, g)
                             : matthews_corrcoef(p, g);
    } else {
      EMOE_THROW(UsageError, "unknown metric '{}' (metrics: accuracy, f1, mcc, pearson, spearman)",
                 name);
    }
    out[name] = 100.0 * v;
  }
  if (names.size() > 1) {
    double sum = 0;
    for (const auto& name : names) sum += out[name];
    out[kMeanMetric] = sum / static_cast<double>(names.size());
  }
  return out;
}

MeanStd mean_population_std(const std::vector<double>& values) {
  MeanStd s;
  s.n = static_cast<int64_t>(values.size());
  if (values.empty()) return s;
  for (double x : values) s.mean += x;
  s.mean /= static_cast<double>(values.size());
  double ss = 0;
  for (double x : values) ss += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(ss / static_cast<double>(values.size()));
  return s;
}

}  // namespace emoe
