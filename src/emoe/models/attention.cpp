// Attention math shared by every architecture.
#include "emoe/models/attention.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>

#include "emoe/core/autocast_compat.h"
#include "emoe/models/attention_amx.h"
#include "emoe/models/dropout.h"
#include "emoe/models/matmul.h"
#include "emoe/models/row_kernels.h"

namespace emoe {

int64_t KvCache::length() const {
  if (layers.empty() || !layers[0].k.defined()) return 0;
  return layers[0].k.size(2);
}

void LayerKv::select_rows(const at::Tensor& rows) {
  if (!k.defined()) return;
  const int64_t s = k.size(2);
  if (k_room.defined()) {
    k_room = k_room.index_select(0, rows);
    v_room = v_room.index_select(0, rows);
    k = k_room.narrow(2, 0, s);
    v = v_room.narrow(2, 0, s);
  } else {
    k = k.index_select(0, rows);
    v = v.index_select(0, rows);
  }
}

std::pair<at::Tensor, at::Tensor> append_kv(LayerKv* cache, const at::Tensor& k,
                                            const at::Tensor& v) {
  if (!cache) return {k, v};
  if (!cache->k.defined()) {  // the first step (a prompt, or cross-attention's keys) as it is
    cache->k = k;
    cache->v = v;
    return {k, v};
  }
  const int64_t past = cache->k.size(2), t = k.size(2), s = past + t;
  TORCH_CHECK(
      k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes() && cache->k.size(0) == k.size(0) &&
          cache->k.size(1) == k.size(1) && cache->k.size(3) == k.size(3),
      "append_kv: keys/values ", k.sizes(), " do not continue the cache ", cache->k.sizes());
  if (!cache->k_room.defined() || cache->k_room.size(2) < s ||
      cache->k_room.scalar_type() != k.scalar_type()) {
    const int64_t room = cache->reserve >= s ? cache->reserve : std::max<int64_t>(2 * s, 16);
    auto grow = [&](const at::Tensor& old) {
      auto sizes = old.sizes().vec();
      sizes[2] = room;
      auto buf = at::empty(sizes, k.options());
      buf.narrow(2, 0, past).copy_(old);
      return buf;
    };
    cache->k_room = grow(cache->k);
    cache->v_room = grow(cache->v);
  }
  cache->k_room.narrow(2, past, t).copy_(k);
  cache->v_room.narrow(2, past, t).copy_(v);
  cache->k = cache->k_room.narrow(2, 0, s);
  cache->v = cache->v_room.narrow(2, 0, s);
  return {cache->k, cache->v};
}

at::Tensor build_block_mask(const at::Tensor& attention_mask, int64_t t, int64_t s, bool causal,
                            const at::Device& device) {
  at::Tensor blocked;
  if (causal && t > 1) {
    // query i (absolute position s - t + i) may see keys j <= s - t + i
    auto q = torch::arange(s - t, s, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto k = torch::arange(0, s, torch::TensorOptions().dtype(torch::kLong).device(device));
    blocked = (k.unsqueeze(0) > q.unsqueeze(1)).view({1, 1, t, s});
  }
  // a mask without padding blocks nothing: no mask, and no masked_fill over every layer's scores
  // and their gradient (2 x 12 passes over 12 MiB on BERT-base at batch 16 x 128). Checked only
  // for a mask in host memory, where the check costs no device synchronisation.
  // (A mask of the wrong shape still takes the path below, which rejects it.)
  const bool no_padding = attention_mask.defined() && attention_mask.device().is_cpu() &&
                          attention_mask.dim() == 2 && attention_mask.size(1) == s &&
                          !(attention_mask == 0).any().item<bool>();
  if (attention_mask.defined() && !no_padding) {
    auto pad = (attention_mask.to(device) == 0).view({attention_mask.size(0), 1, 1, s});
    blocked = blocked.defined() ? torch::logical_or(blocked, pad) : pad;
  }
  return blocked;
}

at::Tensor add_sliding_window(const at::Tensor& blocked, int64_t t, int64_t s, int64_t window,
                              const at::Device& device) {
  if (s <= window) return blocked;
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  auto q = torch::arange(s - t, s, opts);
  auto k = torch::arange(0, s, opts);
  auto far = (q.unsqueeze(1) - k.unsqueeze(0) >= window).view({1, 1, t, s});
  return blocked.defined() ? torch::logical_or(blocked, far) : far;
}

// The most negative finite value of a floating dtype: a blocked score that stays finite, so a
// fully blocked row (a pad query) gives a uniform softmax instead of NaN.
at::Scalar lowest_value(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return at::Scalar(static_cast<float>(std::numeric_limits<c10::BFloat16>::lowest()));
    case at::kHalf:
      return at::Scalar(-65504.0f);
    case at::kDouble:
      return at::Scalar(std::numeric_limits<double>::lowest());
    default:
      return at::Scalar(std::numeric_limits<float>::lowest());
  }
}

namespace {

// softmax(scores, blocked -> lowest) in the scores' dtype through the row kernels (float32
// arithmetic): one pass forward and one backward instead of ATen's fill, float32 softmax, cast
// and their backward passes.
struct BlockMask {  // (a Function's tensor arguments must be defined: this one may not be)
  at::Tensor mask;
};

// With dropout_p > 0 the probabilities' dropout is made in the same passes (one dropout() call's
// draw, its seed kept): the dropped probabilities are returned, the undropped ones kept.
struct MaskedSoftmaxFn : public torch::autograd::Function<MaskedSoftmaxFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& scores,
                            const BlockMask& blocked, double scale, double dropout_p) {
    const DropoutDraw draw = draw_dropout(dropout_p);
    auto [y, dropped] = masked_softmax_dropout_forward(scores, blocked.mask, scale, draw.if_any());
    ctx->save_for_backward({y});
    if (blocked.mask.defined()) ctx->saved_data["mask"] = blocked.mask;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["seed"] = static_cast<int64_t>(draw.seed);
    ctx->saved_data["p"] = draw.p;
    return draw.p > 0 ? dropped : y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto it = ctx->saved_data.find("mask");
    const at::Tensor mask = it == ctx->saved_data.end() ? at::Tensor() : it->second.toTensor();
    const DropoutDraw draw{static_cast<uint64_t>(ctx->saved_data["seed"].toInt()),
                           ctx->saved_data["p"].toDouble()};
    return {masked_softmax_backward(ctx->get_saved_variables()[0], grads[0], mask,
                                    ctx->saved_data["scale"].toDouble(), draw.if_any()),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor scaled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& block_mask, double scale, double dropout_p,
                            bool training, at::Tensor* probs) {
  // grouped-query attention: the rep query heads of each key/value head are one group, computed
  // as rep x T rows against that head's keys and values (Hugging Face's repeat_kv copies the keys
  // and values rep times instead: a copy of the whole cache per layer and decoding step)
  const int64_t b = q.size(0), hq = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t hkv = k.size(1), s = k.size(2), rep = hq / hkv;
  TORCH_CHECK(hkv > 0 && hq == rep * hkv, "attention: ", hq, " query heads for ", hkv,
              " key/value heads");
  // kernels that hand out neither the probabilities nor dropout: decoding's few queries, and
  // bfloat16 inference on a CPU with AMX (scores, softmax and context per block of queries)
  const bool plain = probs == nullptr && (dropout_p == 0.0 || !training);
  if (plain && decode_attention_applies(q, k, v, block_mask))
    return decode_attention(q, k, v, block_mask, scale);
  if (plain && amx_attention_applies(q, k, v, block_mask))
    return amx_attention(q, k, v, block_mask, scale);
  const auto qg = rep == 1 ? q : q.reshape({b, hkv, rep * t, d});
  auto scores = emoe::matmul(qg, k.transpose(-2, -1));
  if (rep > 1) scores = scores.view({b, hq, t, s});
  auto finish = [&](const at::Tensor& p) {  // the probabilities times the values
    if (rep == 1) return emoe::matmul(p, v);
    return emoe::matmul(p.reshape({b, hkv, rep * t, s}), v).view({b, hq, t, d});
  };
  at::Tensor p;
  // Under CPU autocast q may be float32 (RoPE in float32, as Hugging Face's) while the scores
  // are bfloat16: the probabilities then stay bfloat16, what the next product casts them to
  // anyway (ATen's way keeps a float32 copy; not when they are handed out).
  const bool kernel_dtype = scores.scalar_type() == q.scalar_type() ||
                            (probs == nullptr && scores.scalar_type() == at::kBFloat16 &&
                             q.scalar_type() == at::kFloat && emoe::autocast_enabled(at::kCPU));
  if (kernel_dtype && masked_softmax_applies(scores, block_mask)) {
    // the scale applied inside the softmax's passes: a multiplication of q by it (a pass over
    // [B, T, H·d] and another backwards, through ATen's strided bfloat16 loops: 0.67 ms a layer
    // at BERT-base's shape, 3 % of a bf16 inference forward on the AMX Xeon) is not made
    // the probabilities' dropout in the same passes, unless the undropped ones are handed out
    const double fused_p = training && probs == nullptr ? dropout_p : 0.0;
    p = MaskedSoftmaxFn::apply(scores, BlockMask{block_mask}, scale, fused_p);
    if (fused_p > 0) return finish(p);
  } else {
    // the scores scaled as Hugging Face's eager attention scales them, the mask filled in place
    if (scale != 1.0) scores = scores * scale;
    if (block_mask.defined()) scores.masked_fill_(block_mask, lowest_value(scores.scalar_type()));
    auto acc = q.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
    p = torch::softmax(scores, -1, acc).to(q.scalar_type());
  }
  if (probs) *probs = p;
  if (training && dropout_p > 0) p = emoe::dropout(p, dropout_p, true);
  return finish(p);
}

at::Tensor split_heads(const at::Tensor& x, int64_t heads) {
  auto b = x.size(0), t = x.size(1);
  return x.view({b, t, heads, x.size(2) / heads}).transpose(1, 2);
}

at::Tensor merge_heads(const at::Tensor& x) {
  auto b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
  return x.transpose(1, 2).reshape({b, t, h * d});
}

at::Tensor rope_inv_freq(int64_t head_dim, double theta, const at::Device& device) {
  auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device);
  // Same operations as HF: inv_freq = 1 / theta^(arange(0, d, 2) / d).
  auto exponent = torch::arange(0, head_dim, 2, opts.dtype(torch::kLong)).to(torch::kFloat) /
                  static_cast<double>(head_dim);
  return 1.0 / torch::pow(theta, exponent);
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& position_ids,
                                               const at::Tensor& inv_freq, at::ScalarType dtype) {
  auto freqs = position_ids.to(torch::kFloat).unsqueeze(-1) * inv_freq;  // [B,T,D/2]
  auto emb = torch::cat({freqs, freqs}, -1).unsqueeze(1);                // [B,1,T,D]
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& position_ids, int64_t head_dim,
                                               double theta, at::ScalarType dtype) {
  return rope_cos_sin(position_ids, rope_inv_freq(head_dim, theta, position_ids.device()), dtype);
}

namespace {

// RoPE through the row kernels: one pass forward, one back (cos and sin carry no gradient)
struct RopeFn : public torch::autograd::Function<RopeFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& cos, const at::Tensor& sin) {
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->save_for_backward({cos, sin});
    return rope_forward(x, cos, sin);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    return {rope_backward(grads[0], saved[0], saved[1], dtype), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (rope_applies(x, cos, sin)) return RopeFn::apply(x, cos, sin);
  auto half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  auto rotated = torch::cat({-x2, x1}, -1);
  return x * cos + rotated * sin;
}

at::Tensor default_position_ids(const at::Tensor& attention_mask, int64_t batch, int64_t t,
                                int64_t past, const at::Device& device) {
  if (attention_mask.defined()) {
    auto m = attention_mask.to(device).to(torch::kLong);
    auto pos = m.cumsum(-1) - 1;
    pos = pos.masked_fill(m == 0, 1);
    return pos.narrow(1, pos.size(1) - t, t);
  }
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  return torch::arange(past, past + t, opts).unsqueeze(0).expand({batch, t});
}

}  // namespace emoe
