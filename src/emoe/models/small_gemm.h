// Products with few rows, as decoding makes them (one new token per sequence per step):
// y = x W^T (+ b) for x with at most kSmallGemmMaxRows rows, on the CPU, float32 or bfloat16.
//
// Why: such a product reads every weight once for a handful of multiply-adds, so its speed is
// the speed of reading the weights. The libraries' general products do not reach it there:
// measured on a 2-core Xeon with AMX, one row against a 32000 x 512 weight, OpenBLAS float32 read
// the weights at ~6 GB/s and oneDNN bfloat16 at ~8 GB/s, where a plain sum of the same weights
// ran at 18-28 GB/s. These kernels stream each weight row once, keep every row of x beside it
// (so eight rows cost about what one does), and sum in float32: bfloat16 pairs by vdpbf16ps
// where the CPU has AVX-512 BF16, else widened in registers. AVX-512 BF16, AVX-512F or AVX2+FMA,
// the best the CPU has; elsewhere the library is used.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace emoe {

constexpr int64_t kSmallGemmMaxRows = 8;
// Calls of one shape that auto alternates between the kernels and the library before it keeps one
// (six per path; bfloat16 weights [N, K] under avx512-bf16 have a third path, the AVX-512F kernels
// that widen them to float32: 18 calls there).
constexpr int64_t kSmallGemmTrialCalls = 12;

// The kernels this process uses: "avx512-bf16" (AVX-512F, and vdpbf16ps for bfloat16 weights
// stored [N, K]), "avx512", "avx2" or "" (none: the library's products).
std::string small_gemm_isa();
// "auto" (the default): the best kernels this CPU has, and for each product shape (dtype, rows,
// K, N, layout, bias) the kernels and the library's product alternated over the shape's first
// kSmallGemmTrialCalls calls in the model, timed there, the faster kept (the library must win by
// 5 %; the trial's calls all return the kernels' result; under avx512-bf16, bfloat16 weights [N, K]
// also try the widening AVX-512F kernels); e.g. eight rows against a bfloat16 weight may run faster
// on oneDNN's kernels. An instruction set this CPU has pins the kernels for every
// shape; "" or "library" uses none. EMOE_SMALL_GEMM sets it at start-up; this function sets it for
// the process (tests; benchmarks compare with the library in one process) and returns the previous
// setting. Throws UsageError for a set this CPU lacks or an unknown name.
std::string set_small_gemm_isa(const std::string& isa);
// Shapes decided so far under auto, and how many of them chose the library.
std::pair<int64_t, int64_t> small_gemm_measurements();

// auto's decisions so far, for a training checkpoint (see GemmChoiceSet in matmul.h): the shape
// key (dtype code, rows, K, N, layout, bias: six integers, comma-separated) -> "kernels",
// "library" or "widening". pin_small_gemm_choices makes those shapes skip their trial and run the
// saved path; "" or what is malformed (nothing pinned then). forget: every decision and trial
// dropped (tests stand in for a new process).
std::map<std::string, std::string> small_gemm_choices_made();
std::string pin_small_gemm_choices(const std::map<std::string, std::string>& choices);
void forget_small_gemm_choices();

// x [..., K] times a weight stored [N, K] (weight_kn false: a Linear's [out, in]) or [K, N]
// (weight_kn true: GPT-2's Conv1D), plus bias [N] when defined; [..., N] in x's dtype, summed in
// float32 and rounded once.
// small_gemm_applies: true when small_gemm_linear computes these: kernels in use, x, weight (and
// bias) on the CPU in one dtype (float32 or bfloat16), x with at most kSmallGemmMaxRows rows of
// K, weight contiguous 2-D, no autocast, and no gradient wanted (grad mode off, or none of them
// requires one).
bool small_gemm_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        bool weight_kn);
at::Tensor small_gemm_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             bool weight_kn);

// Several weights against the same x (a fused layer's q, k and v, or gate and up), each as
// small_gemm_linear computes it: one output per weight. auto times the kernels (one product per
// weight) against the library's one product over the weights concatenated (weights stored
// [K, N]: one library product per weight), as one shape. biases: one per weight, all defined or
// all undefined; every weight of one K and layout.
std::vector<at::Tensor> small_gemm_group(const at::Tensor& x,
                                         const std::vector<at::Tensor>& weights,
                                         const std::vector<at::Tensor>& biases, bool weight_kn);

// How many products the kernels have computed in this process (tests check the path was taken).
int64_t small_gemm_count();

}  // namespace emoe
