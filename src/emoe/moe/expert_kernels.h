// Float32 and bfloat16 CPU kernels for dispatched experts whose gathers and scatters are part of
// the matrix products: an expert's rows are read straight from the tokens' rows of the input, and
// its outputs are added straight into the tokens' rows of the output, so the n·k copies that a
// library GEMM needs (gather into a buffer, product, scatter-add back) are never made.
//
// Why: with many narrow experts (BERT-base at N 64: 48 neurons each, k 16) every token's row is
// gathered and scattered 16 times each way, and library GEMMs run products with one dimension of
// 48 at 55-75 % of their large-product speed. These kernels keep a tile of 8 rows x 48 columns in
// AVX-512 registers over the long dimension.
//
// Layout: the rows of all experts are sorted by expert — `counts[j]` rows for expert j, in order —
// and `tokens[r]` is row r's token. Each expert owns a block of s = (its block width) columns or
// rows of a shared weight matrix, addressed through a row stride, so no weight is sliced or copied.
#pragma once
#include <cstdint>
#include <vector>

namespace emoe::expert_kernels {

// True when this CPU runs the kernels (AVX-512F); otherwise callers use library GEMMs.
bool available();

// c[r, 0:s] = x[tokens[r], 0:k] · b_j (+ bias[j·s : j·s+s]) for every row r of expert j, where
// b_j[kk][c] = b[kk·ldb + j·s + c] (a [k, s] block of columns of b). c is [rows, s], contiguous.
void gather_gemm(const float* x, int64_t ldx, int64_t k, const int64_t* tokens,
                 const std::vector<int64_t>& counts, int64_t s, const float* b, int64_t ldb,
                 const float* bias, float* c);

// y[tokens[r], 0:n] += h[r, 0:s] · b_j for every row r of expert j, where
// b_j[c][col] = b[(j·s + c)·ldb + col] (a [s, n] block of rows of b). h is [rows, s], contiguous.
// Deterministic: each output element sums its rows in expert order.
void scatter_gemm(const float* h, const int64_t* tokens, const std::vector<int64_t>& counts,
                  int64_t s, const float* b, int64_t ldb, int64_t n, float* y, int64_t ldy);

// w_j[kk][c] = Σ over the rows r of expert j of x[tokens[r], kk] · h[r, c], written into
// w[kk·w_k + (j·s + c)·w_c] (w_j a [k, s] block of columns of w; any strides, so that the gradient
// of a [E·s, d] weight is written in place, w_k 1, w_c d); zero for an expert without rows.
void gather_weight_grad(const float* x, int64_t ldx, int64_t k, const int64_t* tokens,
                        const std::vector<int64_t>& counts, int64_t s, const float* h, float* w,
                        int64_t w_k, int64_t w_c);

// bfloat16 (AVX-512 BF16: vdpbf16ps): inputs and weights in bf16 (given as their bits), products
// exact and summed in float32. The weights are addressed through two strides and packed per call
// into the pairs the instruction takes. Rows follow the same layout as above.
bool bf16_available();

// c[r, 0:s] = bf16(x[tokens[r], 0:k] · B_j (+ bias[j·s : j·s+s], float32)) for every row r of
// expert j, where B_j(kk, c) = b[kk·b_k + (j·s + c)·b_c]. c is [rows, s], contiguous.
void gather_gemm_bf16(const uint16_t* x, int64_t ldx, int64_t k, const int64_t* tokens,
                      const std::vector<int64_t>& counts, int64_t s, const uint16_t* b, int64_t b_k,
                      int64_t b_c, const float* bias, uint16_t* c);

// y[tokens[r], 0:n] += h[r, 0:s] · B_j in float32 for every row r of expert j, where
// B_j(c, col) = b[(j·s + c)·b_k + col·b_c]. h is [rows, s], contiguous. Deterministic as
// scatter_gemm.
void scatter_gemm_bf16(const uint16_t* h, const int64_t* tokens, const std::vector<int64_t>& counts,
                       int64_t s, const uint16_t* b, int64_t b_k, int64_t b_c, int64_t n, float* y,
                       int64_t ldy);

// w[kk·w_k + (j·s + c)·w_c] = Σ over the rows r of expert j of x[tokens[r], kk] · h[r, c], in
// float32 (any strides, as gather_weight_grad); zero for an expert without rows. h is [rows, s],
// contiguous.
void gather_weight_grad_bf16(const uint16_t* x, int64_t ldx, int64_t k, const int64_t* tokens,
                             const std::vector<int64_t>& counts, int64_t s, const uint16_t* h,
                             float* w, int64_t w_k, int64_t w_c);

// bfloat16 on AMX tiles (amx_bf16: tdpbf16ps, 16 x 16 float32 accumulators over 16 x 32 bf16
// operands): the same three products with the same arguments and layouts as the *_bf16 kernels
// above, products exact and summed in float32. A tile of 16 routed rows is gathered into a small
// buffer (AMX loads rows at one stride) and the weights are packed per call into the pairs the
// instruction takes, zero-padded to whole tiles. Only where emoe::amx_available()
// (core/amx_tiles.h).

void gather_gemm_amx(const uint16_t* x, int64_t ldx, int64_t k, const int64_t* tokens,
                     const std::vector<int64_t>& counts, int64_t s, const uint16_t* b, int64_t b_k,
                     int64_t b_c, const float* bias, uint16_t* c);

// (the scatter into y's first y_rows rows: y[t] += Σ_j, or with accumulate false y[t] = Σ_j,
// zero for a token without rows; each element's terms summed from zero in expert order, then
// added into y once)
void scatter_gemm_amx(const uint16_t* h, const int64_t* tokens, const std::vector<int64_t>& counts,
                      int64_t s, const uint16_t* b, int64_t b_k, int64_t b_c, int64_t n, float* y,
                      int64_t ldy, int64_t y_rows, bool accumulate);

// (the weight gradient at any strides: element (kk, j·s + c) at w[kk·w_k + (j·s + c)·w_c], so
// that the gradient of a [E·s, d] weight is written in place, w_k 1, w_c d)
void gather_weight_grad_amx(const uint16_t* x, int64_t ldx, int64_t k, const int64_t* tokens,
                            const std::vector<int64_t>& counts, int64_t s, const uint16_t* h,
                            float* w, int64_t w_k, int64_t w_c);

}  // namespace emoe::expert_kernels
