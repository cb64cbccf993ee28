// T5: config, modules named as Hugging Face's, relative position bias, encoder-decoder forward
// with a decoder KV cache, and the FFN slots of both stacks.
#include "emoe/models/t5.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "emoe/core/error.h"
#include "emoe/models/dropout.h"
#include "emoe/models/linear.h"
#include "emoe/models/norms.h"
#include "emoe/models/recompute.h"

namespace emoe {

T5Config T5Config::from_json(const JsonFields& j) {
  T5Config c;
  c.vocab_size = j.get_int("vocab_size", c.vocab_size);
  c.d_model = j.get_int("d_model", c.d_model);
  c.d_kv = j.get_int("d_kv", c.d_kv);
  c.d_ff = j.get_int("d_ff", c.d_ff);
  c.num_layers = j.get_int("num_layers", c.num_layers);
  c.num_decoder_layers = j.get_int("num_decoder_layers", c.num_layers);
  c.num_heads = j.get_int("num_heads", c.num_heads);
  c.relative_attention_num_buckets =
      j.get_int("relative_attention_num_buckets", c.relative_attention_num_buckets);
  c.relative_attention_max_distance =
      j.get_int("relative_attention_max_distance", c.relative_attention_max_distance);
  c.n_positions = j.get_int("n_positions", c.n_positions);
  c.dropout_rate = j.get_probability("dropout_rate", c.dropout_rate);
  c.layer_norm_epsilon = j.get_double("layer_norm_epsilon", c.layer_norm_epsilon);
  c.initializer_factor = j.get_double("initializer_factor", c.initializer_factor);
  c.tie_word_embeddings = j.get_bool("tie_word_embeddings", true);
  auto first_id = [&](const char* k, int64_t fallback) {
    auto v = j.get_int_list(k);
    return v.empty() ? fallback : v[0];
  };
  c.pad_token_id = first_id("pad_token_id", c.pad_token_id);
  c.eos_token_id = first_id("eos_token_id", c.eos_token_id);
  c.decoder_start_token_id = first_id("decoder_start_token_id", c.pad_token_id);

  // Hugging Face's T5Config: "ACT" or "gated-ACT"; "gated-gelu" means the tanh form (gelu_new).
  // Its dense_act_fn field is derived from feed_forward_proj, so it is not read here.
  c.feed_forward_proj = j.get_string("feed_forward_proj", c.feed_forward_proj);
  std::string act = c.feed_forward_proj;
  const std::string gated_prefix = "gated-";
  c.gated = act.rfind(gated_prefix, 0) == 0;
  if (c.gated) act = act.substr(gated_prefix.size());
  if (act.empty() || act.find('-') != std::string::npos)
    j.fail("feed_forward_proj",
           fmt::format("expected ACT or gated-ACT (e.g. relu, gated-gelu), got '{}'",
                       c.feed_forward_proj));
  if (c.feed_forward_proj == "gated-gelu") act = "gelu_new";
  c.act = parse_activation(act, j.file() + ": field 'feed_forward_proj'");

  for (auto [name, v] : {std::pair{"vocab_size", c.vocab_size},
                         {"d_model", c.d_model},
                         {"d_kv", c.d_kv},
                         {"d_ff", c.d_ff},
                         {"num_layers", c.num_layers},
                         {"num_decoder_layers", c.num_decoder_layers},
                         {"num_heads", c.num_heads},
                         {"relative_attention_num_buckets", c.relative_attention_num_buckets},
                         {"relative_attention_max_distance", c.relative_attention_max_distance}})
    if (v <= 0) j.fail(name, fmt::format("expected a positive integer, got {}", v));
  // The encoder's bidirectional buckets: half per direction, half of those exact.
  if (c.relative_attention_num_buckets < 4)
    j.fail("relative_attention_num_buckets",
           fmt::format("expected at least 4 buckets (2 exact ones per direction), got {}",
                       c.relative_attention_num_buckets));
  // The decoder's log-spaced buckets start at num_buckets / 2 and end at max_distance.
  if (c.relative_attention_max_distance <= c.relative_attention_num_buckets / 2)
    j.fail("relative_attention_max_distance",
           fmt::format("relative_attention_max_distance {} must exceed "
                       "relative_attention_num_buckets / 2 = {}",
                       c.relative_attention_max_distance, c.relative_attention_num_buckets / 2));
  if (!(c.dropout_rate >= 0 && c.dropout_rate < 1))
    j.fail("dropout_rate", fmt::format("expected a probability in [0, 1), got {}", c.dropout_rate));
  if (!(c.layer_norm_epsilon >= 0))
    j.fail("layer_norm_epsilon", fmt::format("expected >= 0, got {}", c.layer_norm_epsilon));
  for (auto [name, v] : {std::pair{"pad_token_id", c.pad_token_id},
                         {"eos_token_id", c.eos_token_id},
                         {"decoder_start_token_id", c.decoder_start_token_id}})
    if (v < 0 || v >= c.vocab_size)
      j.fail(name,
             fmt::format("{} {} is outside the vocabulary of {} tokens", name, v, c.vocab_size));
  return c;
}

at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, bool bidirectional,
                                       int64_t num_buckets, int64_t max_distance) {
  auto rp = relative_position;
  auto buckets = torch::zeros_like(rp);
  if (bidirectional) {
    num_buckets /= 2;
    buckets = buckets + (rp > 0).to(torch::kLong) * num_buckets;
    rp = rp.abs();
  } else {
    rp = -torch::min(rp, torch::zeros_like(rp));
  }
  // half of the buckets are for exact increments, the other half log-spaced up to max_distance
  const int64_t max_exact = num_buckets / 2;
  auto is_small = rp < max_exact;
  auto large =
      max_exact + (torch::log(rp.to(torch::kFloat) / static_cast<double>(max_exact)) /
                   std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)) *
                   static_cast<double>(num_buckets - max_exact))
                      .to(torch::kLong);
  large = torch::min(large, torch::full_like(large, num_buckets - 1));
  return buckets + torch::where(is_small, rp, large);
}

