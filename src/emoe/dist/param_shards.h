// Parameters sharded by transformer block (ZeRO stage 3, Rajbhandari et al. 2020; PyTorch FSDP's
// full_shard): each parameter of a block has one owner rank, which alone keeps its values between
// uses; on the other ranks the parameter keeps its shape but has no storage. Around each block's
// forward the owners broadcast the block's weights (before_forward) and the other ranks let them
// go again (after_forward); a hook on the gradient of the block's output brings them back before
// the backward pass reaches the block, and lets go of the block backward finished before. So a
// rank holds its own share plus about one block at any time.
//
// The storage is swapped under the tensor (same TensorImpl and StorageImpl), so the modules, the
// optimiser and the tensors autograd saved for backward keep pointing at the right parameter.
// Every rank must run the same forwards and backwards (the broadcasts are collectives).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "emoe/core/block_hooks.h"

namespace emoe {

class Communicator;

class ParameterShards : public BlockHooks {
 public:
  struct Member {
    at::Tensor param;  // contiguous, the only tensor on its storage (checked)
    int owner = 0;
  };
  // blocks[b]: the parameters of block b and their owners (the same on every rank). The
  // parameters must hold their values on every rank now; the non-owners' storage is freed here.
  ParameterShards(Communicator& comm, std::vector<std::vector<Member>> blocks);
  ~ParameterShards() override;
  ParameterShards(const ParameterShards&) = delete;
  ParameterShards& operator=(const ParameterShards&) = delete;

  void before_forward(size_t block) override;
  void after_forward(size_t block, const at::Tensor& out) override;

  // Every block's weights gathered and held until the matching release_all() — on every rank
  // (keep -1: evaluation) or on rank `keep` alone (checkpoints), the others receiving each block
  // and dropping it at once. While held, the forward hooks do nothing. Calls nest; a nested call
  // asking for more than the outer one holds is a logic error.
  void gather_all(int keep = -1);
  // Ends a gather_all(); at the outermost, and outside any gather_all(), every block gathered by
  // the hooks is let go (call it after each backward).
  void release_all();
  // Stops managing the parameters, leaving them as they are (call after gather_all(r) on rank r
  // to keep the whole model there).
  void detach_all();

  // Elements of sharded parameters this rank holds storage for now, and in all.
  int64_t held_numel() const;
  int64_t sharded_numel() const;
  int64_t owned_numel() const;
  size_t blocks() const { return blocks_.size(); }
  int64_t gathers() const { return gathers_; }

 private:
  void gather(size_t block, bool keep);
  void release(size_t block);
  void on_backward(size_t block);

  Communicator& comm_;
  std::vector<std::vector<Member>> blocks_;
  std::vector<char> gathered_;
  int pinned_ = 0;       // depth of gather_all()
  int pinned_for_ = -1;  // the outermost gather_all's keep
  bool detached_ = false;
  int64_t gathers_ = 0;
};

}  // namespace emoe
