// Data-parallel gradient averaging: gradients are packed into buckets (in the reverse order of
// the parameters, the order backward produces them) and each bucket's all-reduce starts from an
// autograd hook as soon as its last gradient is accumulated, while backward goes on. Buckets are
// launched in the same order on every rank, so the collectives match.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace emoe {

class Communicator;

class GradientSync {
 public:
  GradientSync(Communicator& comm, std::vector<at::Tensor> params, int64_t bucket_bytes = 25 << 20);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Arms the hooks for the next backward (the one that ends a gradient-accumulation window);
  // backwards in between accumulate locally and communicate nothing.
  void arm();
  // Launches the buckets the hooks did not (a rank with an empty batch, unused parameters),
  // waits for all, and writes grad = sum over ranks / world size. A gradient that is undefined
  // on every rank stays undefined (as it would in one process). Disarms the hooks.
  void finish();

  int64_t buckets() const;
  int64_t started_during_backward() const { return started_in_backward_; }

 private:
  struct Bucket;
  void on_ready(size_t param_index);
  void launch(Bucket& b);

  Communicator& comm_;
  std::vector<at::Tensor> params_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<char> ready_;
  std::vector<std::shared_ptr<void>> accumulators_;  // keeps the hooked grad accumulators alive
  size_t next_launch_ = 0;
  bool armed_ = false;
  int64_t started_in_backward_ = 0;
};

}  // namespace emoe