at::Tensor t5_shift_right(const at::Tensor& labels, int64_t decoder_start_token_id,
                          int64_t pad_token_id) {
  EMOE_CHECK(labels.dim() == 2 && labels.size(1) > 0, InputError,
             "labels: expected a non-empty [batch, seq] tensor, got {} dims", labels.dim());
  auto l = labels.to(torch::kLong);
  auto start = torch::full({l.size(0), 1}, decoder_start_token_id, l.options());
  auto shifted = torch::cat({start, l.narrow(1, 0, l.size(1) - 1)}, 1);
  return shifted.masked_fill(shifted == -100, pad_token_id);
}

namespace {

// T5Block keeps float16 activations finite (Hugging Face clamps after every sub-layer).
torch::Tensor t5_clamp_fp16(const torch::Tensor& h) {
  if (h.scalar_type() != torch::kHalf) return h;
  const double max = 65504.0;
  auto bound = torch::where(torch::isinf(h).any(), torch::full({}, max - 1000, h.options()),
                            torch::full({}, max, h.options()));
  return torch::clamp(h, -bound, bound);
}

Linear t5_linear(int64_t in, int64_t out) {
  return Linear(LinearOptions{in, out, false, false});
}

class T5AttentionImpl : public torch::nn::Module {
 public:
  T5AttentionImpl(const T5Config& c, bool has_relative_bias) : c_(c) {
    q_ = register_module("q", t5_linear(c.d_model, c.inner_dim()));
    k_ = register_module("k", t5_linear(c.d_model, c.inner_dim()));
    v_ = register_module("v", t5_linear(c.d_model, c.inner_dim()));
    o_ = register_module("o", t5_linear(c.inner_dim(), c.d_model));
    if (has_relative_bias)
      rel_ = register_module("relative_attention_bias",
                             torch::nn::Embedding(c.relative_attention_num_buckets, c.num_heads));
  }

  // [1, heads, T, S]: the learned bias of query positions past..past+T-1 over keys 0..S-1.
  torch::Tensor position_bias(int64_t past, int64_t t, int64_t s, bool bidirectional) {
    auto opts = torch::TensorOptions().dtype(torch::kLong).device(rel_->weight.device());
    auto context = torch::arange(past, past + t, opts).unsqueeze(1);
    auto memory = torch::arange(0, s, opts).unsqueeze(0);
    auto bucket = t5_relative_position_bucket(memory - context, bidirectional,
                                              c_.relative_attention_num_buckets,
                                              c_.relative_attention_max_distance);
    return rel_(bucket).permute({2, 0, 1}).unsqueeze(0);
  }

