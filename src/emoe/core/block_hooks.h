// What every architecture calls around each transformer block's forward, so that a training
// engine can manage the block's weights there: sharded training (train.sharding full) gathers a
// block's weights before it runs and lets them go afterwards (dist/param_shards.h).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstddef>

namespace emoe {

class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  // Block `block` (its index in PretrainedModelImpl::blocks()) is about to run: its weights must
  // be present when this returns.
  virtual void before_forward(size_t block) = 0;
  // Block `block` has run and produced `out` (its output hidden states). Its weights may go now;
  // when autograd will differentiate through the block, the hook arranges to bring them back
  // before the backward pass reaches it (e.g. a hook on `out`'s gradient).
  virtual void after_forward(size_t block, const at::Tensor& out) = 0;
};

}  // namespace emoe
