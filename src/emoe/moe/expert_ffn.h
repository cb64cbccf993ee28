// Dispatched experts as one autograd function. float32 on a CPU with AVX-512, or bfloat16 summed in
// float32 (autocast) on one with AVX-512 BF16: register-tile kernels that read each expert's rows
// straight from the input's token rows and add its outputs straight into the output's
// (expert_kernels.h). Otherwise (CUDA, other dtypes, older CPUs): for each group of
// experts, their tokens are gathered into a small buffer (at most `group_bytes`, or one expert's
// rows), pushed through the expert's blocks of the FFN weights by library GEMMs (two, three when
// gated) and added back into the output. Either way the replicated inputs and outputs of all
// experts (n·k rows of d_model each, 96 MiB per BERT-base layer at batch 16 x 128 with k = 16) are
// never materialised. Only the pre-activations (n·k x d_ff/N) are kept for the backward pass —
// and their activations where those are the experts' outputs (not gated, unit weights: EMoE),
// which saves recomputing them — and the backward pass regathers its rows the same way.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <map>
#include <string>
#include <vector>

#include "emoe/models/activation.h"

namespace emoe {

// out[t] = Σ over the rows r of expert j with tokens[r] = t of
//            weights[r] · (act(x[t] W_in,jᵀ + b_in,j) ⊙ (x[t] W_up,jᵀ)) W_out,jᵀ
// where the rows are grouped by expert (`counts[j]` rows for expert j, in order), W_in,j is rows
// j·s..(j+1)·s of w_in [N·s, d] (and of w_up, b_in), W_out,j columns j·s..(j+1)·s of
// w_out [d, N·s]; b_in, w_up and weights may be undefined (no bias, not gated, unit weights).
// Differentiable in x, w_in, b_in, w_up, w_out and weights. The experts compute in `compute`
// (default: x's dtype; no autocast inside): the inputs are cast to it once inside, and each
// gradient comes back in its input's dtype — under autocast the float32 parameters go in as they
// are, and the CPU kernels' float32 weight gradients come out without a bfloat16 round trip.
// `accumulate` (default: the compute dtype) is the output's dtype, in which the experts'
// contributions to a token are summed — float32 for bfloat16 experts, as autocast's composed
// path does.
at::Tensor dispatched_expert_ffn(const at::Tensor& x, const at::Tensor& tokens,
                                 const std::vector<int64_t>& counts, const at::Tensor& weights,
                                 const at::Tensor& w_in, const at::Tensor& b_in,
                                 const at::Tensor& w_up, const at::Tensor& w_out, Activation act,
                                 int64_t group_bytes = int64_t{16} << 20,
                                 c10::optional<at::ScalarType> accumulate = c10::nullopt,
                                 c10::optional<at::ScalarType> compute = c10::nullopt);

// How dispatched experts compute on the CPU: library GEMMs per expert (oneDNN or ATen through
// gemm_out), float32 AVX-512 register tiles, or — bfloat16, summed in float32 — AVX-512 BF16
// register tiles or AMX tiles.
enum class ExpertPath { kLibrary, kAvx512, kAvx512Bf16, kAmx };
const char* to_string(ExpertPath path);  // "library", "avx512", "avx512-bf16", "amx"

// One layer's experts as the kernels see them.
struct ExpertShape {
  at::ScalarType dtype;   // the compute dtype: float32 or bfloat16
  int64_t d, s, experts;  // model width, neurons per expert, expert count
  bool gated;
};
ExpertShape bert_base_expert_shape(at::ScalarType dtype);  // 64 experts of 48 x 768

// The paths this CPU can run for experts of that dtype (library always).
std::vector<ExpertPath> expert_paths_available(at::ScalarType dtype);
// The path for a shape, chosen once per shape and process: EMOE_EXPERT_KERNELS (library, avx512,
// avx512-bf16 or amx; auto or unset: measure; a path of the other dtype leaves this one
// measured) when set, else the fastest of the paths this CPU has (a less specialised one must
// be 10 % faster than amx / the AVX-512 tiles to be taken), timed on that shape's expert width
// (1024 tokens over min(N, 16) experts, k a quarter of them, forward and backward; the best of
// three after a warm-up; milliseconds for BERT-base's shape), logged once. A value that names no
// path this CPU has throws UsageError naming the variable.
ExpertPath expert_path(const ExpertShape& shape);
// The choice and how it was made: "amx (measured: amx 4.1 ms, avx512-bf16 9.3 ms, library
// 12.0 ms)" or "library (EMOE_EXPERT_KERNELS)".
std::string expert_path_report(const ExpertShape& shape);
// Every choice this process made so far, one line per shape.
std::vector<std::string> expert_path_reports();
// The choices so far, for a training checkpoint (see GemmChoiceSet in models/matmul.h):
// "float32|bfloat16,width,neurons,experts,gated(0|1)" -> path name. pin_expert_path_choices makes
// those shapes take the saved path untimed (reported "<path> (pinned)"; EMOE_EXPERT_KERNELS, when
// set, still decides instead); "" or what is malformed or not a path of this CPU (nothing pinned
// then). forget: every choice dropped (tests stand in for a new process).
std::map<std::string, std::string> expert_path_choices_made();
std::string pin_expert_path_choices(const std::map<std::string, std::string>& choices);
void forget_expert_path_choices();
// Forces the path for the calling thread where it fits the dtype (tests and benchmarks compare
// paths; nullopt: back to the measured choice). Returns the previous forced value.
c10::optional<ExpertPath> force_expert_path(c10::optional<ExpertPath> path);

// Whether CPU experts may use the register-tile kernels (default: yes); tests and benchmarks
// switch them off to compare with the library-GEMM path. Returns the previous setting.
bool set_expert_kernels(bool enabled);
// True when this CPU has register-tile or AMX kernels for tensors like x (float32 or bfloat16,
// summed in float32) and they are enabled; expert_path() picks among them per shape.
bool expert_kernels_used(const at::Tensor& x);

}  // namespace emoe
