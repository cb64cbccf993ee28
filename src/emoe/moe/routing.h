// Top-k routing shared by every routed method: noise, ranking, capacity, combine weights, losses.
#pragma once
#include <ATen/core/Tensor.h>

#include <tuple>

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

// torch::topk(x, k, -1) (largest first, sorted) of the rows of a [n, E] tensor. Contiguous
// float32 CPU rows go through a partial sort per row (ATen 1.13's CPU topk took ~1 ms for
// BERT-base's 2048 x 64 logits, 1 % of a dispatched EMoE step; this takes ~0.05); ties go to the
// lower index and NaN ranks above every number. Elsewhere torch::topk.
std::tuple<at::Tensor, at::Tensor> top_k_rows(const at::Tensor& x, int64_t k);

// Per-expert count of kept assignments: [E] int64 (stays on the device, no host sync).
at::Tensor expert_counts(const Routing& r, int64_t experts);

}  // namespace emoe
