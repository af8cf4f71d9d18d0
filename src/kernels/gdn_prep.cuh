// The Gated DeltaNet prompt chunk's internals shared by kernels/gdn_chunk.cu (the prep kernel, the sequential
// recurrence) and kernels/gdn_wy.cu (the chunked form on the tensor cores).
#pragma once

#include <cstddef>

#include "kernels/mixers.h"

namespace lily::cuda {

// Row layout of the prep's output per token (floats): q normed and scaled [Hk][Dk] | k normed [Hk][Dk] |
// v after conv + SiLU [Hv][Dv] | k . q [Hk] | beta [Hv] | decay [Hv] | log decay [Hv] | padding to a multiple of
// 4 floats (rows start 16-byte aligned: the 16-byte copies of q, k and v).
struct PrepRow {
  int key_dim, vd, n_k, n_v;
  __host__ __device__ int width() const { return (2 * key_dim + vd + n_k + 3 * n_v + 3) & ~3; }
  __host__ __device__ int q(int kh) const { return kh * (key_dim / n_k); }
  __host__ __device__ int k(int kh) const { return key_dim + q(kh); }
  __host__ __device__ int v(int h) const { return 2 * key_dim + h * (vd / n_v); }
  __host__ __device__ int kq(int kh) const { return 2 * key_dim + vd + kh; }
  __host__ __device__ int beta(int h) const { return 2 * key_dim + vd + n_k + h; }
  __host__ __device__ int decay(int h) const { return 2 * key_dim + vd + n_k + n_v + h; }
  __host__ __device__ int log_decay(int h) const { return 2 * key_dim + vd + n_k + 2 * n_v + h; }
};
inline PrepRow prep_row(GdnDims d) {
  return PrepRow{d.n_k_heads * d.k_dim, d.n_v_heads * d.v_dim, d.n_k_heads, d.n_v_heads};
}

// The chunked form (kernels/gdn_wy.cu): the real model's head size only.
bool gdn_wy_supported(GdnDims dims);
// Its work area for n tokens (bytes).
size_t gdn_wy_work_bytes(int n, GdnDims dims);
// o (ungated, [n][Hv * Dv]) and the state after the chunk, from the prep rows of n tokens at positions pos0 ...
void launch_gdn_wy(const float* prep, float* work, float* state, float* out, int pos0, int n, GdnDims dims,
                   cudaStream_t s);

}  // namespace lily::cuda
