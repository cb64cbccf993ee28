// The row kernels against ATen's ops, alternated in one process: the chunked LM loss (forward and
// both gradients) of a Llama-style head, and causal attention (its masked softmax) forward and
// backward at the Llama-style benchmark's shape, float32 and bf16 autocast.
//
// Usage: bench_rows [--rows N] [--vocab V] [--hidden H] [--chunk ROWS] [--seconds TENTHS]
//   defaults: the Llama-style benchmark's step (8 x 255 rows, 32000 words, 512 wide).
#include <fmt/format.h>
#include <torch/torch.h>

#include <functional>
#include <iostream>
#include <memory>

#include "bench_common.h"
#include "emoe/core/cpu_info.h"
#include "emoe/core/error.h"
#include "emoe/core/runtime.h"
#include "emoe/models/attention.h"
#include "emoe/models/lm_loss.h"
#include "emoe/models/row_kernels.h"
#include "emoe/train/precision.h"

namespace {

struct Options {
  int64_t rows = 8 * 255, vocab = 32000, hidden = 512, chunk = 0;
  double seconds = 1.5;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    EMOE_CHECK(i + 1 < argc, UsageError, "{}: expected a value", a);
    const std::string v = argv[++i];
    if (a == "--rows")
      o.rows = emoe::bench::positive(a, v);
    else if (a == "--vocab")
      o.vocab = emoe::bench::positive(a, v);
    else if (a == "--hidden")
      o.hidden = emoe::bench::positive(a, v);
    else if (a == "--chunk")
      o.chunk = emoe::bench::positive(a, v);
    else if (a == "--seconds")
      o.seconds = static_cast<double>(emoe::bench::positive(a, v)) / 10.0;
    else
      EMOE_THROW(UsageError, "unknown argument '{}' (--rows, --vocab, --hidden, --seconds TENTHS)",
                 a);
  }
  return o;
}

// One table row: `step` run with ATen's ops and with the kernels in alternated rounds, the best
// of each kept (the machine is noisy).
void compare_row(const std::string& precision, const std::string& kernels, double seconds,
                 const std::function<void(const std::string&)>& step) {
  double lib = 1e30, ker = 1e30;
  for (int round = 0; round < 3; ++round) {
    lib = std::min(lib, emoe::bench::time_per_call([&] { step("library"); }, 2, seconds / 3));
    ker = std::min(ker, emoe::bench::time_per_call([&] { step(kernels); }, 2, seconds / 3));
  }
  std::cout << fmt::format("| {} | {:.1f} | {:.1f} | {:.2f}x |\n", precision, lib * 1e3, ker * 1e3,
                           ker / lib);
}

