// Benchmark: balanced k-means split of one Llama-2-7B-sized FFN (11008 x 4096, random weights)
// into 64 experts, against the random split. Prints times and the inertia ratio of one run.
#include <chrono>
#include <cstdlib>
#include <iostream>

#include "emoe/core/logging.h"
#include "emoe/core/runtime.h"
#include "emoe/moe/split.h"

int main(int argc, char** argv) {
  emoe::ensure_runtime_environment(argc, argv);
  emoe::configure_threads(0);
  emoe::init_logging(std::getenv("EMOE_DEBUG") ? 2 : 1);
  int64_t rows = 11008, dim = 4096, experts = 64;
  emoe::KMeansOptions o;
  o.restarts = argc > 1 ? std::atoi(argv[1]) : 1;
  o.max_iter = argc > 2 ? std::atoi(argv[2]) : 1000;
  if (argc > 3)
    rows = std::atoll(argv[3]), dim = std::atoll(argv[4]), experts = std::atoll(argv[5]);
  torch::manual_seed(0);
  auto keys = torch::randn({rows, dim}) * 0.02;
  std::cout << "split " << rows << " x " << dim << " into " << experts << " experts, restarts "
            << o.restarts << ", max_iter " << o.max_iter << "\n";
  auto t0 = std::chrono::steady_clock::now();
  auto km = emoe::balanced_kmeans(keys, experts, o);
  double tk = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto rnd = emoe::random_split(keys, experts, 0);
  std::cout << "balanced k-means: " << tk << " s (" << km.iterations
            << " iterations in the best restart, "
            << tk / std::max<int64_t>(1, km.iterations * o.restarts) << " s per iteration)\n"
            << "random split:     " << rnd.seconds << " s\n"
            << "inertia k-means / random: " << km.inertia / rnd.inertia << "\n";
  return 0;
}
