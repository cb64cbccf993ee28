// Peak memory of loading a big checkpoint in its own dtype (issue 24): writes a Llama-shaped
// bfloat16 checkpoint (about 1 B parameters by default) to a scratch folder, then loads it in a
// fresh process the way `--dtype bfloat16` does (load_any_model) and reports the peak resident set
// (VmHWM) as a ratio to the weights' bytes. Usage:
//   build/bench/bench_load [--dir /tmp/emoe-bench-load] [--hidden 2048] [--layers 16]
//                          [--intermediate 5632] [--vocab 32000] [--dtype bfloat16] [--keep]
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "emoe/core/error.h"
#include "emoe/core/runtime.h"
#include "emoe/methods/model_folder.h"

namespace fs = std::filesystem;

namespace {

struct Shape {
  int64_t hidden = 2048, layers = 16, intermediate = 5632, vocab = 32000, heads = 16;
};

// A /proc/self/status field in KiB (VmHWM: the peak resident set; VmRSS: the current one).
int64_t status_kib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::atoll(line.c_str() + field.size() + 1);
  return -1;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> llama_tensors(const Shape& s) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> t;
  t.push_back({"model.embed_tokens.weight", {s.vocab, s.hidden}});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"})
      t.push_back({p + "self_attn." + m + ".weight", {s.hidden, s.hidden}});
    t.push_back({p + "mlp.gate_proj.weight", {s.intermediate, s.hidden}});
    t.push_back({p + "mlp.up_proj.weight", {s.intermediate, s.hidden}});
    t.push_back({p + "mlp.down_proj.weight", {s.hidden, s.intermediate}});
    t.push_back({p + "input_layernorm.weight", {s.hidden}});
    t.push_back({p + "post_attention_layernorm.weight", {s.hidden}});
  }
  t.push_back({"model.norm.weight", {s.hidden}});
  t.push_back({"lm_head.weight", {s.vocab, s.hidden}});
  std::sort(t.begin(), t.end());
  return t;
}

// Streams the checkpoint tensor by tensor (the writer never holds the model): the header first,
// then N(0, 0.02) bfloat16 values (norm weights 1). Returns the weights' bytes.
uint64_t write_checkpoint(const std::string& dir, const Shape& s) {
  fs::create_directories(dir);
  nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}},
                        {"model_type", "llama"},
                        {"hidden_size", s.hidden},
                        {"intermediate_size", s.intermediate},
                        {"num_hidden_layers", s.layers},
                        {"num_attention_heads", s.heads},
                        {"num_key_value_heads", s.heads},
                        {"vocab_size", s.vocab},
                        {"max_position_embeddings", 2048},
                        {"hidden_act", "silu"},
                        {"rms_norm_eps", 1e-5},
                        {"rope_theta", 10000.0},
                        {"tie_word_embeddings", false},
                        {"bos_token_id", 1},
                        {"eos_token_id", 2},
                        {"torch_dtype", "bfloat16"}};
  std::ofstream(dir + "/config.json") << cfg.dump(2) << "\n";
  const auto tensors = llama_tensors(s);
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    uint64_t n = 2;
    for (auto d : shape) n *= static_cast<uint64_t>(d);
    header[name] = {{"dtype", "BF16"}, {"shape", shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  std::ofstream out(dir + "/model.safetensors", std::ios::binary);
  const uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out << text;
  torch::manual_seed(0);
  for (const auto& [name, shape] : tensors) {
    auto t = shape.size() == 1 ? torch::ones(shape, torch::kBFloat16)
                               : (torch::randn(shape) * 0.02).to(torch::kBFloat16);
    out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  }
  out.close();
  EMOE_CHECK(out.good(), RuntimeError, "{}: write failed (disk full?)", dir);
  return offset;
}

// The child: load once and print one markdown row.
int measure(const std::string& dir, const std::string& dtype_name) {
  emoe::configure_threads(0);
  (void)torch::ones({8}).sum().item<float>();  // libtorch's lazy start-up is not the load's
  const int64_t base_kib = status_kib("VmRSS");
  emoe::LoadOptions lo;
  lo.dtype = emoe::parse_dtype(dtype_name);
  const auto t0 = std::chrono::steady_clock::now();
  auto model = emoe::load_any_model(dir, lo);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t peak_kib = status_kib("VmHWM");
  int64_t params = 0;
  uint64_t bytes = 0;
  for (const auto& p : model->parameters()) {
    params += p.numel();
    bytes += p.nbytes();
  }
  const double gib = 1024.0 * 1024 * 1024;
  const double peak = static_cast<double>(peak_kib) * 1024,
               base = static_cast<double>(base_kib) * 1024;
  std::cout << fmt::format(
      "| {:.3f} B | {} | {:.2f} GiB | {:.2f} GiB | {:.2f} GiB | **{:.3f}** | {:.3f} | {:.1f} |\n",
      params / 1e9, dtype_name, bytes / gib, base / gib, peak / gib,
      peak / static_cast<double>(bytes), (peak - base) / static_cast<double>(bytes), secs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Shape s;
  std::string dir = "/tmp/emoe-bench-load", dtype = "bfloat16", load_dir;
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "bench_load: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--dir")
      dir = next();
    else if (a == "--hidden")
      s.hidden = std::stoll(next());
    else if (a == "--layers")
      s.layers = std::stoll(next());
    else if (a == "--intermediate")
      s.intermediate = std::stoll(next());
    else if (a == "--vocab")
      s.vocab = std::stoll(next());
    else if (a == "--heads")
      s.heads = std::stoll(next());
    else if (a == "--dtype")
      dtype = next();
    else if (a == "--keep")
      keep = true;
    else if (a == "--load")
      load_dir = next();
    else {
      std::cerr << "bench_load: unknown argument " << a << "\n";
      return 2;
    }
  }
  try {
    if (!load_dir.empty()) return measure(load_dir, dtype);
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t bytes = write_checkpoint(dir, s);
    std::cerr << fmt::format(
        "bench_load: wrote {} ({:.2f} GiB of bfloat16 weights) in {:.1f} s\n", dir,
        bytes / (1024.0 * 1024 * 1024),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::cout << fmt::format(
        "Loading a Llama-shaped bfloat16 checkpoint (hidden {}, {} layers, intermediate {}, vocab "
        "{}) with load_any_model, dtype {} (what `--dtype {}` does), in a fresh process:\n\n",
        s.hidden, s.layers, s.intermediate, s.vocab, dtype, dtype);
    std::cout << "| parameters | dtype | weights | RSS before | peak RSS (VmHWM) | peak / weights "
                 "| (peak - before) / weights | load (s) |\n|---|---|---|---|---|---|---|---|\n"
              << std::flush;
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) throw emoe::RuntimeError("bench_load: cannot find its own executable");
    self[n] = '\0';
    const int rc =
        std::system(fmt::format("'{}' --load '{}' --dtype {}", self, dir, dtype).c_str());
    if (!keep) fs::remove_all(dir);
    return rc == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "bench_load: " << e.what() << "\n";
    return 1;
  }
}
