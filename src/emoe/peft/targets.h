// A model's Linear modules for PEFT: target matching, Hugging Face paths, scaled activations.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "emoe/models/linear.h"
#include "emoe/models/model.h"
#include "emoe/peft/ia3.h"

namespace emoe {

struct NamedLinear {
  std::string name;  // module key, e.g. bert.encoder.layer.0.attention.self.query
  LinearImpl* linear = nullptr;
};

// Every Linear module of the model, in module order.
std::vector<NamedLinear> named_linears(PretrainedModelImpl& model);
// The parameters of every adapter the model's Linear modules carry.
std::set<const c10::TensorImpl*> adapter_parameters(PretrainedModelImpl& model);

// PEFT's rule on dotted module names: the target equals the name or is a suffix of it that starts
// after a '.'. A '*' component matches any one component, so "layer.*.output.dense" is BERT's
// FFN output and not attention.output.dense.
bool target_matches(const std::string& target, const std::string& module_name);

// The module's path as Hugging Face names it for this model class (model.file_key), e.g. a
// BertModel drops "bert.": encoder.layer.0.attention.self.query. And back (model.module_key).
std::string hf_module_path(const PretrainedModelImpl& model, const std::string& module_key);
std::string module_key_of_hf_path(const PretrainedModelImpl& model, const std::string& hf_path);

// The Linear names with layer numbers folded ("model.layers.*.mlp.down_proj, ..."), for errors.
std::string linear_names_summary(const std::vector<NamedLinear>& linears);

// The activations (IA)^3 / MoV scale at a Linear's output: GPT-2's fused c_attn (q|k|v) gives
// its k and v parts [d, 2d) and [2d, 3d) — q is never scaled, as (IA)^3 rescales keys and
// values only; any other layer gives its whole output.
std::vector<ScaledRange> scaled_output_ranges(const PretrainedModelImpl& model,
                                              const std::string& module_key,
                                              const LinearImpl& linear);

// Throws UsageError when the Linear belongs to an FFN whose MoE plug computes it from raw
// weights (dispatched execution, GMoE copies, pre-activation dropout), so an adapter there would
// be skipped silently.
void check_adapter_reaches(PretrainedModelImpl& model, const std::string& module_key,
                           const LinearImpl& linear);

}  // namespace emoe
