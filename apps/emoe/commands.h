// Subcommand registration for the emoe tool; each subcommand lives in its own file.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace emoe::cli {

// --threads, --device, --dtype: on every command that runs a model.
struct RunFlags {
  int threads = 0;
  std::string device = "cpu";
  std::string dtype = "float32";
};
void add_run_flags(CLI::App* cmd, RunFlags& flags);
// --threads/--device/--dtype of the commands that read a run config (train, sweep): when given,
// they become the run config's `threads`, `device` and `dtype` (as --set would).
struct RunConfigFlags {
  int threads = -1;
  std::string device, dtype;
  void add_to(CLI::App* cmd);
  void append_sets(std::vector<std::string>& sets) const;
};
// Applies --threads and parses --device/--dtype (UsageError on bad values).
struct RunSettings {
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType dtype = c10::kFloat;
  int threads = 1;
};
RunSettings apply_run_flags(const RunFlags& flags);

// The floating dtype a model folder stores its weights in (its first floating tensor's; float32
// when it has none): convert and export write their output in it, so bfloat16 stays bfloat16.
c10::ScalarType stored_float_dtype(const std::string& model_dir);
// A multi-valued flag: every one takes commas and repeated values alike (`--ood imdb,yelp`,
// `--ood imdb yelp` and `--ood imdb --ood yelp` give the same list), and says so in --help.
template <typename T>
CLI::Option* add_list_option(CLI::App* cmd, const std::string& name, std::vector<T>& values,
                             const std::string& help) {
  return cmd->add_option(name, values, help + " (a list: a,b or a b)")->delimiter(',');
}
// For unsigned options such as --seed: CLI11 would wrap -1 around to 2^64 - 1.
CLI::Validator non_negative_integer();

void register_info(CLI::App& app);
void register_generate(CLI::App& app);
void register_forward(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_convert(CLI::App& app);
void register_export(CLI::App& app);
void register_train(CLI::App& app);
void register_eval(CLI::App& app);
void register_sweep(CLI::App& app);
void register_analyze(CLI::App& app);
void register_prune(CLI::App& app);
void register_bench(CLI::App& app);
void register_pretrain(CLI::App& app);
void register_demo(CLI::App& app);

}  // namespace emoe::cli
