// Row-wise kernels of a training step that ATen runs as several passes over memory: the
// language-model loss's softmax and gradient over the vocabulary (one pass to read the row's
// maximum, one for the exponentials and their sum, one to write the gradient, in place, in the
// logits' own dtype), the SwiGLU gate silu(g) * u, GELU, RMSNorm, attention's masked softmax,
// RoPE and bias gradients, each forward and backward in one pass.
//
// Why: under bf16 autocast the chunked LM loss ran its softmax as ATen ops on a float32 copy of
// the bfloat16 logits (copy, gather, amax, sub, exp, sum, mul, scatter, copy back: nine passes
// over a [rows, 32000] block), 20 % of a Llama-style bf16 training step on a Xeon with AMX, where
// the products themselves take less. The kernels compute in float32 with a vector exp (Cephes's
// polynomial, relative error ~2 ulp) on AVX-512F or AVX2+FMA, the best the CPU has; elsewhere (or
// on another device) the callers keep ATen's ops.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "emoe/models/dropout.h"

namespace emoe {

// The instruction set the kernels use in this process: "avx512", "avx2" or "" (none: ATen's ops).
std::string row_kernels_isa();
// "auto" (default: the best this CPU has), "avx512", "avx2" (pinned; an error where the CPU lacks
// it) or "library" / "" (ATen's ops). EMOE_ROW_KERNELS sets it at start-up; this sets it for the
// process (tests and benchmarks compare both in one run) and returns the previous setting.
// Throws UsageError for an unknown name or a set this CPU lacks.
std::string set_row_kernels_isa(const std::string& isa);

// Cross-entropy over rows of logits [R, V] (CPU, float32 or bfloat16, last dimension contiguous),
// targets [R] (int64, each in [0, V)): loss [R] (float32) gets log Σ_j exp(x_j) - x_target per row.
// With scale [R] (float32) defined, each row of logits is overwritten by its gradient
// (softmax(x) - onehot(target)) * scale, computed in float32 and rounded once to the logits' dtype.
// Returns false, touching nothing, when the kernels do not apply (none in use, another device or
// dtype); the caller then computes it with ATen's ops.
bool softmax_xent_rows(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& scale,
                       const at::Tensor& loss);

// The SwiGLU gate silu(gate) * up (Llama, Qwen, Mistral; T5 v1.1 uses GELU), in float32, rounded
// once to the inputs' dtype. Applies to CPU tensors of one shape and dtype (float32 or bfloat16),
// contiguous, while kernels are in use; silu_mul_forward/backward check it. The backward pass
// gives (d gate, d up) from the incoming gradient (taken to the inputs' dtype).
bool silu_mul_applies(const at::Tensor& gate, const at::Tensor& up);
at::Tensor silu_mul_forward(const at::Tensor& gate, const at::Tensor& up);
std::pair<at::Tensor, at::Tensor> silu_mul_backward(const at::Tensor& gate, const at::Tensor& up,
                                                    const at::Tensor& grad_out);

// GELU, erf form (BERT's "gelu"): y = x Phi(x), in float32 (erf to 1.5e-7), rounded once to the
// input's dtype, for contiguous float32 or bfloat16 CPU tensors while kernels are in use; the
// backward pass gives x's gradient from y's.
bool gelu_erf_applies(const at::Tensor& x);
at::Tensor gelu_erf_forward(const at::Tensor& x);
at::Tensor gelu_erf_backward(const at::Tensor& x, const at::Tensor& grad_out);

// LayerNorm of a residual sum, y = LayerNorm(a + r) (BERT's post-norm), in one pass each way: a
// float32 or bfloat16 (a linear's output under bf16 autocast), r, weight and bias float32, a and
// r contiguous of one shape, on the CPU while kernels are in use. The sum and the statistics in
// float32 (as autocast's float32 add and layer_norm); forward gives {y, s = a + r (undefined
// without keep_sum), mean, rstd [rows]}; backward {d a (a's dtype), d r, d weight, d bias}.
bool add_layer_norm_applies(const at::Tensor& a, const at::Tensor& r, const at::Tensor& weight,
                            const at::Tensor& bias);
// With a dropout draw (dropout.h), y = LayerNorm(dropout(a) + r) with that draw's mask, the
// dropped a never written to memory; the backward pass's d a is then the gradient of a before
// the dropout.
std::vector<at::Tensor> add_layer_norm_forward(const at::Tensor& a, const at::Tensor& r,
                                               const at::Tensor& weight, const at::Tensor& bias,
                                               double eps, bool keep_sum,
                                               const DropoutDraw* dropout = nullptr);
std::vector<at::Tensor> add_layer_norm_backward(const at::Tensor& s, const at::Tensor& mean,
                                                const at::Tensor& rstd, const at::Tensor& weight,
                                                const at::Tensor& grad_out, at::ScalarType a_dtype,
                                                const DropoutDraw* dropout = nullptr);

// RMSNorm y = weight * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps) over the last dimension, for
// float32 x and weight on the CPU (x contiguous) while kernels are in use (rms_norm_applies):
// forward gives (y, rstd [rows]); backward (d x, d weight) from the incoming gradient.
bool rms_norm_applies(const at::Tensor& x, const at::Tensor& weight);
// bfloat16 x and weight (forward only, no backward kernel): rms_norm_forward rounds x * rstd to
// bfloat16 before the weight's product, as Hugging Face's LlamaRMSNorm does
bool rms_norm_bf16_applies(const at::Tensor& x, const at::Tensor& weight);
std::pair<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& x, const at::Tensor& weight,
                                                   double eps);
