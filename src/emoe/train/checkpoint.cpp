// Atomic, complete training checkpoints.
#include "emoe/train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include "emoe/core/error.h"
#include "emoe/io/atomic_file.h"
#include "emoe/io/safetensors.h"
#include "emoe/moe/kernel_choices.h"

namespace emoe {
namespace fs = std::filesystem;

nlohmann::json TrainState::to_json() const {
  return {
      {"step", step},
      {"epoch", epoch},
      {"batch_in_epoch", batch_in_epoch},
      {"best_metric", std::isfinite(best_metric) ? nlohmann::json(best_metric) : nlohmann::json()},
      {"best_epoch", best_epoch},
      {"evals_without_gain", evals_without_gain},
      {"metrics_bytes", metrics_bytes},
      {"train_seconds", train_seconds},
      {"history", history},
      {"usage", usage},
      {"skipped_steps", skipped_steps}};
}

TrainState TrainState::from_json(const nlohmann::json& j, const std::string& where) {
  TrainState s;
  try {
    s.step = j.at("step").get<int64_t>();
    s.epoch = j.at("epoch").get<int64_t>();
    s.batch_in_epoch = j.at("batch_in_epoch").get<int64_t>();
    if (!j.at("best_metric").is_null()) s.best_metric = j.at("best_metric").get<double>();
    s.best_epoch = j.at("best_epoch").get<int64_t>();
    s.evals_without_gain = j.at("evals_without_gain").get<int64_t>();
    s.metrics_bytes = j.at("metrics_bytes").get<int64_t>();
    s.train_seconds = j.value("train_seconds", 0.0);
    s.history = j.at("history");
    s.usage = j.value("usage", nlohmann::json());
    s.skipped_steps = j.value("skipped_steps", int64_t{0});
  } catch (const nlohmann::json::exception& e) {
    EMOE_THROW(InputError, "{}: malformed training state: {}", where, e.what());
  }
  return s;
}

std::string latest_checkpoint(const std::string& run_dir) {
  auto pointer = fs::path(run_dir) / "checkpoints" / "latest";
  if (!fs::exists(pointer)) return "";
  std::ifstream in(pointer);
  std::string name;
  std::getline(in, name);
  // only "step-" and digits: a path (../../other/checkpoints/step-N) would resume another run
  const bool step_name = name.size() > 5 && name.compare(0, 5, "step-") == 0 &&
                         name.find_first_not_of("0123456789", 5) == std::string::npos;
  auto dir = fs::path(run_dir) / "checkpoints" / name;
  EMOE_CHECK(step_name && fs::is_directory(dir) && !fs::is_symlink(dir), InputError,
             "{}: points at '{}', which is not a step-N checkpoint folder of this run",
             pointer.string(), name);
  return dir.string();
}

std::string first_nonfinite_parameter(PretrainedModelImpl& model) {
  torch::NoGradGuard g;
  for (const auto& p : model.named_parameters())
    if (p.value().is_floating_point() && !torch::isfinite(p.value()).all().item<bool>())
      return p.key();
  return "";
}

void require_finite_weights(PretrainedModelImpl& model, const std::string& target) {
  const std::string bad = first_nonfinite_parameter(model);
  EMOE_CHECK(bad.empty(), RuntimeError,
             "{}: not written: the weights are not finite (NaN or infinity in '{}'); the training "
             "diverged (lower train.lr); the last checkpoint, if any, is intact",
             target, bad);
}

void save_checkpoint(const std::string& run_dir, PretrainedModelImpl& model, Optimizer& opt,
                     const TrainState& state) {
  auto root = fs::path(run_dir) / "checkpoints";
  auto name = fmt::format("step-{:08d}", state.step);
  auto dir = root / name;
  require_finite_weights(model, dir.string());
  std::error_code ec;
  fs::create_directories(dir, ec);
  EMOE_CHECK(!ec, RuntimeError, "{}: cannot create: {}", dir.string(), ec.message());
  try {
    std::vector<std::pair<std::string, torch::Tensor>> params;
    for (const auto& p : model.named_parameters()) params.emplace_back(p.key(), p.value());
    save_safetensors((dir / "model.safetensors").string(), params, {{"format", "emoe-checkpoint"}});
    {
      auto tmp = (dir / ".optimizer.pt.tmp").string();
      torch::save(opt.adamw(), tmp);
      fs::rename(tmp, dir / "optimizer.pt", ec);
      EMOE_CHECK(!ec, RuntimeError, "{}: rename failed: {}", (dir / "optimizer.pt").string(),
                 ec.message());
    }
    auto rng = at::detail::getDefaultCPUGenerator().get_state();
    save_safetensors((dir / "rng.safetensors").string(), {{"cpu", rng}});
    write_text_atomic((dir / "state.json").string(), state.to_json().dump(1) + "\n");
    // the kernels timed so far: a resumed run computes on the same ones (kernel_choices.h)
    write_text_atomic((dir / "kernels.json").string(), kernel_choices_json().dump(1) + "\n");
    // Only now does the checkpoint become the latest; a crash before this leaves the old one.
    write_text_atomic((root / "latest").string(), name + "\n");
  } catch (const std::exception& e) {
    // a full disk (or any write error): the half-written folder goes, the latest stays
    fs::remove_all(dir, ec);
    std::string why = e.what();
    if (auto nl = why.find('\n'); nl != std::string::npos) why.resize(nl);
    const auto prev = latest_checkpoint(run_dir);
    EMOE_THROW(RuntimeError, "{}: checkpoint not written ({}); {}", dir.string(), why,
               prev.empty() ? std::string("no earlier checkpoint exists")
                            : "the previous checkpoint " + fs::path(prev).filename().string() +
                                  " is intact");
  }
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && e.path().filename() != name) fs::remove_all(e.path(), ec);
}

