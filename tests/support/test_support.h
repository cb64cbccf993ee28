// Test helpers: locating ../shared (skip locally, fail under CI when absent), temp dirs, CLI runs.
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "emoe/models/model.h"

namespace emoe::test {

// Tolerance against the Hugging Face reference outputs (fixtures/README.md advises 1e-4).
constexpr double kGoldenTol = 1e-4;

// Absolute path of ../shared/<rel>, or "" when it does not exist.
std::string shared_path(const std::string& rel);
// True when running under CI (CI=true in the environment).
bool under_ci();
// The repository root and the built `emoe` binary.
std::string source_dir();
std::string emoe_binary();

// A fresh temporary directory, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs `emoe <args>` through the shell (args are passed verbatim), capturing both streams.
CommandResult run_emoe(const std::string& args, const std::string& stdin_text = "");

// The "loss" of every "train" record in RUN/metrics.jsonl, in order (a half-written last line is skipped).
std::vector<double> train_losses(const std::string& run_dir);

// A seeded 2-layer BERT sequence classifier (hidden 16, d_ff 32, 2 labels) with N(0, 0.3) weights.
ModelPtr tiny_bert_classifier();

// Max |a - b| over elements (after broadcasting), as a double.
double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b);
// Max |a - b| over positions where mask (B,T) is nonzero; a and b are (B,T,...).
double max_abs_diff_masked(const torch::Tensor& a, const torch::Tensor& b,
                           const torch::Tensor& mask);

}  // namespace emoe::test

// Skips the test (or fails it under CI) when ../shared/<rel> is missing; else sets `var`.
#define EMOE_REQUIRE_SHARED(var, rel)                                                  \
  std::string var = ::emoe::test::shared_path(rel);                                    \
  if (var.empty()) {                                                                   \
    if (::emoe::test::under_ci()) {                                                    \
      FAIL() << "../shared/" << (rel) << " is missing, and CI=true requires it";       \
    } else {                                                                           \
      GTEST_SKIP() << "../shared/" << (rel) << " not found: test needs the shared data"; \
    }                                                                                  \
  }
