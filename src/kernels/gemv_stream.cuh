// Building blocks of the streaming q4 kernels (gemv.cu: plain / batched GEMV with K = 2048 or 4096; moe.cu,
// moe_fused.cu: expert gate/up with SwiGLU; gdn_fused.cu). Design: a warp owns R rows; each lane issues all
// its 16-byte weight loads (chunks lane, lane + 32, ... of each row, 32 q4 elements each) and its scale|bias
// words before anything else, so R * K / 2 bytes per warp are in flight with few registers. x is staged once
// per block in shared memory, per 32-element chunk c as 16-bit fixed point, x ~ sx_c * (256 hi + lo) with
// int8 hi, lo (StreamX); the dot products are then integer: per 8 weights (one 32-bit word of nibbles) two
// masks and four dp4a (sum q*hi, sum q*lo over the even and the odd elements), 7 instructions where the fp32
// path took 20 (the kernels were issue-bound: the arithmetic added ~36 % to a 14 MB phase, bench_stream).
// Per chunk and row: scale * sx * (256 Dhi + Dlo) + bias * sum(x), the sum of x in fp32 (exact as before).
// Error: |x - x~| <= max|x_c| / 65024 per element (a 16-bit mantissa relative to the chunk's largest
// element), max|x_c| / 32512 where t lands on an exact .5 tie and lo is clamped; the int sums are exact. Tests
// compare against a reference on x~ (kernel_test_util.h stream_x).
#pragma once
#include "kernels/gemv_impl.cuh"
#include "kernels/qdot.cuh"

