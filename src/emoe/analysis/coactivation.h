// The activation-clustering picture (the EMoE paper's Figure 4): how FFN neurons fire together on
// real text, with the neurons ordered by their EMoE expert, so that groups of neurons that fire
// together show as blocks on the diagonal; beside it the same neurons ordered by a random split.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "emoe/models/model.h"

namespace emoe {

// Pearson correlation of the neurons' firing over tokens: active [tokens, d_ff] (nonzero =
// fired) -> [d_ff, d_ff] float, 0 where a neuron never or always fires (no variance).
at::Tensor firing_correlation(const at::Tensor& active);

struct BlockContrast {
  double within = 0;   // mean correlation of distinct neuron pairs in the same expert
  double between = 0;  // ... in different experts
};
// assignment: neuron -> expert (every expert in [0, experts)).
BlockContrast block_contrast(const at::Tensor& correlation, const std::vector<int64_t>& assignment,
                             int64_t experts);

struct CoactivationOptions {
  int64_t layer = 0;  // over ModelSummary::ffn_slots()
  int64_t experts = 16;
  uint64_t seed = 0;          // of the balanced k-means and of the random split
  int64_t max_tokens = 4096;  // tokens of the sample gathered
  int64_t max_pixels = 256;   // cells per axis of the figure (neurons averaged in groups)
};

struct CoactivationOutput {
  std::string figure, markdown;  // coactivation_layer<L>.png, coactivation_layer<L>.md
  BlockContrast emoe, random;
  int64_t tokens = 0;
  double firing_rate = 0;  // mean share of neurons that fire per token
};

// Gathers the layer's activations on `sample`, splits its keys as EMoE does (balanced k-means on
// the L2-normalised keys, restarts from the options' defaults) and as a random split, and writes
// the two-panel figure and a markdown note into out_dir. The model is left unchanged.
CoactivationOutput write_coactivation(PretrainedModelImpl& model,
                                      const std::vector<ModelInputs>& sample,
                                      const CoactivationOptions& options,
                                      const std::string& out_dir);

}  // namespace emoe
