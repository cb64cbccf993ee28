// Analytic FLOP counter.
#include "emoe/analysis/flops.h"

#include "emoe/models/architecture.h"

namespace emoe {

namespace {

// One converted FFN's MACs per token (the FFN itself and its gate) in place of the dense FFN's.
std::pair<double, double> converted_ffn_macs(const MethodCost& m, double d, double ffn_dense) {
  const double e = static_cast<double>(m.moe_config.experts),
               k = static_cast<double>(m.moe_config.topk);
  const double cos_dim = static_cast<double>(m.moe_config.cosine_dim);
  const double cosine = d * cos_dim + cos_dim * e;
  if (m.moe_config.method == MoeMethod::kGmoe)  // k full experts per token
    return {k * ffn_dense, m.moe_config.gate == GateKind::kCosine ? cosine : d * e};
  const double ffn =
      m.moe_config.execution == Execution::kDispatched ? ffn_dense * k / e : ffn_dense;
  const double gate = m.moe_config.gate == GateKind::kMlp      ? d * e + e * e
                      : m.moe_config.gate == GateKind::kCosine ? cosine
                                                               : d * e;
  return {ffn, gate};
}

// The backward: gradients w.r.t. inputs cost one forward everywhere; gradients w.r.t. weights
// cost one forward of the matmuls whose weights train.
void finish_count(FlopCount& c, const ModelSummary& s, const MethodCost& m, double proj) {
  for (const auto& [k, v] : c.forward) c.forward_total += v;
  const auto& fw = c.forward;
  double trainable_weight_macs = 0;
  if (m.trainable_body && m.peft.method == PeftMethod::kNone) {
    trainable_weight_macs = proj + fw.at("ffn") + fw.at("gate") + fw.at("head");
  } else {
    // a pretrained LM head stays frozen under PEFT; a new classification head trains
    const double head_trains = s.head == Head::kSequenceClassification ? fw.at("head") : 0.0;
    trainable_weight_macs = fw.at("adapters") + head_trains +
                            (m.moe && m.moe_config.gate != GateKind::kAvgK ? fw.at("gate") : 0);
  }
  c.train_total = 2 * c.forward_total + trainable_weight_macs;
}

// T5: per example, then divided by its source + target tokens.
FlopCount count_encoder_decoder(const ModelSummary& s, const MethodCost& m, int64_t seq_len,
                                int64_t target_len) {
  const double d = static_cast<double>(s.hidden_size), f = static_cast<double>(s.intermediate_size);
  const double S = static_cast<double>(seq_len),
               T = static_cast<double>(target_len > 0 ? target_len : seq_len);
  const double Le = static_cast<double>(s.num_layers),
               Ld = static_cast<double>(s.num_decoder_layers);
  const double hd = static_cast<double>(s.attention_head_dim());
  const double in = hd * static_cast<double>(s.num_heads);  // inner attention width
  const bool gated = s.gated_ffn;
  const double ffn_dense = (gated ? 3.0 : 2.0) * d * f;
  const double proj_enc = Le * S * 4 * d * in;
  const double proj = proj_enc + Ld * (T * 4 * d * in + T * 2 * d * in + S * 2 * d * in);
  const double scores = Le * S * 2 * S * in + Ld * (T * 2 * T * in + T * 2 * S * in);
  double ffn = (Le * S + Ld * T) * ffn_dense, gate = 0;
  if (m.moe) {
    const auto [conv_ffn, conv_gate] = converted_ffn_macs(m, d, ffn_dense);
    const double dec = static_cast<double>(m.moe_decoder_layers);
    const double enc = static_cast<double>(m.moe_layers) - dec;
    ffn += (enc * S + dec * T) * (conv_ffn - ffn_dense);
    gate = (enc * S + dec * T) * conv_gate;
  }
  const auto pm = m.peft.method;
  const double r = static_cast<double>(m.peft.r), pe = static_cast<double>(m.peft.experts);
  double adapters = 0;
  // LoRA on q and v: self-attention q, v of each stack, cross-attention q (target) and v
  // (source); r (d + in) per token and target
  if (pm == PeftMethod::kLora) adapters = r * (d + in) * (Le * S * 2 + Ld * (T * 2 + T + S));
  // MoLoRA on every linear of the blocks (T5's default): E experts of r (a + b) and a router a·E
  // on the input of each (a -> b) linear
  if (pm == PeftMethod::kMolora) {
    auto site = [&](double a, double b) { return pe * r * (a + b) + a * pe; };
    const double ffn_site = (gated ? 2 : 1) * site(d, f) + site(f, d);
    const double self_attn = 3 * site(d, in) + site(in, d);
    adapters = Le * S * (self_attn + ffn_site) +
               Ld * (T * (self_attn + site(d, in) + site(in, d) + ffn_site) + S * 2 * site(d, in));
  }
  // MoV on k, v (router a·W_r and mixture p·V over `in`) and the FFN intermediate (over f)
  if (pm == PeftMethod::kMov)
    adapters = 2 * in * pe * 2 * (Le * S + Ld * (T + S)) + 2 * f * pe * (Le * S + Ld * T);
  const double head = s.head == Head::kSeq2SeqLM ? T * d * static_cast<double>(s.vocab_size) : 0.0;
  const double tokens = S + T;
  FlopCount c;
  c.forward["attention_proj"] = proj / tokens;
  c.forward["attention_scores"] = scores / tokens;
  c.forward["ffn"] = ffn / tokens;
  c.forward["gate"] = gate / tokens;
  c.forward["adapters"] = adapters / tokens;
  c.forward["head"] = head / tokens;
  finish_count(c, s, m, proj / tokens);
  return c;
}

}  // namespace

FlopCount count_flops(const ModelSummary& s, const MethodCost& m, int64_t seq_len,
                      int64_t target_len) {
  if (s.encoder_decoder()) return count_encoder_decoder(s, m, seq_len, target_len);
  const double d = static_cast<double>(s.hidden_size), f = static_cast<double>(s.intermediate_size);
  const double L = static_cast<double>(s.num_layers), T = static_cast<double>(seq_len);
  const double head_dim = d / static_cast<double>(s.num_heads);
  const double kv = head_dim * static_cast<double>(s.num_kv_heads);
  const bool gated = s.gated_ffn;
  const Architecture& arch = architecture_of(s);
  FlopCount c;
  auto& fw = c.forward;
  // per layer
  const double proj = d * d /*q*/ + 2 * d * kv /*k, v*/ + d * d /*o*/;
  const double scores = 2 * T * d;  // q·k over T keys and the weighted sum of T values
  const double ffn_dense = (gated ? 3.0 : 2.0) * d * f;
  double ffn = L * ffn_dense, gate = 0, adapters = 0;
  if (m.moe) {
    const double conv_layers = static_cast<double>(m.moe_layers);
    const auto [conv_ffn, conv_gate] = converted_ffn_macs(m, d, ffn_dense);
    ffn += conv_layers * (conv_ffn - ffn_dense);
    gate = conv_layers * conv_gate;
  }
  // PEFT adapters on the default targets: (in, out) of each adapted attention projection
  std::vector<std::pair<double, double>> targets;
  if (!arch.fused.empty())
    targets = {{d, 3 * d}};  // a fused q|k|v projection (GPT-2 c_attn)
  else
    targets = {{d, d}, {d, kv}};  // query, value
  const auto pm = m.peft.method;
  const double r = static_cast<double>(m.peft.r), pe = static_cast<double>(m.peft.experts);
  for (const auto& [in, out] : targets) {
    if (pm == PeftMethod::kLora) adapters += L * r * (in + out);
    if (pm == PeftMethod::kMolora)
      adapters += L * (pe * r * (in + out) + in * pe);  // experts + router
  }
  // MoV: router a·W_r and the mixture p·V for keys, values and the FFN intermediate
  if (pm == PeftMethod::kMov) adapters = L * 2 * (2 * kv * pe + f * pe);
  // (IA)^3 scales elementwise: no multiply-accumulates worth counting
  const double head =
      s.head == Head::kCausalLM || s.head == Head::kMaskedLM ? d * static_cast<double>(s.vocab_size)
      : s.head == Head::kSequenceClassification
          ? (arch.pooled_classifier ? d * d : 0.0) / T + d * static_cast<double>(s.num_labels) / T
          : 0.0;
  fw["attention_proj"] = L * proj;
  fw["attention_scores"] = L * scores;
  fw["ffn"] = ffn;
  fw["gate"] = gate;
  fw["adapters"] = adapters;
  fw["head"] = head;
  finish_count(c, s, m, L * proj);
  return c;
}

}  // namespace emoe
