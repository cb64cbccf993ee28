// Llama: config, modules named as Hugging Face's, RoPE + grouped-query attention, gated FFN slot.
#include "emoe/models/llama.h"

#include <torch/torch.h>

#include <cmath>

#include "emoe/core/error.h"
#include "emoe/models/linear.h"
#include "emoe/models/norms.h"

namespace emoe {

LlamaConfig LlamaConfig::from_json(const JsonFields& j) {
  LlamaConfig c;
  c.vocab_size = j.get_int("vocab_size", c.vocab_size);
  c.hidden_size = j.get_int("hidden_size", c.hidden_size);
  c.intermediate_size = j.get_int("intermediate_size", c.intermediate_size);
  c.num_hidden_layers = j.get_int("num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = j.get_int("num_attention_heads", c.num_attention_heads);
  c.num_key_value_heads = j.get_int("num_key_value_heads", c.num_attention_heads);
  c.max_position_embeddings = j.get_int("max_position_embeddings", c.max_position_embeddings);
  c.hidden_act = j.get_string("hidden_act", c.hidden_act);
  c.rms_norm_eps = j.get_double("rms_norm_eps", c.rms_norm_eps);
  c.rope_theta = j.get_double("rope_theta", c.rope_theta);
  c.initializer_range = j.get_double("initializer_range", c.initializer_range);
  c.tie_word_embeddings = j.get_bool("tie_word_embeddings", false);
  c.attention_bias = j.get_bool("attention_bias", false);
  auto opt = [&](const char* k) {
    auto v = j.get_int_list(k);
    return v.empty() ? std::optional<int64_t>() : std::optional<int64_t>(v[0]);
  };
  c.bos_token_id = opt("bos_token_id");
  c.eos_token_id = opt("eos_token_id");
  c.pad_token_id = opt("pad_token_id");
  if (j.has("id2label") && j.raw()["id2label"].is_object())
    c.num_labels = static_cast<int64_t>(j.raw()["id2label"].size());
  c.num_labels = j.get_int("num_labels", c.num_labels);
  c.problem_type = j.get_string("problem_type", "");
  for (auto [name, v] : {std::pair{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                         {"intermediate_size", c.intermediate_size},
                         {"num_hidden_layers", c.num_hidden_layers},
                         {"num_attention_heads", c.num_attention_heads},
                         {"num_key_value_heads", c.num_key_value_heads},
                         {"max_position_embeddings", c.max_position_embeddings},
                         {"num_labels", c.num_labels}})
    if (v <= 0) j.fail(name, fmt::format("expected a positive integer, got {}", v));
  if (c.hidden_size % c.num_attention_heads != 0)
    j.fail("hidden_size", fmt::format("hidden_size {} is not a multiple of num_attention_heads {}",
                                      c.hidden_size, c.num_attention_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    j.fail("num_key_value_heads",
           fmt::format("num_attention_heads {} is not a multiple of num_key_value_heads {}",
                       c.num_attention_heads, c.num_key_value_heads));
  if (c.head_dim() % 2 != 0)
    j.fail("hidden_size", fmt::format("head dimension {} must be even for rotary embeddings",
                                      c.head_dim()));
  if (c.rope_theta <= 0) j.fail("rope_theta", fmt::format("expected > 0, got {}", c.rope_theta));
  if (j.has("rope_scaling")) {
    const auto& rs = j.raw()["rope_scaling"];
    std::string type = rs.is_object() && rs.contains("type") && rs["type"].is_string()
                           ? rs["type"].get<std::string>() : "";
    if (type != "linear" || !rs.contains("factor") || !rs["factor"].is_number())
      j.fail("rope_scaling", fmt::format("only {{\"type\": \"linear\", \"factor\": F}} is supported, got {}", rs.dump()));
    c.rope_linear_factor = rs["factor"].get<double>();
    if (c.rope_linear_factor <= 0) j.fail("rope_scaling", "factor must be > 0");
  }
  for (auto [name, v] : {std::pair{"bos_token_id", c.bos_token_id}, {"eos_token_id", c.eos_token_id},
                         {"pad_token_id", c.pad_token_id}})
    if (v && (*v < 0 || *v >= c.vocab_size))
      j.fail(name, fmt::format("{} {} is outside the vocabulary of {} tokens", name, *v, c.vocab_size));
  parse_activation(c.hidden_act, j.file() + ": field 'hidden_act'");
  return c;
}

namespace {


class LlamaLayerImpl : public torch::nn::Module, public FfnSlot {
 public:
  LlamaLayerImpl(const LlamaConfig& c, int64_t index) : c_(c), index_(index) {
    const int64_t d = c.hidden_size, hd = c.head_dim();
    auto lin = [](int64_t in, int64_t out, bool bias) { return Linear(LinearOptions{in, out, bias, false}); };
    auto attn = register_module("self_attn", container());
    q_ = attn->register_module("q_proj", lin(d, c.num_attention_heads * hd, c.attention_bias));
    k_ = attn->register_module("k_proj", lin(d, c.num_key_value_heads * hd, c.attention_bias));
    v_ = attn->register_module("v_proj", lin(d, c.num_key_value_heads * hd, c.attention_bias));
    o_ = attn->register_module("o_proj", lin(c.num_attention_heads * hd, d, c.attention_bias));
    mlp_ = register_module("mlp", container());
    gate_ = mlp_->register_module("gate_proj", lin(d, c.intermediate_size, false));
    up_ = mlp_->register_module("up_proj", lin(d, c.intermediate_size, false));
    down_ = mlp_->register_module("down_proj", lin(c.intermediate_size, d, false));
    in_norm_ = register_module("input_layernorm", RMSNorm(d, c.rms_norm_eps));
    post_norm_ = register_module("post_attention_layernorm", RMSNorm(d, c.rms_norm_eps));
    act_ = parse_activation(c.hidden_act, "hidden_act");
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& block_mask, const torch::Tensor& token_mask,
                        LayerKv* kv, torch::Tensor* probs) {
    auto h = in_norm_(x);
    auto qkv = fused_linear({q_.get(), k_.get(), v_.get()}, h);
    auto q = apply_rope(split_heads(qkv[0], c_.num_attention_heads), cos, sin);
    const auto [k, v] =
        append_kv(kv, apply_rope(split_heads(qkv[1], c_.num_key_value_heads), cos, sin),
                  split_heads(qkv[2], c_.num_key_value_heads));
    double scale = 1.0 / std::sqrt(static_cast<double>(c_.head_dim()));
    auto a = o_(merge_heads(scaled_attention(q, k, v, block_mask, scale, 0.0, is_training(), probs)));
    auto r = x + a;
    return r + run_ffn(post_norm_(r), token_mask);
  }

  torch::Tensor ffn_hidden(const torch::Tensor& x) override {
    return activate(gate_(x), act_) * up_(x);
  }
  torch::Tensor ffn_output(const torch::Tensor& h) override { return down_(h); }
  FfnView ffn_view() override {
    FfnView v;
    v.w_in = gate_->weight;
    v.w_up = up_->weight;
    v.w_out = down_->weight;
    v.act = act_;
    return v;
  }
  torch::nn::Module& ffn_owner() override { return *mlp_; }
  std::string ffn_prefix() const override { return fmt::format("model.layers.{}.mlp", index_); }
  std::string layer_prefix() const override { return fmt::format("model.layers.{}", index_); }
  int64_t layer_index() const override { return index_; }

 private:
  LlamaConfig c_;
  int64_t index_;
  Activation act_;
  Linear q_{nullptr}, k_{nullptr}, v_{nullptr}, o_{nullptr}, gate_{nullptr}, up_{nullptr}, down_{nullptr};
  RMSNorm in_norm_{nullptr}, post_norm_{nullptr};
  std::shared_ptr<torch::nn::Module> mlp_;
};

class LlamaModelImpl : public PretrainedModelImpl {
 public:
  LlamaModelImpl(const LlamaConfig& c, Head head) : c_(c), head_(head) {
    auto model = register_module("model", container());
    embed_ = model->register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
    auto layers = model->register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      auto layer = std::make_shared<LlamaLayerImpl>(c, i);
      layers->push_back(layer);
      layers_.push_back(layer);
    }
    norm_ = model->register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
    if (head == Head::kCausalLM && !c.tie_word_embeddings)
      lm_head_ = register_module("lm_head", Linear(LinearOptions{c.hidden_size, c.vocab_size, false, false}));
    if (head == Head::kSequenceClassification)
      score_ = register_module("score", Linear(LinearOptions{c.hidden_size, c.num_labels, false, false}));
    summary_.model_type = "llama";
    summary_.head = head;
    summary_.causal = true;
    summary_.gated_ffn = true;
    summary_.num_layers = c.num_hidden_layers;
    summary_.hidden_size = c.hidden_size;
    summary_.num_heads = c.num_attention_heads;
    summary_.num_kv_heads = c.num_key_value_heads;
    summary_.intermediate_size = c.intermediate_size;
    summary_.vocab_size = c.vocab_size;
    summary_.max_positions = c.max_position_embeddings;
    summary_.num_labels = head == Head::kSequenceClassification ? c.num_labels : 0;
    summary_.bos_token_id = c.bos_token_id;
    summary_.eos_token_id = c.eos_token_id;
    summary_.pad_token_id = c.pad_token_id;
    summary_.activation = c.hidden_act;
    init_weights();
  }

  void init_weights() {
    torch::NoGradGuard g;
    for (auto& p : named_parameters()) {
      const auto& k = p.key();
      bool is_bias = k.size() >= 4 && k.substr(k.size() - 4) == "bias";
      if (k.find("norm") != std::string::npos) p.value().fill_(1.0);
      else if (is_bias) p.value().zero_();
      else p.value().normal_(0.0, c_.initializer_range);
    }
    if (c_.pad_token_id) embed_->weight[*c_.pad_token_id].zero_();
  }

  ModelOutputs forward(const ModelInputs& in) override {
    const auto& ids = in.input_ids;
    EMOE_CHECK(ids.dim() == 2, InputError, "input_ids: expected [batch, seq], got {} dims", ids.dim());
    const int64_t b = ids.size(0), t = ids.size(1);
    const int64_t past = in.cache ? in.cache->length() : 0;
    EMOE_CHECK(past + t <= c_.max_position_embeddings, InputError,
               "input_ids: sequence length {} exceeds max_position_embeddings {}", past + t,
               c_.max_position_embeddings);
    auto dev = embed_->weight.device();
    auto ids_d = ids.to(dev);
    auto pos = in.position_ids.defined() ? in.position_ids.to(dev)
                                         : default_position_ids({}, b, t, past, dev);
    auto h = embed_(ids_d);
    auto scaled_pos = c_.rope_linear_factor == 1.0 ? pos : pos.to(torch::kFloat) / c_.rope_linear_factor;
    auto [cos, sin] = rope_cos_sin(scaled_pos, c_.head_dim(), c_.rope_theta, h.scalar_type());
    ModelOutputs out;
    if (in.cache && in.cache->layers.empty()) in.cache->layers.resize(layers_.size());
    auto block = build_block_mask(in.attention_mask, t, past + t, /*causal=*/true, dev);
    torch::Tensor token_mask;
    if (in.attention_mask.defined())
      token_mask = in.attention_mask.to(dev).narrow(1, in.attention_mask.size(1) - t, t);
    for (size_t i = 0; i < layers_.size(); ++i) {
      if (in.output_hidden_states) out.hidden_states.push_back(h);
      torch::Tensor probs;
      h = layers_[i]->forward(h, cos, sin, block, token_mask,
                              in.cache ? &in.cache->layers[i] : nullptr,
                              in.output_attentions ? &probs : nullptr);
      if (in.output_attentions) out.attentions.push_back(probs);
    }
    decoder_only_outputs(
        norm_(h),
        {head_, lm_head_ ? lm_head_.get() : nullptr, embed_->weight,
         score_ ? score_.get() : nullptr, c_.pad_token_id, c_.num_labels, c_.problem_type},
        in, out);
    return out;
  }

  const ModelSummary& summary() const override { return summary_; }
  std::vector<FfnSlot*> ffn_slots() override {
    std::vector<FfnSlot*> out;
    for (auto& l : layers_) out.push_back(l.get());
    return out;
  }

  std::string module_key(const std::string& file_key) const override {
    std::string k = file_key;
    auto ends = [&](const std::string& s) {
      return k.size() >= s.size() && k.compare(k.size() - s.size(), s.size(), s) == 0;
    };
    if (ends("rotary_emb.inv_freq")) return "";  // a buffer some exports store
    if (k.rfind("model.", 0) != 0 && k.rfind("lm_head.", 0) != 0 && k.rfind("score.", 0) != 0)
      k = "model." + k;
    if (k == "lm_head.weight" && !lm_head_ && head_ != Head::kSequenceClassification && c_.tie_word_embeddings)
      return "";  // a stored copy of the tied embedding
    return k;
  }
  std::string file_key(const std::string& module_key) const override {
    if (head_ == Head::kBase && module_key.rfind("model.", 0) == 0) return module_key.substr(6);
    return module_key;
  }
  bool is_head_key(const std::string& k) const override {
    return k.rfind("score.", 0) == 0 || k.rfind("lm_head.", 0) == 0;
  }
  void init_head() override {
    torch::NoGradGuard g;
    if (score_) score_->weight.normal_(0.0, c_.initializer_range);
    if (lm_head_) lm_head_->weight.normal_(0.0, c_.initializer_range);
  }
  torch::Tensor input_embeddings() override { return embed_->weight; }

 private:
  LlamaConfig c_;
  Head head_;
  ModelSummary summary_;
  torch::nn::Embedding embed_{nullptr};
  std::vector<std::shared_ptr<LlamaLayerImpl>> layers_;
  RMSNorm norm_{nullptr};
  Linear lm_head_{nullptr}, score_{nullptr};
};

}  // namespace

Head llama_head_from_config(const JsonFields& config) {
  const std::string arch = first_architecture(config);
  if (arch == "LlamaForSequenceClassification") return Head::kSequenceClassification;
  if (arch == "LlamaModel") return Head::kBase;
  return Head::kCausalLM;
}

ModelPtr make_llama(const JsonFields& config, Head head) {
  const std::string architecture =
      head_class("Llama", head,
                 {{Head::kBase, "LlamaModel"},
                  {Head::kSequenceClassification, "LlamaForSequenceClassification"},
                  {Head::kCausalLM, "LlamaForCausalLM"}});
  auto model = std::make_shared<LlamaModelImpl>(LlamaConfig::from_json(config), head);
  model->set_config_json(config_with_architecture(config, architecture));
  return model;
}

namespace {

nlohmann::json llama_pretrain_config(const PretrainShape& s) {
  return {{"model_type", "llama"},
          {"architectures", {"LlamaForCausalLM"}},
          {"vocab_size", s.vocab_size},
          {"hidden_size", s.hidden},
          {"intermediate_size", s.intermediate},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.heads},
          {"num_key_value_heads", s.kv_heads > 0 ? s.kv_heads : s.heads},
          {"max_position_embeddings", s.max_positions},
          {"rms_norm_eps", 1e-5},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", true},
          {"bos_token_id", s.bos.value_or(1)},
          {"eos_token_id", s.eos.value_or(2)}};
}

}  // namespace

const Architecture& llama_architecture() {
  static const Architecture a = [] {
    Architecture t;
    t.model_type = "llama";
    t.display_name = "Llama";
    t.class_prefixes = {"Llama"};
    t.ffn_keys = "mlp.gate_proj";
    t.peft.lora = {"q_proj", "v_proj"};
    t.peft.scaling = {"k_proj", "v_proj", "down_proj"};
    t.peft.feedforward = {"down_proj"};
    t.peft.library_feedforward = {"down_proj"};
    t.pretrained_head_prefixes = {"lm_head."};
    t.pretrain_objective = PretrainObjective::kCausalLM;
    t.pretrain_config = llama_pretrain_config;
    t.default_head = llama_head_from_config;
    t.make = make_llama;
    return t;
  }();
  return a;
}

}  // namespace emoe
