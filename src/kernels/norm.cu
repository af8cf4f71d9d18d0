// The standalone RMSNorm of the decode step (docs/model.md §2.1): add_rmsnorm_kernel, a residual add of up to two
// deltas + RMSNorm with the effective (1 + w) weight, for the multi-launch paths (the fused kernels normalise
// in their prologues; the attention q/k norms are in kernels/qk_rope.cuh). Tested in
// tests/gpu/test_mixer_kernels.cu.
#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "kernels/mixers.h"

namespace lily::cuda {

namespace {

constexpr int kNormThreads = 1024;

// Sum over the block; every thread gets the result. `red` holds one float per warp.
__device__ float block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // `red` may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < (int)(blockDim.x / 32); ++w) t += red[w];
  return t;
}

__global__ void add_rmsnorm_kernel(float* __restrict__ h, const float* __restrict__ d1,
                                   const float* __restrict__ d2, const float* __restrict__ w,
                                   float* __restrict__ out, int n, float eps) {
  __shared__ float red[32];
  dep_trigger();
  dep_wait();
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float x = h[i];
    if (d1) x += d1[i];
    if (d2) x += d2[i];
    if (d1 || d2) h[i] = x;
    ss += x * x;
  }
  const float r = rsqrtf(block_sum(ss, red) / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = h[i] * r * w[i];
}

}  // namespace

void launch_add_rmsnorm(float* h, const float* d1, const float* d2, const float* w, float* out, int n, float eps,
                        cudaStream_t s) {
  launch_mixer(add_rmsnorm_kernel, dim3(1), dim3(kNormThreads), 0, s, 1, h, d1, d2, w, out, n, eps);
}

}  // namespace lily::cuda
