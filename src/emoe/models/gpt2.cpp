// GPT-2: config, Conv1D-layout modules named as Hugging Face's, load quirks, forward with KV cache.
#include "emoe/models/gpt2.h"

#include <torch/torch.h>

#include <cmath>

#include "emoe/core/error.h"
#include "emoe/models/dropout.h"
#include "emoe/models/linear.h"
#include "emoe/models/norms.h"
#include "emoe/models/recompute.h"

namespace emoe {

Gpt2Config Gpt2Config::from_json(const JsonFields& j) {
  Gpt2Config c;
  c.vocab_size = j.get_int("vocab_size", c.vocab_size);
  c.n_embd = j.get_int("n_embd", c.n_embd);
  c.n_layer = j.get_int("n_layer", c.n_layer);
  c.n_head = j.get_int("n_head", c.n_head);
  c.n_positions = j.get_int("n_positions", c.n_positions);
  c.n_inner = j.get_int("n_inner", 0);
  if (c.n_inner == 0) c.n_inner = 4 * c.n_embd;
  c.activation_function = j.get_string("activation_function", c.activation_function);
  c.layer_norm_epsilon = j.get_double("layer_norm_epsilon", c.layer_norm_epsilon);
  c.embd_pdrop = j.get_probability("embd_pdrop", c.embd_pdrop);
  c.attn_pdrop = j.get_probability("attn_pdrop", c.attn_pdrop);
  c.resid_pdrop = j.get_probability("resid_pdrop", c.resid_pdrop);
  c.summary_first_dropout = j.get_probability("summary_first_dropout", c.summary_first_dropout);
  c.initializer_range = j.get_double("initializer_range", c.initializer_range);
  c.scale_attn_weights = j.get_bool("scale_attn_weights", true);
  c.scale_attn_by_inverse_layer_idx = j.get_bool("scale_attn_by_inverse_layer_idx", false);
  c.tie_word_embeddings = j.get_bool("tie_word_embeddings", true);
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
                         {"n_embd", c.n_embd},
                         {"n_layer", c.n_layer},
                         {"n_head", c.n_head},
                         {"n_positions", c.n_positions},
                         {"n_inner", c.n_inner},
                         {"num_labels", c.num_labels}})
    if (v <= 0) j.fail(name, fmt::format("expected a positive integer, got {}", v));
  if (c.n_embd % c.n_head != 0)
    j.fail("n_embd", fmt::format("n_embd {} is not a multiple of n_head {}", c.n_embd, c.n_head));
  for (auto [name, v] : {std::pair{"bos_token_id", c.bos_token_id},
                         {"eos_token_id", c.eos_token_id},
                         {"pad_token_id", c.pad_token_id}})
    if (v && (*v < 0 || *v >= c.vocab_size))
      j.fail(name,
             fmt::format("{} {} is outside the vocabulary of {} tokens", name, *v, c.vocab_size));
  if (j.get_bool("add_cross_attention", false))
    j.fail("add_cross_attention", "cross-attention GPT-2 is not supported (expected false)");
  parse_activation(c.activation_function, j.file() + ": field 'activation_function'");
  return c;
}