  // Self-attention when `source` is undefined (keys appended to `kv`), else cross-attention over
  // `source` (its keys and values computed once and kept in `kv`). `bias` is added to the scores:
  // position bias and mask, [1 or B, heads or 1, T, S]. T5 does not scale scores by 1/sqrt(d_kv).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& source,
                        const torch::Tensor& bias, LayerKv* kv, torch::Tensor* probs) {
    torch::Tensor q, k, v;
    if (!source.defined()) {
      auto qkv = fused_linear({q_.get(), k_.get(), v_.get()}, x);
      q = split_heads(qkv[0], c_.num_heads);
      std::tie(k, v) =
          append_kv(kv, split_heads(qkv[1], c_.num_heads), split_heads(qkv[2], c_.num_heads));
    } else {
      q = split_heads(q_(x), c_.num_heads);
      if (kv && kv->k.defined()) {
        k = kv->k;
        v = kv->v;
      } else {
        auto kvs = fused_linear({k_.get(), v_.get()}, source);
        // computed once: an empty cache keeps them for the next steps
        std::tie(k, v) =
            append_kv(kv, split_heads(kvs[0], c_.num_heads), split_heads(kvs[1], c_.num_heads));
      }
    }
    auto scores = torch::matmul(q, k.transpose(-2, -1));
    if (bias.defined()) scores = scores + bias;
    auto acc = q.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
    auto p = torch::softmax(scores, -1, acc).to(q.scalar_type());
    if (probs) *probs = p;
    p = emoe::dropout(p, c_.dropout_rate, is_training());
    return o_(merge_heads(torch::matmul(p, v)));
  }

 private:
  T5Config c_;
  Linear q_{nullptr}, k_{nullptr}, v_{nullptr}, o_{nullptr};
  torch::nn::Embedding rel_{nullptr};
};
TORCH_MODULE(T5Attention);

// One block: layer.0 self-attention, (decoder) layer.1 cross-attention, then the FFN, each
// pre-normed with a residual. The block is its FFN's slot.
class T5BlockImpl : public torch::nn::Module, public FfnSlot {
 public:
  T5BlockImpl(const T5Config& c, bool decoder, int64_t index, int64_t slot_index)
      : c_(c), decoder_(decoder), index_(index), slot_index_(slot_index) {
    auto layer = register_module("layer", container());
    auto self_layer = layer->register_module("0", container());
    self_attn_ = self_layer->register_module("SelfAttention", T5Attention(c, index == 0));
    self_norm_ =
        self_layer->register_module("layer_norm", RMSNorm(c.d_model, c.layer_norm_epsilon));
    if (decoder) {
      auto cross_layer = layer->register_module("1", container());
      cross_attn_ = cross_layer->register_module("EncDecAttention", T5Attention(c, false));
      cross_norm_ =
          cross_layer->register_module("layer_norm", RMSNorm(c.d_model, c.layer_norm_epsilon));
    }
    auto ff_layer = layer->register_module(decoder ? "2" : "1", container());
    mlp_ = ff_layer->register_module("DenseReluDense", container());
    wi_ = mlp_->register_module(c.gated ? "wi_0" : "wi", t5_linear(c.d_model, c.d_ff));
    if (c.gated) wi_up_ = mlp_->register_module("wi_1", t5_linear(c.d_model, c.d_ff));
    wo_ = mlp_->register_module("wo", t5_linear(c.d_ff, c.d_model));
    ff_norm_ = ff_layer->register_module("layer_norm", RMSNorm(c.d_model, c.layer_norm_epsilon));
  }

  T5AttentionImpl& self_attention() { return *self_attn_; }

