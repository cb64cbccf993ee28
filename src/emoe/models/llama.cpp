// Llama: config, modules named as Hugging Face's, RoPE + grouped-query attention, gated FFN slot.
#include "emoe/models/llama.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "emoe/core/error.h"
#include "emoe/models/linear.h"
#include "emoe/models/norms.h"
#include "emoe/models/recompute.h"

namespace emoe {

namespace {

// What tells the families apart in config.json and in Hugging Face's class names.
struct FamilyNames {
  const char* model_type;
  const char* prefix;   // the class names' prefix: LlamaForCausalLM, Qwen2Model, ...
  const char* display;  // in messages
};

const FamilyNames& family_names(LlamaFamily f) {
  static const FamilyNames names[] = {{"llama", "Llama", "Llama"},
                                      {"mistral", "Mistral", "Mistral"},
                                      {"qwen2", "Qwen2", "Qwen2"},
                                      {"qwen3", "Qwen3", "Qwen3"}};
  return names[static_cast<int>(f)];
}

// rope_scaling: null, or {"rope_type" (or "type"): default | linear | dynamic | llama3, ...}.
void parse_rope_scaling(const JsonFields& j, LlamaConfig& c) {
  if (!j.has("rope_scaling")) return;
  const auto& rs = j.raw()["rope_scaling"];
  auto fail = [&](const std::string& what) {
    j.fail("rope_scaling", fmt::format("{}, got {}", what, rs.dump()));
  };
  if (!rs.is_object()) fail("expected an object or null");
  const char* type_key = rs.contains("rope_type") ? "rope_type" : "type";
  if (!rs.contains(type_key) || !rs[type_key].is_string())
    fail("expected \"rope_type\": default, linear, dynamic or llama3");
  const std::string type = rs[type_key].get<std::string>();
  using Rope = LlamaConfig::Rope;
  static const std::pair<const char*, Rope> kTypes[] = {{"default", Rope::kDefault},
                                                        {"linear", Rope::kLinear},
                                                        {"dynamic", Rope::kDynamic},
                                                        {"llama3", Rope::kLlama3}};
  const auto* known = std::find_if(std::begin(kTypes), std::end(kTypes),
                                   [&](const auto& t) { return type == t.first; });
  if (known == std::end(kTypes))
    fail("supported rope types are default, linear, dynamic and llama3");
  c.rope_type = known->second;
  if (c.rope_type == Rope::kDefault) return;
  auto number = [&](const char* key, double fallback, bool required) {
    if (!rs.contains(key) || rs[key].is_null()) {
      if (required) fail(fmt::format("{} scaling needs \"{}\"", type, key));
      return fallback;
    }
    if (!rs[key].is_number()) fail(fmt::format("\"{}\" must be a number", key));
    return rs[key].get<double>();
  };
  c.rope_factor = number("factor", 1.0, true);
  if (!(c.rope_factor > 0)) fail("\"factor\" must be > 0");
  if (c.rope_type == Rope::kLlama3) {
    c.low_freq_factor = number("low_freq_factor", 1.0, true);
    c.high_freq_factor = number("high_freq_factor", 4.0, true);
    c.original_max_position_embeddings =
        static_cast<int64_t>(number("original_max_position_embeddings", 0, true));
    if (!(c.high_freq_factor > c.low_freq_factor) || c.low_freq_factor <= 0 ||
        c.original_max_position_embeddings <= 0)
      fail(
          "llama3 scaling needs 0 < low_freq_factor < high_freq_factor and "
          "original_max_position_embeddings > 0");
  }
}

// The sliding window: Mistral's sliding_window (null: none); Qwen2/Qwen3 apply theirs only with
// use_sliding_window, to the layers from max_window_layers on (Hugging Face's layer_types).
void parse_sliding_window(const JsonFields& j, LlamaConfig& c) {
  if (c.family == LlamaFamily::kLlama) return;
  const bool qwen = c.family == LlamaFamily::kQwen2 || c.family == LlamaFamily::kQwen3;
  if (qwen && !j.get_bool("use_sliding_window", false)) return;
  if (!j.has("sliding_window")) return;
  const int64_t w = j.get_int("sliding_window");
  if (w <= 0)
    j.fail("sliding_window", fmt::format("expected a positive window or null, got {}", w));
  c.sliding_window = w;
  if (qwen) c.first_window_layer = j.get_int("max_window_layers", c.num_hidden_layers);
}

}  // namespace

LlamaConfig LlamaConfig::from_json(const JsonFields& j, LlamaFamily family) {
  LlamaConfig c;
  c.family = family;
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
  // Qwen2 always has q/k/v biases (and no o_proj bias); the others follow attention_bias
  const bool attention_bias = j.get_bool("attention_bias", false);
  c.qkv_bias = family == LlamaFamily::kQwen2 || attention_bias;
  c.o_bias = family != LlamaFamily::kQwen2 && attention_bias;
  c.qk_norm = family == LlamaFamily::kQwen3;
  // Qwen3's configuration class defaults head_dim to 128; the others derive it
  c.explicit_head_dim = j.get_int("head_dim", family == LlamaFamily::kQwen3 ? 128 : 0);
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
  for (auto [name, v] : {std::pair{"vocab_size", c.vocab_size},
                         {"hidden_size", c.hidden_size},
                         {"intermediate_size", c.intermediate_size},
                         {"num_hidden_layers", c.num_hidden_layers},
                         {"num_attention_heads", c.num_attention_heads},
                         {"num_key_value_heads", c.num_key_value_heads},
                         {"max_position_embeddings", c.max_position_embeddings},
                         {"num_labels", c.num_labels}})
    if (v <= 0) j.fail(name, fmt::format("expected a positive integer, got {}", v));
  if (c.explicit_head_dim < 0)
    j.fail("head_dim", fmt::format("expected a positive integer, got {}", c.explicit_head_dim));
  if (c.explicit_head_dim == 0 && c.hidden_size % c.num_attention_heads != 0)
    j.fail("hidden_size", fmt::format("hidden_size {} is not a multiple of num_attention_heads {}",
                                      c.hidden_size, c.num_attention_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    j.fail("num_key_value_heads",
           fmt::format("num_attention_heads {} is not a multiple of num_key_value_heads {}",
                       c.num_attention_heads, c.num_key_value_heads));
  if (c.head_dim() % 2 != 0)
    j.fail(c.explicit_head_dim > 0 ? "head_dim" : "hidden_size",
           fmt::format("head dimension {} must be even for rotary embeddings", c.head_dim()));
  if (c.rope_theta <= 0) j.fail("rope_theta", fmt::format("expected > 0, got {}", c.rope_theta));
  parse_rope_scaling(j, c);
  parse_sliding_window(j, c);
  for (auto [name, v] : {std::pair{"bos_token_id", c.bos_token_id},
                         {"eos_token_id", c.eos_token_id},
                         {"pad_token_id", c.pad_token_id}})
    if (v && (*v < 0 || *v >= c.vocab_size))
      j.fail(name,
             fmt::format("{} {} is outside the vocabulary of {} tokens", name, *v, c.vocab_size));
  parse_activation(c.hidden_act, j.file() + ": field 'hidden_act'");
  return c;
}

at::Tensor LlamaConfig::inv_freq(int64_t max_position, const at::Device& device) const {
  const int64_t d = head_dim();
  if (rope_type == Rope::kDynamic && max_position + 1 > max_position_embeddings) {
    // Hugging Face's dynamic NTK: past max_position_embeddings the base grows with the length
    const double len = static_cast<double>(max_position + 1);
    const double ratio = rope_factor * len / static_cast<double>(max_position_embeddings);
    const double base = rope_theta * std::pow(ratio - (rope_factor - 1),
                                              static_cast<double>(d) / static_cast<double>(d - 2));
    return rope_inv_freq(d, base, device);
  }
  auto inv = rope_inv_freq(d, rope_theta, device);
  if (rope_type != Rope::kLlama3) return inv;
  // Llama 3.1: wavelengths above original/low_freq_factor slow down by `factor`, those below
  // original/high_freq_factor stay, and the ones between blend smoothly (as Hugging Face computes)
  const double old_len = static_cast<double>(original_max_position_embeddings);
  const double low_wavelen = old_len / low_freq_factor, high_wavelen = old_len / high_freq_factor;
  auto wavelen = 2 * M_PI / inv;
  auto scaled = torch::where(wavelen > low_wavelen, inv / rope_factor, inv);
  auto smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
  auto smoothed = (1 - smooth) * scaled / rope_factor + smooth * scaled;
  auto medium = torch::logical_not(wavelen < high_wavelen)
                    .logical_and(torch::logical_not(wavelen > low_wavelen));
  return torch::where(medium, smoothed, scaled);
}

namespace {

class LlamaLayerImpl : public torch::nn::Module, public FfnSlot {
 public:
  LlamaLayerImpl(const LlamaConfig& c, int64_t index) : c_(c), index_(index) {
    const int64_t d = c.hidden_size, hd = c.head_dim();
    auto lin = [](int64_t in, int64_t out, bool bias) {
      return Linear(LinearOptions{in, out, bias, false});
    };
    auto attn = register_module("self_attn", container());
    q_ = attn->register_module("q_proj", lin(d, c.num_attention_heads * hd, c.qkv_bias));
    k_ = attn->register_module("k_proj", lin(d, c.num_key_value_heads * hd, c.qkv_bias));
    v_ = attn->register_module("v_proj", lin(d, c.num_key_value_heads * hd, c.qkv_bias));
    o_ = attn->register_module("o_proj", lin(c.num_attention_heads * hd, d, c.o_bias));
    if (c.qk_norm) {
      q_norm_ = attn->register_module("q_norm", RMSNorm(hd, c.rms_norm_eps));
      k_norm_ = attn->register_module("k_norm", RMSNorm(hd, c.rms_norm_eps));
    }
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
    auto q = split_heads(qkv[0], c_.num_attention_heads);
    auto k_new = split_heads(qkv[1], c_.num_key_value_heads);
    if (q_norm_) {  // Qwen3: each head of q and k normalised before RoPE
      q = q_norm_(q);
      k_new = k_norm_(k_new);
    }
    q = apply_rope(q, cos, sin);
    const auto [k, v] =
        append_kv(kv, apply_rope(k_new, cos, sin), split_heads(qkv[2], c_.num_key_value_heads));
    double scale = 1.0 / std::sqrt(static_cast<double>(c_.head_dim()));
    auto a =
        o_(merge_heads(scaled_attention(q, k, v, block_mask, scale, 0.0, is_training(), probs)));
    auto r = residual_add(x, a);
    return residual_add(r, run_ffn(post_norm_(r), token_mask));
  }

  torch::Tensor ffn_hidden(const torch::Tensor& x) override {
    return activate_gated(gate_(x), up_(x), act_);
  }
  std::pair<torch::Tensor, torch::Tensor> ffn_preactivation(const torch::Tensor& x) override {
    return {gate_(x), up_(x)};
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
  Linear q_{nullptr}, k_{nullptr}, v_{nullptr}, o_{nullptr}, gate_{nullptr}, up_{nullptr},
      down_{nullptr};
  RMSNorm in_norm_{nullptr}, post_norm_{nullptr}, q_norm_{nullptr}, k_norm_{nullptr};
  std::shared_ptr<torch::nn::Module> mlp_;
};

class LlamaModelImpl : public PretrainedModelImpl {
 public:
  LlamaModelImpl(const LlamaConfig& c, Head head) : c_(c), head_(head) {
    auto model = register_module("model", container());
    embed_ =
        model->register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
    auto layers = model->register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      auto layer = std::make_shared<LlamaLayerImpl>(c, i);
      layers->push_back(layer);
      layers_.push_back(layer);
    }
    norm_ = model->register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
    if (head == Head::kCausalLM && !c.tie_word_embeddings)
      lm_head_ = register_module("lm_head",
                                 Linear(LinearOptions{c.hidden_size, c.vocab_size, false, false}));
    if (head == Head::kSequenceClassification)
      score_ = register_module("score",
                               Linear(LinearOptions{c.hidden_size, c.num_labels, false, false}));
    summary_.model_type = family_names(c.family).model_type;
    summary_.head = head;
    summary_.causal = true;
    summary_.gated_ffn = true;
    summary_.num_layers = c.num_hidden_layers;
    summary_.hidden_size = c.hidden_size;
    summary_.num_heads = c.num_attention_heads;
    summary_.num_kv_heads = c.num_key_value_heads;
    summary_.head_dim = c.head_dim();
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
      if (k.find("norm") != std::string::npos)
        p.value().fill_(1.0);
      else if (is_bias)
        p.value().zero_();
      else
        p.value().normal_(0.0, c_.initializer_range);
    }
    if (c_.pad_token_id) embed_->weight[*c_.pad_token_id].zero_();
  }

  ModelOutputs forward(const ModelInputs& in) override {
    const auto& ids = in.input_ids;
    EMOE_CHECK(ids.dim() == 2, InputError, "input_ids: expected [batch, seq], got {} dims",
               ids.dim());
    const int64_t b = ids.size(0), t = ids.size(1);
    const int64_t past = in.cache ? in.cache->length() : 0;
    // dynamic RoPE scaling exists to run past max_position_embeddings
    EMOE_CHECK(
        past + t <= c_.max_position_embeddings || c_.rope_type == LlamaConfig::Rope::kDynamic,
        InputError, "input_ids: sequence length {} exceeds max_position_embeddings {}", past + t,
        c_.max_position_embeddings);
    auto dev = embed_->weight.device();
    auto ids_d = ids.to(dev);
    auto pos = in.position_ids.defined() ? in.position_ids.to(dev)
                                         : default_position_ids({}, b, t, past, dev);
    auto h = embed_(ids_d);
    auto [cos, sin] = rope(pos, past + t, h.scalar_type());
    ModelOutputs out;
    if (in.cache && in.cache->layers.empty()) in.cache->layers.resize(layers_.size());
    auto block = build_block_mask(in.attention_mask, t, past + t, /*causal=*/true, dev);
    torch::Tensor window_block;  // the layers with sliding-window attention
    if (c_.sliding_window)
      window_block = add_sliding_window(block, t, past + t, *c_.sliding_window, dev);
    torch::Tensor token_mask;
    if (in.attention_mask.defined())
      token_mask = in.attention_mask.to(dev).narrow(1, in.attention_mask.size(1) - t, t);
    for (size_t i = 0; i < layers_.size(); ++i) {
      if (in.output_hidden_states) out.hidden_states.push_back(h);
      torch::Tensor probs;
      const bool windowed = c_.sliding_window && static_cast<int64_t>(i) >= c_.first_window_layer;
      // (cache and probs: only in a plain run, which calls the lambda at once)
      auto* want = in.output_attentions ? &probs : nullptr;
      auto* kv = in.cache ? &in.cache->layers[i] : nullptr;
      const std::weak_ptr<LlamaLayerImpl> layer = layers_[i];
      const auto mask = windowed ? window_block : block;
      h = run_block(
          i, *layers_[i], {h},
          [layer, cos = cos, sin = sin, mask, token_mask, kv,
           want](const std::vector<torch::Tensor>& x) {
            return lock_block(layer)->forward(x[0], cos, sin, mask, token_mask, kv, want);
          },
          kv != nullptr || want != nullptr);
      if (in.output_attentions) out.attentions.push_back(probs);
    }
    decoder_only_outputs(
        norm_(h),
        {head_, lm_head_ ? lm_head_.get() : nullptr, embed_->weight,
         score_ ? score_.get() : nullptr, c_.pad_token_id, c_.num_labels, c_.problem_type},
        in, out);
    return out;
  }

  // RoPE's cos/sin for these positions; `length` = past + new positions
  std::pair<torch::Tensor, torch::Tensor> rope(const torch::Tensor& pos, int64_t length,
                                               at::ScalarType dtype) const {
    if (c_.rope_type == LlamaConfig::Rope::kDefault)
      return rope_cos_sin(pos, c_.head_dim(), c_.rope_theta, dtype);
    if (c_.rope_type == LlamaConfig::Rope::kLinear)
      return rope_cos_sin(pos.to(torch::kFloat) / c_.rope_factor, c_.head_dim(), c_.rope_theta,
                          dtype);
    const int64_t max_position = c_.rope_type == LlamaConfig::Rope::kDynamic && pos.numel() > 0
                                     ? pos.max().item<int64_t>()
                                     : length - 1;
    return rope_cos_sin(pos, c_.inv_freq(max_position, pos.device()), dtype);
  }

  const ModelSummary& summary() const override { return summary_; }
  std::vector<FfnSlot*> ffn_slots() override {
    std::vector<FfnSlot*> out;
    for (auto& l : layers_) out.push_back(l.get());
    return out;
  }
  std::vector<torch::nn::Module*> blocks() override {
    std::vector<torch::nn::Module*> out;
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
    if (k == "lm_head.weight" && !lm_head_ && head_ != Head::kSequenceClassification &&
        c_.tie_word_embeddings)
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

namespace {

Head family_head_from_config(const JsonFields& config, LlamaFamily family) {
  const std::string arch = first_architecture(config);
  const std::string prefix = family_names(family).prefix;
  if (arch == prefix + "ForSequenceClassification") return Head::kSequenceClassification;
  if (arch == prefix + "Model") return Head::kBase;
  return Head::kCausalLM;
}

ModelPtr make_family(const JsonFields& config, Head head, LlamaFamily family) {
  const auto& n = family_names(family);
  const std::string prefix = n.prefix, base = prefix + "Model",
                    seqcls = prefix + "ForSequenceClassification", lm = prefix + "ForCausalLM";
  const std::string architecture = head_class(n.display, head,
                                              {{Head::kBase, base.c_str()},
                                               {Head::kSequenceClassification, seqcls.c_str()},
                                               {Head::kCausalLM, lm.c_str()}});
  auto model = std::make_shared<LlamaModelImpl>(LlamaConfig::from_json(config, family), head);
  model->set_config_json(config_with_architecture(config, architecture));
  return model;
}

// A Llama-shaped model to pretrain; each relative adds its own fields.
nlohmann::json family_pretrain_config(const PretrainShape& s, LlamaFamily family) {
  const auto& n = family_names(family);
  nlohmann::json j = {{"model_type", n.model_type},
                      {"architectures", {std::string(n.prefix) + "ForCausalLM"}},
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
  if (family == LlamaFamily::kMistral) j["sliding_window"] = nullptr;
  if (family == LlamaFamily::kQwen2 || family == LlamaFamily::kQwen3) {
    j["use_sliding_window"] = false;
    j["rope_theta"] = 1000000.0;
  }
  if (family == LlamaFamily::kQwen3) j["head_dim"] = s.hidden / s.heads;
  return j;
}

// The traits every member of the family shares (SPEC §3.1: EMoE's keys are gate_proj's rows).
Architecture family_architecture(LlamaFamily family) {
  const auto& n = family_names(family);
  Architecture t;
  t.model_type = n.model_type;
  t.display_name = n.display;
  t.class_prefixes = {n.prefix};
  t.ffn_keys = "mlp.gate_proj";
  t.peft.lora = {"q_proj", "v_proj"};
  t.peft.scaling = {"k_proj", "v_proj", "down_proj"};
  t.peft.feedforward = {"down_proj"};
  t.peft.library_feedforward = {"down_proj"};
  t.pretrained_head_prefixes = {"lm_head."};
  t.pretrain_objective = PretrainObjective::kCausalLM;
  return t;
}

template <LlamaFamily F>
Head head_of(const JsonFields& config) {
  return family_head_from_config(config, F);
}
template <LlamaFamily F>
ModelPtr make_of(const JsonFields& config, Head head) {
  return make_family(config, head, F);
}
template <LlamaFamily F>
nlohmann::json pretrain_of(const PretrainShape& s) {
  return family_pretrain_config(s, F);
}
template <LlamaFamily F>
const Architecture& architecture_of_family() {
  static const Architecture a = [] {
    Architecture t = family_architecture(F);
    t.pretrain_config = pretrain_of<F>;
    t.default_head = head_of<F>;
    t.make = make_of<F>;
    return t;
  }();
  return a;
}

}  // namespace

Head llama_head_from_config(const JsonFields& config) {
  return family_head_from_config(config, LlamaFamily::kLlama);
}

ModelPtr make_llama(const JsonFields& config, Head head) {
  return make_family(config, head, LlamaFamily::kLlama);
}

const Architecture& llama_architecture() {
  return architecture_of_family<LlamaFamily::kLlama>();
}
const Architecture& mistral_architecture() {
  return architecture_of_family<LlamaFamily::kMistral>();
}
const Architecture& qwen2_architecture() {
  return architecture_of_family<LlamaFamily::kQwen2>();
}
const Architecture& qwen3_architecture() {
  return architecture_of_family<LlamaFamily::kQwen3>();
}

}  // namespace emoe
