// Top-k routing shared by every routed method: noise, ranking, capacity, combine weights, losses.
#pragma once
#include <ATen/core/Tensor.h>

#include "emoe/moe/moe_config.h"

namespace emoe {

struct Routing {
  at::Tensor experts;   // [n, k] int64 selected expert ids
  at::Tensor weights;   // [n, k] combine weights; 0 where capacity dropped the assignment
  at::Tensor aux_loss;  // scalar (weighted) or undefined
};

// Routes n tokens given gate logits [n, E]. In training, adds gate noise; ranks (softmax first
// when configured); selects top-k; weights 1 or renormalised probabilities; applies expert
// capacity k·int(factor·ceil(n/E)) with batch-prioritised dropping; computes the balance loss.
Routing route_tokens(const at::Tensor& logits, const MoeConfig& cfg, bool training);

// Per-expert count of kept assignments: [E] int64 (stays on the device, no host sync).
at::Tensor expert_counts(const Routing& r, int64_t experts);

}  // namespace emoe