  torch::Tensor forward(torch::Tensor h, const torch::Tensor& self_bias,
                        const torch::Tensor& encoder, const torch::Tensor& cross_bias,
                        const torch::Tensor& token_mask, LayerKv* self_kv, LayerKv* cross_kv,
                        torch::Tensor* self_probs, torch::Tensor* cross_probs) {
    const bool train = is_training();
    h = h + emoe::dropout(
                self_attn_->forward(self_norm_(h), torch::Tensor(), self_bias, self_kv, self_probs),
                c_.dropout_rate, train);
    h = t5_clamp_fp16(h);
    if (cross_attn_) {
      h = h + emoe::dropout(
                  cross_attn_->forward(cross_norm_(h), encoder, cross_bias, cross_kv, cross_probs),
                  c_.dropout_rate, train);
      h = t5_clamp_fp16(h);
    }
    h = h + emoe::dropout(run_ffn(ff_norm_(h), token_mask), c_.dropout_rate, train);
    return t5_clamp_fp16(h);
  }

  // v1.0: relu(wi x); v1.1: act(wi_0 x) * wi_1 x (wi_0 rows are the keys).
  torch::Tensor ffn_hidden(const torch::Tensor& x) override {
    return wi_up_ ? activate_gated(wi_(x), wi_up_(x), c_.act) : activate(wi_(x), c_.act);
  }
  std::pair<torch::Tensor, torch::Tensor> ffn_preactivation(const torch::Tensor& x) override {
    return {wi_(x), wi_up_ ? wi_up_(x) : torch::Tensor()};
  }
  // Hugging Face's dropout between the activation and wo lives here, so plugs keep it.
  torch::Tensor ffn_output(const torch::Tensor& h) override {
    return wo_(emoe::dropout(h, c_.dropout_rate, is_training()));
  }
  FfnView ffn_view() override {
    FfnView v;
    v.w_in = wi_->weight;
    if (wi_up_) v.w_up = wi_up_->weight;
    v.w_out = wo_->weight;
    v.act = c_.act;
    return v;
  }
  torch::nn::Module& ffn_owner() override { return *mlp_; }
  std::string ffn_prefix() const override {
    return fmt::format("{}.block.{}.layer.{}.DenseReluDense", decoder_ ? "decoder" : "encoder",
                       index_, decoder_ ? 2 : 1);
  }
  std::string layer_prefix() const override {
    return fmt::format("{}.block.{}", decoder_ ? "decoder" : "encoder", index_);
  }
  int64_t layer_index() const override { return slot_index_; }

 private:
  T5Config c_;
  bool decoder_;
  int64_t index_, slot_index_;
  T5Attention self_attn_{nullptr}, cross_attn_{nullptr};
  RMSNorm self_norm_{nullptr}, cross_norm_{nullptr}, ff_norm_{nullptr};
  Linear wi_{nullptr}, wi_up_{nullptr}, wo_{nullptr};
  std::shared_ptr<torch::nn::Module> mlp_;
};

// What a stack returns besides its output, when asked.
struct T5StackRecord {
  std::vector<torch::Tensor>* hidden = nullptr;
  std::vector<torch::Tensor>* attentions = nullptr;
  std::vector<torch::Tensor>* cross = nullptr;
  BlockHooks* hooks = nullptr;  // called around each block; block indices start at first_block
  bool checkpoint = false;      // activation checkpointing of each block (recompute.h)
  size_t first_block = 0;
};

class T5StackImpl : public torch::nn::Module {
 public:
  // slot_offset: the FFN slot index of block 0 (the decoder's follow the encoder's).
  T5StackImpl(const T5Config& c, bool decoder, int64_t slot_offset) : c_(c), decoder_(decoder) {
    const int64_t n = decoder ? c.num_decoder_layers : c.num_layers;
    auto blocks = register_module("block", torch::nn::ModuleList());
    for (int64_t i = 0; i < n; ++i) {
      auto b = std::make_shared<T5BlockImpl>(c, decoder, i, slot_offset + i);
      blocks->push_back(b);
      blocks_.push_back(b);
    }
    final_norm_ = register_module("final_layer_norm", RMSNorm(c.d_model, c.layer_norm_epsilon));
  }

  const std::vector<std::shared_ptr<T5BlockImpl>>& blocks() const { return blocks_; }

