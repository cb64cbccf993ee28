// The benchmarks' baseline: BERT (sequence classification) and Llama (causal LM) written in
// plain ATen operations, one call per operation in the order Hugging Face transformers 4.33's
// modeling_bert.py / modeling_llama.py make them (the version issue 27's Hugging Face figures
// came from), on the weights of an emoe model under Hugging Face's keys. It is what eager
// PyTorch runs for those models, less Python's per-operation overhead (so a ratio against it
// is a lower bound of one against Hugging Face itself), and the same weights give the same
// loss as emoe's model (bench_eager checks that before it times anything). Layers that carry
// LoRA weights in the state run as PEFT 0.5's LoRA Linear (the PEFT release of transformers
// 4.33's time).
#pragma once
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "emoe/core/error.h"

namespace emoe::bench {

class EagerReference {
 public:
  enum class Kind { kBert, kLlama };

  // `state`: the model's tensors under Hugging Face's keys (emoe::model_state), copied here;
  // each trains here if it trains there. A linear layer NAME with NAME.lora_A.weight and
  // NAME.lora_B.weight in the state runs as PEFT 0.5's LoRA Linear (set_lora: its scaling and
  // dropout).
  EagerReference(Kind kind, const nlohmann::json& config,
                 const std::vector<std::pair<std::string, torch::Tensor>>& state)
      : kind_(kind), config_(config) {
    for (const auto& [key, t] : state)
      w_[key] = t.detach().clone().requires_grad_(t.requires_grad());
    hidden_ = config_["hidden_size"].get<int64_t>();
    heads_ = config_["num_attention_heads"].get<int64_t>();
    layers_ = config_["num_hidden_layers"].get<int64_t>();
    if (kind_ == Kind::kBert) {
      dropout_ = config_.value("hidden_dropout_prob", 0.1);
      attention_dropout_ = config_.value("attention_probs_dropout_prob", 0.1);
    } else {
      kv_heads_ = config_.value("num_key_value_heads", heads_);
      const int64_t d = hidden_ / heads_;
      // LlamaRotaryEmbedding's cache: float32 cos/sin over every position, computed once
      const double theta = config_.value("rope_theta", 10000.0);
      auto inv_freq =
          1.0 / torch::pow(theta, torch::arange(0, d, 2, torch::kFloat) / static_cast<double>(d));
      auto t = torch::arange(config_["max_position_embeddings"].get<int64_t>(), torch::kFloat);
      auto freqs = torch::outer(t, inv_freq);
      auto emb = torch::cat({freqs, freqs}, -1);
      cos_ = emb.cos(), sin_ = emb.sin();
    }
  }

  void to(const c10::Device& device, c10::ScalarType dtype) {
    for (auto& [key, t] : w_) {
      const bool trains = t.requires_grad();
      t = t.detach().to(device, dtype).requires_grad_(trains);
    }
    if (cos_.defined()) cos_ = cos_.to(device), sin_ = sin_.to(device);
  }
  void train(bool on) { training_ = on; }
  // LoRA's alpha / r and its dropout on the adapter's input (PEFT's lora_dropout)
  void set_lora(double scaling, double dropout) {
    lora_scaling_ = scaling, lora_dropout_ = dropout;
  }
  // The weight under Hugging Face's key `key` (its .grad() after a backward pass).
  const torch::Tensor& weight(const std::string& key) const { return w_.at(key); }
  // The tensors that train (all of them in full fine-tuning).
  std::vector<torch::Tensor> parameters() const {
    std::vector<torch::Tensor> out;
    for (const auto& [key, t] : w_)
      if (t.requires_grad()) out.push_back(t);
    return out;
  }

  // The loss (labels defined) and the logits; BERT: labels [B], Llama: labels = input ids.
  struct Output {
    torch::Tensor loss, logits;
  };
  Output forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                 const torch::Tensor& labels) {
    Output out = kind_ == Kind::kBert ? bert(input_ids, attention_mask, labels)
                                      : llama(input_ids, attention_mask, labels);
    check_every_weight_used();
    return out;
  }