// ATen's autocast scope for bf16 rows (none for fp32)
std::unique_ptr<emoe::PrecisionScope> precision_scope(bool bf16) {
  if (!bf16) return nullptr;
  return std::make_unique<emoe::PrecisionScope>(emoe::Precision::kBf16Mixed, torch::kCPU);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const int threads = emoe::configure_threads(0);
    const auto cpu = emoe::read_cpu_info();
    const std::string kernels = emoe::row_kernels_isa();
    std::cout << fmt::format("# bench_rows: {} ({} threads; {}); row kernels: {}\n", cpu.model,
                             threads, cpu.isa_text(), kernels.empty() ? "none" : kernels);
    if (kernels.empty()) {
      std::cout << "no row kernels on this CPU (or EMOE_ROW_KERNELS=library): nothing to compare\n";
      return 0;
    }
    torch::manual_seed(0);
    const int64_t t = o.rows / 8 + 1;  // 8 sequences of t tokens: 8 (t - 1) rows predicted
    auto hidden = torch::randn({8, t, o.hidden}).requires_grad_(true);
    auto weight = (torch::randn({o.vocab, o.hidden}) * 0.02).requires_grad_(true);
    auto labels = torch::randint(0, o.vocab, {8, t}, torch::kLong);
    std::cout << fmt::format("LM loss, forward + both gradients, {} rows x {} words x {} wide\n",
                             8 * (t - 1), o.vocab, o.hidden);
    std::cout << "| precision | ATen's ops ms | row kernels ms | ratio |\n|---|---|---|---|\n";
    for (const bool bf16 : {false, true}) {
      compare_row(bf16 ? "bf16" : "fp32", kernels, o.seconds, [&](const std::string& isa) {
        emoe::set_row_kernels_isa(isa);
        const auto scope = precision_scope(bf16);
        auto loss = emoe::chunked_causal_lm_loss(hidden, weight, labels, o.chunk);
        auto g = torch::autograd::grad({loss}, {hidden, weight});
      });
    }
    // causal attention, 8 heads of 64 over 8 sequences of t tokens: the products are ATen's
    // either way, the softmax between them the kernels' or ATen's fill + softmax + casts
    {
      const int64_t heads = 8, d = 64;
      auto q = torch::randn({8, heads, t, d}).requires_grad_(true);
      auto k = torch::randn({8, heads, t, d}).requires_grad_(true);
      auto v = torch::randn({8, heads, t, d}).requires_grad_(true);
      const auto mask = emoe::build_block_mask(at::Tensor(), t, t, true, torch::kCPU);
      std::cout << fmt::format(
          "\nCausal attention, forward + gradients, 8 x {} heads x {} tokens x {} wide\n", heads, t,
          d);
      std::cout << "| precision | ATen's ops ms | row kernels ms | ratio |\n|---|---|---|---|\n";
      for (const bool bf16 : {false, true}) {
        compare_row(bf16 ? "bf16" : "fp32", kernels, o.seconds, [&](const std::string& isa) {
          emoe::set_row_kernels_isa(isa);
          const auto scope = precision_scope(bf16);
          auto out = emoe::scaled_attention(q, k, v, mask, 0.125, 0.0, true);
          auto g = torch::autograd::grad({out.sum()}, {q, k, v});
        });
      }
      std::cout << "\n";
    }
    emoe::set_row_kernels_isa(kernels);
    // where the bf16 time goes: the three products (oneDNN; the gradients' summed into float32)
    // and the kernel, one chunk of the loss's rows at a time as the loss runs them
    {
      torch::NoGradGuard no_grad;
      const int64_t n = 8 * (t - 1),
                    chunk = std::min<int64_t>(
                        n, o.chunk > 0 ? o.chunk : emoe::lm_loss_chunk_rows(n, o.vocab, 2));
      auto h = hidden.detach().reshape({-1, o.hidden}).narrow(0, 0, chunk).to(torch::kBFloat16);
      auto w = weight.detach().to(torch::kBFloat16);
      auto logits = torch::empty({chunk, o.vocab}, h.options());
      auto gh = torch::empty({chunk, o.hidden}), gw = torch::zeros({o.vocab, o.hidden});
      auto target = torch::randint(0, o.vocab, {chunk}, torch::kLong);
      auto scale = torch::full({chunk}, 1.0f / static_cast<float>(n));
      auto loss = torch::empty({chunk});
      auto time = [&](const std::function<void()>& f) {
        return emoe::bench::time_per_call(f, 3, o.seconds / 6) * 1e3 * static_cast<double>(n) /
               static_cast<double>(chunk);
      };
      const double fwd = time([&] { emoe::gemm_out(logits, h, w.t()); });
      const double rows = time([&] { emoe::softmax_xent_rows(logits, target, scale, loss); });
      const double dh = time([&] { emoe::gemm_out(gh, logits, w); });
      const double dw = time([&] { emoe::gemm_out(gw, logits.t(), h, at::Tensor(), true); });
      const double flops = 2.0 * static_cast<double>(chunk * o.vocab * o.hidden) * 1e-9 *
                           static_cast<double>(n) / static_cast<double>(chunk);
      std::cout << fmt::format(
          "bf16 parts, ms for all rows in chunks of {} (GFLOP/s): logits {:.1f} ({:.0f}), softmax "
          "rows {:.1f}, hidden's gradient {:.1f} ({:.0f}), weight's gradient {:.1f} ({:.0f})\n",
          chunk, fwd, flops / fwd * 1e3, rows, dh, flops / dh * 1e3, dw, flops / dw * 1e3);
    }
    return 0;
  } catch (const emoe::InputError& e) {
    std::cerr << "bench_rows: error: " << e.what() << "\n";
    return 2;
  }
}