namespace {

Linear conv1d(int64_t in, int64_t out) {
  return Linear(LinearOptions{in, out, true, true});
}

class Gpt2BlockImpl : public torch::nn::Module, public FfnSlot {
 public:
  Gpt2BlockImpl(const Gpt2Config& c, int64_t index) : c_(c), index_(index) {
    ln_1_ = register_module("ln_1", LayerNorm(c.n_embd, c.layer_norm_epsilon));
    auto attn = register_module("attn", container());
    c_attn_ = attn->register_module("c_attn", conv1d(c.n_embd, 3 * c.n_embd));
    attn_proj_ = attn->register_module("c_proj", conv1d(c.n_embd, c.n_embd));
    ln_2_ = register_module("ln_2", LayerNorm(c.n_embd, c.layer_norm_epsilon));
    mlp_ = register_module("mlp", container());
    c_fc_ = mlp_->register_module("c_fc", conv1d(c.n_embd, c.n_inner));
    mlp_proj_ = mlp_->register_module("c_proj", conv1d(c.n_inner, c.n_embd));
    act_ = parse_activation(c.activation_function, "activation_function");
    scale_ = 1.0;
    if (c.scale_attn_weights) scale_ /= std::sqrt(static_cast<double>(c.n_embd / c.n_head));
    if (c.scale_attn_by_inverse_layer_idx) scale_ /= static_cast<double>(index + 1);
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& block_mask,
                        const torch::Tensor& token_mask, LayerKv* kv, torch::Tensor* probs) {
    auto h = ln_1_(x);
    auto qkv = c_attn_(h).split(c_.n_embd, -1);
    auto q = split_heads(qkv[0], c_.n_head);
    const auto [k, v] =
        append_kv(kv, split_heads(qkv[1], c_.n_head), split_heads(qkv[2], c_.n_head));
    auto a = merge_heads(
        scaled_attention(q, k, v, block_mask, scale_, c_.attn_pdrop, is_training(), probs));
    a = emoe::dropout(attn_proj_(a), c_.resid_pdrop, is_training());
    auto r = residual_add(x, a);
    auto f = run_ffn(ln_2_(r), token_mask);
    return residual_add(r, emoe::dropout(f, c_.resid_pdrop, is_training()));
  }

  torch::Tensor ffn_hidden(const torch::Tensor& x) override {
    return c_fc_->forward_activated(x, act_);
  }
  std::pair<torch::Tensor, torch::Tensor> ffn_preactivation(const torch::Tensor& x) override {
    return {c_fc_(x), torch::Tensor()};
  }
  torch::Tensor ffn_output(const torch::Tensor& h) override { return mlp_proj_(h); }
  FfnView ffn_view() override {
    FfnView v;
    v.w_in = c_fc_->weight.t();  // stored [d, d_ff]
    v.b_in = c_fc_->bias;
    v.w_out = mlp_proj_->weight.t();  // stored [d_ff, d]
    v.b_out = mlp_proj_->bias;
    v.act = act_;
    return v;
  }
  torch::nn::Module& ffn_owner() override { return *mlp_; }
  std::string ffn_prefix() const override { return fmt::format("transformer.h.{}.mlp", index_); }
  std::string layer_prefix() const override { return fmt::format("transformer.h.{}", index_); }
  int64_t layer_index() const override { return index_; }

 private:
  Gpt2Config c_;
  int64_t index_;
  double scale_;
  Activation act_;
  LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  Linear c_attn_{nullptr}, attn_proj_{nullptr}, c_fc_{nullptr}, mlp_proj_{nullptr};
  std::shared_ptr<torch::nn::Module> mlp_;
};

class Gpt2ModelImpl : public PretrainedModelImpl {
 public:
  Gpt2ModelImpl(const Gpt2Config& c, Head head) : c_(c), head_(head) {
    auto tr = register_module("transformer", container());
    wte_ = tr->register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
    wpe_ = tr->register_module("wpe", torch::nn::Embedding(c.n_positions, c.n_embd));
    auto h = tr->register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.n_layer; ++i) {
      auto block = std::make_shared<Gpt2BlockImpl>(c, i);
      h->push_back(block);
      blocks_.push_back(block);
    }
    ln_f_ = tr->register_module("ln_f", LayerNorm(c.n_embd, c.layer_norm_epsilon));
    if (head == Head::kCausalLM && !c.tie_word_embeddings)
      lm_head_ =
          register_module("lm_head", Linear(LinearOptions{c.n_embd, c.vocab_size, false, false}));
    if (head == Head::kSequenceClassification)
      score_ =
          register_module("score", Linear(LinearOptions{c.n_embd, c.num_labels, false, false}));
    summary_.model_type = "gpt2";
    summary_.head = head;
    summary_.causal = true;
    summary_.num_layers = c.n_layer;
    summary_.hidden_size = c.n_embd;
    summary_.num_heads = summary_.num_kv_heads = c.n_head;
    summary_.intermediate_size = c.n_inner;
    summary_.vocab_size = c.vocab_size;
    summary_.max_positions = c.n_positions;
    summary_.learned_positions = true;
    summary_.num_labels = head == Head::kSequenceClassification ? c.num_labels : 0;
    summary_.bos_token_id = c.bos_token_id;
    summary_.eos_token_id = c.eos_token_id;
    summary_.pad_token_id = c.pad_token_id;
    summary_.activation = c.activation_function;
    init_weights();
  }

