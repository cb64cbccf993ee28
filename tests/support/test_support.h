// Test helpers: locating ../shared (skip locally, fail under CI when absent), temp dirs, CLI runs.
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "emoe/models/loader.h"
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

// The "loss" of every "train" record in RUN/metrics.jsonl, in order (a half-written last line is
// skipped).
std::vector<double> train_losses(const std::string& run_dir);

// A seeded 2-layer BERT sequence classifier (hidden 16, d_ff 32, 2 labels) with N(0, 0.3) weights.
ModelPtr tiny_bert_classifier();

// The device the golden tests run their models on: EMOE_TEST_DEVICE (cpu, cuda, cuda:N; default
// cpu), so that one suite checks a CUDA build against the same fixtures (scripts/device_check.sh).
// A value that names no usable device is an error, not a silent fall back to the CPU.
torch::Device test_device();
// test_device()'s parsing of a value (nullptr or "": cpu); throws naming the variable.
torch::Device parse_test_device(const char* value);
// load_model with options.device set to test_device().
ModelPtr load_test_model(const std::string& dir, LoadOptions options = {});
// A fixture file's tensors on test_device().
std::map<std::string, torch::Tensor> load_fixture(const std::string& path);
// in's tensors moved to test_device().
ModelInputs on_test_device(ModelInputs in);

// Max |a - b| over elements (after broadcasting), as a double; a and b may be on different
// devices (both are compared on the CPU).
double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b);
// Max |a - b| over positions where mask (B,T) is nonzero; a and b are (B,T,...).
double max_abs_diff_masked(const torch::Tensor& a, const torch::Tensor& b,
                           const torch::Tensor& mask);

}  // namespace emoe::test

// Skips the test (or fails it under CI) when ../shared/<rel> is missing; else sets `var`.
#define EMOE_REQUIRE_SHARED(var, rel)                                                    \
  std::string var = ::emoe::test::shared_path(rel);                                      \
  if (var.empty()) {                                                                     \
    if (::emoe::test::under_ci()) {                                                      \
      FAIL() << "../shared/" << (rel) << " is missing, and CI=true requires it";         \
    } else {                                                                             \
      GTEST_SKIP() << "../shared/" << (rel) << " not found: test needs the shared data"; \
    }                                                                                    \
  }