bool load_checkpoint(const std::string& run_dir, PretrainedModelImpl& model, Optimizer& opt,
                     TrainState& state) {
  std::string dir = latest_checkpoint(run_dir);
  if (dir.empty()) return false;
  auto file = [&](const char* f) {
    auto p = (fs::path(dir) / f).string();
    EMOE_CHECK(fs::exists(p), InputError, "{}: missing (incomplete checkpoint)", p);
    return p;
  };
  {
    SafetensorsFile f(file("model.safetensors"));
    torch::NoGradGuard g;
    std::vector<std::string> problems;
    for (const auto& p : model.named_parameters()) {
      if (!f.contains(p.key())) {
        problems.push_back("missing " + p.key());
        continue;
      }
      auto t = f.load(p.key(), p.value().scalar_type(), p.value().device());
      if (t.sizes() != p.value().sizes()) {
        problems.push_back(p.key() + " has another shape");
        continue;
      }
      p.value().copy_(t);
    }
    EMOE_CHECK(problems.empty(), InputError,
               "{}: does not match this run's model ({}); was the config changed?",
               file("model.safetensors"), fmt::join(problems, ", "));
  }
  try {
    torch::load(opt.adamw(), file("optimizer.pt"));
  } catch (const c10::Error& e) {  // PyTorch's own reader: a truncated or foreign file
    std::string why = e.what_without_backtrace();
    if (auto nl = why.find('\n'); nl != std::string::npos) why.resize(nl);
    EMOE_THROW(InputError, "{}: not a readable optimiser state ({}); the checkpoint is damaged",
               file("optimizer.pt"), why);
  }
  auto rng = load_safetensors(file("rng.safetensors"));
  EMOE_CHECK(rng.count("cpu"), InputError,
             "{}: no 'cpu' generator state; the checkpoint is damaged", file("rng.safetensors"));
  at::Generator gen = at::detail::getDefaultCPUGenerator();  // a handle on the global generator
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng.at("cpu"));
  std::ifstream in(file("state.json"));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    EMOE_THROW(InputError, "{}: not valid JSON: {}", file("state.json"), e.what());
  }
  state = TrainState::from_json(j, file("state.json"));
  // absent in checkpoints written before 2026-12-06: every kernel is then timed afresh
  const auto kernels = (fs::path(dir) / "kernels.json").string();
  if (fs::exists(kernels)) pin_kernel_choices_file(kernels);
  return true;
}

}  // namespace emoe
