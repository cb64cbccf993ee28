// Analytic FLOP counter.
#include "emoe/analysis/flops.h"

namespace emoe {

FlopCount count_flops(const ModelSummary& s, const MethodCost& m, int64_t seq_len) {
  const double d = static_cast<double>(s.hidden_size), f = static_cast<double>(s.intermediate_size);
  const double L = static_cast<double>(s.num_layers), T = static_cast<double>(seq_len);
  const double head_dim = d / static_cast<double>(s.num_heads);
  const double kv = head_dim * static_cast<double>(s.num_kv_heads);
  const bool gated = s.model_type == "llama";
  FlopCount c;
  auto& fw = c.forward;
  // per layer
  const double proj = d * d /*q*/ + 2 * d * kv /*k, v*/ + d * d /*o*/;
  const double scores = 2 * T * d;  // q·k over T keys and the weighted sum of T values
  const double ffn_dense = (gated ? 3.0 : 2.0) * d * f;
  double ffn = L * ffn_dense, gate = 0, adapters = 0, trainable_weight_macs = 0;
  const double conv_layers = m.moe ? static_cast<double>(m.moe_layers) : 0.0;
  if (m.moe) {
    const double e = static_cast<double>(m.moe_config.experts), k = static_cast<double>(m.moe_config.topk);
    const auto method = m.moe_config.method;
    double per_layer_ffn = ffn_dense, per_layer_gate = 0;
    if (method == MoeMethod::kGmoe) {
      per_layer_ffn = k * ffn_dense;  // k full experts per token
      per_layer_gate = m.moe_config.gate == GateKind::kCosine
                           ? d * static_cast<double>(m.moe_config.cosine_dim) + static_cast<double>(m.moe_config.cosine_dim) * e
                           : d * e;
    } else {
      if (m.moe_config.execution == Execution::kDispatched) per_layer_ffn = ffn_dense * k / e;
      per_layer_gate = m.moe_config.gate == GateKind::kMlp ? d * e + e * e
                       : m.moe_config.gate == GateKind::kCosine
                           ? d * static_cast<double>(m.moe_config.cosine_dim) + static_cast<double>(m.moe_config.cosine_dim) * e
                           : d * e;
    }
    ffn += conv_layers * (per_layer_ffn - ffn_dense);
    gate = conv_layers * per_layer_gate;
  }
  // PEFT adapters on the default targets: (in, out) of each adapted attention projection
  std::vector<std::pair<double, double>> targets;
  if (s.model_type == "gpt2") targets = {{d, 3 * d}};  // fused c_attn
  else if (s.model_type == "llama") targets = {{d, d}, {d, kv}};  // q_proj, v_proj
  else targets = {{d, d}, {d, d}};  // query, value
  const auto pm = m.peft.method;
  const double r = static_cast<double>(m.peft.r), pe = static_cast<double>(m.peft.experts);
  for (const auto& [in, out] : targets) {
    if (pm == PeftMethod::kLora) adapters += L * r * (in + out);
    if (pm == PeftMethod::kMolora) adapters += L * (pe * r * (in + out) + in * pe);  // experts + router
  }
  // MoV: router a·W_r and the mixture p·V for keys, values and the FFN intermediate
  if (pm == PeftMethod::kMov) adapters = L * 2 * (2 * kv * pe + f * pe);
  // (IA)^3 scales elementwise: no multiply-accumulates worth counting
  const double head = s.head == Head::kCausalLM || s.head == Head::kMaskedLM
                          ? d * static_cast<double>(s.vocab_size)
                          : s.head == Head::kSequenceClassification
                                ? (s.model_type == "bert" ? d * d : 0.0) / T + d * static_cast<double>(s.num_labels) / T
                                : 0.0;
  fw["attention_proj"] = L * proj;
  fw["attention_scores"] = L * scores;
  fw["ffn"] = ffn;
  fw["gate"] = gate;
  fw["adapters"] = adapters;
  fw["head"] = head;
  for (const auto& [k, v] : fw) c.forward_total += v;
  // backward: gradients w.r.t. inputs cost one forward everywhere; gradients w.r.t. weights
  // cost one forward of the matmuls whose weights train.
  if (m.trainable_body && pm == PeftMethod::kNone) {
    trainable_weight_macs = L * proj + ffn + gate + head;
  } else {
    // a pretrained LM head stays frozen under PEFT; a new classification head trains
    const double head_trains = s.head == Head::kSequenceClassification ? head : 0.0;
    trainable_weight_macs = adapters + head_trains + (m.moe && m.moe_config.gate != GateKind::kAvgK ? gate : 0);
  }
  c.train_total = 2 * c.forward_total + trainable_weight_macs;
  return c;
}

}  // namespace emoe