  // x: embedded tokens [B, T, d]. mask: [B, past + T] (1 = real token) or undefined. Decoder:
  // encoder output [B, S, d] and its mask [B, S] (or undefined); cache extended in place.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask,
                        const torch::Tensor& encoder, const torch::Tensor& encoder_mask,
                        KvCache* cache, const T5StackRecord& rec) {
    const bool train = is_training();
    const int64_t t = x.size(1);
    const int64_t past = cache ? cache->length() : 0;
    const auto dev = x.device();
    if (cache && cache->layers.empty()) {
      cache->layers.resize(blocks_.size());
      cache->cross.resize(blocks_.size());
    }
    // Position bias from block 0, shared by every block, with the mask folded in as Hugging
    // Face's T5Stack does (finfo.min at blocked positions).
    auto bias = blocks_[0]
                    ->self_attention()
                    .position_bias(past, t, past + t, !decoder_)
                    .to(x.scalar_type());
    auto blocked = build_block_mask(mask, t, past + t, /*causal=*/decoder_, dev);
    if (blocked.defined()) bias = bias.masked_fill(blocked, lowest_value(bias.scalar_type()));
    torch::Tensor cross_bias;
    if (decoder_ && encoder_mask.defined()) {
      auto m = encoder_mask.to(dev);
      cross_bias = torch::zeros({m.size(0), 1, 1, m.size(1)}, x.options())
                       .masked_fill((m == 0).view({m.size(0), 1, 1, m.size(1)}),
                                    lowest_value(x.scalar_type()));
    }
    torch::Tensor token_mask;
    if (mask.defined()) token_mask = mask.to(dev).narrow(1, mask.size(1) - t, t);

    auto h = emoe::dropout(x, c_.dropout_rate, train);
    for (size_t i = 0; i < blocks_.size(); ++i) {
      if (rec.hidden) rec.hidden->push_back(h);
      torch::Tensor self_probs, cross_probs;
      const bool want = rec.attentions != nullptr;
      // (cache and probabilities: only in a plain run, which calls the lambda at once; the
      // position bias and the encoder's output may need gradients: inputs of the block)
      auto* self_kv = cache ? &cache->layers[i] : nullptr;
      auto* cross_kv = cache ? &cache->cross[i] : nullptr;
      auto* self_p = want ? &self_probs : nullptr;
      auto* cross_p = want && decoder_ ? &cross_probs : nullptr;
      const std::weak_ptr<T5BlockImpl> block = blocks_[i];
      h = run_block(rec.hooks, rec.first_block + i, *blocks_[i],
                    rec.checkpoint && train && !cache && !want, {h, bias, encoder, cross_bias},
                    [block, token_mask, self_kv, cross_kv, self_p,
                     cross_p](const std::vector<torch::Tensor>& x) {
                      return lock_block(block)->forward(x[0], x[1], x[2], x[3], token_mask, self_kv,
                                                        cross_kv, self_p, cross_p);
                    });
      if (want) rec.attentions->push_back(self_probs);
      if (want && decoder_ && rec.cross) rec.cross->push_back(cross_probs);
    }
    h = emoe::dropout(final_norm_(h), c_.dropout_rate, train);
    if (rec.hidden) rec.hidden->push_back(h);
    return h;
  }

 private:
  T5Config c_;
  bool decoder_;
  std::vector<std::shared_ptr<T5BlockImpl>> blocks_;
  RMSNorm final_norm_{nullptr};
};

torch::Tensor t5_check_ids(const torch::Tensor& t, const char* name) {
  EMOE_CHECK(t.dim() == 2 && t.size(1) > 0, InputError,
             "{}: expected a non-empty [batch, seq] tensor, got shape [{}]", name,
             fmt::join(t.sizes(), ", "));
  return t;
}

