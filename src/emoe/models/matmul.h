// Matrix products for the hot loop: oneDNN's AVX-512 kernels for float32 on CPU where this machine
// has them, ATen's (OpenBLAS) otherwise. Results agree with ATen's to float32 rounding.
//
// Why: Debian 12's OpenBLAS (0.3.21) runs AVX-512 CPUs it does not know (AMD Zen 4/5) on its AVX2
// kernels, and the image pins OPENBLAS_CORETYPE=Haswell on them (older builds compute wrong
// results with the AVX-512 ones); ATen's batched products loop over OpenBLAS calls per matrix.
// oneDNN (already libtorch's own bfloat16 and convolution engine) picks its kernels by
// instruction set. Measured on a 2-core AMD EPYC with AVX-512 (bench_gemm): 2048 x 768 x 3072
// 195 -> ~360 GFLOP/s; attention's 192 x (128 x 64 x 128) 75 -> ~280-380 GFLOP/s.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace emoe {

// True when a float32 product of CPU tensors like `t` goes through emoe's products: built with
// oneDNN, the CPU has AVX-512 (avx512_core), no autocast is active, and EMOE_GEMM is not "aten"
// (each product then runs on oneDNN or, per shape, on ATen: Float32Gemm below).
bool onednn_matmul_enabled(const at::Tensor& t);
// "onednn (avx512_core[, bf16])" or "aten (OpenBLAS)": what float32 CPU products use in this
// process (", bf16": gemm_out's bfloat16 products too).
std::string matmul_backend_name();

// Which library computes float32 CPU products where oneDNN is used (EMOE_GEMM: "onednn", "aten",
// or unset/"auto": measured). kMeasured: each 2-D product of a shape past 16M multiply-adds is
// timed once in both on first sight, and later products of that shape use the faster (ATen only
// when faster by 15 %); smaller, batched and varying-size products stay with oneDNN. kMeasured
// also picks oneDNN's implementation of each product class, float32 and bfloat16, by timing
// (onednn_implementation_choices); kOneDnn takes oneDNN's first everywhere, untimed.
enum class Float32Gemm { kMeasured, kOneDnn, kAten };
// Sets it for the process (tests); returns the previous setting.
Float32Gemm set_float32_gemm(Float32Gemm choice);
// How bfloat16 CPU products are computed where oneDNN's AVX-512 BF16 kernels are not available
// (EMOE_BF16_GEMM: "float32", "native", or unset). kFloat32: the operands widened to float32 and
// multiplied there (oneDNN or OpenBLAS), the result rounded once to the output's dtype — the
// sums autocast's bfloat16 products make (float32 accumulation), at the float32 products' speed.
// kNative: ATen's bfloat16 products, which on a CPU without AVX-512 are a scalar loop (measured
// 4.9 GFLOP/s against OpenBLAS's 172 in float32 on a 2-core AVX2 EPYC). Unset: kFloat32 on CPUs
// without AVX-512 (no avx512_core as oneDNN reads the CPU, which is when ATen 1.13 takes its
// scalar path), else kNative; where AVX-512 BF16 is present oneDNN computes them either way.
enum class Bf16Gemm { kNative, kFloat32 };
Bf16Gemm bf16_gemm();
// Sets it for the process (tests); returns the previous setting.
Bf16Gemm set_bf16_gemm(Bf16Gemm choice);
// Whether oneDNN's products first copy their second operand (a weight, for a layer's forward
// and input-gradient products) into the blocked layout oneDNN's kernels read (EMOE_PACK_B:
// "measured", "always", "never"; unset: measured). oneDNN's brgemm kernels given a plain matrix
// copy its panels as they go; one reorder of the whole matrix first, then the product on the
// blocked copy, measured 3-16 % faster for most of BERT-base's and the Llama-style model's 2-D
// products on a 2-core AMD EPYC with AVX-512 BF16, the reorder included (and slower for others:
// a few hundred rows, or the float32 LM head). The same kernel on the same sums: the results are
// the same bits. kMeasured: each 2-D product class past 16M multiply-adds is timed packed and
// plain along with oneDNN's implementations (onednn_implementation_choices; the packed variant
// named "<implementation> (B packed)") and the faster kept; kAlways: every 2-D product oneDNN
// offers a blocked layout for (tests); kNever: none. The blocked copy lives in one scratch
// buffer per thread, kept between products (allocator-counted tensor memory).
enum class PackB { kMeasured, kAlways, kNever };
PackB pack_b();
// Sets it for the process (tests); returns the previous setting. Drops cached primitives.
PackB set_pack_b(PackB choice);

// True when emoe computes bfloat16 CPU products itself (oneDNN's AVX-512 BF16 kernels, or the
// float32 path above): autocast's linear layers and attention products then run on gemm_out.
bool bf16_products_on_gemm_out();

// Shapes measured so far, and how many of them chose ATen.
std::pair<int64_t, int64_t> float32_gemm_measurements();