  // Hugging Face's greedy search with its cache (use_cache=True), 4.33: the prompt's forward
  // over every position, then one token at a time, each layer's keys and values concatenated
  // onto the cache (torch.cat), the attention mask grown by a column, the next token the argmax
  // of the last position's float32 logits. Returns [B, T + new_tokens].
  torch::Tensor greedy(const torch::Tensor& prompt, int64_t new_tokens,
                       const std::function<void(int64_t)>& on_step = {}) {
    EMOE_CHECK(kind_ == Kind::kLlama, UsageError, "greedy generation: a causal LM only");
    torch::NoGradGuard no_grad;
    std::vector<std::pair<torch::Tensor, torch::Tensor>> cache(layers_);
    auto ids = prompt;
    auto mask = torch::ones_like(prompt);
    auto step_ids = prompt;
    for (int64_t step = 0; step < new_tokens; ++step) {
      // prepare_inputs_for_generation: position ids from the mask's running sum
      auto positions = mask.cumsum(-1) - 1;
      positions.masked_fill_(mask == 0, 1);
      positions = positions.narrow(1, positions.size(1) - step_ids.size(1), step_ids.size(1));
      auto logits = llama_logits(step_ids, mask, positions, &cache).to(torch::kFloat);
      auto next = logits.select(1, logits.size(1) - 1).argmax(-1);
      ids = torch::cat({ids, next.unsqueeze(1)}, -1);
      mask = torch::cat({mask, torch::ones({mask.size(0), 1}, mask.options())}, -1);
      step_ids = next.unsqueeze(1);
      if (on_step) on_step(step);
    }
    return ids;
  }

 private:
  torch::Tensor p(const std::string& key) {
    auto it = w_.find(key);
    EMOE_CHECK(it != w_.end(), InputError, "eager reference: no weight '{}' in the model's state",
               key);
    used_.insert(key);
    return it->second;
  }
  void check_every_weight_used() {
    if (used_.size() == w_.size()) return;
    std::vector<std::string> unused;
    for (const auto& [key, t] : w_)
      if (!used_.count(key)) unused.push_back(key);
    EMOE_THROW(InputError, "eager reference: weights the forward pass did not use: {}",
               fmt::join(unused, ", "));
  }
  torch::Tensor linear(const torch::Tensor& x, const std::string& name, bool bias = true) {
    auto result = torch::linear(x, p(name + ".weight"), bias ? p(name + ".bias") : torch::Tensor());
    if (!w_.count(name + ".lora_A.weight")) return result;
    // PEFT 0.5's lora.Linear.forward: the base layer; x cast to lora_A's dtype; the update
    // lora_B(lora_A(lora_dropout(x))) * scaling added in place; the sum cast to x's dtype
    const auto a = p(name + ".lora_A.weight"), b = p(name + ".lora_B.weight");
    const auto xa = x.to(a.scalar_type());
    result += torch::linear(torch::linear(dropout(xa, lora_dropout_), a), b) * lora_scaling_;
    return result.to(x.scalar_type());
  }
  torch::Tensor layer_norm(const torch::Tensor& x, const std::string& name) {
    return torch::layer_norm(x, {hidden_}, p(name + ".weight"), p(name + ".bias"),
                             config_.value("layer_norm_eps", 1e-12));
  }
  torch::Tensor dropout(const torch::Tensor& x, double rate) {
    return torch::dropout(x, rate, training_);
  }
  // [B, T, heads * d] -> [B, heads, T, d] (transpose_for_scores)
  torch::Tensor split_heads(const torch::Tensor& x, int64_t heads) const {
    const int64_t d = hidden_ / heads_;
    return x.view({x.size(0), x.size(1), heads, d}).permute({0, 2, 1, 3});
  }