class T5ModelImpl : public PretrainedModelImpl {
 public:
  T5ModelImpl(const T5Config& c, Head head) : c_(c), head_(head) {
    shared_ = register_module("shared", torch::nn::Embedding(c.vocab_size, c.d_model));
    encoder_ = register_module("encoder", std::make_shared<T5StackImpl>(c, false, 0));
    decoder_ = register_module("decoder", std::make_shared<T5StackImpl>(c, true, c.num_layers));
    if (head == Head::kSeq2SeqLM && !c.tie_word_embeddings)
      lm_head_ = register_module("lm_head", t5_linear(c.d_model, c.vocab_size));
    summary_.model_type = "t5";
    summary_.head = head;
    summary_.causal = false;
    summary_.gated_ffn = c.gated;
    summary_.num_layers = c.num_layers;
    summary_.num_decoder_layers = c.num_decoder_layers;
    summary_.hidden_size = c.d_model;
    summary_.num_heads = c.num_heads;
    summary_.num_kv_heads = c.num_heads;
    summary_.head_dim = c.d_kv;
    summary_.intermediate_size = c.d_ff;
    summary_.vocab_size = c.vocab_size;
    summary_.max_positions = c.n_positions;
    summary_.eos_token_id = c.eos_token_id;
    summary_.pad_token_id = c.pad_token_id;
    summary_.decoder_start_token_id = c.decoder_start_token_id;
    summary_.activation = c.feed_forward_proj;
    init_weights();
  }

  // Hugging Face's T5PreTrainedModel._init_weights.
  void init_weights() {
    torch::NoGradGuard g;
    const double f = c_.initializer_factor;
    const double dm = static_cast<double>(c_.d_model);
    auto ends = [](const std::string& k, const std::string& s) {
      return k.size() >= s.size() && k.compare(k.size() - s.size(), s.size(), s) == 0;
    };
    for (auto& p : named_parameters()) {
      const auto& k = p.key();
      auto& w = p.value();
      if (ends(k, "layer_norm.weight"))
        w.fill_(f);
      else if (k == "shared.weight" || k == "lm_head.weight")
        w.normal_(0.0, f);
      else if (ends(k, ".wi.weight") || ends(k, ".wi_0.weight") || ends(k, ".wi_1.weight"))
        w.normal_(0.0, f * std::pow(dm, -0.5));
      else if (ends(k, ".wo.weight"))
        w.normal_(0.0, f * std::pow(static_cast<double>(c_.d_ff), -0.5));
      else if (ends(k, ".q.weight"))
        w.normal_(0.0, f * std::pow(dm * static_cast<double>(c_.d_kv), -0.5));
      else if (ends(k, ".k.weight") || ends(k, ".v.weight") ||
               ends(k, "relative_attention_bias.weight"))
        w.normal_(0.0, f * std::pow(dm, -0.5));
      else if (ends(k, ".o.weight"))
        w.normal_(0.0, f * std::pow(static_cast<double>(c_.inner_dim()), -0.5));
    }
  }

