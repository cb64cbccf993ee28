// Benchmark: one FFN layer forward+backward, dense vs EMoE masked vs EMoE dispatched at
// k/N = 1/2, 1/4, 1/8. Prints times and ratios measured in the same run: for each row the three
// are timed in turn, step after step, and each column is the median of its steps, so that the
// machine's load changes all three alike.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <vector>

#include "emoe/core/logging.h"
#include "emoe/core/runtime.h"
#include "emoe/models/loader.h"
#include "emoe/moe/convert.h"

namespace {

double time_once(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  emoe::ensure_runtime_environment(argc, argv);
  emoe::configure_threads(0);
  emoe::init_logging(0);
  const int64_t d = 768, d_ff = 3072, tokens = argc > 1 ? std::atoll(argv[1]) : 2048;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  nlohmann::json cfg = {{"model_type", "bert"}, {"hidden_size", d}, {"intermediate_size", d_ff},
                        {"num_hidden_layers", 1}, {"num_attention_heads", 12}, {"vocab_size", 100},
                        {"max_position_embeddings", 512}};
  torch::manual_seed(0);
  auto model = emoe::create_model(emoe::JsonFields(cfg, "bench"), emoe::Head::kBase);
  auto* slot = model->ffn_slots()[0];
  auto x = torch::randn({tokens, d}, torch::requires_grad());
  auto step = [&] {
    model->zero_grad();
    auto y = slot->run_ffn(x, {});
    y.sum().backward();
  };
  std::cout << "FFN " << d << " x " << d_ff << ", " << tokens << " tokens, forward+backward, "
            << emoe::configure_threads(0) << " threads\n";
  std::cout << "| N | k/N | dense (ms) | masked (ms) | dispatched (ms) | masked/dense | dispatched/dense | dispatched/masked |\n"
               "|---|---|---|---|---|---|---|---|\n";
  for (int64_t experts : {64, 16}) {
  auto c = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  c.experts = experts;
  c.layers = {0};
  c.split = "random";
  c.topk = 1;
  model->ffn_slots()[0]->set_plug(nullptr);
  emoe::convert_to_moe(*model, c);
  auto* plug = emoe::moe_plugs(*model)[0];
  for (int64_t div : {2, 4, 8}) {
    plug->mutable_config().topk = experts / div;
    std::vector<double> td, tm, tx;
    for (int r = -1; r < reps; ++r) {  // r = -1: warm-up of each
      plug->set_dense_override(true);
      const double a = time_once(step);
      plug->set_dense_override(false);
      plug->mutable_config().execution = emoe::Execution::kMasked;
      const double b = time_once(step);
      plug->mutable_config().execution = emoe::Execution::kDispatched;
      const double c2 = time_once(step);
      if (r < 0) continue;
      td.push_back(a), tm.push_back(b), tx.push_back(c2);
    }
    const double dense = median(td), masked = median(tm), disp = median(tx);
    std::cout << fmt::format("| {} | 1/{} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.2f} | {:.2f} |\n",
                             experts, div, dense * 1e3, masked * 1e3, disp * 1e3, masked / dense,
                             disp / dense, disp / masked);
  }
  }
  return 0;
}
