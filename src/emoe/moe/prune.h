// Expert pruning by usage: keep each converted layer's M most-selected experts.
#pragma once
#include <string>
#include <vector>

#include "emoe/models/model.h"
#include "emoe/moe/usage.h"

namespace emoe {

// Per MoE source (kind "selections", in layer order): the `keep` experts with the most training
// selections (ties by lower index).
std::vector<std::vector<int64_t>> most_used_experts(const UsageRecorder& usage, int64_t keep);

// Restricts every routed plug of `model` (in layer order) to the given experts; an empty list
// lifts the restriction. InputError when the model's plugs do not match the record.
void apply_expert_pruning(PretrainedModelImpl& model,
                          const std::vector<std::vector<int64_t>>& keep);

// M = N, N/2, ..., 1 (the pruning table's rows).
std::vector<int64_t> halving_schedule(int64_t experts);

}  // namespace emoe