  ModelOutputs forward(const ModelInputs& in) override {
    ModelOutputs out;
    const auto dev = shared_->weight.device();
    torch::Tensor enc_mask;
    if (in.attention_mask.defined())
      enc_mask = t5_check_ids(in.attention_mask, "attention_mask").to(dev);
    torch::Tensor enc;
    if (in.encoder_last_hidden_state.defined()) {
      enc = in.encoder_last_hidden_state.to(dev);
    } else {
      EMOE_CHECK(in.input_ids.defined(), InputError, "input_ids: required by the T5 encoder");
      auto ids = t5_check_ids(in.input_ids, "input_ids").to(dev);
      if (enc_mask.defined())
        EMOE_CHECK(enc_mask.sizes() == ids.sizes(), InputError,
                   "attention_mask: shape [{}] differs from input_ids [{}]",
                   fmt::join(enc_mask.sizes(), ", "), fmt::join(ids.sizes(), ", "));
      T5StackRecord rec;
      if (in.output_hidden_states) rec.hidden = &out.encoder_hidden_states;
      if (in.output_attentions) rec.attentions = &out.encoder_attentions;
      rec.hooks = block_hooks_;
      rec.checkpoint = checkpointing_;
      enc = encoder_->forward(shared_(ids), enc_mask, {}, {}, nullptr, rec);
    }
    if (enc_mask.defined())
      EMOE_CHECK(enc_mask.size(0) == enc.size(0) && enc_mask.size(1) == enc.size(1), InputError,
                 "attention_mask: shape [{}] does not match the encoder output [{}, {}]",
                 fmt::join(enc_mask.sizes(), ", "), enc.size(0), enc.size(1));
    out.encoder_last_hidden_state = enc;

    torch::Tensor dec_ids;
    if (in.decoder_input_ids.defined())
      dec_ids = t5_check_ids(in.decoder_input_ids, "decoder_input_ids");
    else if (in.labels.defined() && head_ == Head::kSeq2SeqLM)
      dec_ids = t5_shift_right(in.labels, c_.decoder_start_token_id, c_.pad_token_id);
    else
      EMOE_THROW(InputError,
                 "decoder_input_ids: required by the T5 decoder (or labels, which are "
                 "shifted right to make them)");
    dec_ids = dec_ids.to(dev).to(torch::kLong);
    EMOE_CHECK(dec_ids.size(0) == enc.size(0), InputError,
               "decoder_input_ids: batch {} differs from the encoder's {}", dec_ids.size(0),
               enc.size(0));
    const int64_t past = in.cache ? in.cache->length() : 0;
    torch::Tensor dec_mask;
    if (in.decoder_attention_mask.defined()) {
      dec_mask = t5_check_ids(in.decoder_attention_mask, "decoder_attention_mask").to(dev);
      EMOE_CHECK(dec_mask.size(0) == dec_ids.size(0) && dec_mask.size(1) == past + dec_ids.size(1),
                 InputError, "decoder_attention_mask: expected shape [{}, {}], got [{}]",
                 dec_ids.size(0), past + dec_ids.size(1), fmt::join(dec_mask.sizes(), ", "));
    }
    T5StackRecord rec;
    if (in.output_hidden_states) rec.hidden = &out.hidden_states;
    if (in.output_attentions) {
      rec.attentions = &out.attentions;
      rec.cross = &out.cross_attentions;
    }
    rec.hooks = block_hooks_;
    rec.checkpoint = checkpointing_;
    rec.first_block = encoder_->blocks().size();
    auto h = decoder_->forward(shared_(dec_ids), dec_mask, enc, enc_mask, in.cache, rec);
    out.last_hidden_state = h;
    if (head_ == Head::kSeq2SeqLM) {
      // tied (v1.0): rescale before projecting onto the embedding matrix
      if (c_.tie_word_embeddings) h = h * std::pow(static_cast<double>(c_.d_model), -0.5);
      out.logits = lm_head_ ? lm_head_(h) : torch::linear(h, shared_->weight);
      if (in.labels.defined()) {
        EMOE_CHECK(in.labels.dim() == 2 && in.labels.size(0) == dec_ids.size(0) &&
                       in.labels.size(1) == dec_ids.size(1),
                   InputError, "labels: shape [{}] differs from decoder_input_ids [{}]",
                   fmt::join(in.labels.sizes(), ", "), fmt::join(dec_ids.sizes(), ", "));
        out.loss = token_cross_entropy(out.logits, in.labels.to(torch::kLong));
      }
    }
    return out;
  }

  const ModelSummary& summary() const override { return summary_; }
  std::vector<FfnSlot*> ffn_slots() override {
    std::vector<FfnSlot*> out;
    for (auto* stack : {encoder_.get(), decoder_.get()})
      for (auto& b : stack->blocks()) out.push_back(b.get());
    return out;
  }
  std::vector<torch::nn::Module*> blocks() override {
    std::vector<torch::nn::Module*> out;
    for (auto* stack : {encoder_.get(), decoder_.get()})
      for (auto& b : stack->blocks()) out.push_back(b.get());
    return out;
  }
  // The stack computes the position bias from block 0's table before the first block runs.
  bool read_outside_block(const std::string& key_in_block) const override {
    const std::string s = "relative_attention_bias.weight";
    return key_in_block.size() >= s.size() &&
           key_in_block.compare(key_in_block.size() - s.size(), s.size(), s) == 0;
  }