  Output bert(const torch::Tensor& ids, const torch::Tensor& mask, const torch::Tensor& labels) {
    const int64_t b = ids.size(0), t = ids.size(1), d = hidden_ / heads_;
    const auto position_ids = torch::arange(t, ids.options()).unsqueeze(0);
    const auto token_type_ids = torch::zeros_like(ids);
    auto emb = torch::embedding(p("bert.embeddings.word_embeddings.weight"), ids) +
               torch::embedding(p("bert.embeddings.token_type_embeddings.weight"), token_type_ids);
    emb += torch::embedding(p("bert.embeddings.position_embeddings.weight"), position_ids);
    auto h = dropout(layer_norm(emb, "bert.embeddings.LayerNorm"), dropout_);
    // get_extended_attention_mask: (1 - mask) * finfo(float32).min, [B, 1, 1, T]
    const auto extended = (1.0 - mask.unsqueeze(1).unsqueeze(2).to(torch::kFloat)) *
                          std::numeric_limits<float>::lowest();
    for (int64_t l = 0; l < layers_; ++l) {
      const std::string pre = fmt::format("bert.encoder.layer.{}.", l);
      auto q = split_heads(linear(h, pre + "attention.self.query"), heads_);
      auto k = split_heads(linear(h, pre + "attention.self.key"), heads_);
      auto v = split_heads(linear(h, pre + "attention.self.value"), heads_);
      auto scores = torch::matmul(q, k.transpose(-1, -2));
      scores = scores / std::sqrt(static_cast<double>(d));
      scores = scores + extended;
      auto probs = dropout(torch::softmax(scores, -1), attention_dropout_);
      auto context = torch::matmul(probs, v).permute({0, 2, 1, 3}).contiguous().view({b, t, -1});
      auto a = dropout(linear(context, pre + "attention.output.dense"), dropout_);
      a = layer_norm(a + h, pre + "attention.output.LayerNorm");
      auto i = torch::gelu(linear(a, pre + "intermediate.dense"));
      auto o = dropout(linear(i, pre + "output.dense"), dropout_);
      h = layer_norm(o + a, pre + "output.LayerNorm");
    }
    auto pooled = torch::tanh(linear(h.select(1, 0), "bert.pooler.dense"));
    auto logits = linear(dropout(pooled, dropout_), "classifier");
    Output out;
    out.logits = logits;
    if (labels.defined())
      out.loss = torch::cross_entropy_loss(logits.view({-1, logits.size(-1)}), labels.view(-1));
    return out;
  }

  torch::Tensor rms_norm(const torch::Tensor& x, const std::string& name) {
    const auto input_dtype = x.scalar_type();
    auto h = x.to(torch::kFloat);
    auto variance = h.pow(2).mean(-1, true);
    h = h * torch::rsqrt(variance + config_.value("rms_norm_eps", 1e-6));
    return p(name + ".weight") * h.to(input_dtype);
  }
  static torch::Tensor rotate_half(const torch::Tensor& x) {
    const int64_t half = x.size(-1) / 2;
    return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  }

