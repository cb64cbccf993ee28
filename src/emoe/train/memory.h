// What a fine-tuning run needs in memory, per method: weights, gradients, AdamW state and an
// activation estimate (`emoe info --memory`).
#pragma once
#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

#include "emoe/models/model.h"

namespace emoe {

struct TrainingMemory {
  std::string method;
  int64_t parameters = 0, trainable = 0;
  // bytes
  int64_t weights = 0;      // every parameter in the run's dtype
  int64_t gradients = 0;    // the trainable parameters' gradients, in the run's dtype
  int64_t optimizer = 0;    // AdamW's two moments per trainable parameter, float32
  int64_t activations = 0;  // activation_bytes()
  // under train.gradient_checkpointing, in place of `activations` (not in total())
  int64_t checkpointed_activations = 0;
  int64_t total() const { return weights + gradients + optimizer + activations; }
};

// Activations kept for the backward pass, after Korthikanti et al. 2022 ("Reducing Activation
// Recomputation in Large Transformer Models", eq. 1, no recomputation or parallelism):
// s·b·h·(34 + 5·a·s/h) bytes per transformer layer for 16-bit activations (s sequence length,
// b batch, h hidden size, a attention heads), scaled by bytes(dtype)/2 for other dtypes, summed
// over the layers (an encoder-decoder's decoder layers too). The embeddings and the output
// logits are left out (training computes the LM loss in chunks). One estimate for every method:
// adapters still back-propagate through the frozen layers.
int64_t activation_bytes(const ModelSummary& s, int64_t batch, int64_t seq_len,
                         c10::ScalarType dtype);
// The same under activation checkpointing (train.gradient_checkpointing; Korthikanti et al.'s
// "full recomputation"): each transformer layer keeps its input, s·b·h values in the dtype, and
// one layer's activations above (its recomputation in the backward pass) come on top.
int64_t checkpointed_activation_bytes(const ModelSummary& s, int64_t batch, int64_t seq_len,
                                      c10::ScalarType dtype);

// The memory of fine-tuning the folder's model with `method` (run-config defaults; an expert
// count that divides d_ff when the default does not), built from config.json without its weights.
TrainingMemory training_memory(const std::string& model_dir, const std::string& method,
                               int64_t batch, int64_t seq_len, c10::ScalarType dtype);

// One rank's share of `whole` (the memory of one process at global batch `batch`) in data
// parallel over `world` ranks at train.sharding `sharding` (none | optimizer | gradients): the
// batch split evenly (activations scale with ceil(batch / world)), the AdamW state divided by
// world at optimizer and gradients, the gradients too at gradients (even shares; the real cut
// at parameter boundaries is printed by a run). The weights stay whole on every rank.
TrainingMemory per_rank_memory(const TrainingMemory& whole, int64_t batch, int world,
                               const std::string& sharding);

}  // namespace emoe
