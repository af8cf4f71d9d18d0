// Normalisation kernels of the decode step (model.md §2.1, §2.3):
//   add_rmsnorm_kernel           residual add of up to two deltas + RMSNorm with the effective (1 + w) weight
//   qk_norm_rope_append_kernel   attention q/k RMSNorm, partial NeoX RoPE (fp32 angles), KV-cache append
// Tested against CPU references in tests/gpu/test_mixer_kernels.cu.
#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "kernels/mixers.h"
#include "util/bf16.h"

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

// The rotation frequency of element i < rope_dim: inv_freq = theta^(-2f/rope_dim), f = i % (rope_dim / 2),
// computed in double and rounded to fp32 (the angles are fp32). Independent of the step's data: the kernel
// computes it before waiting for the previous launch (a double pow is a long dependent chain).
__device__ float rope_inv_freq(int i, int rope_dim, float theta) {
  if (i >= rope_dim) return 0.f;
  const int f = i % (rope_dim / 2);
  return (float)pow((double)theta, -2.0 * f / rope_dim);
}

// x [d] in registers of one block (one element per thread, d = blockDim.x): RMSNorm with weight w, then
// rotate-half RoPE on the first rope_dim elements (inv_freq: rope_inv_freq of this thread's element). Returns
// this thread's element.
__device__ float norm_rope(float x, const float* __restrict__ w, int pos, int rope_dim, float inv_freq, float eps,
                           float* red, float* buf) {
  const int i = threadIdx.x, d = blockDim.x;
  const float r = rsqrtf(block_sum(x * x, red) / d + eps);
  const float y = x * r * w[i];
  buf[i] = y;
  __syncthreads();
  if (i >= rope_dim) return y;
  const int half = rope_dim / 2;
  const int f = i % half;
  float sn, cs;
  sincosf((float)pos * inv_freq, &sn, &cs);
  const float x1 = buf[f], x2 = buf[f + half];
  return i < half ? x1 * cs - x2 * sn : x2 * cs + x1 * sn;
}

// Blocks [0, n_heads): query heads; blocks [n_heads, n_heads + n_kv): KV heads. blockDim.x = head_dim.
__global__ void qk_norm_rope_append_kernel(const float* __restrict__ qg, const float* __restrict__ k,
                                           const float* __restrict__ v, const float* __restrict__ q_norm,
                                           const float* __restrict__ k_norm, float* __restrict__ q_out,
                                           KvPages kv, const int* __restrict__ pos_ptr, int n_heads, int rope_dim,
                                           float theta, float eps) {
  extern __shared__ float buf[];  // [head_dim]
  __shared__ float red[32];
  const int d = blockDim.x, i = threadIdx.x;
  const float inv_freq = rope_inv_freq(i, rope_dim, theta);
  dep_trigger();
  dep_wait();
  const int pos = *pos_ptr;
  if ((int)blockIdx.x < n_heads) {
    const int h = blockIdx.x;
    const float y = norm_rope(qg[(size_t)h * 2 * d + i], q_norm, pos, rope_dim, inv_freq, eps, red, buf);
    q_out[(size_t)h * d + i] = y;
    return;
  }
  const int g = blockIdx.x - n_heads;
  const float y = norm_rope(k[(size_t)g * d + i], k_norm, pos, rope_dim, inv_freq, eps, red, buf);
  uint16_t* page = kv.pages[pos / kv.page_tokens];
  const int t = pos % kv.page_tokens;
  const size_t k_off = ((size_t)g * kv.page_tokens + t) * d + i;
  const size_t v_off = ((size_t)(kv.n_kv + g) * kv.page_tokens + t) * d + i;
  page[k_off] = f32_to_bf16(y);
  page[v_off] = f32_to_bf16(v[(size_t)g * d + i]);
}

}  // namespace

size_t kv_page_elems(int page_tokens, int n_kv, int head_dim) {
  return (size_t)2 * n_kv * page_tokens * head_dim;
}

void launch_add_rmsnorm(float* h, const float* d1, const float* d2, const float* w, float* out, int n, float eps,
                        cudaStream_t s) {
  launch_mixer(add_rmsnorm_kernel, dim3(1), dim3(kNormThreads), 0, s, 1, h, d1, d2, w, out, n, eps);
}

void launch_qk_norm_rope_append(const float* qg, const float* k, const float* v, const float* q_norm,
                                const float* k_norm, float* q_out, KvPages kv, const int* pos, int n_heads,
                                int head_dim, int rope_dim, float theta, float eps, cudaStream_t s) {
  LILY_CHECK(head_dim % 32 == 0 && head_dim <= 1024 && rope_dim % 2 == 0 && rope_dim <= head_dim,
             "qk_norm_rope_append: unsupported head_dim ", head_dim, " / rope_dim ", rope_dim);
  launch_ex(qk_norm_rope_append_kernel, dim3(n_heads + kv.n_kv), dim3(head_dim), head_dim * sizeof(float), s,
            LaunchOpts{attention_pdl(), 1, false}, qg, k, v, q_norm, k_norm, q_out, kv, pos, n_heads, rope_dim, theta,
            eps);
}

}  // namespace lily::cuda
