// Decode attention (batch 1, one query token) over a paged bf16 KV cache, model.md §2.3:
//   score_tile     the group's query heads (8 for the real model) score a tile of 64 tokens against each key
//                  row, read once for all of them (GQA packing); one warp per 8 tokens
//   softmax_tile   online softmax per head: running max / sum, rescale factor for the accumulators
//   pv_tile        accumulate p·V with each value row read once for all heads of the group
//   combine        the last split block of a KV head (ticket counter) merges every split's (acc, m, l) and
//                  applies the sigmoid output gate
// Grid: (splits, n_kv). The token range [0, *pos] is cut into `splits` chunks at run time, so one captured
// graph serves every context length (flash-decoding); short contexts leave most blocks empty.
// Tested against a CPU reference in tests/gpu/test_mixer_kernels.cu (including a 128K-token cache).
#include <cfloat>

#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "kernels/mixers.h"
#include "util/bf16.h"

namespace lily::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;
constexpr int kTokPerWarp = kAttnTile / kWarps;  // 8
constexpr int kMinChunk = 256;                   // fewest tokens a split is given
constexpr int kMaxSplits = 128;                  // split blocks per KV head at most
constexpr float kLog2e = 1.4426950408889634f;

// EPL consecutive bf16 values kept packed in registers (half the registers of fp32), unpacked on use.
template <int EPL>
struct Row {
  uint32_t w[EPL / 2 > 0 ? EPL / 2 : 1];
};

// p is aligned to EPL * 2 bytes; one vector load per lane.
template <int EPL>
__device__ __forceinline__ void load_row(const uint16_t* p, Row<EPL>& r) {
  if constexpr (EPL == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    r.w[0] = u.x, r.w[1] = u.y, r.w[2] = u.z, r.w[3] = u.w;
  } else if constexpr (EPL == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    r.w[0] = u.x, r.w[1] = u.y;
  } else if constexpr (EPL == 2) {
    r.w[0] = *reinterpret_cast<const uint32_t*>(p);
  } else {
    r.w[0] = p[0];
  }
}

template <int EPL>
__device__ __forceinline__ float unpack(const Row<EPL>& r, int e) {
  if constexpr (EPL == 1) return __uint_as_float(r.w[0] << 16);
  return (e & 1) ? __uint_as_float(r.w[e / 2] & 0xffff0000u) : __uint_as_float(r.w[e / 2] << 16);
}

// Reduce 8 per-lane values (one per head) over the warp with a reduce-scatter: 9 shuffles instead of 40.
// Afterwards lane l holds the full sum of head ((l >> 4) & 1) * 4 + ((l >> 3) & 1) * 2 + ((l >> 2) & 1).
__device__ __forceinline__ float reduce_scatter8(float (&v)[kMaxGroup], int lane) {
  const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float send = b4 ? v[k] : v[k + 4];
    const float keep = b4 ? v[k + 4] : v[k];
    v[k] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float send = b3 ? v[k] : v[k + 2];
    const float keep = b3 ? v[k + 2] : v[k];
    v[k] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
  }
  {
    const float send = b2 ? v[0] : v[1];
    const float keep = b2 ? v[1] : v[0];
    v[0] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
  }
  v[0] += __shfl_xor_sync(0xffffffffu, v[0], 2);
  v[0] += __shfl_xor_sync(0xffffffffu, v[0], 1);
  return v[0];
}

struct AttnShared {
  float s[kMaxGroup][kAttnTile];  // scores (log2 domain), then probabilities
  float corr[kMaxGroup];          // rescale of the accumulators for this tile
  float m[kMaxGroup];             // running max (log2 domain)
  float l[kMaxGroup];             // running sum of probabilities
  int last;                       // this block combines
  float w[kMaxGroup][kMaxSplits];     // combine: split maxima, then their weights
  float lsum[kMaxGroup][kMaxSplits];  // combine: split probability sums
};

__device__ __forceinline__ const uint16_t* kv_row(const KvPages& kv, int which, int g, int t) {
  const uint16_t* page = kv.pages[t / kv.page_tokens];
  return page + ((size_t)(which * kv.n_kv + g) * kv.page_tokens + t % kv.page_tokens) * kv.head_dim;
}

