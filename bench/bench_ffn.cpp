// Benchmark: one FFN layer forward+backward, dense vs EMoE masked vs EMoE dispatched at
// k/N = 1/2, 1/4, 1/8. Prints times and ratios measured in the same run.
#include <chrono>
#include <iostream>

#include "emoe/core/logging.h"
#include "emoe/core/runtime.h"
#include "emoe/models/loader.h"
#include "emoe/moe/convert.h"

namespace {

double time_it(const std::function<void()>& f, int reps) {
  f();  // warm-up
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
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
  double dense = time_it(step, reps);
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
    plug->mutable_config().execution = emoe::Execution::kMasked;
    double masked = time_it(step, reps);
    plug->mutable_config().execution = emoe::Execution::kDispatched;
    double disp = time_it(step, reps);
    std::cout << fmt::format("| {} | 1/{} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.2f} | {:.2f} |\n",
                             experts, div, dense * 1e3, masked * 1e3, disp * 1e3, masked / dense,
                             disp / dense, disp / masked);
  }
  }
  return 0;
}
