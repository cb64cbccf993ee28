// Data-parallel gradient averaging: gradients are packed into buckets (in the reverse order of
// the parameters, the order backward produces them) and each bucket's collective starts from an
// autograd hook as soon as its last gradient is accumulated, while backward goes on. Buckets are
// launched in the same order on every rank, so the collectives match.
//
// Sharded levels (ZeRO, Rajbhandari et al. 2020): the parameters are cut into one contiguous run
// per rank, balanced by size and cut at parameter boundaries; a rank owns its run: it alone keeps
// the run's reduced gradients and AdamW state and steps it, then broadcasts the updated weights.
//   optimizer (stage 1): each bucket is all-reduced; after finish() a rank holds the averaged
//     gradients of its own parameters only (the optimiser then makes state for those alone).
//   gradients (stage 2): each bucket is reduced to its owner alone; a bucket's gradients are
//     released as soon as they are packed, and a rank that does not own a bucket drops it once
//     its reduction is done, so a rank holds about 1/N of the gradients after backward.
//   full (stage 3): as gradients; in addition the transformer blocks' weights live on their
//     owners only between uses (param_shards.h), so they are not broadcast after the step.
// A parameter's shard is whole (no tensor is split), so the optimiser state of a parameter lives
// on one rank and a checkpoint can be gathered and re-sharded for any world size.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace emoe {

class Communicator;

enum class ShardingLevel { kNone, kOptimizer, kGradients, kFull };
// "none", "optimizer", "gradients", "full"; UsageError naming `what` otherwise.
ShardingLevel parse_sharding(const std::string& text, const std::string& what);
std::string to_string(ShardingLevel level);

// Owner rank of each of `numels.size()` parameters: contiguous runs, in order, each rank's run
// ending where the running total first reaches (r + 1) / world of the whole.
std::vector<int> partition_by_size(const std::vector<int64_t>& numels, int world);

class GradientSync {
 public:
  // owners: the rank that owns each parameter (sharded levels); empty: partition_by_size.
  GradientSync(Communicator& comm, std::vector<at::Tensor> params,
               ShardingLevel level = ShardingLevel::kNone, std::vector<int> owners = {},
               int64_t bucket_bytes = 25 << 20);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Arms the hooks for the next backward (the one that ends a gradient-accumulation window);
  // backwards in between accumulate locally and communicate nothing.
  void arm();
  // Launches the buckets the hooks did not (a rank with an empty batch, unused parameters),
  // waits for all, and writes grad = sum over ranks / world size — for every parameter (none),
  // or for this rank's own parameters, the others' gradients left undefined (sharded). A
  // gradient that is undefined on every rank stays undefined (as it would in one process).
  // Disarms the hooks.
  void finish();

  // Sharded: the sum over ranks of the squared L2 norms of the owned gradients (the squared
  // global gradient norm); none: of every gradient (already averaged).
  double global_grad_norm_sq();
  // Sharded: each owner broadcasts its parameters (after its optimiser step), bucket by bucket,
  // but those left to their owners.
  void broadcast_parameters();
  // Parameters (by index, 1 = left) that stay with their owner after the step: sharding full
  // gathers them where they are used.
  void leave_to_owners(std::vector<char> by_index);

  ShardingLevel level() const { return level_; }
  bool sharded() const { return level_ != ShardingLevel::kNone; }
  // Gradients reduced to their owner alone (gradients and full).
  bool reduces_to_owner() const {
    return level_ == ShardingLevel::kGradients || level_ == ShardingLevel::kFull;
  }
  // Whether this rank steps parameter k (always, unsharded).
  bool owns(size_t k) const;
  int owner(size_t k) const { return owner_[k]; }
  int64_t owned_numel() const;
  int64_t buckets() const;
  int64_t started_during_backward() const { return started_in_backward_; }

 private:
  struct Bucket;
  void on_ready(size_t param_index);
  void launch(Bucket& b);
  void settle(Bucket& b);  // waits for b; a non-owner drops its buffer (gradients level)

  Communicator& comm_;
  std::vector<at::Tensor> params_;
  ShardingLevel level_;
  std::vector<int> owner_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<char> ready_;
  std::vector<char> left_to_owner_;                  // not broadcast after the step
  std::vector<std::shared_ptr<void>> accumulators_;  // keeps the hooked grad accumulators alive
  size_t next_launch_ = 0;
  bool armed_ = false;
  int64_t started_in_backward_ = 0;
};

}  // namespace emoe