template <int EPL>
__global__ void __launch_bounds__(kThreads) attention_decode_kernel(
    const float* __restrict__ q, const float* __restrict__ qg, KvPages kv, const int* __restrict__ pos_ptr,
    float* __restrict__ out, AttnScratch scratch, int group) {
  constexpr int D = EPL * 32;
  __shared__ AttnShared sh;
  __shared__ float acc_sh[kMaxGroup][D];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = blockIdx.y, split = blockIdx.x, splits = gridDim.x;
  dep_trigger();
  dep_wait();
  const int len = *pos_ptr + 1;
  int chunk = (len + splits - 1) / splits;
  chunk = max(kMinChunk, (chunk + kAttnTile - 1) / kAttnTile * kAttnTile);
  const int t_begin = split * chunk, t_end = min(len, t_begin + chunk);

  // queries of the group, pre-scaled by 1/sqrt(d) and log2(e) (softmax in base 2)
  float qr[kMaxGroup][EPL];
  const float qscale = rsqrtf((float)D) * kLog2e;
#pragma unroll
  for (int hh = 0; hh < kMaxGroup; ++hh)
#pragma unroll
    for (int e = 0; e < EPL; ++e)
      qr[hh][e] = hh < group ? q[(size_t)(g * group + hh) * D + lane * EPL + e] * qscale : 0.f;
  float acc[kMaxGroup][EPL] = {};
  if (tid < kMaxGroup) {
    sh.m[tid] = -FLT_MAX;
    sh.l[tid] = 0.f;
  }

  for (int t0 = t_begin; t0 < t_end; t0 += kAttnTile) {
    __syncthreads();  // previous tile's probabilities are consumed
    // score_tile
    // K and V rows of the tile are requested together (one memory round trip per tile)
    Row<EPL> kx[kTokPerWarp] = {}, vx[kTokPerWarp] = {};
#pragma unroll
    for (int k = 0; k < kTokPerWarp; ++k) {
      const int t = t0 + warp * kTokPerWarp + k;
      if (t < t_end) {
        load_row<EPL>(kv_row(kv, 0, g, t) + lane * EPL, kx[k]);
        load_row<EPL>(kv_row(kv, 1, g, t) + lane * EPL, vx[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < kTokPerWarp; ++k) {
      const int t = t0 + warp * kTokPerWarp + k;
      float v[kMaxGroup];
#pragma unroll
      for (int hh = 0; hh < kMaxGroup; ++hh) {
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) d = fmaf(qr[hh][e], unpack(kx[k], e), d);
        v[hh] = d;
      }
      const float sc = reduce_scatter8(v, lane);
      const int hh = ((lane >> 4) & 1) * 4 + ((lane >> 3) & 1) * 2 + ((lane >> 2) & 1);
      if ((lane & 3) == 0) sh.s[hh][warp * kTokPerWarp + k] = t < t_end ? sc : -INFINITY;
    }
    __syncthreads();
    // softmax_tile: warp hh owns head hh
    if (warp < group) {
      const float s0 = sh.s[warp][lane], s1 = sh.s[warp][lane + 32];
      float mx = fmaxf(s0, s1);
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = sh.m[warp];
      const float m_new = fmaxf(m_old, mx);
      const float p0 = exp2f(s0 - m_new), p1 = exp2f(s1 - m_new);
      float sum = p0 + p1;
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      sh.s[warp][lane] = p0;
      sh.s[warp][lane + 32] = p1;
      __syncwarp();
      if (lane == 0) {
        const float c = exp2f(m_old - m_new);
        sh.corr[warp] = c;
        sh.l[warp] = sh.l[warp] * c + sum;
        sh.m[warp] = m_new;
      }
    }
    __syncthreads();
    // pv_tile
#pragma unroll
    for (int hh = 0; hh < kMaxGroup; ++hh) {
      const float c = hh < group ? sh.corr[hh] : 0.f;
#pragma unroll
      for (int e = 0; e < EPL; ++e) acc[hh][e] *= c;
    }
#pragma unroll
    for (int k = 0; k < kTokPerWarp; ++k) {
      const int t = t0 + warp * kTokPerWarp + k;
      if (t >= t_end) break;
#pragma unroll
      for (int hh = 0; hh < kMaxGroup; ++hh) {
        const float p = hh < group ? sh.s[hh][warp * kTokPerWarp + k] : 0.f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[hh][e] = fmaf(p, unpack(vx[k], e), acc[hh][e]);
      }
    }
  }

  // merge the warps' accumulators in a fixed order (deterministic), write this split's partial (acc, m, l)
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w)
#pragma unroll
      for (int hh = 0; hh < kMaxGroup; ++hh)
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc_sh[hh][lane * EPL + e] = (w ? acc_sh[hh][lane * EPL + e] : 0.f) + acc[hh][e];
    __syncthreads();
  }
  const int stride = D + 2;
  float* part = scratch.partial + ((size_t)g * scratch.max_splits + split) * group * stride;
  for (int i = tid; i < group * D; i += kThreads) part[(i / D) * stride + i % D] = (&acc_sh[0][0])[i];
  if (tid < group) {
    part[tid * stride + D] = sh.m[tid];
    part[tid * stride + D + 1] = sh.l[tid];
  }

  // combine: the last block of this KV head to finish merges all splits
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned prev = atomicAdd(&scratch.tickets[g], 1u);
    sh.last = prev == (unsigned)splits - 1;
  }
  __syncthreads();
  if (!sh.last) return;
  __threadfence();
  // note: __ldcg reads through L2 only; this SM's L1 may hold these lines from an earlier launch.
  // Splits [0, n_active) hold tokens; their (m, l) go to shared memory, one warp per head turns them into
  // weights exp2(m - max) and 1 / Σ weight·l, then every output element sums over the active splits with
  // its loads for 8 elements in flight at once.
  const float* parts = scratch.partial + (size_t)g * scratch.max_splits * group * stride;
  const int n_active = min(splits, (len + chunk - 1) / chunk);
  for (int i = tid; i < group * n_active; i += kThreads) {
    const int hh = i / n_active, sp = i % n_active;
    sh.w[hh][sp] = __ldcg(parts + ((size_t)sp * group + hh) * stride + D);
    sh.lsum[hh][sp] = __ldcg(parts + ((size_t)sp * group + hh) * stride + D + 1);
  }
  __syncthreads();
  if (warp < group) {
    float mx = -FLT_MAX;
    for (int sp = lane; sp < n_active; sp += 32) mx = fmaxf(mx, sh.w[warp][sp]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float den = 0.f;
    for (int sp = lane; sp < n_active; sp += 32) {
      const float w = exp2f(sh.w[warp][sp] - mx);
      sh.w[warp][sp] = w;
      den = fmaf(w, sh.lsum[warp][sp], den);
    }
    for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
    if (lane == 0) sh.corr[warp] = 1.f / den;
  }
  __syncthreads();
  constexpr int kPer = kMaxGroup * D / kThreads;  // output elements per thread (<= 8)
  float num[kPer] = {};
#pragma unroll 2
  for (int sp = 0; sp < n_active; ++sp) {
    const float* p = parts + (size_t)sp * group * stride;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int i = tid + k * kThreads, hh = i / D;
      if (hh < group) num[k] = fmaf(sh.w[hh][sp], __ldcg(p + hh * stride + i % D), num[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = tid + k * kThreads, hh = i / D, dim = i % D;
    if (hh >= group) continue;
    const int h = g * group + hh;
    const float gate = qg[(size_t)h * 2 * D + D + dim];
    out[(size_t)h * D + dim] = num[k] * sh.corr[hh] / (1.f + __expf(-gate));
  }
  if (tid == 0) scratch.tickets[g] = 0;  // ready for the next launch (graph replay)
}

}  // namespace

size_t attn_scratch_floats(int n_kv, int max_splits, int group, int head_dim) {
  return (size_t)n_kv * max_splits * group * (head_dim + 2);
}

void launch_attention_decode(const float* q, const float* qg, KvPages kv, const int* pos, float* out,
                             AttnScratch scratch, int splits, int n_heads, cudaStream_t s) {
  const int group = n_heads / kv.n_kv;
  LILY_CHECK(n_heads % kv.n_kv == 0 && group <= kMaxGroup && splits >= 1 && splits <= scratch.max_splits &&
                 splits <= kMaxSplits &&
                 kv.page_tokens % kAttnTile == 0,
             "attention_decode: unsupported n_heads ", n_heads, " n_kv ", kv.n_kv, " splits ", splits);
  const dim3 grid(splits, kv.n_kv), block(kThreads);
  switch (kv.head_dim) {
    case 256: launch_mixer(attention_decode_kernel<8>, grid, block, 0, s, 1, q, qg, kv, pos, out, scratch, group); break;
    case 128: launch_mixer(attention_decode_kernel<4>, grid, block, 0, s, 1, q, qg, kv, pos, out, scratch, group); break;
    case 64: launch_mixer(attention_decode_kernel<2>, grid, block, 0, s, 1, q, qg, kv, pos, out, scratch, group); break;
    case 32: launch_mixer(attention_decode_kernel<1>, grid, block, 0, s, 1, q, qg, kv, pos, out, scratch, group); break;
    default: ::lily::fail("attention_decode: head_dim ", kv.head_dim, " not supported (256, 128, 64, 32)");
  }
}

}  // namespace lily::cuda
