// Shared --threads/--device/--dtype handling, and the dtype a model folder stores.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>

#include "commands.h"
#include "emoe/core/runtime.h"
#include "emoe/io/safetensors.h"

namespace emoe::cli {

void add_run_flags(CLI::App* cmd, RunFlags& flags) {
  cmd->add_option("--threads", flags.threads, "Intra-op threads (default: one per core)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--device", flags.device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", flags.dtype, "Compute dtype: float32, bfloat16 or float16 (GPU)")
      ->capture_default_str();
}

void RunConfigFlags::add_to(CLI::App* cmd) {
  cmd->add_option("--threads", threads,
                  "Intra-op threads (same as --set threads=N; default: one per core)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--device", device, "cpu, cuda or cuda:N (same as --set device=...)");
  cmd->add_option("--dtype", dtype, "float32 or bfloat16 weights (same as --set dtype=...)");
}

void RunConfigFlags::append_sets(std::vector<std::string>& sets) const {
  if (threads >= 0) sets.push_back("threads=" + std::to_string(threads));
  if (!device.empty()) sets.push_back("device=" + device);
  if (!dtype.empty()) sets.push_back("dtype=" + dtype);
}

RunSettings apply_run_flags(const RunFlags& flags) {
  RunSettings s;
  s.dtype = parse_dtype(flags.dtype);
  s.device = parse_device(flags.device);
  s.threads = configure_threads(flags.threads);
  spdlog::debug("threads {}, device {}, dtype {}", s.threads, s.device.str(), dtype_name(s.dtype));
  return s;
}

c10::ScalarType stored_float_dtype(const std::string& model_dir) {
  CheckpointReader ckpt(model_dir);
  for (const auto& name : ckpt.names()) {
    const auto& d = ckpt.entry(name).dtype;
    if (d == "BF16") return c10::kBFloat16;
    if (d == "F16") return c10::kHalf;
    if (d == "F32" || d == "F64") return c10::kFloat;
  }
  return c10::kFloat;
}

CLI::Validator non_negative_integer() {
  return CLI::Validator(
      [](std::string& v) {
        const bool ok = !v.empty() && std::all_of(v.begin(), v.end(), [](unsigned char c) {
          return std::isdigit(c) != 0;
        });
        return ok ? std::string() : "expected a non-negative integer, got " + v;
      },
      "UINT");
}

}  // namespace emoe::cli
