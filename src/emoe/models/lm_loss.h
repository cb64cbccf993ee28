// The causal-LM head and its loss in row chunks, without the [tokens, vocab] logits.
//
// A Llama-style model at batch 8 x 256 with a 32,000-token vocabulary makes 262 MB of float32
// logits; cross-entropy keeps their log-softmax for the backward pass and the backward pass makes
// two more tensors of that size. When only the loss is wanted (training: ModelInputs::
// output_logits = false), chunked_causal_lm_loss computes logits for a few hundred rows at a time
// and, in the same pass, the gradients of the mean loss with respect to the hidden states and
// the head's weight; the backward pass only scales them.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace emoe {

// Whether chunked_causal_lm_loss takes these: float32 (or float64 without autocast) hidden states
// and weight on one device, [B, T, H] and [V, H]. Under autocast the products run in its dtype
// (the logits rounded to it, as autocast's linear layer leaves them) and the softmax, the loss
// and the gradients' sums in float32, as autocast's cross_entropy does.
bool chunked_lm_loss_supported(const at::Tensor& hidden, const at::Tensor& weight);

// causal_lm_loss(hidden W^T, labels): hidden [B, T, H], weight [V, H] (any layout), labels
// [B, T] with -100 for ignored positions; the mean cross-entropy of position t's logits against
// label t + 1 over the positions not ignored (NaN when all are). Differentiable in hidden and
// weight; their gradients are computed in the forward pass when grad mode is on and either needs
// one. chunk_rows: rows of logits at a time (0: lm_loss_chunk_rows). On the CPU the softmax rows
// run in the row kernels (row_kernels.h) in place in the products' dtype, where they apply.
at::Tensor chunked_causal_lm_loss(const at::Tensor& hidden, const at::Tensor& weight,
                                  const at::Tensor& labels, int64_t chunk_rows = 0);

// The default chunk for `rows` rows of `vocab` logits of element_size bytes: about 32 MiB, a
// multiple of 64 rows where that leaves at least 64 (the products' kernels run whole tiles).
int64_t lm_loss_chunk_rows(int64_t rows, int64_t vocab, int64_t element_size);

}  // namespace emoe