namespace lily::cuda::detail {

template <int K>
struct StreamX {
  static constexpr int nch = K / 32;  // 32-element chunks per row
  // xq[k * nch + c]: word k (elements 8k .. 8k + 7) of chunk c as int8x4 {hi of the even elements 8k + 0, 2,
  // 4, 6; hi of the odd ones; lo even; lo odd}: the order of the nibbles in (w & 0x0f0f0f0f) and
  // ((w >> 4) & 0x0f0f0f0f) of the weight word.
  uint4 xq[4 * nch];
  float sx[nch];                      // chunk c's unit: x = sx * (256 hi + lo)
  float xsum[nch];                    // sum of chunk c (fp32, the float values)
  float red[32];                      // per-warp partial sums of squares (fused RMSNorm)
};

// The 16-bit fixed point of x (StreamX): t = x * (127 / max|x_c|) in [-127, 127], hi = rint(t),
// lo = clamp(rint((t - hi) * 256), -127, 127) (t - hi is exact), sx = max|x_c| / 32512. The test reference
// (kernel_test_util.h) repeats these fp32 steps.
__device__ __forceinline__ void x16_split(float x, float inv, int& hi, int& lo) {
  const float t = x * inv;
  const float h = rintf(t);
  hi = static_cast<int>(h);
  lo = max(-127, min(127, static_cast<int>(rintf((t - h) * 256.f))));
}

// Fused RMSNorm of the GEMV input (docs/model.md §2.1): x = h * rsqrt(mean(h²) + eps) * w, w the effective weight.
// Every block computes the same sum in the same order, so all blocks stage bit-identical x; block 0 also
// stores x to x_out (when non-null) for later kernels (the MoE experts read the normed input).
struct NormIn {
  const float* w = nullptr;  // [K]; nullptr: x is used as given
  float eps = 0.f;
  float* x_out = nullptr;    // [K] or nullptr
  float* x_smem = nullptr;   // [K] shared memory or nullptr: every block also keeps x in plain fp32 order
  bool pdl = false;          // launched with PDL: h only after griddepcontrol.wait (no launcher sets it now)
};

__device__ __forceinline__ float4 x4_at(const float* x, int i) { return reinterpret_cast<const float4*>(x)[i]; }
__device__ __forceinline__ float4 x4_at(const uint16_t* x, int i) {
  const uint2 v = reinterpret_cast<const uint2*>(x)[i];
  return make_float4(bf16_lo(v.x), bf16_hi(v.x), bf16_lo(v.y), bf16_hi(v.y));
}

// Stage one float4 of x (float4 index i: chunk i / 8, part i % 8, elements 4p .. 4p + 3 of the chunk): its
// fixed-point bytes and, in the lane holding part 0, the chunk's unit and sum (the parts summed pairwise, a
// butterfly every lane of the 8 computes alike). The 8 parts of a chunk are in 8 consecutive lanes
// (i = threadIdx.x + a multiple of 8); every lane must call; lanes with store = false only take part in the
// shuffles (s may live in global memory: the GDN mixer's step blocks stage their outputs there). Every block
// staging x runs it at once (issue-bound: 16 warps) and the GDN step and the MoE act wait on it: 3 shuffles for
// the sum where a sequential order took 8.
template <int K>
__device__ __forceinline__ void stream_put_x4(StreamX<K>& s, int i, float4 v, bool store = true) {
  constexpr int nch = K / 32;
  float t = (v.x + v.y) + (v.z + v.w);
  float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) {
    t += __shfl_xor_sync(0xffffffffu, t, o);
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  }
  const float inv = m > 0.f ? 127.f / m : 0.f;
  int h0, h1, h2, h3, l0, l1, l2, l3;
  x16_split(v.x, inv, h0, l0);
  x16_split(v.y, inv, h1, l1);
  x16_split(v.z, inv, h2, l2);
  x16_split(v.w, inv, h3, l3);
  // this part's half of word p / 2: even elements (v.x, v.z) and odd ones (v.y, v.w), 2 bytes each
  const uint32_t hi = (h0 & 0xff) | (h2 & 0xff) << 8 | (h1 & 0xff) << 16 | (h3 & 0xff) << 24;
  const uint32_t lo = (l0 & 0xff) | (l2 & 0xff) << 8 | (l1 & 0xff) << 16 | (l3 & 0xff) << 24;
  const uint32_t hi2 = __shfl_xor_sync(0xffffffffu, hi, 1), lo2 = __shfl_xor_sync(0xffffffffu, lo, 1);
  if (store && (i & 1) == 0) {  // the even part writes the word: its bytes first (elements 8k + 0..3), then the odd part's
    uint4 q;
    q.x = (hi & 0xffffu) | hi2 << 16;
    q.y = hi >> 16 | (hi2 & 0xffff0000u);
    q.z = (lo & 0xffffu) | lo2 << 16;
    q.w = lo >> 16 | (lo2 & 0xffff0000u);
    s.xq[((i & 7) >> 1) * nch + (i >> 3)] = q;
  }
  if (store && (i & 7) == 0) {
    s.xsum[i >> 3] = t;
    s.sx[i >> 3] = m / 32512.f;
  }
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
// The norm weights of this thread's elements: requested before the reduction (the persistent kernels: at entry,
// they are constant), not after it, which cost a memory round trip more.
template <int K, int NT>
struct NormW {
  float4 w[K / 4 / NT];
};
template <int K, int NT>
__device__ __forceinline__ NormW<K, NT> stream_load_norm_w(const float* w) {
  NormW<K, NT> r;
#pragma unroll
  for (int j = 0; j < K / 4 / NT; ++j) r.w[j] = x4_at(w, threadIdx.x + j * NT);
  return r;
}
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

// nw: the norm weights loaded ahead, or null (read from n.w after the reduction: stream_stage_x_norm, the GEMV
// launched with PDL, whose weight rows hold the registers). mid(): run by every thread once the block's h has
// arrived (after the sum of squares' barrier), before the rest of the norm (the GDN mixer requests its weight
// rows there).
struct NoMid {
  __device__ void operator()() const {}
};
template <int K, int NT, typename Mid = NoMid>
__device__ __forceinline__ void stream_stage_loaded_norm(const HRegs<K, NT>& hr, const NormW<K, NT>* nw,
                                                         const NormIn& n, StreamX<K>& s, Mid mid = {}) {
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
  mid();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < NT / 32; ++w) total += s.red[w];
  const float r = rsqrtf(total / K + n.eps);
  const bool store = n.x_out != nullptr && blockIdx.x == 0;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = threadIdx.x + j * NT;
    const float4 w = nw ? nw->w[j] : x4_at(n.w, i);
    const float4 x = make_float4(v[j].x * r * w.x, v[j].y * r * w.y, v[j].z * r * w.z, v[j].w * r * w.w);
    if (store) reinterpret_cast<float4*>(n.x_out)[i] = x;
    if (n.x_smem) reinterpret_cast<float4*>(n.x_smem)[i] = x;
    stream_put_x4(s, i, x);
  }
  __syncthreads();
}

// Stage x = RMSNorm(h) with h and the norm weights requested together (the streaming GEMVs' prologue when h is
// final at launch: before any weight request).
template <int K, int NT>
__device__ __forceinline__ void stream_stage_norm_first(const float* h, const NormIn& n, StreamX<K>& s) {
  HRegs<K, NT> hr;
  stream_load_h(h, hr);
  const NormW<K, NT> nw = stream_load_norm_w<K, NT>(n.w);
  stream_stage_loaded_norm<K, NT>(hr, &nw, n, s);
}

