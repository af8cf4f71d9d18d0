// The fused Gated DeltaNet decode step (model.md §2.2), one launch per linear-attention layer:
//   conv_silu        causal depthwise conv (4 taps) over raw qkv held in a 4-slot ring + SiLU
//   l2norm_qk        L2 norms of the key head's q and k (q additionally * 1/sqrt(Dk))
//   gates            beta = sigmoid(b), decay = exp(-exp(A_log) * softplus(a + dt_bias))
//   delta_rule       S = decay*S; mem = Sᵀk; S += k ⊗ beta(v - mem); o = Sᵀq   (state read once, written once)
//   gated_rmsnorm    y = RMSNorm(o) * w * silu(z), with the head's sum of squares shared over a thread-block
//                    cluster
// Grid: (column tiles of 32 value columns, Hv value heads), one cluster per value head. The columns of a
// head's state are independent in the delta rule, so splitting them over 4 blocks gives 128 blocks for the
// real model; only the output norm needs the whole head, exchanged through distributed shared memory.
// Tested against a CPU reference in tests/gpu/test_mixer_kernels.cu.
#include <cooperative_groups.h>

#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "kernels/mixers.h"

namespace lily::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;   // 8 column quads x 32 row groups
constexpr int kCols = 32;       // value columns per block
constexpr int kMaxDk = 128;     // 32 row groups x 4 rows per thread
constexpr int kRowsPerThread = kMaxDk / 32;

struct GdnShared {
  float qn[kMaxDk];
  float kn[kMaxDk];
  float v[kCols];
  float red[kThreads / 32][kCols];   // per-warp partial column sums
  float o[kCols];
  float warp_ss[kThreads / 32];
  float head_ss;                     // this block's share of Σ o² (read by the cluster)
};

__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(__expf(x)); }

// Causal depthwise conv of channel c at position pos over ring slots (pos-3..pos-1) % 4 and the current value,
// then SiLU. Taps before the sequence start read as 0.
__device__ float conv_silu(const float* __restrict__ conv_w, const float* __restrict__ ring, int conv_dim, int c,
                           float x_cur, int pos) {
  float acc = conv_w[c * 4 + 3] * x_cur;
#pragma unroll
  for (int back = 1; back <= 3; ++back)
    if (pos - back >= 0) acc += conv_w[c * 4 + 3 - back] * ring[(size_t)((pos - back) & 3) * conv_dim + c];
  return silu(acc);
}

// Sum over the 4 row groups of a warp that share a column quad (lanes c4, c4+8, c4+16, c4+24), then over the
// 8 warps through shared memory. Returns the 4 column totals of this thread's quad.
__device__ float4 column_sums(float4 p, float (*red)[kCols]) {
#pragma unroll
  for (int o = 8; o <= 16; o <<= 1) {
    p.x += __shfl_xor_sync(0xffffffffu, p.x, o);
    p.y += __shfl_xor_sync(0xffffffffu, p.y, o);
    p.z += __shfl_xor_sync(0xffffffffu, p.z, o);
    p.w += __shfl_xor_sync(0xffffffffu, p.w, o);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, c4 = threadIdx.x % 8;
  __syncthreads();  // red may still be read by a previous call
  if (lane < 8) {
    red[warp][c4 * 4 + 0] = p.x;
    red[warp][c4 * 4 + 1] = p.y;
    red[warp][c4 * 4 + 2] = p.z;
    red[warp][c4 * 4 + 3] = p.w;
  }
  __syncthreads();
  float4 t = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    t.x += red[w][c4 * 4 + 0];
    t.y += red[w][c4 * 4 + 1];
    t.z += red[w][c4 * 4 + 2];
    t.w += red[w][c4 * 4 + 3];
  }
  return t;
}

__device__ __forceinline__ float4 fma4(float4 a, float s, float4 b) {
  return make_float4(fmaf(a.x, s, b.x), fmaf(a.y, s, b.y), fmaf(a.z, s, b.z), fmaf(a.w, s, b.w));
}