  std::string module_key(const std::string& file_key) const override {
    // copies of the tied `shared` embedding, and a tensor old checkpoints carry that Hugging
    // Face ignores as well (cross-attention has no position bias)
    if (file_key == "encoder.embed_tokens.weight" || file_key == "decoder.embed_tokens.weight" ||
        file_key == "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight")
      return "";
    if (file_key == "lm_head.weight" && !lm_head_ && c_.tie_word_embeddings) return "";
    return file_key;
  }
  std::string file_key(const std::string& module_key) const override { return module_key; }
  bool is_head_key(const std::string& k) const override { return k.rfind("lm_head.", 0) == 0; }
  void init_head() override {
    torch::NoGradGuard g;
    if (lm_head_) lm_head_->weight.normal_(0.0, c_.initializer_factor);
  }
  torch::Tensor input_embeddings() override { return shared_->weight; }

 private:
  T5Config c_;
  Head head_;
  ModelSummary summary_;
  torch::nn::Embedding shared_{nullptr};
  std::shared_ptr<T5StackImpl> encoder_, decoder_;
  Linear lm_head_{nullptr};
};

}  // namespace

Head t5_head_from_config(const JsonFields& config) {
  const std::string arch = first_architecture(config);
  if (arch == "T5Model") return Head::kBase;
  // T5WithLMHeadModel: the class name in the original t5-small..t5-11b configs
  if (arch.empty() || arch == "T5ForConditionalGeneration" || arch == "T5WithLMHeadModel")
    return Head::kSeq2SeqLM;
  config.fail(
      "architectures",
      fmt::format("'{}' is not supported (T5ForConditionalGeneration and T5Model are)", arch));
}

ModelPtr make_t5(const JsonFields& config, Head head) {
  EMOE_CHECK(
      head == Head::kBase || head == Head::kSeq2SeqLM, UsageError,
      "T5 supports the heads base (T5Model) and seq2seq-lm (T5ForConditionalGeneration), not {}",
      head_name(head));
  auto model = std::make_shared<T5ModelImpl>(T5Config::from_json(config), head);
  auto j = config.raw();
  j["architectures"] = {head == Head::kBase ? "T5Model" : "T5ForConditionalGeneration"};
  model->set_config_json(j);
  return model;
}

namespace {

// T5 v1.0 layout: ReLU FFN, tied embeddings; the decoder starts with pad as T5 does
nlohmann::json t5_pretrain_config(const PretrainShape& s) {
  return {{"model_type", "t5"},
          {"architectures", {"T5ForConditionalGeneration"}},
          {"vocab_size", s.vocab_size},
          {"d_model", s.hidden},
          {"d_kv", s.hidden / s.heads},
          {"d_ff", s.intermediate},
          {"num_layers", s.layers},
          {"num_decoder_layers", s.layers},
          {"num_heads", s.heads},
          {"relative_attention_num_buckets", 32},
          {"relative_attention_max_distance", 128},
          {"dropout_rate", 0.1},
          {"layer_norm_epsilon", 1e-6},
          {"initializer_factor", 1.0},
          {"feed_forward_proj", "relu"},
          {"tie_word_embeddings", true},
          {"is_encoder_decoder", true},
          {"pad_token_id", s.pad.value_or(0)},
          {"eos_token_id", s.eos.value_or(1)},
          {"decoder_start_token_id", s.pad.value_or(0)},
          {"n_positions", s.max_positions}};
}

}  // namespace

const Architecture& t5_architecture() {
  static const Architecture a = [] {
    Architecture t;
    t.model_type = "t5";
    t.display_name = "T5";
    t.class_prefixes = {"T5"};
    t.encoder_decoder = true;
    t.ffn_keys = "DenseReluDense.wi (v1.1: wi_0)";
    // PEFT's mappings; k, v (and q) also match the cross-attention's
    t.peft.lora = {"q", "v"};
    // MoLoRA where its paper ran it: every linear layer of the blocks (wi or wi_0 / wi_1, wo)
    t.peft.molora = {"q", "k", "v", "o", "DenseReluDense.*"};
    t.peft.scaling = {"k", "v", "wo"};
    t.peft.feedforward = {"wo"};
    t.peft.library_feedforward = {"wo"};
    t.pretrained_head_prefixes = {"lm_head."};
    t.pretrain_objective = PretrainObjective::kSpanCorruption;
    t.pretrain_config = t5_pretrain_config;
    t.default_head = t5_head_from_config;
    t.make = make_t5;
    return t;
  }();
  return a;
}

}  // namespace emoe
