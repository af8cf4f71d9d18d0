// CPU matrix products on checkpoint matrices (Mat: bf16, f32 or MLX affine 4/8-bit). Weights are
// dequantized a few rows at a time into a small per-thread fp32 buffer (never a whole matrix); all sums
// accumulate in fp32. Every (row, input) dot product goes through one kernel with a fixed summation order,
// so a product's result does not depend on the number of inputs, the thread count or the row's block:
// a prompt processed at once and token by token gives bit-identical outputs.
#pragma once
#include <cstdint>

#include "model/weights.h"
#include "util/thread_pool.h"

namespace lily {

// y[r] = sum_i W[r][i] x[i]; x [cols], y [rows].
void matvec(const Mat& w, const float* x, float* y, ThreadPool& pool);

// Y[t][r] = sum_i W[r][i] X[t][i] for t < n; X [n][ldx] (first cols used), Y [n][ldy] (first rows written).
// Each weight row is read and dequantized once for all n inputs.
void matmul_rows(const Mat& w, const float* x, int64_t n, int64_t ldx, float* y, int64_t ldy, ThreadPool& pool);

// out[i] = W[row][i] in fp32 (embedding gather); out [cols].
void gather_row(const Mat& w, int64_t row, float* out);

// out[r][i] = W[row0 + r][i] for r < n_rows; out [n_rows][cols]. For tests and small tensors only.
void dequantize_rows(const Mat& w, int64_t row0, int64_t n_rows, float* out);

// Checks that a Mat's fields are self-consistent (format, bits, group size, pointers); throws lily::Error
// naming `what`.
void check_mat(const Mat& w, const char* what);

}  // namespace lily