// oneDNN's implementation of each product class measured so far in this process (EMOE_GEMM
// unset: every product past 16M multiply-adds is timed once in each of oneDNN's implementations
// of it — brgemm, gemm-based — and the fastest kept for its class; see matmul.cpp), one line
// each: "class: chosen (default; ...)" or "class: chosen (over <oneDNN's first>; ...)", with each
// implementation's GFLOP/s.
std::vector<std::string> onednn_implementation_choices();

// The choices above as this process made them so far, for a training checkpoint: a resumed run
// pins them, so that its products of those shapes and classes run on the implementations (and so
// round as) the run it continues did, untimed. float32_library: 2-D float32 shape key -> "aten"
// or "onednn"; onednn_implementations: class -> oneDNN's implementation name (one oneDNN does
// not offer for a product falls back to its first).
struct GemmChoiceSet {
  std::map<std::string, std::string> float32_library, onednn_implementations;
};
GemmChoiceSet gemm_choices_made();
// Pins them (replacing this process's choice for those keys; each that changes a choice listed
// by onednn_implementation_choices as "class: name (pinned)", and where one replaces an earlier
// choice the cached primitives are dropped, so that every later product takes it); "" or what is
// malformed (nothing is pinned then). Only EMOE_GEMM unset (measured) consults them.
std::string pin_gemm_choices(const GemmChoiceSet& set);
// Forgets every choice (tests stand in for a new process).
void forget_gemm_choices();

// oneDNN primitives cached (one per product shape, layout and options seen; tests).
int64_t onednn_primitives_cached();
// How many products oneDNN has computed in this process (tests check the path was taken).
int64_t onednn_product_count();
// ... and of those, how many on a packed second operand (PackB).
int64_t onednn_packed_product_count();

// out = a @ b (+ bias) without autograd. a [..., M, K], b [..., K, N], out [..., M, N] with the
// same leading dims, each matrix row- or column-major inside (any strides between matrices);
// bias [N] or undefined. With accumulate, out += a @ b (bias not allowed). shapes_vary: 2-D
// products whose sizes change from call to call (an expert's rows) share one oneDNN primitive.
// float32 (AVX-512) and bfloat16 (AVX-512 BF16) go through oneDNN, computing in the inputs' dtype;
// bfloat16 elsewhere per Bf16Gemm (kFloat32: widened to float32 and multiplied there); any other
// dtype or device through ATen's mm/addmm. bfloat16 a and b may write (or accumulate
// into) a float32 out, without bias: oneDNN keeps its float32 sums; elsewhere the bfloat16 product
// is rounded once and then added.
void gemm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
              const at::Tensor& bias = at::Tensor(), bool accumulate = false,
              bool shapes_vary = false);

// x W^T + b with autograd (x [..., in], weight [out, in] in any layout, bias [out] or undefined).
// Keeps x for the backward pass only when the weight needs a gradient, and the weight only when
// x does. Falls back to torch::linear where oneDNN is not used. Under CPU bf16 autocast with a
// float32 weight that wants a gradient (autocast_linear_applies): the products in bfloat16 as
// autocast's linear, the weight's and bias's gradients summed straight into float32.
bool autocast_linear_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
// x W_iᵀ + b_i for 2 or 3 float32 weights [out_i, in] of one input (a fused projection in
// training) under CPU bf16 autocast, where autocast_linear_applies to each weight that needs a
// gradient: each output as linear() computes it, but x rounded once, no concatenation of the
// weights or split of the output, and x's gradient summed over the products in float32. biases:
// one per weight, or none.
std::vector<at::Tensor> autocast_linear_group(const at::Tensor& x,
                                              const std::vector<at::Tensor>& weights,
                                              const std::vector<at::Tensor>& biases);
// Inference under CPU bf16 autocast with a bfloat16 weight (a layer's cast copy) where nothing
// needs a gradient: x and the bias rounded to bfloat16 as autocast's linear rounds them, the
// product on oneDNN with the bias added in its epilogue (ATen's addmm first copies the bias into
// every row of the output, then multiplies). Undefined where it does not apply.
at::Tensor autocast_inference_linear(const at::Tensor& x, const at::Tensor& weight,
                                     const at::Tensor& bias);
// While alive, the next autocast_inference_linear on this thread computes GELU (erf, or tanh) of
// its product in the product's epilogue — oneDNN's post-op, on the float32 sums before they are
// rounded to bfloat16, so one pass over the output fewer — where oneDNN runs it; applied() says
// whether it did (if not, the caller applies the activation itself). Inference only: the
// activated output carries no autograd history of the activation.
class InferenceGeluEpilogue {
 public:
  explicit InferenceGeluEpilogue(bool tanh);
  ~InferenceGeluEpilogue();
  InferenceGeluEpilogue(const InferenceGeluEpilogue&) = delete;
  InferenceGeluEpilogue& operator=(const InferenceGeluEpilogue&) = delete;
  bool applied() const;
};
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// a @ b with autograd for a [..., M, K], b [..., K, N] with equal leading dims; falls back to
// torch::matmul where oneDNN is not used.
at::Tensor matmul(const at::Tensor& a, const at::Tensor& b);

}  // namespace emoe