std::pair<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& x, const at::Tensor& weight,
                                                    const at::Tensor& rstd,
                                                    const at::Tensor& grad_out);

// Σ over rows of g [R, N] (CPU, float32 or bfloat16, rows contiguous) in float32: [N] — a bias's
// gradient without ATen's float32 copy of a bfloat16 g first. column_sum_applies says whether the
// kernels take it.
bool column_sum_applies(const at::Tensor& g);
at::Tensor column_sum(const at::Tensor& g);

// x + a for x float32 and a bfloat16 of one shape (CPU, both contiguous): a pre-norm block's
// residual sum under bf16 autocast (the float32 stream plus a bfloat16 output) in one vector pass,
// where ATen's mixed-dtype add converts element by element (0.84 ms for 1M elements on the AMX
// Xeon, 2026-12-07). The same bits.
bool residual_add_applies(const at::Tensor& x, const at::Tensor& a);
at::Tensor residual_add_forward(const at::Tensor& x, const at::Tensor& a);

// Attention probabilities: softmax over the last dimension of scale · scores (CPU, float32 or
// bfloat16, contiguous) with the positions where `mask` (bool, broadcastable to scores, its last
// dimension whole and contiguous; or undefined: nothing blocked) is true taken as the dtype's
// lowest value, in float32, rounded once to the scores' dtype — what a multiplication,
// masked_fill + softmax(float32) + a cast back compute in five passes and two float32 copies.
// The backward pass gives the (unscaled) scores' gradient from the probabilities y and the
// incoming gradient (blocked positions 0). With a power-of-two scale the results are those of
// the scale applied to either operand of the product that made the scores, bit for bit.
bool masked_softmax_applies(const at::Tensor& scores, const at::Tensor& mask);
at::Tensor masked_softmax_forward(const at::Tensor& scores, const at::Tensor& mask,
                                  double scale = 1.0);
// With the probabilities' dropout fused in: {y, dropout(y)} for a dropout draw (dropout.h), the
// dropped copy written from each row while it is in cache; the backward pass then takes the
// gradient of the dropped probabilities and drops it row by row as dropout's backward would.
std::pair<at::Tensor, at::Tensor> masked_softmax_dropout_forward(const at::Tensor& scores,
                                                                 const at::Tensor& mask,
                                                                 double scale,
                                                                 const DropoutDraw* dropout);
at::Tensor masked_softmax_backward(const at::Tensor& y, const at::Tensor& grad_out,
                                   const at::Tensor& mask, double scale = 1.0,
                                   const DropoutDraw* dropout = nullptr);

// One row of masked_softmax_forward on bfloat16 bits (x and y n long, mask n bytes or null,
// scratch n floats), for kernels that make their scores themselves (the AMX attention): false,
// touching nothing, where no kernels are in use.
bool masked_softmax_row_bf16(const uint16_t* x, const uint8_t* mask, double scale, uint16_t* y,
                             int64_t n, float* scratch);

// Rotary embeddings, Hugging Face's rotate_half convention: y = x * cos + rotate_half(x) * sin
// over the last dimension (even, D), x [B, H, T, D] (CPU, float32 or bfloat16, the last dimension
// contiguous: a view of heads is fine), cos and sin [1 or B, 1, T, D] (contiguous, float32 or
// bfloat16, no gradient); y [B, H, T, D] contiguous in the promoted dtype, computed in float32
// in one pass (ATen: a concatenation, a negation, two products and a sum, and as many passes
// back). rope_backward gives x's gradient (in x's dtype) from y's.
bool rope_applies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor rope_forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor rope_backward(const at::Tensor& grad_out, const at::Tensor& cos, const at::Tensor& sin,
                         at::ScalarType x_dtype);

// Attention for decoding: softmax(scale q k^T, blocked -> lowest) v with q [B, Hq, T, D], k and v
// [B, Hkv, S, D] (Hq a multiple of Hkv: grouped-query attention), each row of q against its head's
// keys and values in one pass (dot products, softmax and the weighted sum in float32, rounded once
// to the dtype), where the library makes two small products and a softmax of a shape new at every
// step (S grows). Applies to CPU tensors of one dtype (float32 or bfloat16) with the last dimension
// contiguous (k and v may be views of a cache with room), T <= kDecodeAttentionRows, no gradient
// wanted, no autocast, kernels in use, and a bool mask as masked_softmax takes (or undefined).
constexpr int64_t kDecodeAttentionRows = 8;
bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& mask);
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask, double scale);
}  // namespace emoe
