// Building blocks of the streaming q4 kernels (gemv.cu: plain / batched GEMV with K = 2048 or 4096; moe.cu:
// expert gate/up with SwiGLU). Design: a warp owns R rows; each lane issues all its 16-byte weight loads
// (chunks lane, lane + 32, ... of each row, 32 q4 elements each) and its scale|bias words before anything
// else, so R * K / 2 bytes per warp are in flight with few registers (<= 64 at R * K <= 8192: four 256-thread
// blocks per SM, leaving room for the next kernel's blocks to prefetch under PDL). x is staged once per block
// in shared memory, permuted so that the lanes (consecutive chunks) read conflict-free float4s, with one
// x-sum per 32-element chunk; each x float4 read is reused for the warp's R rows. Dequantisation as in
// qdot.cuh: f = 1 + q/16 by PRMT, sum x*q = 16 (sum x*f - sum x), fp32 throughout.
#pragma once
#include "kernels/qdot.cuh"

namespace lily::cuda::detail {

template <int K>
struct StreamX {
  static constexpr int nch = K / 32;  // 32-element chunks per row
  float4 xt[8 * nch];                 // xt[p * nch + c] = x[32c + 4p .. 32c + 4p + 3]
  float xsum[nch];                    // sum of chunk c
  float red[32];                      // per-warp partial sums of squares (fused RMSNorm)
};

// Fused RMSNorm of the GEMV input (model.md §2.1): x = h * rsqrt(mean(h²) + eps) * w, w the effective weight.
// Every block computes the same sum in the same order, so all blocks stage bit-identical x; block 0 also
// stores x to x_out (when non-null) for later kernels (the MoE experts read the normed input).
struct NormIn {
  const float* w = nullptr;  // [K]; nullptr: x is used as given
  float eps = 0.f;
  float* x_out = nullptr;    // [K] or nullptr
  bool pdl = false;          // launched with PDL: h may only be read after griddepcontrol.wait
};

__device__ __forceinline__ float4 x4_at(const float* x, int i) { return reinterpret_cast<const float4*>(x)[i]; }
__device__ __forceinline__ float4 x4_at(const uint16_t* x, int i) {
  const uint2 v = reinterpret_cast<const uint2*>(x)[i];
  return make_float4(bf16_lo(v.x), bf16_hi(v.x), bf16_lo(v.y), bf16_hi(v.y));
}

// Stage one float4 of x (float4 index i: chunk i / 8, part i % 8) and, in the lane holding part 0, the chunk
// sum in the order of load_x (parts 0..7 in sequence), so results equal the other kernels' bit for bit. The 8
// parts of a chunk are in 8 consecutive lanes (i = threadIdx.x + a multiple of 8); every lane must call.
template <int K>
__device__ __forceinline__ void stream_put_x4(StreamX<K>& s, int i, float4 v) {
  constexpr int nch = K / 32;
  s.xt[(i & 7) * nch + (i >> 3)] = v;
  const float part = (v.x + v.y) + (v.z + v.w);
  float t = 0.f;
#pragma unroll
  for (int k = 0; k < 8; ++k) t += __shfl_sync(0xffffffffu, part, (threadIdx.x & 24) + k);
  if ((i & 7) == 0) s.xsum[i >> 3] = t;
}

// Stage: x [K] into s by a block of NT threads (every thread takes part; ends with a barrier).
template <int K, int NT, typename XT>
__device__ __forceinline__ void stream_stage_x(const XT* x, StreamX<K>& s) {
  static_assert((K / 4) % NT == 0, "K / 4 must be a multiple of the block size");
#pragma unroll
  for (int j = 0; j < K / 4 / NT; ++j) {
    const int i = threadIdx.x + j * NT;
    stream_put_x4(s, i, x4_at(x, i));
  }
  __syncthreads();
}

// Stage: x = RMSNorm(h) (see NormIn) into s by a block of NT threads; ends with a barrier.
// h in registers first (stream_load_h), then the norm from them (stream_stage_loaded_norm): kernels that issue
// many weight loads at entry load h before them, so its L2 reads are not queued behind the weight stream.
template <int K, int NT>
struct HRegs {
  float4 v[K / 4 / NT];
};
template <int K, int NT>
__device__ __forceinline__ void stream_load_h(const float* h, HRegs<K, NT>& r) {
  static_assert((K / 4) % NT == 0 && NT % 32 == 0, "K / 4 must be a multiple of the block size");
#pragma unroll
  for (int j = 0; j < K / 4 / NT; ++j) {
    const float4* p = reinterpret_cast<const float4*>(h) + threadIdx.x + j * NT;
    asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(r.v[j].x), "=f"(r.v[j].y), "=f"(r.v[j].z), "=f"(r.v[j].w)
                 : "l"(p));
  }
}

