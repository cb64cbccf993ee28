// `emoe info MODEL_DIR`: architecture, sizes, parameter counts, FFN expert options, tokenizer.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>

#include "commands.h"
#include "emoe/core/cpu_info.h"
#include "emoe/core/error.h"
#include "emoe/core/runtime.h"
#include "emoe/io/safetensors.h"
#include "emoe/methods/model_folder.h"
#include "emoe/models/matmul.h"
#include "emoe/models/row_kernels.h"
#include "emoe/models/small_gemm.h"
#include "emoe/moe/convert.h"
#include "emoe/moe/expert_ffn.h"
#include "emoe/moe/expert_kernels.h"
#include "emoe/tokenizer/tokenizer.h"
#include "emoe/train/memory.h"
#include "emoe/train/method_table.h"

namespace emoe::cli {
namespace {

struct InfoArgs {
  std::string model_dir, dtype = "float32";
  bool json = false, memory = false, system = false;
  int64_t batch = 32, seq_len = 128;  // the run config's train.batch_size and max_length
  std::vector<int> ranks;             // data-parallel world sizes of the per-rank report
};

std::string human_bytes(int64_t n) {
  const double x = static_cast<double>(n);
  if (x >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", x / (1024.0 * 1024 * 1024));
  if (x >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", x / (1024.0 * 1024));
  if (x >= 1024.0) return fmt::format("{:.1f} KiB", x / 1024.0);
  return fmt::format("{} B", n);
}

// This machine as the kernels see it: CPU, instruction sets, threads, which product each path
// runs on, and the peak the instruction sets allow (the benchmarks measure the real one).
void run_system(const InfoArgs& a) {
  const CpuInfo cpu = read_cpu_info();
  const TheoreticalPeak peak = theoretical_peak(cpu);
  const int threads = configure_threads(0);
  // each dtype's path is chosen by measuring the paths this CPU has, per shape (expert_ffn.h):
  // here at BERT-base's (64 experts of 48 x 768)
  auto describe = [](at::ScalarType dtype) {
    const auto shape = bert_base_expert_shape(dtype);
    const ExpertPath path = expert_path(shape);
    const char* what = path == ExpertPath::kAmx ? "emoe's AMX tile kernels"
                       : path == ExpertPath::kAvx512Bf16
                           ? "emoe's AVX-512 BF16 gather/scatter kernels"
                       : path == ExpertPath::kAvx512 ? "emoe's AVX-512 gather/scatter kernels"
                                                     : "library GEMMs per expert";
    return std::make_pair(std::string(to_string(path)),
                          fmt::format("{} — {}", what, expert_path_report(shape)));
  };
  const auto [path32, experts32] = describe(at::kFloat);
  const auto [path16, experts16] = describe(at::kBFloat16);
  // decoding's products (few rows): emoe's kernels or the library, measured per shape under auto
  const std::string small = small_gemm_isa();
  const std::string small_text =
      small.empty() ? "library (EMOE_SMALL_GEMM=library, or no AVX2+FMA / AVX-512 kernels)"
                    : fmt::format(
                          "emoe's {} kernels, or the library where it measures faster per "
                          "shape (EMOE_SMALL_GEMM pins one)",
                          small);
  // the training step's row-wise kernels (LM loss, SwiGLU, RMSNorm, attention's softmax, bias
  // gradients): the best vector set the CPU has, or ATen's ops
  const std::string rows = row_kernels_isa();
  // bf16 inference's attention (models/attention_amx.h): on the AMX tiles where the CPU has them
  const std::string attention =
      !rows.empty() && amx_available()
          ? "bf16 inference on the AMX tiles (scores, softmax and context per block of 16 "
            "queries); otherwise batched products + the softmax kernel"
          : "batched products + the softmax kernel (no AMX, or row kernels off)";
  // bfloat16 products (matmul.h's Bf16Gemm): oneDNN's (AMX or AVX-512 BF16), float32, or ATen's
  const std::string bf16_products =
      bf16_gemm() == Bf16Gemm::kFloat32
          ? "computed in float32 (operands widened, sums rounded once to bfloat16; the default "
            "without AVX-512, EMOE_BF16_GEMM pins it)"
      : bf16_products_on_gemm_out()
          ? (std::find(cpu.isa.begin(), cpu.isa.end(), "amx_bf16") != cpu.isa.end()
                 ? "oneDNN's bf16 kernels, on the AMX tiles here"
                 : "oneDNN's AVX-512 BF16 kernels")
          : "ATen's (EMOE_BF16_GEMM=native, or AVX-512 without BF16: oneDNN inside ATen)";
  nlohmann::json j = {{"cpu", cpu.model},
                      {"logical_cores", cpu.cores},
                      {"clock_mhz", cpu.mhz},
                      {"clock_source", cpu.clock_source},
                      {"isa", cpu.isa},
                      {"threads", threads},
                      {"float32_products", matmul_backend_name()},
                      {"dispatched_experts_float32", experts32},
                      {"dispatched_experts_bfloat16", experts16},
                      {"dispatched_experts_float32_path", path32},
                      {"dispatched_experts_bfloat16_path", path16},
                      {"bfloat16_products", bf16_products},
                      {"decoding_products", small.empty() ? "library" : small},
                      {"row_kernels", rows.empty() ? "library" : rows},
                      {"attention", attention},
                      {"theoretical_peak_gflops",
                       {{"float32", peak.fp32_gflops},
                        {"bfloat16", peak.bf16_gflops},
                        {"float32_basis", peak.fp32_basis},
                        {"bfloat16_basis", peak.bf16_basis}}}};
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  const std::string clock =
      cpu.mhz > 0 ? fmt::format("{:.0f} MHz ({})", cpu.mhz, cpu.clock_source) : "clock unknown";
  std::cout << fmt::format("cpu          {} ({} logical cores, {})\n",
                           cpu.model.empty() ? "unknown" : cpu.model, cpu.cores, clock)
            << fmt::format("isa          {}\n", cpu.isa_text())
            << fmt::format("threads      {} (ATen intra-op)\n", threads)
            << fmt::format("products     float32: {}\n", matmul_backend_name())
            << fmt::format("bf16         products: {}\n", bf16_products)
            << fmt::format("decoding     products of at most {} rows: {}\n", kSmallGemmMaxRows,
                           small_text)
            << fmt::format(
                   "row kernels  LM loss, SwiGLU, GELU, RMSNorm, attention softmax, RoPE, bias "
                   "gradients: "
                   "{}\n",
                   rows.empty()
                       ? "ATen's ops (EMOE_ROW_KERNELS=library, or no AVX2+FMA / "
                         "AVX-512)"
                       : fmt::format("emoe's {} kernels (EMOE_ROW_KERNELS pins a set)", rows))
            << fmt::format("attention    {}\n", attention)
            << fmt::format(
                   "experts      dispatched, at BERT-base's shape (chosen per shape by "
                   "measurement): float32 {}; bfloat16 {}\n",
                   experts32, experts16);
  if (cpu.mhz > 0)
    std::cout << fmt::format(
        "peak (ISA)   float32 {:.0f} GFLOP/s ({}), bfloat16 {:.0f} GFLOP/s ({}): cores x "
        "clock x FLOP/cycle at the clock read ({}), which {}; bench/bench_gemm measures the "
        "real peak\n",
        peak.fp32_gflops, peak.fp32_basis, peak.bf16_gflops, peak.bf16_basis, cpu.clock_source,
        cpu.clock_source == "cpuinfo_max_freq"
            ? "bounds it"
            : "may be below the clock the cores reach (turbo: a measured peak above it)");
}

// The memory of a fine-tuning run per method (train/memory.h has the formulas).
nlohmann::json memory_report(const InfoArgs& a) {
  const auto dtype = parse_dtype(a.dtype);
  nlohmann::json methods = nlohmann::json::array();
  nlohmann::json per_rank = nlohmann::json::array();
  for (const auto& method : method_names()) {
    const TrainingMemory m = training_memory(a.model_dir, method, a.batch, a.seq_len, dtype);
    for (int world : a.ranks) {
      nlohmann::json row = {{"method", method}, {"ranks", world}};
      for (const char* level : {"none", "optimizer", "gradients", "full"})
        row[std::string(level) + "_bytes"] = per_rank_memory(m, a.batch, world, level).total();
      per_rank.push_back(row);
    }
    methods.push_back({{"method", m.method},
                       {"parameters", m.parameters},
                       {"trainable", m.trainable},
                       {"weights_bytes", m.weights},
                       {"gradients_bytes", m.gradients},
                       {"optimizer_bytes", m.optimizer},
                       {"activations_bytes", m.activations},
                       {"activations_checkpointed_bytes", m.checkpointed_activations},
                       {"total_bytes", m.total()}});
  }
  return {{"batch", a.batch},
          {"seq_len", a.seq_len},
          {"dtype", dtype_name(dtype)},
          {"formula",
           "weights: parameters x bytes(dtype); gradients: trainable x bytes(dtype); AdamW: "
           "trainable x 2 x 4 bytes (float32 moments); activations: layers x s*b*h*(34 + "
           "5*a*s/h) x bytes(dtype)/2 (Korthikanti et al. 2022, eq. 1)"},
          {"methods", methods},
          {"per_rank", per_rank}};
}

// Divisors of d_ff: the expert counts an even split allows.
std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

void run_info(const InfoArgs& a) {
  MoeState moe;
  auto model = load_any_model(a.model_dir, {}, &moe);
  CheckpointReader ckpt(a.model_dir);
  const auto& s = model->summary();

  // FFN parameters are found through the FFN slots, so no name matching is needed for them.
  std::set<const void*> ffn_ptrs;
  for (auto* slot : model->ffn_slots()) {
    auto v = slot->ffn_view();
    for (const auto& t : {v.w_in, v.b_in, v.w_up, v.w_out, v.b_out})
      if (t.defined()) ffn_ptrs.insert(t.data_ptr());
  }
  auto has = [](const std::string& k, std::initializer_list<const char*> parts) {
    for (const char* p : parts)
      if (k.find(p) != std::string::npos) return true;
    return false;
  };
  const void* embedding = model->input_embeddings().data_ptr();  // T5's `shared`, ...
  int64_t embed = 0, attn = 0, ffn = 0, norm = 0, head_params = 0, total = 0;
  for (const auto& p : model->named_parameters()) {
    const auto& k = p.key();
    int64_t n = p.value().numel();
    total += n;
    if (model->is_head_key(k))
      head_params += n;
    else if (ffn_ptrs.count(p.value().data_ptr()))
      ffn += n;
    else if (p.value().data_ptr() == embedding || has(k, {"embed", "wte", "wpe"}))
      embed += n;
    else if (has(k, {"norm", "LayerNorm", "ln_"}))
      norm += n;
    else
      attn += n;
  }
  std::string disk_dtype = ckpt.names().empty() ? "?" : ckpt.entry(ckpt.names()[0]).dtype;
  std::string tok_kind = "none", tok_error;
  int64_t tok_vocab = 0;
  try {
    auto tok = load_tokenizer(a.model_dir);
    tok_kind = tok->kind();
    tok_vocab = tok->vocab_size();
  } catch (const InputError& e) {
    tok_error = e.what();
  }
  nlohmann::json j;
  j["model_dir"] = a.model_dir;
  j["model_type"] = s.model_type;
  j["architecture"] = model->config_json()["architectures"][0];
  j["head"] = head_name(s.head);
  j["layers"] = s.num_layers;
  if (s.encoder_decoder()) j["decoder_layers"] = s.num_decoder_layers;
  j["hidden_size"] = s.hidden_size;
  j["attention_heads"] = s.num_heads;
  j["kv_heads"] = s.num_kv_heads;
  j["ffn_size"] = s.intermediate_size;
  j["ffn_activation"] = s.activation;
  j["ffn_gated"] = model->ffn_slots().empty() ? false : model->ffn_slots()[0]->ffn_view().gated();
  j["valid_expert_counts"] = divisors(s.intermediate_size);
  j["vocab_size"] = s.vocab_size;
  j["max_positions"] = s.max_positions;
  if (s.num_labels) j["num_labels"] = s.num_labels;
  j["parameters"] = {{"total", total}, {"embeddings", embed},     {"attention", attn},
                     {"ffn", ffn},     {"norms_and_other", norm}, {"head", head_params}};
  j["weights"] = {{"file", ckpt.source()}, {"dtype", disk_dtype}, {"tensors", ckpt.names().size()}};
  j["tokenizer"] = {{"kind", tok_kind}, {"vocab_size", tok_vocab}};
  if (!tok_error.empty()) j["tokenizer"]["error"] = tok_error;
  if (!moe.empty()) j["moe"] = moe.config.to_json();
  if (a.memory) j["training_memory"] = memory_report(a);
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  auto human = [](int64_t n) {
    if (n >= 1000000000) return fmt::format("{:.2f}B", n / 1e9);
    if (n >= 1000000) return fmt::format("{:.2f}M", n / 1e6);
    if (n >= 1000) return fmt::format("{:.1f}K", n / 1e3);
    return std::to_string(n);
  };
  std::cout << fmt::format("model        {}\n", a.model_dir)
            << fmt::format("architecture {} ({}, head: {})\n", j["architecture"].get<std::string>(),
                           s.model_type, head_name(s.head))
            << fmt::format("layers       {}   hidden {}   heads {} (kv {})\n",
                           s.encoder_decoder()
                               ? fmt::format("{} encoder + {} decoder (FFN slots 0..{})",
                                             s.num_layers, s.num_decoder_layers, s.ffn_layers() - 1)
                               : std::to_string(s.num_layers),
                           s.hidden_size, s.num_heads, s.num_kv_heads)
            << fmt::format("ffn          {} x {} ({}{})   valid expert counts N: {}\n",
                           s.hidden_size, s.intermediate_size, s.activation,
                           j["ffn_gated"].get<bool>() ? ", gated" : "",
                           fmt::join(divisors(s.intermediate_size), " "))
            << fmt::format("vocab        {}   max positions {}\n", s.vocab_size, s.max_positions)
            << fmt::format(
                   "parameters   {} total: embeddings {}, attention {}, ffn {}, norms/other {}, "
                   "head {}\n",
                   human(total), human(embed), human(attn), human(ffn), human(norm),
                   human(head_params))
            << fmt::format("weights      {} ({} tensors, {})\n", ckpt.source(), ckpt.names().size(),
                           disk_dtype)
            << fmt::format("tokenizer    {}{}\n", tok_kind,
                           tok_vocab ? fmt::format(" ({} tokens)", tok_vocab) : tok_error);
  if (!moe.empty())
    std::cout << fmt::format("moe          {}: N = {}, k = {}, layers {}, gate {}, {} execution\n",
                             to_string(moe.config.method), moe.config.experts, moe.config.topk,
                             fmt::join(moe.config.layers, ","), to_string(moe.config.gate),
                             to_string(moe.config.execution));
  if (a.memory) {
    const auto& mem = j["training_memory"];
    std::cout << fmt::format(
        "\nmemory to fine-tune at batch {}, sequence length {}, {} weights (AdamW moments float32; "
        "activations after Korthikanti et al. 2022: layers x s*b*h*(34 + 5*a*s/h) bytes at 16 "
        "bits):\n",
        a.batch, a.seq_len, mem["dtype"].get<std::string>());
    std::cout << "| method | parameters | trainable | weights | gradients | AdamW state | "
                 "activations | total |\n|---|---|---|---|---|---|---|---|\n";
    for (const auto& m : mem["methods"])
      std::cout << fmt::format(
          "| {} | {} | {} | {} | {} | {} | {} | {} |\n", m["method"].get<std::string>(),
          human(m["parameters"].get<int64_t>()), human(m["trainable"].get<int64_t>()),
          human_bytes(m["weights_bytes"].get<int64_t>()),
          human_bytes(m["gradients_bytes"].get<int64_t>()),
          human_bytes(m["optimizer_bytes"].get<int64_t>()),
          human_bytes(m["activations_bytes"].get<int64_t>()),
          human_bytes(m["total_bytes"].get<int64_t>()));
    if (!mem["methods"].empty())
      std::cout << fmt::format(
          "with train.gradient_checkpointing: activations {} for every method (each layer keeps "
          "its input, s*b*h values, and one layer's activations come on top while it is "
          "recomputed)\n",
          human_bytes(mem["methods"][0]["activations_checkpointed_bytes"].get<int64_t>()));
    if (!mem["per_rank"].empty()) {
      std::cout << fmt::format(
          "\nper rank, data parallel with the global batch {} split over the ranks, by "
          "train.sharding (optimizer: AdamW state / ranks; gradients: gradients too; full: "
          "weights too, plus the one block in use):\n",
          a.batch);
      std::cout << "| method | ranks | none | optimizer | gradients | full |\n"
                   "|---|---|---|---|---|---|\n";
      for (const auto& r : mem["per_rank"])
        std::cout << fmt::format("| {} | {} | {} | {} | {} | {} |\n",
                                 r["method"].get<std::string>(), r["ranks"].get<int>(),
                                 human_bytes(r["none_bytes"].get<int64_t>()),
                                 human_bytes(r["optimizer_bytes"].get<int64_t>()),
                                 human_bytes(r["gradients_bytes"].get<int64_t>()),
                                 human_bytes(r["full_bytes"].get<int64_t>()));
    }
  }
}

}  // namespace

void register_info(CLI::App& app) {
  auto args = std::make_shared<InfoArgs>();
  auto* cmd = app.add_subcommand(
      "info", "Describe a Hugging Face model folder (or, --system, this machine)");
  cmd->add_option("MODEL_DIR", args->model_dir,
                  "Model folder (config.json + safetensors); not with --system");
  cmd->add_flag("--json", args->json, "Print JSON instead of text");
  cmd->add_flag("--system", args->system,
                "Describe this machine instead: CPU, instruction sets, threads, the kernels each "
                "path runs on and the peak the instruction sets allow");
  cmd->add_flag("--memory", args->memory,
                "Memory a fine-tuning run needs per method: weights, gradients, AdamW state, "
                "activations");
  auto* batch = cmd->add_option("--batch", args->batch, "Batch size of the memory report")
                    ->capture_default_str()
                    ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  auto* seq = cmd->add_option("--seq-len", args->seq_len, "Sequence length of the memory report")
                  ->capture_default_str()
                  ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--dtype", args->dtype, "Weights dtype of the memory report: float32, bfloat16")
      ->capture_default_str();
  add_list_option(cmd, "--ranks", args->ranks,
                  "Data-parallel world sizes for a per-rank memory report by train.sharding, "
                  "e.g. --ranks 2,8")
      ->check(CLI::Range(1, 1 << 20));
  cmd->callback([args, batch, seq] {
    if (args->system) {
      EMOE_CHECK(args->model_dir.empty(), UsageError,
                 "--system describes this machine: give it no MODEL_DIR (got {})", args->model_dir);
      run_system(*args);
      return;
    }
    EMOE_CHECK(!args->model_dir.empty(), UsageError,
               "MODEL_DIR: required (a model folder), or --system for this machine");
    if (batch->count() || seq->count() || !args->ranks.empty()) args->memory = true;
    run_info(*args);
  });
}

}  // namespace emoe::cli
