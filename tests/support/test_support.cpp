// Implementation of the test helpers.
#include "support/test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "emoe/core/runtime.h"
#include "emoe/io/hf_config.h"
#include "emoe/io/safetensors.h"
#include "emoe/models/loader.h"

namespace emoe::test {
namespace fs = std::filesystem;

std::string source_dir() {
  return EMOE_SOURCE_DIR;
}
std::string emoe_binary() {
  return EMOE_BINARY;
}

bool under_ci() {
  const char* ci = std::getenv("CI");
  return ci && (std::string(ci) == "true" || std::string(ci) == "1");
}

std::string shared_path(const std::string& rel) {
  fs::path base;
  if (const char* env = std::getenv("EMOE_SHARED"); env && *env)
    base = env;
  else
    base = fs::path(source_dir()) / ".." / "shared";
  fs::path p = base / rel;
  if (!fs::exists(p)) return "";
  return fs::canonical(p).string();
}

TempDir::TempDir() {
  std::random_device rd;
  auto base = fs::temp_directory_path();
  for (int i = 0; i < 100; ++i) {
    fs::path p = base / ("emoe_test_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    if (fs::create_directory(p)) {
      path_ = p.string();
      return;
    }
  }
  throw std::runtime_error("cannot create a temporary directory");
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

static std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CommandResult run_emoe(const std::string& args, const std::string& stdin_text) {
  TempDir tmp;
  std::string in = tmp.file("stdin"), out = tmp.file("stdout"), err = tmp.file("stderr");
  {
    std::ofstream f(in, std::ios::binary);
    f << stdin_text;
  }
  std::string cmd = "cd '" + source_dir() + "' && '" + emoe_binary() + "' " + args + " <'" + in +
                    "' >'" + out + "' 2>'" + err + "'";
  int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

torch::Device parse_test_device(const char* value) {
  const std::string text = value != nullptr && *value != '\0' ? value : "cpu";
  try {
    return parse_device(text);
  } catch (const std::exception& e) {
    throw std::runtime_error("EMOE_TEST_DEVICE=" + text + ": " + e.what());
  }
}

torch::Device test_device() {
  static const torch::Device device = parse_test_device(std::getenv("EMOE_TEST_DEVICE"));
  return device;
}

ModelPtr load_test_model(const std::string& dir, LoadOptions options) {
  options.device = test_device();
  return load_model(dir, options);
}

std::map<std::string, torch::Tensor> load_fixture(const std::string& path) {
  auto tensors = load_safetensors(path);
  for (auto& [name, t] : tensors) t = t.to(test_device());
  return tensors;
}

ModelInputs on_test_device(ModelInputs in) {
  for (auto* t :
       {&in.input_ids, &in.attention_mask, &in.token_type_ids, &in.position_ids, &in.labels,
        &in.decoder_input_ids, &in.decoder_attention_mask, &in.encoder_last_hidden_state})
    if (t->defined()) *t = t->to(test_device());
  return in;
}

namespace {
torch::Tensor cpu_double(const torch::Tensor& t) {
  return t.to(torch::kCPU, torch::kDouble);
}
}  // namespace

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (cpu_double(a) - cpu_double(b)).abs().max().item<double>();
}

double max_abs_diff_masked(const torch::Tensor& a, const torch::Tensor& b,
                           const torch::Tensor& mask) {
  auto m = mask.to(torch::kCPU, torch::kBool);
  auto d = (cpu_double(a) - cpu_double(b)).abs();
  auto sel = d.index({m});
  if (sel.numel() == 0) return 0.0;
  return sel.max().item<double>();
}

ModelPtr tiny_bert_classifier() {
  nlohmann::json j = {{"model_type", "bert"},         {"hidden_size", 16},
                      {"intermediate_size", 32},      {"num_hidden_layers", 2},
                      {"num_attention_heads", 2},     {"vocab_size", 50},
                      {"max_position_embeddings", 32}};
  torch::manual_seed(0);
  auto m = emoe::create_model(emoe::JsonFields(j, "config.json"),
                              emoe::Head::kSequenceClassification, 2);
  torch::NoGradGuard g;
  for (auto& p : m->parameters()) p.normal_(0, 0.3);
  return m;
}

std::vector<double> train_losses(const std::string& run_dir) {
  std::vector<double> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);  // a line still being written is skipped
    if (!j.is_discarded() && j["type"] == "train" && j["loss"].is_number())
      out.push_back(j["loss"].get<double>());
  }
  return out;
}

}  // namespace emoe::test