  void init_weights() {
    torch::NoGradGuard g;
    for (auto& p : named_parameters()) {
      const auto& k = p.key();
      bool is_bias = k.size() >= 4 && k.substr(k.size() - 4) == "bias";
      if (k.find("ln_") != std::string::npos) {
        if (is_bias)
          p.value().zero_();
        else
          p.value().fill_(1.0);
      } else if (is_bias) {
        p.value().zero_();
      } else if (k.find("c_proj.weight") != std::string::npos) {
        // GPT-2's scaled init of residual projections
        p.value().normal_(0.0, c_.initializer_range / std::sqrt(2.0 * c_.n_layer));
      } else {
        p.value().normal_(0.0, c_.initializer_range);
      }
    }
  }

  ModelOutputs forward(const ModelInputs& in) override {
    const auto& ids = in.input_ids;
    EMOE_CHECK(ids.dim() == 2, InputError, "input_ids: expected [batch, seq], got {} dims",
               ids.dim());
    const int64_t b = ids.size(0), t = ids.size(1);
    const int64_t past = in.cache ? in.cache->length() : 0;
    EMOE_CHECK(past + t <= c_.n_positions, InputError,
               "input_ids: sequence length {} exceeds n_positions {}", past + t, c_.n_positions);
    auto dev = wte_->weight.device();
    auto ids_d = ids.to(dev);
    auto pos = in.position_ids.defined() ? in.position_ids.to(dev)
                                         : default_position_ids({}, b, t, past, dev);
    auto h = emoe::dropout(wte_(ids_d) + wpe_(pos), c_.embd_pdrop, is_training());
    ModelOutputs out;
    if (in.cache && in.cache->layers.empty()) in.cache->layers.resize(blocks_.size());
    auto block = build_block_mask(in.attention_mask, t, past + t, /*causal=*/true, dev);
    torch::Tensor token_mask;
    if (in.attention_mask.defined())
      token_mask = in.attention_mask.to(dev).narrow(1, in.attention_mask.size(1) - t, t);
    for (size_t i = 0; i < blocks_.size(); ++i) {
      if (in.output_hidden_states) out.hidden_states.push_back(h);
      torch::Tensor probs;
      // (cache and probs: only in a plain run, which calls the lambda at once)
      auto* want = in.output_attentions ? &probs : nullptr;
      auto* kv = in.cache ? &in.cache->layers[i] : nullptr;
      const std::weak_ptr<Gpt2BlockImpl> layer = blocks_[i];
      h = run_block(
          i, *blocks_[i], {h},
          [layer, block, token_mask, kv, want](const std::vector<torch::Tensor>& x) {
            return lock_block(layer)->forward(x[0], block, token_mask, kv, want);
          },
          kv != nullptr || want != nullptr);
      if (in.output_attentions) out.attentions.push_back(probs);
    }
    decoder_only_outputs(
        ln_f_(h),
        {head_, lm_head_ ? lm_head_.get() : nullptr, wte_->weight, score_ ? score_.get() : nullptr,
         c_.pad_token_id, c_.num_labels, c_.problem_type},
        in, out);
    return out;
  }

