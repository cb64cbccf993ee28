// Activation checkpointing ("gradient checkpointing"; Chen et al. 2016, "Training Deep Nets with
// Sublinear Memory Cost"; Hugging Face's gradient_checkpointing_enable): a transformer block's
// forward keeps none of its intermediate activations, only its inputs, and runs again in the
// backward pass to differentiate it. A training step then holds one block's activations at a
// time instead of every block's, for one more forward pass of the blocks.
//
// The recomputation sees what the first run saw: the random generators (dropout seeds, noisy
// gates) are set back to their state at the first run, and autocast to its setting then, so
// it computes the same values (the gradients are the same bits as without checkpointing where the
// kernels are deterministic; tested). Routed modules inside the block count their expert usage
// once (recomputing() is true during the second run), and their balance losses become outputs
// of the checkpointed block, so that their gradients still reach everything before it.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace torch::nn {
class Module;
}

namespace emoe {

class BlockHooks;

// A block's forward: its output from its tensor inputs (the ones given to run_block, in order;
// undefined ones stay undefined). Every tensor it reads that may need a gradient must come
// through the inputs; what needs none (masks, rotary tables) it may capture.
using BlockForward = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

// Runs block `index` (`block`: its module) between the block hooks (null: none), through
// activation checkpointing when `checkpoint` is set, grad mode is on and the inputs or the
// block's parameters need a gradient; plainly otherwise.
at::Tensor run_block(BlockHooks* hooks, size_t index, torch::nn::Module& block, bool checkpoint,
                     const std::vector<at::Tensor>& inputs, const BlockForward& forward);

// The block a forward closure runs, which the closure holds weakly: the closure lives in the
// backward graph, and a routed module inside the block holds that graph through its balance loss,
// so a strong reference would keep the block, and its weights, alive for ever.
template <class Block>
std::shared_ptr<Block> lock_block(const std::weak_ptr<Block>& block) {
  auto b = block.lock();
  TORCH_CHECK(b, "activation checkpointing: the model was freed before its backward pass");
  return b;
}

// True while the current thread recomputes a checkpointed block for its backward pass (what is
// counted per forward, such as expert usage, is not counted again then).
bool recomputing();

// Checkpointed blocks run so far in this process, and recomputed (tests).
int64_t checkpointed_block_runs();
int64_t recomputed_block_runs();

}  // namespace emoe