__global__ void __launch_bounds__(kThreads) gdn_step_kernel(
    const float* __restrict__ qkv, const float* __restrict__ z, const float* __restrict__ a_in,
    const float* __restrict__ b_in, const float* __restrict__ conv_w, const float* __restrict__ a_log,
    const float* __restrict__ dt_bias, const float* __restrict__ norm_w, float* __restrict__ ring,
    float* __restrict__ state, float* __restrict__ out, const int* __restrict__ pos_ptr, GdnDims dims, float eps) {
  __shared__ GdnShared sh;
  cg::cluster_group cluster = cg::this_cluster();
  dep_trigger();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int h = blockIdx.y, kh = h / (dims.n_v_heads / dims.n_k_heads);
  const int Dk = dims.k_dim, Dv = dims.v_dim, key_dim = dims.n_k_heads * Dk;
  const int conv_dim = 2 * key_dim + dims.n_v_heads * Dv;
  const int col0 = blockIdx.x * kCols;
  const bool writes_qk = blockIdx.x == 0 && h % (dims.n_v_heads / dims.n_k_heads) == 0;

  // This thread's 4 rows x 4 columns of the state, requested before waiting for the in_proj kernel (no earlier
  // kernel of the step writes this layer's state), so the loads overlap its tail and the conv and norms.
  const int c4 = tid % 8, rg = tid / 8;
  const int col = col0 + c4 * 4;
  const bool col_ok = col < Dv;
  float* S = state + (size_t)h * Dk * Dv;
  float4 s[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int i = rg + 32 * r;
    s[r] = col_ok && i < Dk ? *reinterpret_cast<const float4*>(S + (size_t)i * Dv + col)
                            : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  dep_wait();
  const int pos = *pos_ptr;
  const size_t slot = (size_t)(pos & 3) * conv_dim;

  // conv + SiLU: threads [0,128) q channel tid, [128,256) k channel tid-128; threads [0,32) also one v column.
  const int i_qk = tid % kMaxDk;
  const bool is_k = tid >= kMaxDk;
  float u = 0.f;
  if (i_qk < Dk) {
    const int c = (is_k ? key_dim : 0) + kh * Dk + i_qk;
    const float x = qkv[c];
    u = conv_silu(conv_w, ring, conv_dim, c, x, pos);
    if (writes_qk) ring[slot + c] = x;
  }
  if (tid < kCols && col0 + tid < Dv) {
    const int c = 2 * key_dim + h * Dv + col0 + tid;
    const float x = qkv[c];
    sh.v[tid] = conv_silu(conv_w, ring, conv_dim, c, x, pos);
    ring[slot + c] = x;
  }

  // L2 norms: warps 0-3 hold q, warps 4-7 hold k.
  float ss = u * u;
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) sh.warp_ss[warp] = ss;
  __syncthreads();
  const int half = kThreads / 64;
  float part = 0.f;
  for (int w = 0; w < half; ++w) part += sh.warp_ss[(is_k ? half : 0) + w];
  if (i_qk < Dk) {
    const float scale = is_k ? 1.f : rsqrtf((float)Dk);
    (is_k ? sh.kn : sh.qn)[i_qk] = u * rsqrtf(part + 1e-6f) * scale;
  }

  // gates (every thread computes the two scalars of head h)
  const float beta = sigmoid(b_in[h]);
  const float decay = __expf(-__expf(a_log[h]) * softplus(a_in[h] + dt_bias[h]));
  __syncthreads();

  // delta rule on this thread's 4 rows x 4 columns
  float4 mem = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int i = rg + 32 * r;
    s[r] = make_float4(s[r].x * decay, s[r].y * decay, s[r].z * decay, s[r].w * decay);
    if (i < Dk) mem = fma4(s[r], sh.kn[i], mem);
  }
  mem = column_sums(mem, sh.red);
  float4 dlt = make_float4(0.f, 0.f, 0.f, 0.f);
  if (col_ok) {
    const float* v = sh.v + c4 * 4;
    dlt = make_float4(beta * (v[0] - mem.x), beta * (v[1] - mem.y), beta * (v[2] - mem.z), beta * (v[3] - mem.w));
  }
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int i = rg + 32 * r;
    if (col_ok && i < Dk) {
      const float kn = sh.kn[i];
      s[r] = make_float4(fmaf(kn, dlt.x, s[r].x), fmaf(kn, dlt.y, s[r].y), fmaf(kn, dlt.z, s[r].z),
                         fmaf(kn, dlt.w, s[r].w));
      *reinterpret_cast<float4*>(S + (size_t)i * Dv + col) = s[r];
      o = fma4(s[r], sh.qn[i], o);
    }
  }
  o = column_sums(o, sh.red);

  // gated RMSNorm over the whole head: block partial Σo², summed over the cluster (one block per column tile)
  if (tid < 8) {
    sh.o[c4 * 4 + 0] = o.x;
    sh.o[c4 * 4 + 1] = o.y;
    sh.o[c4 * 4 + 2] = o.z;
    sh.o[c4 * 4 + 3] = o.w;
  }
  __syncthreads();
  if (warp == 0) {
    const float x = col0 + lane < Dv ? sh.o[lane] : 0.f;
    float t = x * x;
    for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
    if (lane == 0) sh.head_ss = t;
  }
  cluster.sync();
  if (warp == 0) {
    float total = 0.f;
    for (unsigned r = 0; r < cluster.num_blocks(); ++r) total += *cluster.map_shared_rank(&sh.head_ss, r);
    const int j = col0 + lane;
    if (j < Dv) {
      const float n = sh.o[lane] * rsqrtf(total / Dv + eps);
      out[(size_t)h * Dv + j] = n * norm_w[j] * silu(z[(size_t)h * Dv + j]);
    }
  }
  cluster.sync();  // keep this block's shared memory alive until every block of the cluster has read it
}

}  // namespace

void launch_gdn_step(const float* qkv, const float* z, const float* a, const float* b, const float* conv_w,
                     const float* a_log, const float* dt_bias, const float* norm_w, float* conv_ring,
                     float* state, float* out, const int* pos, GdnDims dims, float eps, cudaStream_t s) {
  LILY_CHECK(dims.k_dim >= 1 && dims.k_dim <= kMaxDk && dims.v_dim % 4 == 0 && dims.v_dim <= 8 * kCols &&
                 dims.n_k_heads > 0 && dims.n_v_heads % dims.n_k_heads == 0,
             "gdn_step: unsupported dims Dk=", dims.k_dim, " Dv=", dims.v_dim, " Hk=", dims.n_k_heads,
             " Hv=", dims.n_v_heads);
  const int tiles = (dims.v_dim + kCols - 1) / kCols;
  // cluster = the column tiles of one value head (the output norm needs the whole head)
  launch_mixer(gdn_step_kernel, dim3(tiles, dims.n_v_heads), dim3(kThreads), 0, s, tiles, qkv, z, a, b, conv_w, a_log,
               dt_bias, norm_w, conv_ring, state, out, pos, dims, eps);
}

}  // namespace lily::cuda