  const ModelSummary& summary() const override { return summary_; }
  std::vector<FfnSlot*> ffn_slots() override {
    std::vector<FfnSlot*> out;
    for (auto& b : blocks_) out.push_back(b.get());
    return out;
  }
  std::vector<torch::nn::Module*> blocks() override {
    std::vector<torch::nn::Module*> out;
    for (auto& b : blocks_) out.push_back(b.get());
    return out;
  }

  std::string module_key(const std::string& file_key) const override {
    std::string k = file_key;
    auto ends = [&](const std::string& s) {
      return k.size() >= s.size() && k.compare(k.size() - s.size(), s.size(), s) == 0;
    };
    if (ends(".attn.bias") || ends(".attn.masked_bias")) return "";  // causal-mask buffers
    if (k.rfind("transformer.", 0) != 0 && k.rfind("lm_head.", 0) != 0 && k.rfind("score.", 0) != 0)
      k = "transformer." + k;
    if (k == "lm_head.weight" && !lm_head_) return "";  // a stored copy of the tied embedding
    return k;
  }
  std::string file_key(const std::string& module_key) const override {
    if (head_ == Head::kBase && module_key.rfind("transformer.", 0) == 0)
      return module_key.substr(12);
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
  torch::Tensor input_embeddings() override { return wte_->weight; }

 private:
  Gpt2Config c_;
  Head head_;
  ModelSummary summary_;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  std::vector<std::shared_ptr<Gpt2BlockImpl>> blocks_;
  LayerNorm ln_f_{nullptr};
  Linear lm_head_{nullptr}, score_{nullptr};
};

}  // namespace

Head gpt2_head_from_config(const JsonFields& config) {
  const std::string arch = first_architecture(config);
  if (arch == "GPT2ForSequenceClassification") return Head::kSequenceClassification;
  if (arch == "GPT2Model") return Head::kBase;
  return Head::kCausalLM;
}

ModelPtr make_gpt2(const JsonFields& config, Head head) {
  const std::string architecture =
      head_class("GPT-2", head,
                 {{Head::kBase, "GPT2Model"},
                  {Head::kSequenceClassification, "GPT2ForSequenceClassification"},
                  {Head::kCausalLM, "GPT2LMHeadModel"}});
  auto model = std::make_shared<Gpt2ModelImpl>(Gpt2Config::from_json(config), head);
  model->set_config_json(config_with_architecture(config, architecture));
  return model;
}

namespace {

nlohmann::json gpt2_pretrain_config(const PretrainShape& s) {
  return {{"model_type", "gpt2"},
          {"architectures", {"GPT2LMHeadModel"}},
          {"vocab_size", s.vocab_size},
          {"n_embd", s.hidden},
          {"n_layer", s.layers},
          {"n_head", s.heads},
          {"n_inner", s.intermediate},
          {"n_positions", s.max_positions},
          {"activation_function", "gelu_new"},
          {"bos_token_id", s.bos.value_or(s.eos.value_or(0))},
          {"eos_token_id", s.eos.value_or(0)}};
}

}  // namespace

const Architecture& gpt2_architecture() {
  static const Architecture a = [] {
    Architecture t;
    t.model_type = "gpt2";
    t.display_name = "GPT-2";
    t.class_prefixes = {"GPT2"};
    t.ffn_keys = "mlp.c_fc";
    t.conv1d_weights = true;
    t.peft.lora = {"c_attn"};
    t.peft.scaling = {"c_attn", "mlp.c_proj"};
    t.peft.feedforward = {"mlp.c_proj"};
    t.peft.library_feedforward = {"mlp.c_proj"};
    // (IA)^3 and MoV scale the k and v parts of the fused projection, not q
    t.fused = {{"attn.c_attn", {"q", "k", "v"}}};
    t.pretrained_head_prefixes = {"lm_head."};
    t.pretrain_objective = PretrainObjective::kCausalLM;
    t.pretrain_config = gpt2_pretrain_config;
    t.default_head = gpt2_head_from_config;
    t.make = make_gpt2;
    return t;
  }();
  return a;
}

}  // namespace emoe
