// Float32 CPU kernels for dispatched experts whose gathers and scatters are part of the matrix
// products: an expert's rows are read straight from the tokens' rows of the input, and its
// outputs are added straight into the tokens' rows of the output, so the n·k copies that a
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
void scatter_gemm(const float* h, const int64_t* tokens, const std::vector<int64_t>& counts, int64_t s,
                  const float* b, int64_t ldb, int64_t n, float* y, int64_t ldy);

// w_j[kk][c] = Σ over the rows r of expert j of x[tokens[r], kk] · h[r, c], written into
// w[kk·ldw + j·s + c] (w_j a [k, s] block of columns of w); zero for an expert without rows.
void gather_weight_grad(const float* x, int64_t ldx, int64_t k, const int64_t* tokens,
                        const std::vector<int64_t>& counts, int64_t s, const float* h, float* w,
                        int64_t ldw);

}  // namespace emoe::expert_kernels