template <int K, int NT>
__device__ __forceinline__ void stream_stage_loaded_norm(const HRegs<K, NT>& hr, const NormIn& n, StreamX<K>& s) {
  constexpr int J = K / 4 / NT;
  float4 v[J];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    v[j] = hr.v[j];
    ss = fmaf(v[j].x, v[j].x, fmaf(v[j].y, v[j].y, fmaf(v[j].z, v[j].z, fmaf(v[j].w, v[j].w, ss))));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) s.red[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < NT / 32; ++w) total += s.red[w];
  const float r = rsqrtf(total / K + n.eps);
  const bool store = n.x_out != nullptr && blockIdx.x == 0;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = threadIdx.x + j * NT;
    const float4 w = x4_at(n.w, i);
    const float4 x = make_float4(v[j].x * r * w.x, v[j].y * r * w.y, v[j].z * r * w.z, v[j].w * r * w.w);
    if (store) reinterpret_cast<float4*>(n.x_out)[i] = x;
    stream_put_x4(s, i, x);
  }
  __syncthreads();
}

template <int K, int NT>
__device__ __forceinline__ void stream_stage_x_norm(const float* h, const NormIn& n, StreamX<K>& s) {
  HRegs<K, NT> hr;
#pragma unroll
  for (int j = 0; j < K / 4 / NT; ++j) hr.v[j] = x4_at(h, threadIdx.x + j * NT);
  stream_stage_loaded_norm<K, NT>(hr, n, s);
}

// Either stage: plain x, or RMSNorm(x) when n.w is set (x must then be fp32).
template <int K, int NT, typename XT>
__device__ __forceinline__ void stream_stage_input(const XT* x, const NormIn& n, StreamX<K>& s) {
  if constexpr (sizeof(XT) == 4) {
    if (n.w) {
      stream_stage_x_norm<K, NT>(x, n, s);
      return;
    }
  }
  stream_stage_x<K, NT>(x, s);
}

// Stage: issue this lane's loads of one q4 row (K / 1024 chunks and their scale|bias words).
template <int K>
__device__ __forceinline__ void stream_load_row(const uint8_t* wrow, const uint32_t* sbrow, uint4 (&wv)[K / 1024],
                                                uint32_t (&sv)[K / 1024]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < K / 1024; ++c) {
    wv[c] = ld_stream(wrow + (lane + 32 * c) * 16);
    sv[c] = ld_stream_u32(sbrow + (lane + 32 * c) / 2);
  }
}

// Stage: this lane's partial dot products of R rows with x (sum over the lanes still to do).
template <int K, int R>
__device__ __forceinline__ void stream_dots(const StreamX<K>& xs, const uint4 (&wv)[R][K / 1024],
                                            const uint32_t (&sv)[R][K / 1024], float (&acc)[R]) {
  constexpr int nch = K / 32, nc = K / 1024;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
#pragma unroll
  for (int c = 0; c < nc; ++c) {
    const int ch = lane + 32 * c;
    float s0[R], s1[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s0[r] = s1[r] = 0.f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 xa = xs.xt[(2 * k) * nch + ch], xb = xs.xt[(2 * k + 1) * nch + ch];
      const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint32_t w = k == 0 ? wv[r][c].x : k == 1 ? wv[r][c].y : k == 2 ? wv[r][c].z : wv[r][c].w;
        const uint32_t lo = ((w << 3) & 0x78787878u) | 0x80808080u;  // byte j: 0x80 | q[2j] << 3
        const uint32_t hi = ((w >> 1) & 0x78787878u) | 0x80808080u;  // byte j: 0x80 | q[2j+1] << 3
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          s0[r] = fmaf(xv[2 * j], __uint_as_float(__byte_perm(lo, 0x3f000000u, 0x7044u | (j << 8))), s0[r]);
          s1[r] = fmaf(xv[2 * j + 1], __uint_as_float(__byte_perm(hi, 0x3f000000u, 0x7044u | (j << 8))), s1[r]);
        }
      }
    }
    const float X = xs.xsum[ch];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] += fmaf(16.f * bf16_lo(sv[r][c]), (s0[r] + s1[r]) - X, bf16_hi(sv[r][c]) * X);
  }
}

}  // namespace lily::cuda::detail