template <int K, int NT>
__device__ __forceinline__ void stream_stage_x_norm(const float* h, const NormIn& n, StreamX<K>& s) {
  HRegs<K, NT> hr;
#pragma unroll
  for (int j = 0; j < K / 4 / NT; ++j) hr.v[j] = x4_at(h, threadIdx.x + j * NT);
  stream_stage_loaded_norm<K, NT>(hr, nullptr, n, s);
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

// Stage: issue this lane's loads of R q4 rows (K / 1024 chunks each and their scale|bias words), chunk-major:
// chunk 0 of every row, then chunk 1, ..., the order stream_dots consumes them. An SM receives its data in the
// order it requested it, so the dots of the first chunks run while the later ones arrive (row-major requests
// made the first chunk loop wait for the last row).
// Only the first n rows are requested (the others' registers are left as they are: callers do not store them),
// and only chunks [C0, C1) (a caller may request chunk 0 early and the rest later).
template <int K, int R, int C0 = 0, int C1 = K / 1024>
__device__ __forceinline__ void stream_load_rows(const uint8_t* const (&wrow)[R], const uint32_t* const (&sbrow)[R],
                                                 uint4 (&wv)[R][K / 1024], uint32_t (&sv)[R][K / 1024], int n = R) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = C0; c < C1; ++c)
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r < n) {
        wv[r][c] = ld_stream(wrow[r] + (lane + 32 * c) * 16);
        sv[r][c] = ld_stream_u32(sbrow[r] + (lane + 32 * c) / 2);
      }
}
// One row.
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
// The addresses of the R consecutive rows [task0, task0 + R) of a MultiArgs row space (rows past the end repeat
// the last one), and their requests.
template <int R>
struct RowPtrs {
  const uint8_t* w[R];
  const uint32_t* sb[R];
};
template <int K, int R>
__device__ __forceinline__ RowPtrs<R> multi_row_ptrs(const MultiArgs& a, int task0) {
  RowPtrs<R> p;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int task = min(task0 + r, a.total - 1);
    const int m = find_mat(a, task);
    const size_t row = static_cast<size_t>(task - pick(a.off, m));
    p.w[r] = pick(a.w, m) + row * (K / 2);
    p.sb[r] = pick(a.sb, m) + row * (K / kGroupSize);
  }
  return p;
}
template <int K, int R>
__device__ __forceinline__ void stream_load_multi_rows(const MultiArgs& a, int task0, uint4 (&wv)[R][K / 1024],
                                                       uint32_t (&sv)[R][K / 1024]) {
  const RowPtrs<R> p = multi_row_ptrs<K, R>(a, task0);
  stream_load_rows<K, R>(p.w, p.sb, wv, sv);
}

// One 32-bit word of nibbles (8 weights) against its staged x word xq: the hi and lo integer sums.
__device__ __forceinline__ void word_dp4a(uint32_t w, uint4 xq, int& dh, int& dl) {
  const int even = static_cast<int>(w & 0x0f0f0f0fu), odd = static_cast<int>((w >> 4) & 0x0f0f0f0fu);
  dh = __dp4a(even, static_cast<int>(xq.x), dh);
  dh = __dp4a(odd, static_cast<int>(xq.y), dh);
  dl = __dp4a(even, static_cast<int>(xq.z), dl);
  dl = __dp4a(odd, static_cast<int>(xq.w), dl);
}
// A chunk's contribution from its integer sums: scale * sx * (256 dh + dl) + bias * sum(x) (256 dh + dl < 2^24:
// exact in fp32).
__device__ __forceinline__ float chunk_from_sums(uint32_t sb, float sx, float xsum, int dh, int dl) {
  return fmaf(bf16_lo(sb) * sx, static_cast<float>(dh * 256 + dl), bf16_hi(sb) * xsum);
}

// One chunk ch of a q4 row (its 16 bytes w and scale|bias word sb) with the staged x: stream_dots below for a
// single row.
template <int K>
__device__ __forceinline__ float stream_chunk_dot(const StreamX<K>& xs, int ch, uint4 w, uint32_t sb) {
  constexpr int nch = K / 32;
  int dh = 0, dl = 0;
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) word_dp4a(ws[k], xs.xq[k * nch + ch], dh, dl);
  return chunk_from_sums(sb, xs.sx[ch], xs.xsum[ch], dh, dl);
}

// Stage: this lane's partial dot products of R rows with x (sum over the lanes still to do).
// after0() (optional) runs once chunk 0 of every row has been consumed (its data has arrived).
template <int K, int R, typename After0 = NoMid>
__device__ __forceinline__ void stream_dots(const StreamX<K>& xs, const uint4 (&wv)[R][K / 1024],
                                            const uint32_t (&sv)[R][K / 1024], float (&acc)[R], After0 after0 = {}) {
  constexpr int nch = K / 32, nc = K / 1024;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
#pragma unroll
  for (int c = 0; c < nc; ++c) {
    const int ch = lane + 32 * c;
    int dh[R], dl[R];
#pragma unroll
    for (int r = 0; r < R; ++r) dh[r] = dl[r] = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint4 xq = xs.xq[k * nch + ch];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint32_t w = k == 0 ? wv[r][c].x : k == 1 ? wv[r][c].y : k == 2 ? wv[r][c].z : wv[r][c].w;
        word_dp4a(w, xq, dh[r], dl[r]);
      }
    }
    const float sx = xs.sx[ch], X = xs.xsum[ch];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] += chunk_from_sums(sv[r][c], sx, X, dh[r], dl[r]);
    if (c == 0) after0();
  }
}

}  // namespace lily::cuda::detail
