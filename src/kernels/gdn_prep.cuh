// The prompt path's per-token Gated DeltaNet row (kernels/gdn_chunk.cu's prep kernel writes it; the recurrence
// kernels there and in kernels/gdn_wy.cu read it).
#pragma once

namespace lily::cuda {

// Row layout of the prep's output per token (floats): q normed and scaled [Hk][Dk] | k normed [Hk][Dk] |
// v after conv + SiLU [Hv][Dv] | k . q [Hk] | beta [Hv] | decay [Hv].
struct PrepRow {
  int key_dim, vd, n_k, n_v;
  __host__ __device__ int width() const { return 2 * key_dim + vd + n_k + 2 * n_v; }
  __host__ __device__ int q(int kh) const { return kh * (key_dim / n_k); }
  __host__ __device__ int k(int kh) const { return key_dim + q(kh); }
  __host__ __device__ int v(int h) const { return 2 * key_dim + h * (vd / n_v); }
  __host__ __device__ int kq(int kh) const { return 2 * key_dim + vd + kh; }
  __host__ __device__ int beta(int h) const { return 2 * key_dim + vd + n_k + h; }
  __host__ __device__ int decay(int h) const { return 2 * key_dim + vd + n_k + n_v + h; }
};

}  // namespace lily::cuda
