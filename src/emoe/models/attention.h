// Attention math shared by every architecture: masks, grouped-query attention, KV cache, RoPE.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

#include <utility>
#include <vector>

namespace emoe {

// Keys and values of one layer for incremental decoding: [B, kv_heads, S, head_dim]. From the
// second append on, k and v are views of the first S positions of buffers with room for more
// along S (`reserve` positions, or grown by doubling), so that a step copies its own keys and
// values only, not every cached one again (torch.cat would: O(S^2) copying over a generation).
struct LayerKv {
  at::Tensor k, v;
  at::Tensor k_room, v_room;  // the buffers k and v are views of (undefined until needed)
  // Positions to make room for when the buffers are made (generate: prompt + new tokens, so that
  // they are made once, at their final size); 0 or too few: twice the positions needed.
  int64_t reserve = 0;
  // Keeps rows `rows` (a long tensor of indices into dim 0) of the cache, in that order: beam
  // search's reordering.
  void select_rows(const at::Tensor& rows);
};
struct KvCache {
  std::vector<LayerKv> layers;
  // Encoder-decoder models: each decoder layer's cross-attention keys and values over the encoder
  // output, computed at the first step and reused.
  std::vector<LayerKv> cross;
  int64_t length() const;  // number of cached positions (0 when empty)
};

// Appends one step's keys and values [B, kv_heads, T, D] to `cache` after its cached positions
// (or stores them in an empty one) and returns the keys and values over every position. Without
// a cache (nullptr), k and v themselves.
std::pair<at::Tensor, at::Tensor> append_kv(LayerKv* cache, const at::Tensor& k,
                                            const at::Tensor& v);

// Boolean "blocked" mask [B or 1, 1, T, S] for T queries over S keys, of which the first
// S - T are cached past positions. attention_mask is [B, S] (1 = real token) or undefined.
// Returns an undefined tensor when nothing is blocked.
at::Tensor build_block_mask(const at::Tensor& attention_mask, int64_t t, int64_t s, bool causal,
                            const at::Device& device);

// Adds a sliding window to a block mask from build_block_mask: query i (absolute position
// s - t + i) sees only the `window` positions ending at itself, as Hugging Face's sliding-window
// attention (Mistral, Qwen2) masks; nothing changes while s <= window.
at::Tensor add_sliding_window(const at::Tensor& blocked, int64_t t, int64_t s, int64_t window,
                              const at::Device& device);

// The most negative finite value of a floating dtype (torch.finfo(dtype).min, Hugging Face's mask
// value): a blocked score that stays finite.
at::Scalar lowest_value(at::ScalarType t);

// softmax(q k^T * scale, blocked -> lowest) v with q [B,Hq,T,D], k/v [B,Hkv,S,D]; Hq must be a
// multiple of Hkv (grouped-query attention: query head h reads kv head h / (Hq/Hkv)).
// The softmax runs in float32 (float64 for float64 inputs). `probs`, when given, receives the
// attention probabilities.
at::Tensor scaled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& block_mask, double scale, double dropout_p,
                            bool training, at::Tensor* probs = nullptr);

// [B,T,H*D] <-> [B,H,T,D]
at::Tensor split_heads(const at::Tensor& x, int64_t heads);
at::Tensor merge_heads(const at::Tensor& x);

// Rotary embeddings, Hugging Face's rotate_half convention. cos/sin: [B, 1, T, head_dim].
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& position_ids, int64_t head_dim,
                                               double theta, at::ScalarType dtype);
// RoPE's inverse frequencies 1 / theta^(2i / head_dim), float32 [head_dim / 2], as HF computes.
at::Tensor rope_inv_freq(int64_t head_dim, double theta, const at::Device& device);
// cos/sin from given inverse frequencies (scaled RoPE variants).
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& position_ids,
                                               const at::Tensor& inv_freq, at::ScalarType dtype);
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Default position ids: past..past+T-1 for every row, or for left-padded rows
// cumsum(mask)-1 with pads set to 1 (what Hugging Face's generate() passes).
at::Tensor default_position_ids(const at::Tensor& attention_mask, int64_t batch, int64_t t,
                                int64_t past, const at::Device& device);

}  // namespace emoe
