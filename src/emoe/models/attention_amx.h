// Attention's forward on AMX tiles, for inference in bfloat16.
//
// Why: under bf16 inference the library's path makes three passes per layer — a batched product
// for the scores, the masked softmax, a batched product for the context — and oneDNN's batched
// products over [B, H, T, d] views of the projections (rows H·d apart) ran at 200-450 GFLOP/s in a
// BERT-base forward on the AMX Xeon (2026-12-07), 11 % of the forward for 3 % of its FLOPs. Here
// each (batch, key/value head) packs its keys and values once into the pairs the tile instruction
// takes, and each block of 16 queries makes its scores on the tiles, takes the softmax kernel's
// pass over them while they are in the first-level cache, and sums the values on the tiles,
// written straight into [B, T, H, d] memory (merge_heads is then a view).
#pragma once
#include <ATen/core/Tensor.h>

namespace emoe {

// q [B, Hq, T, d], k and v [B, Hkv, S, d] (Hq a multiple of Hkv: grouped-query heads), all
// bfloat16 on the CPU — or float32 under CPU bf16 autocast (RoPE's queries and keys), rounded as
// autocast's products round them — with the last dimension contiguous (views of a projection or
// a cache are fine), d a multiple of 16 up to 256; the mask bool, broadcastable to [B, Hq, T, S]
// with its last dimension whole and contiguous, or undefined; no gradient wanted; the CPU has AMX
// and the row kernels are in use.
bool amx_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& mask);

// softmax(scale · q kᵀ, blocked -> lowest) v, as scaled_attention computes it in bfloat16 (the
// scores rounded to bfloat16, the softmax in float32 by the row kernel, the probabilities rounded
// to bfloat16, products summed in float32): bfloat16 [B, Hq, T, d], a transposed view of
// [B, T, Hq, d].
at::Tensor amx_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& mask, double scale);

}  // namespace emoe