  // The decoder's logits [B, T, vocab] for `ids` at `positions`; with `cache`, the keys and
  // values of earlier positions are read from it and this call's appended (torch.cat).
  torch::Tensor llama_logits(const torch::Tensor& ids, const torch::Tensor& mask,
                             const torch::Tensor& positions,
                             std::vector<std::pair<torch::Tensor, torch::Tensor>>* cache) {
    const int64_t b = ids.size(0), t = ids.size(1), d = hidden_ / heads_;
    const int64_t past =
        cache != nullptr && (*cache)[0].first.defined() ? (*cache)[0].first.size(2) : 0;
    auto h = torch::embedding(p("model.embed_tokens.weight"), ids);
    // _prepare_decoder_attention_mask: the causal mask (float min above the diagonal) plus the
    // padding mask, [B, 1, T, past + T], in the embeddings' dtype
    const auto dtype = h.scalar_type();
    const double lowest = dtype == torch::kBFloat16
                              ? static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest())
                              : static_cast<double>(std::numeric_limits<float>::lowest());
    auto causal = torch::full({t, t}, lowest, h.options());
    auto cond = torch::arange(t, ids.options());
    causal.masked_fill_(cond < (cond + 1).view({t, 1}), 0);
    if (past > 0) causal = torch::cat({torch::zeros({t, past}, h.options()), causal}, -1);
    auto causal4 = causal.unsqueeze(0).unsqueeze(0).expand({b, 1, t, past + t});
    auto inverted = 1.0 - mask.unsqueeze(1).unsqueeze(2).expand({b, 1, t, past + t}).to(dtype);
    auto attention_mask = inverted.masked_fill(inverted.to(torch::kBool), lowest) + causal4;
    for (int64_t l = 0; l < layers_; ++l) {
      const std::string pre = fmt::format("model.layers.{}.", l);
      auto residual = h;
      auto x = rms_norm(h, pre + "input_layernorm");
      auto q = linear(x, pre + "self_attn.q_proj", false).view({b, t, heads_, d}).transpose(1, 2);
      auto k =
          linear(x, pre + "self_attn.k_proj", false).view({b, t, kv_heads_, d}).transpose(1, 2);
      auto v =
          linear(x, pre + "self_attn.v_proj", false).view({b, t, kv_heads_, d}).transpose(1, 2);
      // the rotary embedding's forward: the cache's first past + T rows in v's dtype, gathered
      // at the position ids
      auto cos = cos_.narrow(0, 0, past + t).to(v.scalar_type()).index({positions}).unsqueeze(1);
      auto sin = sin_.narrow(0, 0, past + t).to(v.scalar_type()).index({positions}).unsqueeze(1);
      q = q * cos + rotate_half(q) * sin;
      k = k * cos + rotate_half(k) * sin;
      if (cache != nullptr) {
        auto& [ck, cv] = (*cache)[l];
        if (ck.defined()) k = torch::cat({ck, k}, 2), v = torch::cat({cv, v}, 2);
        ck = k, cv = v;
      }
      if (kv_heads_ != heads_) {  // repeat_kv
        const int64_t rep = heads_ / kv_heads_;
        auto repeat = [&](const torch::Tensor& x) {
          return x.unsqueeze(2)
              .expand({b, kv_heads_, rep, x.size(2), d})
              .reshape({b, heads_, x.size(2), d});
        };
        k = repeat(k), v = repeat(v);
      }
      auto scores = torch::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(d));
      scores = scores + attention_mask;
      auto probs = torch::softmax(scores, -1, torch::kFloat).to(q.scalar_type());
      auto out = torch::matmul(probs, v).transpose(1, 2).contiguous().reshape({b, t, hidden_});
      h = residual + linear(out, pre + "self_attn.o_proj", false);
      residual = h;
      x = rms_norm(h, pre + "post_attention_layernorm");
      auto mlp = linear(torch::silu(linear(x, pre + "mlp.gate_proj", false)) *
                            linear(x, pre + "mlp.up_proj", false),
                        pre + "mlp.down_proj", false);
      h = residual + mlp;
    }
    h = rms_norm(h, "model.norm");
    return linear(h, "lm_head", false);
  }

  Output llama(const torch::Tensor& ids, const torch::Tensor& mask, const torch::Tensor& labels) {
    const auto positions = torch::arange(ids.size(1), ids.options()).unsqueeze(0);
    auto logits = llama_logits(ids, mask, positions, nullptr).to(torch::kFloat);
    Output out;
    out.logits = logits;
    if (labels.defined()) {
      const int64_t t = logits.size(1);
      auto shift_logits = logits.narrow(1, 0, t - 1).contiguous();
      auto shift_labels = labels.narrow(1, 1, t - 1).contiguous();
      out.loss = torch::cross_entropy_loss(shift_logits.view({-1, shift_logits.size(-1)}),
                                           shift_labels.view(-1));
    }
    return out;
  }

  Kind kind_;
  nlohmann::json config_;
  std::map<std::string, torch::Tensor> w_;
  std::set<std::string> used_;
  int64_t hidden_ = 0, heads_ = 0, kv_heads_ = 0, layers_ = 0;
  double dropout_ = 0, attention_dropout_ = 0, lora_scaling_ = 1, lora_dropout_ = 0;
  bool training_ = true;
  torch::Tensor cos_, sin_;
};

}  // namespace emoe::bench
