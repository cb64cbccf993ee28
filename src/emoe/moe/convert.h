// Converting a dense model to an MoE (split, permute, attach plugs), moe.json, recomposition.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "emoe/models/loader.h"
#include "emoe/moe/moe_config.h"
#include "emoe/moe/routed_ffn.h"
#include "emoe/moe/split.h"

namespace emoe {

// What a converted model carries besides its weights (written as moe.json).
struct MoeState {
  MoeConfig config;
  std::map<int64_t, SplitResult> splits;  // per converted layer (permutation, quality)
  std::string source;                     // the dense model it came from
  bool empty() const { return splits.empty(); }
};

// FFN inputs and hidden activations of real tokens, per layer, gathered on sample batches.
struct FfnActivations {
  std::map<int64_t, torch::Tensor> inputs;  // [n, d]
  std::map<int64_t, torch::Tensor> hidden;  // [n, d_ff]
};
// `keep_hidden` false records the inputs only (MoEfication's router needs no [n, d_ff] copy).
FfnActivations collect_ffn_activations(PretrainedModelImpl& model,
                                       const std::vector<int64_t>& layers,
                                       const std::vector<ModelInputs>& batches, int64_t max_tokens,
                                       bool keep_hidden = true);

// Reorders a slot's neurons in place: new neuron i is old neuron perm[i] (rows of w_in, b_in,
// w_up; columns of w_out). Exact: a dense FFN computes the same function afterwards.
void permute_ffn(FfnSlot& slot, const std::vector<int64_t>& perm);
std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm);

// Splits, permutes and attaches a plug to every configured layer. `sample` is needed for the
// coactivation split and for MoEfication's router; logs cluster sizes, inertia and time.
MoeState convert_to_moe(PretrainedModelImpl& model, MoeConfig cfg,
                        const std::vector<ModelInputs>& sample = {});

// Attaches plugs as `state` describes, to a model whose weights are already in expert order
// (used when loading a converted folder; the plugs' own weights come from the checkpoint).
void attach_moe(PretrainedModelImpl& model, const MoeState& state);

// Drops every plug and restores the original neuron order: the plain dense architecture.
// GMoE's expert copies cannot be folded into one FFN: InputError.
void recompose_dense(PretrainedModelImpl& model, MoeState& state);

// The routed plugs of a model, in layer order.
std::vector<RoutedFfnImpl*> moe_plugs(PretrainedModelImpl& model);
// Sum of the plugs' last balance losses (undefined when none).
torch::Tensor collect_aux_loss(PretrainedModelImpl& model);

nlohmann::json moe_state_to_json(const MoeState& state);
MoeState moe_state_from_json(const JsonFields& j);

}  // namespace emoe
