// BERT and RoBERTa: config, modules named as Hugging Face's, load quirks (gamma/beta, missing
// "bert."/"roberta."), forward.
#include "emoe/models/bert.h"

#include <torch/torch.h>

#include <cmath>

#include "emoe/core/error.h"
#include "emoe/models/dropout.h"
#include "emoe/models/linear.h"
#include "emoe/models/norms.h"
#include "emoe/models/recompute.h"

namespace emoe {

BertConfig BertConfig::from_json(const JsonFields& j, bool roberta) {
  BertConfig c;
  c.roberta = roberta;
  c.vocab_size = j.get_int("vocab_size", c.vocab_size);
  c.hidden_size = j.get_int("hidden_size", c.hidden_size);
  c.num_hidden_layers = j.get_int("num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = j.get_int("num_attention_heads", c.num_attention_heads);
  c.intermediate_size = j.get_int("intermediate_size", c.intermediate_size);
  c.max_position_embeddings = j.get_int("max_position_embeddings", c.max_position_embeddings);
  c.type_vocab_size = j.get_int("type_vocab_size", c.type_vocab_size);
  c.hidden_act = j.get_string("hidden_act", c.hidden_act);
  c.hidden_dropout_prob = j.get_probability("hidden_dropout_prob", c.hidden_dropout_prob);
  c.attention_probs_dropout_prob =
      j.get_probability("attention_probs_dropout_prob", c.attention_probs_dropout_prob);
  if (j.has("classifier_dropout"))
    c.classifier_dropout = j.get_probability("classifier_dropout", 0.0);
  c.layer_norm_eps = j.get_double("layer_norm_eps", c.layer_norm_eps);
  c.initializer_range = j.get_double("initializer_range", c.initializer_range);
  // absent: none for BERT, RobertaConfig's default padding_idx 1 for RoBERTa
  c.pad_token_id = j.has("pad_token_id") ? std::optional<int64_t>(j.get_int("pad_token_id"))
                                         : (roberta ? std::optional<int64_t>(1) : std::nullopt);
  if (roberta && !j.has("pad_token_id") && j.raw().contains("pad_token_id"))
    j.fail("pad_token_id", "RoBERTa needs a padding_idx (its position ids count from it)");
  if (j.has("id2label") && j.raw()["id2label"].is_object())
    c.num_labels = static_cast<int64_t>(j.raw()["id2label"].size());
  c.num_labels = j.get_int("num_labels", c.num_labels);
  c.problem_type = j.get_string("problem_type", "");

  for (auto [name, v] : {std::pair{"vocab_size", c.vocab_size},
                         {"hidden_size", c.hidden_size},
                         {"num_hidden_layers", c.num_hidden_layers},
                         {"num_attention_heads", c.num_attention_heads},
                         {"intermediate_size", c.intermediate_size},
                         {"max_position_embeddings", c.max_position_embeddings},
                         {"type_vocab_size", c.type_vocab_size},
                         {"num_labels", c.num_labels}})
    if (v <= 0) j.fail(name, fmt::format("expected a positive integer, got {}", v));
  if (c.hidden_size % c.num_attention_heads != 0)
    j.fail("hidden_size", fmt::format("hidden_size {} is not a multiple of num_attention_heads {}",
                                      c.hidden_size, c.num_attention_heads));
  std::string pos = j.get_string("position_embedding_type", "absolute");
  if (pos != "absolute")
    j.fail("position_embedding_type",
           fmt::format("only 'absolute' position embeddings are supported, got '{}'", pos));
  if (j.get_bool("is_decoder", false))
    j.fail("is_decoder", "BERT as a decoder is not supported (expected false)");
  if (c.pad_token_id && (*c.pad_token_id < 0 || *c.pad_token_id >= c.vocab_size))
    j.fail("pad_token_id", fmt::format("pad_token_id {} is outside the vocabulary of {} tokens",
                                       *c.pad_token_id, c.vocab_size));
  parse_activation(c.hidden_act, j.file() + ": field 'hidden_act'");
  return c;
}

namespace {

class BertLayerImpl : public torch::nn::Module, public FfnSlot {
 public:
  BertLayerImpl(const BertConfig& c, int64_t index, std::string prefix)
      : c_(c), index_(index), prefix_(std::move(prefix)) {
    auto lin = [](int64_t in, int64_t out) { return Linear(LinearOptions{in, out, true, false}); };
    auto attention = register_module("attention", container());
    auto self = attention->register_module("self", container());
    query_ = self->register_module("query", lin(c.hidden_size, c.hidden_size));
    key_ = self->register_module("key", lin(c.hidden_size, c.hidden_size));
    value_ = self->register_module("value", lin(c.hidden_size, c.hidden_size));
    auto attn_out = attention->register_module("output", container());
    attn_dense_ = attn_out->register_module("dense", lin(c.hidden_size, c.hidden_size));
    attn_norm_ = attn_out->register_module("LayerNorm", LayerNorm(c.hidden_size, c.layer_norm_eps));
    auto intermediate = register_module("intermediate", container());
    inter_dense_ = intermediate->register_module("dense", lin(c.hidden_size, c.intermediate_size));
    auto output = register_module("output", container());
    out_dense_ = output->register_module("dense", lin(c.intermediate_size, c.hidden_size));
    out_norm_ = output->register_module("LayerNorm", LayerNorm(c.hidden_size, c.layer_norm_eps));
    act_ = parse_activation(c.hidden_act, "hidden_act");
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& block_mask,
                        const torch::Tensor& token_mask, torch::Tensor* probs) {
    const int64_t heads = c_.num_attention_heads;
    auto qkv = fused_linear({query_.get(), key_.get(), value_.get()}, x);
    auto q = split_heads(qkv[0], heads);
    auto k = split_heads(qkv[1], heads);
    auto v = split_heads(qkv[2], heads);
    double scale = 1.0 / std::sqrt(static_cast<double>(c_.hidden_size / heads));
    auto ctx = merge_heads(scaled_attention(q, k, v, block_mask, scale,
                                            c_.attention_probs_dropout_prob, is_training(), probs));
    // the hidden dropouts inside the residual LayerNorms' passes
    const double p = is_training() ? c_.hidden_dropout_prob : 0.0;
    auto h = attn_norm_->forward_residual(attn_dense_(ctx), x, p);
    return out_norm_->forward_residual(run_ffn(h, token_mask), h, p);
  }

  torch::Tensor ffn_hidden(const torch::Tensor& x) override {
    return inter_dense_->forward_activated(x, act_);
  }
  std::pair<torch::Tensor, torch::Tensor> ffn_preactivation(const torch::Tensor& x) override {
    return {inter_dense_(x), torch::Tensor()};
  }
  torch::Tensor ffn_output(const torch::Tensor& h) override { return out_dense_(h); }
  FfnView ffn_view() override {
    FfnView v;
    v.w_in = inter_dense_->weight;
    v.b_in = inter_dense_->bias;
    v.w_out = out_dense_->weight;
    v.b_out = out_dense_->bias;
    v.act = act_;
    return v;
  }
  torch::nn::Module& ffn_owner() override { return *this; }
  std::string ffn_prefix() const override { return prefix_; }
  std::string layer_prefix() const override { return prefix_; }
  int64_t layer_index() const override { return index_; }

 private:
  BertConfig c_;
  int64_t index_;
  std::string prefix_;
  Activation act_;
  Linear query_{nullptr}, key_{nullptr}, value_{nullptr}, attn_dense_{nullptr};
  Linear inter_dense_{nullptr}, out_dense_{nullptr};
  LayerNorm attn_norm_{nullptr}, out_norm_{nullptr};
};

class BertModelImpl : public PretrainedModelImpl {
 public:
  BertModelImpl(const BertConfig& c, Head head)
      : c_(c), head_(head), root_(c.roberta ? "roberta" : "bert") {
    auto bert = register_module(root_, container());
    auto emb = bert->register_module("embeddings", container());
    word_ =
        emb->register_module("word_embeddings", torch::nn::Embedding(c.vocab_size, c.hidden_size));
    pos_ = emb->register_module("position_embeddings",
                                torch::nn::Embedding(c.max_position_embeddings, c.hidden_size));
    type_ = emb->register_module("token_type_embeddings",
                                 torch::nn::Embedding(c.type_vocab_size, c.hidden_size));
    emb_norm_ = emb->register_module("LayerNorm", LayerNorm(c.hidden_size, c.layer_norm_eps));
    auto encoder = bert->register_module("encoder", container());
    auto layers = encoder->register_module("layer", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      auto layer =
          std::make_shared<BertLayerImpl>(c, i, fmt::format("{}.encoder.layer.{}", root_, i));
      layers->push_back(layer);
      layers_.push_back(layer);
    }
    auto lin = [](int64_t in, int64_t out) { return Linear(LinearOptions{in, out, true, false}); };
    // RoBERTa's task models have no pooler (add_pooling_layer=False); BERT's MLM has none either
    if (c.roberta ? head == Head::kBase : head != Head::kMaskedLM) {
      auto pooler = bert->register_module("pooler", container());
      pooler_ = pooler->register_module("dense", lin(c.hidden_size, c.hidden_size));
    }
    if (head == Head::kSequenceClassification && c.roberta) {
      auto cls = register_module("classifier", container());
      cls_dense_ = cls->register_module("dense", lin(c.hidden_size, c.hidden_size));
      classifier_ = cls->register_module("out_proj", lin(c.hidden_size, c.num_labels));
    } else if (head == Head::kSequenceClassification) {
      classifier_ = register_module("classifier", lin(c.hidden_size, c.num_labels));
    }
    if (head == Head::kMaskedLM && c.roberta) {
      auto lm = register_module("lm_head", container());
      mlm_dense_ = lm->register_module("dense", lin(c.hidden_size, c.hidden_size));
      mlm_norm_ = lm->register_module("layer_norm", LayerNorm(c.hidden_size, c.layer_norm_eps));
      mlm_bias_ = lm->register_parameter("bias", torch::zeros({c.vocab_size}));
    } else if (head == Head::kMaskedLM) {
      auto cls = register_module("cls", container());
      auto pred = cls->register_module("predictions", container());
      auto transform = pred->register_module("transform", container());
      mlm_dense_ = transform->register_module("dense", lin(c.hidden_size, c.hidden_size));
      mlm_norm_ =
          transform->register_module("LayerNorm", LayerNorm(c.hidden_size, c.layer_norm_eps));
      mlm_bias_ = pred->register_parameter("bias", torch::zeros({c.vocab_size}));
    }
    summary_.model_type = root_;
    summary_.head = head;
    summary_.causal = false;
    summary_.num_layers = c.num_hidden_layers;
    summary_.hidden_size = c.hidden_size;
    summary_.num_heads = summary_.num_kv_heads = c.num_attention_heads;
    summary_.intermediate_size = c.intermediate_size;
    summary_.vocab_size = c.vocab_size;
    summary_.max_positions = c.max_position_embeddings;
    summary_.learned_positions = true;
    summary_.num_labels = head == Head::kSequenceClassification ? c.num_labels : 0;
    summary_.pad_token_id = c.pad_token_id;
    summary_.activation = c.hidden_act;
    init_weights();
  }

  void init_weights() {
    torch::NoGradGuard g;
    for (auto& p : named_parameters()) {
      const auto& k = p.key();
      if (k.find("LayerNorm") != std::string::npos || k.find("layer_norm") != std::string::npos) {
        if (k.size() >= 6 && k.substr(k.size() - 6) == "weight")
          p.value().fill_(1.0);
        else
          p.value().zero_();
      } else if (k.size() >= 4 && k.substr(k.size() - 4) == "bias") {
        p.value().zero_();
      } else {
        p.value().normal_(0.0, c_.initializer_range);
      }
    }
    if (c_.pad_token_id) word_->weight[*c_.pad_token_id].zero_();
  }

  ModelOutputs forward(const ModelInputs& in) override {
    const auto& ids = in.input_ids;
    EMOE_CHECK(ids.dim() == 2, InputError, "input_ids: expected [batch, seq], got {} dims",
               ids.dim());
    const int64_t b = ids.size(0), t = ids.size(1);
    // RoBERTa's positions start after padding_idx
    const int64_t offset = c_.roberta ? *c_.pad_token_id + 1 : 0;
    EMOE_CHECK(t + offset <= c_.max_position_embeddings, InputError,
               "input_ids: sequence length {} exceeds max_position_embeddings {}{}", t,
               c_.max_position_embeddings,
               offset ? fmt::format(" less padding_idx + 1 ({})", offset) : "");
    auto dev = word_->weight.device();
    auto ids_d = ids.to(dev);
    torch::Tensor pos;
    if (in.position_ids.defined()) {
      pos = in.position_ids.to(dev);
    } else if (c_.roberta) {
      // Hugging Face's create_position_ids_from_input_ids: padding_idx + the count of real tokens
      // so far at real tokens, padding_idx at pads, whatever the padding side
      auto real = ids_d.ne(*c_.pad_token_id).to(torch::kLong);
      pos = torch::cumsum(real, 1) * real + *c_.pad_token_id;
    } else {
      pos = torch::arange(t, torch::TensorOptions().dtype(torch::kLong).device(dev))
                .unsqueeze(0)
                .expand({b, t});
    }
    auto types = in.token_type_ids.defined() ? in.token_type_ids.to(dev)
                                             : torch::zeros({b, t}, ids_d.options());
    if (in.token_type_ids.defined()) {  // an id past the table indexes nothing
      const auto lo = types.min().item<int64_t>(), hi = types.max().item<int64_t>();
      EMOE_CHECK(lo >= 0 && hi < c_.type_vocab_size, InputError,
                 "token_type_ids: ids must lie in [0, {}) (config.json type_vocab_size), found "
                 "{}..{}",
                 c_.type_vocab_size, lo, hi);
    }
    auto h = word_(ids_d) + type_(types) + pos_(pos);
    h = emb_norm_(h);
    h = emoe::dropout(h, c_.hidden_dropout_prob, is_training());
    ModelOutputs out;
    if (in.output_hidden_states) out.hidden_states.push_back(h);
    auto block = build_block_mask(in.attention_mask, t, t, /*causal=*/false, dev);
    torch::Tensor token_mask =
        in.attention_mask.defined() ? in.attention_mask.to(dev) : torch::Tensor();
    for (size_t i = 0; i < layers_.size(); ++i) {
      torch::Tensor probs;
      // (probs: asked for only in a plain run, which calls the lambda at once)
      auto* want = in.output_attentions ? &probs : nullptr;
      const std::weak_ptr<BertLayerImpl> layer = layers_[i];
      h = run_block(
          i, *layers_[i], {h},
          [layer, block, token_mask, want](const std::vector<torch::Tensor>& x) {
            return lock_block(layer)->forward(x[0], block, token_mask, want);
          },
          want != nullptr);
      if (in.output_attentions) out.attentions.push_back(probs);
      if (in.output_hidden_states) out.hidden_states.push_back(h);
    }
    out.last_hidden_state = h;
    if (pooler_) out.pooler_output = torch::tanh(pooler_(h.select(1, 0)));
    if (head_ == Head::kSequenceClassification) {
      const double p = c_.classifier_dropout.value_or(c_.hidden_dropout_prob);
      if (c_.roberta) {  // RobertaClassificationHead on <s>: dense, tanh, out_proj
        auto x = emoe::dropout(h.select(1, 0), p, is_training());
        x = emoe::dropout(torch::tanh(cls_dense_(x)), p, is_training());
        out.logits = classifier_(x);
      } else {
        out.logits = classifier_(emoe::dropout(out.pooler_output, p, is_training()));
      }
      if (in.labels.defined())
        out.loss =
            sequence_classification_loss(out.logits, in.labels, c_.num_labels, c_.problem_type);
    } else if (head_ == Head::kMaskedLM) {
      auto x = mlm_norm_(activate(mlm_dense_(h), parse_activation(c_.hidden_act, "hidden_act")));
      out.logits = torch::linear(x, word_->weight, mlm_bias_);
      if (in.labels.defined()) out.loss = token_cross_entropy(out.logits, in.labels);
    }
    return out;
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
    auto replace_suffix = [&](const std::string& from, const std::string& to) {
      if (k.size() > from.size() && k.compare(k.size() - from.size(), from.size(), from) == 0)
        k = k.substr(0, k.size() - from.size()) + to;
    };
    replace_suffix("LayerNorm.gamma", "LayerNorm.weight");
    replace_suffix("LayerNorm.beta", "LayerNorm.bias");
    auto starts = [&](const std::string& p) { return k.rfind(p, 0) == 0; };
    if (c_.roberta) {
      if (!starts("roberta.") && !starts("lm_head.") && !starts("classifier.")) k = "roberta." + k;
      if (k == "roberta.embeddings.position_ids" || k == "roberta.embeddings.token_type_ids")
        return "";                                                                  // buffers
      if (k == "lm_head.decoder.weight" || k == "lm_head.decoder.bias") return "";  // tied
      return k;
    }
    if (!starts("bert.") && !starts("cls.") && !starts("classifier.")) k = "bert." + k;
    if (k == "bert.embeddings.position_ids") return "";  // a non-persistent buffer in new files
    if (k == "cls.predictions.decoder.weight" || k == "cls.predictions.decoder.bias")
      return "";                                     // tied
    if (starts("cls.seq_relationship.")) return "";  // BertForPreTraining's NSP head: unused
    return k;
  }
  std::string file_key(const std::string& module_key) const override {
    const std::string root = root_ + ".";
    if (head_ == Head::kBase && module_key.rfind(root, 0) == 0)
      return module_key.substr(root.size());
    return module_key;
  }
  bool is_head_key(const std::string& k) const override {
    return k.rfind("classifier.", 0) == 0 || k.rfind("cls.", 0) == 0 ||
           k.rfind("lm_head.", 0) == 0 || k.rfind(root_ + ".pooler.", 0) == 0;
  }
  void init_head() override {
    torch::NoGradGuard g;
    for (auto& p : named_parameters()) {
      if (!is_head_key(p.key())) continue;
      const auto& k = p.key();
      if (k.find("LayerNorm.weight") != std::string::npos ||
          k.find("layer_norm.weight") != std::string::npos)
        p.value().fill_(1.0);
      else if (k.size() >= 4 && k.substr(k.size() - 4) == "bias")
        p.value().zero_();
      else
        p.value().normal_(0.0, c_.initializer_range);
    }
  }
  torch::Tensor input_embeddings() override { return word_->weight; }

 private:
  BertConfig c_;
  Head head_;
  std::string root_;  // "bert" or "roberta"
  ModelSummary summary_;
  torch::nn::Embedding word_{nullptr}, pos_{nullptr}, type_{nullptr};
  LayerNorm emb_norm_{nullptr};
  std::vector<std::shared_ptr<BertLayerImpl>> layers_;
  Linear pooler_{nullptr}, classifier_{nullptr}, mlm_dense_{nullptr}, cls_dense_{nullptr};
  LayerNorm mlm_norm_{nullptr};
  torch::Tensor mlm_bias_;
};

}  // namespace

Head bert_head_from_config(const JsonFields& config) {
  const std::string arch = first_architecture(config);
  if (arch == "BertForSequenceClassification") return Head::kSequenceClassification;
  if (arch == "BertForMaskedLM" || arch == "BertForPreTraining") return Head::kMaskedLM;
  return Head::kBase;
}

ModelPtr make_bert(const JsonFields& config, Head head) {
  const std::string architecture =
      head_class("BERT", head,
                 {{Head::kBase, "BertModel"},
                  {Head::kSequenceClassification, "BertForSequenceClassification"},
                  {Head::kMaskedLM, "BertForMaskedLM"}});
  auto model = std::make_shared<BertModelImpl>(BertConfig::from_json(config), head);
  model->set_config_json(config_with_architecture(config, architecture));
  return model;
}

Head roberta_head_from_config(const JsonFields& config) {
  const std::string arch = first_architecture(config);
  if (arch == "RobertaForSequenceClassification") return Head::kSequenceClassification;
  if (arch == "RobertaForMaskedLM") return Head::kMaskedLM;
  return Head::kBase;
}

ModelPtr make_roberta(const JsonFields& config, Head head) {
  const std::string architecture =
      head_class("RoBERTa", head,
                 {{Head::kBase, "RobertaModel"},
                  {Head::kSequenceClassification, "RobertaForSequenceClassification"},
                  {Head::kMaskedLM, "RobertaForMaskedLM"}});
  auto model = std::make_shared<BertModelImpl>(BertConfig::from_json(config, true), head);
  model->set_config_json(config_with_architecture(config, architecture));
  return model;
}

namespace {

nlohmann::json bert_pretrain_config(const PretrainShape& s) {
  return {{"model_type", "bert"},
          {"architectures", {"BertForMaskedLM"}},
          {"vocab_size", s.vocab_size},
          {"hidden_size", s.hidden},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.heads},
          {"intermediate_size", s.intermediate},
          {"max_position_embeddings", s.max_positions},
          {"type_vocab_size", 2},
          {"hidden_act", "gelu"},
          {"hidden_dropout_prob", 0.1},
          {"attention_probs_dropout_prob", 0.1},
          {"layer_norm_eps", 1e-12},
          {"initializer_range", 0.02},
          {"pad_token_id", s.pad.value_or(0)}};
}

}  // namespace

const Architecture& bert_architecture() {
  static const Architecture a = [] {
    Architecture t;
    t.model_type = "bert";
    t.display_name = "BERT";
    t.class_prefixes = {"Bert"};
    t.ffn_keys = "intermediate.dense";
    // "layer.*.output.dense": plain "output.dense" would also catch attention.output.dense
    t.peft.lora = {"query", "value"};
    t.peft.scaling = {"key", "value", "layer.*.output.dense"};
    t.peft.feedforward = {"layer.*.output.dense"};
    t.peft.library_feedforward = {"output.dense"};
    t.pretrained_head_prefixes = {"bert.pooler.", "cls.", "lm_head."};
    t.pooled_classifier = true;
    t.pretrain_objective = PretrainObjective::kMaskedLM;
    t.pretrain_config = bert_pretrain_config;
    t.default_head = bert_head_from_config;
    t.make = make_bert;
    return t;
  }();
  return a;
}

namespace {

nlohmann::json roberta_pretrain_config(const PretrainShape& s) {
  const int64_t pad = s.pad.value_or(1);
  return {{"model_type", "roberta"},
          {"architectures", {"RobertaForMaskedLM"}},
          {"vocab_size", s.vocab_size},
          {"hidden_size", s.hidden},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.heads},
          {"intermediate_size", s.intermediate},
          {"max_position_embeddings", s.max_positions + pad + 1},  // positions start at pad + 1
          {"type_vocab_size", 1},
          {"hidden_act", "gelu"},
          {"hidden_dropout_prob", 0.1},
          {"attention_probs_dropout_prob", 0.1},
          {"layer_norm_eps", 1e-5},
          {"initializer_range", 0.02},
          {"pad_token_id", pad},
          {"bos_token_id", s.bos.value_or(0)},
          {"eos_token_id", s.eos.value_or(2)}};
}

}  // namespace

const Architecture& roberta_architecture() {
  static const Architecture a = [] {
    Architecture t = bert_architecture();
    t.model_type = "roberta";
    t.display_name = "RoBERTa";
    t.class_prefixes = {"Roberta"};
    t.pretrained_head_prefixes = {"roberta.pooler.", "lm_head."};
    t.pretrain_config = roberta_pretrain_config;
    t.default_head = roberta_head_from_config;
    t.make = make_roberta;
    return t;
  }();
  return a;
}

}  // namespace emoe
