// Decode attention (batch 1, one query token) over a paged bf16 KV cache, docs/model.md §2.3, flash-decoding in
// two kernels:
//   attention_split_kernel   grid (splits, n_kv). The tokens [0, *pos] are cut at run time into steps of 8
//                            tokens and the steps spread evenly over the active split blocks (up to 64
//                            tokens each, at least 32 once the context passes 64), so one captured graph
//                            serves every context length. Inside a block each warp walks its own steps with
//                            its own online softmax: no block barrier per tile. Launched with PDL,
//                            it copies its first steps (earlier tokens' rows) before waiting
//                            for the q|k|v projection.
//     norm_rope_lane         (kernels/qk_rope.cuh) q/k RMSNorm + partial rotate-half RoPE of a head held by one
//                            warp (every block its KV head's queries: no separate launch)
//     own_row_append         the warp whose step holds token *pos: its key normalised and rotated, its value,
//                            as bf16 into the cache page and (own_row_patch) into the ring over the copy
//     load_step              cp.async of a step's K and V rows into the warp's 3-stage shared-memory ring,
//                            issued two steps ahead of the compute (loads overlap the math)
//     split_run_mma          head_dim 256 (the real model): per step, the group's 8 query heads score the 8
//                            key rows and accumulate p·V on the tensor cores (mma.sync bf16, fp32 sums, q and
//                            p split into two bf16 terms for ~16-bit mantissas), online softmax in the score
//                            registers; every K/V row read once for all heads of the group (GQA packing)
//     split_run_scalar       smaller heads (the test models): the same steps in fp32 FMAs, a reduce-scatter
//                            leaving head (lane / 4) in each lane
//     merge_warps            the warps' (acc, m, l) merged in a fixed order -> the split's partial
//   attention_combine_kernel (kernels/attention_combine.cu) grid (n_heads, head_dim / 32): merges the active
//                            splits' partials for one head and 32 dims and applies the sigmoid gate.
// Deterministic: every sum has a fixed order; no float atomics. The split kernel reads what another kernel wrote
// through L2 (__ldcg, cp.async.cg): with PDL its block may start on an SM before the previous kernel's blocks
// there finish.
// Tested against a CPU reference in tests/gpu/test_mixer_kernels.cu (odd lengths, tails, a 128K-token cache);
// timed by bench/bench_kernels.cu (attention section).
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "kernels/attention_split.cuh"
#include "kernels/common.cuh"
#include "kernels/grid_barrier.cuh"
#include "kernels/launch.cuh"
#include "kernels/mixers.h"
#include "kernels/mma.cuh"
#include "kernels/qk_rope.cuh"
#include "util/bf16.h"

namespace lily::cuda {

namespace {

using detail::trace_stamp_at;
using qk::LaneRope;
using qk::lane_rope_angles;
using qk::lane_rope_weights;
using qk::load_lane;
using qk::norm_rope_lane;

using attn::active_splits;
using attn::kMaxSplits;
using attn::kStep;
using attn::kWarps;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxGroup = 8;
constexpr int kStages = 3;        // cp.async ring per warp: two steps in flight while one is computed
constexpr float kLog2e = 1.4426950408889634f;

// EPL consecutive bf16 values kept packed in registers (half the registers of fp32), unpacked on use.
template <int EPL>
struct Row {
  uint32_t w[EPL / 2 > 0 ? EPL / 2 : 1];
};

// p (shared memory) is aligned to EPL * 2 bytes; one vector load per lane.
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

// Asynchronous copy of EPL bf16 values (2 * EPL bytes) global -> shared; valid == false writes zeros (a tail
// token past the context: its value row must be 0, not stale shared memory, since p = 0 times NaN is NaN).
template <int EPL>
__device__ __forceinline__ void copy_async(uint16_t* dst, const uint16_t* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int n = valid ? EPL * 2 : 0;
  if constexpr (EPL == 8) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n) : "memory");
  } else if constexpr (EPL == 4) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(n) : "memory");
  } else if constexpr (EPL == 2) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(n) : "memory");
  } else {  // 2 bytes: below cp.async's minimum, a plain (synchronous) copy
    *dst = valid ? *src : uint16_t{0};
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Reduce 8 per-lane values (one per head) over the warp with a reduce-scatter: 9 shuffles instead of 40.
// Afterwards lane l holds the full sum of head l / 4 (all four lanes of a quad hold the same value).
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

// Shared memory of the split kernel besides the dynamic K/V rings.
struct alignas(16) SplitShared {
  uint16_t qa[2 * kMaxGroup * 256];       // tensor-core path: [q_hi; q_lo] as bf16 [16][256] (split_run_mma)
  float x[kWarps][kStep + 1][kMaxGroup];  // per warp: probabilities [token][head], then the rescale per head
  float m[kWarps][kMaxGroup];             // per warp running max (log2 domain) at the end
  float l[kWarps][kMaxGroup];             // per warp running sum at the end
};

// bf16 elements of one warp's ring: [kStages][2 (K, V)][kStep][D]
template <int D>
constexpr int ring_elems() { return kStages * 2 * kStep * D; }

// Where lane's EPL dims of row r of a step sit in its ring stage (elements from the row's start). D = 256 (the
// tensor-core path, read with ldmatrix): the 16-byte chunk c of row r at chunk c ^ (r & 7), so the 8 rows of an
// 8x8 matrix fall in 8 different bank groups. Smaller heads (the scalar path): in place.
template <int EPL>
__device__ __forceinline__ int ring_dim(int r, int lane) {
  if constexpr (EPL == 8) return (lane ^ (r & 7)) * 8;
  return lane * EPL;
}

// Issue the copies of step `step` (tokens [8 step, 8 step + 8)) into one ring stage; lane copies dims
// [lane * EPL, lane * EPL + EPL) of every row (to ring_dim). A step never crosses a page (page_tokens % kStep
// == 0).
template <int EPL>
__device__ __forceinline__ void load_step(const KvPages& kv, int g, int step, int len, uint16_t* stage, int lane) {
  constexpr int D = EPL * 32;
  const int t0 = step * kStep;
  const uint16_t* page = kv.pages[t0 / kv.page_tokens];
  const int row0 = t0 % kv.page_tokens;
#pragma unroll
  for (int which = 0; which < 2; ++which) {
    const uint16_t* src = page + ((size_t)(which * kv.n_kv + g) * kv.page_tokens + row0) * D + lane * EPL;
#pragma unroll
    for (int k = 0; k < kStep; ++k)
      copy_async<EPL>(stage + (which * kStep + k) * D + ring_dim<EPL>(k, lane), src + (size_t)k * D, t0 + k < len);
  }
}

// The warp's ring at step i (in `stage`): keep kStages - 1 steps in flight (issue step i + kStages - 1 into the
// stage computed at step i - 1; at step 0 of a warp with kStages steps or more split_issue_last did), then wait
// until step i has landed.
template <int EPL>
__device__ __forceinline__ void ring_next(const KvPages& kv, int g, int first, int n_my, int len, int i, int stage,
                                          uint16_t* ring, int lane) {
  constexpr int kStageElems = 2 * kStep * EPL * 32;
  if (i > 0 || n_my < kStages) {
    const int j = i + kStages - 1;
    const int js = stage == 0 ? kStages - 1 : stage - 1;
    if (j < n_my) load_step<EPL>(kv, g, first + j * kWarps, len, ring + js * kStageElems, lane);
    cp_async_commit();
  }
  cp_async_wait<kStages - 1>();
  __syncwarp();
}

// One split block's share of the tokens [0, len): steps [s_begin, s_end) of 8 tokens; warp w walks steps
// first + kWarps * i, i < n_my.
struct SplitPlan {
  int len, n_active;
  bool active;  // split < n_active
  int first, n_my;
  int i_own;    // the warp's step i that holds token len - 1 (the current one), or -1
};
__device__ __forceinline__ SplitPlan split_plan(int len, int split, int splits) {
  SplitPlan p;
  const int n_steps = (len + kStep - 1) / kStep;
  p.len = len;
  p.n_active = active_splits(n_steps, splits);
  p.active = split < p.n_active;
  const int s_begin = (int)((long long)split * n_steps / p.n_active);
  const int s_end = (int)((long long)(split + 1) * n_steps / p.n_active);
  p.first = s_begin + threadIdx.x / 32;
  p.n_my = p.first < s_end ? (s_end - p.first + kWarps - 1) / kWarps : 0;
  const int last = n_steps - 1;
  p.i_own = last >= p.first && (last - p.first) % kWarps == 0 && (last - p.first) / kWarps < p.n_my
                ? (last - p.first) / kWarps : -1;
  return p;
}

// The copies of the warp's step i into stage i of its ring (the ring's first fill; no commit).
template <int EPL>
__device__ __forceinline__ void split_issue_stage(const SplitPlan& p, const KvPages& kv, int g, uint16_t* ring_all,
                                                  int i) {
  constexpr int D = EPL * 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  load_step<EPL>(kv, g, p.first + i * kWarps, p.len, ring_all + warp * ring_elems<D>() + i * 2 * kStep * D, lane);
}

// Start the copies of the warp's first kStages - 1 steps into its ring (one commit group each).
template <int EPL>
__device__ __forceinline__ void split_issue_first(const SplitPlan& p, const KvPages& kv, int g, uint16_t* ring_all) {
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < p.n_my) split_issue_stage<EPL>(p, kv, g, ring_all, i);
    cp_async_commit();
  }
}
// The last stage's copies (when the warp has that many steps), issued once the warp has staged its q (tensor-core
// path: before the block's barrier, where it waits for the warp that appends the token's K/V; before: by the
// step loop at step 0, after the barrier). Not before the wait with the first two stages: they delayed the
// wait's return and q.
template <int EPL>
__device__ __forceinline__ void split_issue_last(const SplitPlan& p, const KvPages& kv, int g, uint16_t* ring_all) {
  if (kStages - 1 < p.n_my) {  // (else ring_next commits the empty group at step 0, as before)
    split_issue_stage<EPL>(p, kv, g, ring_all, kStages - 1);
    cp_async_commit();
  }
}

// ---- the token's own K/V row (q/k norm + RoPE: kernels/qk_rope.cuh) ----
// The current token's K and V rows as bf16 (this lane's EPL dims).
template <int EPL>
struct OwnRow {
  uint16_t k[EPL], v[EPL];
};
template <int EPL>
__device__ __forceinline__ void store_bf16_lane(uint16_t* dst, const uint16_t (&x)[EPL]) {
  if constexpr (EPL == 8) {
    uint4 u;
    u.x = x[0] | (uint32_t)x[1] << 16, u.y = x[2] | (uint32_t)x[3] << 16;
    u.z = x[4] | (uint32_t)x[5] << 16, u.w = x[6] | (uint32_t)x[7] << 16;
    *reinterpret_cast<uint4*>(dst) = u;
  } else {
#pragma unroll
    for (int e = 0; e < EPL; ++e) dst[e] = x[e];
  }
}

// Token t's key (normalised, rotated) and value for KV head g, appended to the cache page (read by later steps)
// and returned for the ring (own_row_patch): the split kernel's copies may have read the page's stale row.
template <int EPL>
__device__ __forceinline__ OwnRow<EPL> own_row_append(const AttnIn& in, const LaneRope<EPL>& lr, const KvPages& kv,
                                                      int g, int t) {
  constexpr int D = EPL * 32;
  const int lane = threadIdx.x % 32;
  float kx[EPL], vx[EPL];
  load_lane<EPL>(in.k + (size_t)g * D + lane * EPL, kx);
  load_lane<EPL>(in.v + (size_t)g * D + lane * EPL, vx);
  norm_rope_lane<EPL>(kx, lr.wk, lr, in.eps);
  OwnRow<EPL> r;
#pragma unroll
  for (int e = 0; e < EPL; ++e) r.k[e] = f32_to_bf16(kx[e]), r.v[e] = f32_to_bf16(vx[e]);
  uint16_t* page = kv.pages[t / kv.page_tokens];
  const size_t row = (size_t)g * kv.page_tokens + t % kv.page_tokens;
  store_bf16_lane<EPL>(page + row * D + lane * EPL, r.k);
  store_bf16_lane<EPL>(page + (row + (size_t)kv.n_kv * kv.page_tokens) * D + lane * EPL, r.v);
  return r;
}

// Overwrite row r of a ring stage (after the warp's copies of it landed) with the token's own K and V: each lane
// its own dims, where its copies put them (ring_dim). Ends with __syncwarp.
template <int EPL>
__device__ __forceinline__ void own_row_patch(uint16_t* stage, int r, const OwnRow<EPL>& own) {
  constexpr int D = EPL * 32;
  const int lane = threadIdx.x % 32;
  store_bf16_lane<EPL>(stage + r * D + ring_dim<EPL>(r, lane), own.k);
  store_bf16_lane<EPL>(stage + (kStep + r) * D + ring_dim<EPL>(r, lane), own.v);
  __syncwarp();
}

// merge_warps: weights exp2(m_w - M) per head, scaled accumulators summed over the warps in a fixed order.
// A warp without steps has m = -inf, acc = 0 and weight 0; warp 0 always has a step, so M is finite.
// The weight of warp w's head hh (sh.m of every warp written, then a block barrier).
__device__ __forceinline__ float merge_weight(const SplitShared& sh, int warp, int hh) {
  float mb = sh.m[0][hh];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) mb = fmaxf(mb, sh.m[w][hh]);
  return exp2f(sh.m[warp][hh] - mb);
}

// Row stride of the weighted accumulators a warp leaves in its ring: 4 floats of padding, so the tensor-core
// path's stores (lanes: heads 2 (lane % 4) + {0, 1}, dims lane / 4 + ...) hit 32 different banks.
template <int D>
constexpr int acc_stride() { return D + 4; }
static_assert(kMaxGroup * acc_stride<256>() * 4 <= ring_elems<256>() * 2, "the accumulators fit in a warp's ring");

// After every warp stored its weighted accumulators [kMaxGroup][acc_stride] as fp32 at the start of its ring: their sum
// over the warps, and per head the block's max and sum, into the split's partial.
template <int D>
__device__ __forceinline__ void write_partial(const SplitShared& sh, const uint16_t* ring_all, int g, int split,
                                              int group, const AttnScratch& scratch) {
  __syncthreads();
  const int tid = threadIdx.x;
  const int stride = D + 2;
  float* part = scratch.partial + ((size_t)g * scratch.max_splits + split) * group * stride;
  for (int i = tid; i < group * D; i += kThreads) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      sum += reinterpret_cast<const float*>(ring_all + w * ring_elems<D>())[(i / D) * acc_stride<D>() + i % D];
    part[(i / D) * stride + i % D] = sum;
  }
  if (tid < group) {
    float mb = sh.m[0][tid];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) mb = fmaxf(mb, sh.m[w][tid]);
    float lb = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) lb += exp2f(sh.m[w][tid] - mb) * sh.l[w][tid];
    part[tid * stride + D] = mb;
    part[tid * stride + D + 1] = lb;
  }
}

// The rest of the split block after split_issue_first: scores, online softmax, p·V over its steps, the warps
// merged into the split's partial (acc, m, l) in scratch. Scalar fp32 path (head_dim < 256: the test models).
template <int EPL>
__device__ __forceinline__ void split_run_scalar(const SplitPlan& p, const AttnIn& in, const LaneRope<EPL>& lr,
                                                 const KvPages& kv, int g, int split, int group,
                                                 const AttnScratch& scratch, uint16_t* ring_all, SplitShared& sh) {
  constexpr int D = EPL * 32;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int hh_lane = lane >> 2;  // the head whose scores this lane holds after reduce_scatter8
  const int len = p.len, first = p.first, n_my = p.n_my;
  uint16_t* ring = ring_all + warp * ring_elems<D>();
  constexpr int kStageElems = 2 * kStep * D;

  // queries of the group, normalised and rotated, pre-scaled by 1/sqrt(d) and log2(e) (softmax in base 2);
  // heads past the group are 0
  float qr[kMaxGroup][EPL];
  const float qscale = rsqrtf((float)D) * kLog2e;
  const OwnRow<EPL> own = p.i_own >= 0 ? own_row_append<EPL>(in, lr, kv, g, len - 1) : OwnRow<EPL>{};
#pragma unroll
  for (int hh = 0; hh < kMaxGroup; ++hh) {
    float x[EPL] = {};
    // vector loads where EPL allows: through L2 (__ldcg); scalar loads would each fetch every lane's sector again
    if (hh < group) load_lane<EPL>(in.qg + (size_t)(g * group + hh) * 2 * D + lane * EPL, x);
    norm_rope_lane<EPL>(x, lr.wq, lr, in.eps);
#pragma unroll
    for (int e = 0; e < EPL; ++e) qr[hh][e] = x[e] * qscale;
  }
  split_issue_last<EPL>(p, kv, g, ring_all);
  trace_stamp_at(scratch.trace_split, blockIdx.x + blockIdx.y * gridDim.x, 1);
  float acc[kMaxGroup][EPL] = {};
  float m = -INFINITY, l = 0.f;  // online softmax state of head hh_lane
  float(*x)[kMaxGroup] = sh.x[warp];

  int stage = 0;
  for (int i = 0; i < n_my; ++i) {
    ring_next<EPL>(kv, g, first, n_my, len, i, stage, ring, lane);
    if (i == p.i_own) own_row_patch<EPL>(ring + stage * kStageElems, (len - 1) % kStep, own);
    const uint16_t* kst = ring + stage * kStageElems + lane * EPL;
    const uint16_t* vst = kst + kStep * D;
    const int t0 = (first + i * kWarps) * kStep;
    // score_step
    float s[kStep];
#pragma unroll
    for (int k = 0; k < kStep; ++k) {
      Row<EPL> kr;
      load_row<EPL>(kst + k * D, kr);
      float v[kMaxGroup];
#pragma unroll
      for (int hh = 0; hh < kMaxGroup; ++hh) {
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) d = fmaf(qr[hh][e], unpack(kr, e), d);
        v[hh] = d;
      }
      const float sc = reduce_scatter8(v, lane);
      s[k] = t0 + k < len ? sc : -INFINITY;
    }
    // softmax_step (every step has a valid first token, so m_new is finite)
    float mx = s[0];
#pragma unroll
    for (int k = 1; k < kStep; ++k) mx = fmaxf(mx, s[k]);
    const float m_new = fmaxf(m, mx);
    const float corr = exp2f(m - m_new);  // 0 on the first step (m = -inf)
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kStep; ++k) {
      s[k] = exp2f(s[k] - m_new);
      sum += s[k];
    }
    l = l * corr + sum;
    m = m_new;
    if ((lane & 3) == 0) {
#pragma unroll
      for (int k = 0; k < kStep; ++k) x[k][hh_lane] = s[k];
      x[kStep][hh_lane] = corr;
    }
    __syncwarp();
    // pv_step: rescale only when some head's max moved (rare once the context is long)
    if (__any_sync(0xffffffffu, corr != 1.f)) {
      const float4 c0 = *reinterpret_cast<const float4*>(&x[kStep][0]);
      const float4 c1 = *reinterpret_cast<const float4*>(&x[kStep][4]);
      const float c[kMaxGroup] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
#pragma unroll
      for (int hh = 0; hh < kMaxGroup; ++hh)
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[hh][e] *= c[hh];
    }
#pragma unroll
    for (int k = 0; k < kStep; ++k) {
      Row<EPL> vr;
      load_row<EPL>(vst + k * D, vr);
      const float4 p0 = *reinterpret_cast<const float4*>(&x[k][0]);
      const float4 p1 = *reinterpret_cast<const float4*>(&x[k][4]);
      const float p[kMaxGroup] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
      for (int hh = 0; hh < kMaxGroup; ++hh)
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[hh][e] = fmaf(p[hh], unpack(vr, e), acc[hh][e]);
    }
    __syncwarp();  // this stage and x are rewritten by the next steps
    stage = stage == kStages - 1 ? 0 : stage + 1;
  }
  trace_stamp_at(scratch.trace_split, blockIdx.x + blockIdx.y * gridDim.x, 3);
  cp_async_wait<0>();

  // merge_warps
  if ((lane & 3) == 0) {
    sh.m[warp][hh_lane] = m;
    sh.l[warp][hh_lane] = l;
  }
  __syncthreads();
  float* accw = reinterpret_cast<float*>(ring);  // [kMaxGroup][acc_stride] fp32 in the warp's own ring
#pragma unroll
  for (int hh = 0; hh < kMaxGroup; ++hh) {
    const float f = merge_weight(sh, warp, hh);
#pragma unroll
    for (int e = 0; e < EPL; ++e) accw[hh * acc_stride<D>() + lane * EPL + e] = acc[hh][e] * f;
  }
  write_partial<D>(sh, ring_all, g, split, group, scratch);
}

// ---- tensor-core path (head_dim 256, the real model) ----
// Per warp and 8-token step, with mma.sync on bf16 (K and V are bf16 already; fp32 accumulation):
//   S  [16 x 8]  = A [16 x 256] · K^T   m16n8k16, A's rows 0..7 the group's queries rounded to bf16 (q_hi), rows
//                                       8..15 the rest (q_lo = bf16(q - q_hi)): s = S[h] + S[h + 8] carries ~16
//                                       mantissa bits of q (products with bf16 K exact, sums in fp32)
//   O^T [256 x 8] += V^T · P^T          m16n8k8 per 16 dims, twice: P rounded to bf16 (p_hi) and the rest (p_lo)
// The C fragment of S (lane: head lane / 4, tokens 2 (lane % 4) + {0, 1}) is exactly the B fragment P^T needs, so
// the softmax runs in the registers that hold the scores: a quad of lanes shares one head. K rows are B fragments
// by ldmatrix, V rows A fragments by ldmatrix.trans, both from the swizzled ring (ring_dim). ~110 instructions
// per warp and step where the scalar path takes ~1300 (it was issue-bound: 71 % of copy bandwidth at 128K).
using mma::bf16_round;
using mma::pack_bf16x2;

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void mma_k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_k8(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(b));
}

__device__ __forceinline__ void split_run_mma(const SplitPlan& p, const AttnIn& in, const LaneRope<8>& rope,
                                              const KvPages& kv, int g, int split, int group,
                                              const AttnScratch& scratch, uint16_t* ring_all, SplitShared& sh) {
  constexpr int EPL = 8, D = 256, kRow = D * 2;  // bytes per K/V row in the ring
  constexpr int kStageElems = 2 * kStep * D;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int hq = lane >> 2, tq = lane & 3;  // fragment row (head) and column pair of this lane
  const int len = p.len, first = p.first, n_my = p.n_my;
  uint16_t* ring = ring_all + warp * ring_elems<D>();
  const unsigned ring_s = static_cast<unsigned>(__cvta_generic_to_shared(ring));

  // [q_hi; q_lo] staged once per block as the bf16 A matrix [16][D] (rows 8..15 the remainders; chunk c of row r
  // at c ^ (r & 7)), q normalised and rotated (warp hh holds head hh), pre-scaled by 1/sqrt(d) and log2(e)
  // (softmax in base 2); heads past the group are 0. Each thread converts 8 consecutive values (one 16-byte chunk
  // of a row): one L2 read of q per block, not per warp. The warp whose step holds the current token reads its
  // k and v in the same round trip.
  OwnRow<EPL> own{};
  {
    const float qscale = rsqrtf((float)D) * kLog2e;
    const int hh = warp, c = lane;
    static_assert(kThreads * 8 == kMaxGroup * D && kThreads / 32 == kMaxGroup, "a warp per head, a chunk per thread");
    float v[8] = {};
    if (hh < group) load_lane<8>(in.qg + (size_t)(g * group + hh) * 2 * D + c * 8, v);
    if (p.i_own >= 0) own = own_row_append<EPL>(in, rope, kv, g, len - 1);
    norm_rope_lane<8>(v, rope.wq, rope, in.eps);
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float x0 = v[2 * k] * qscale, x1 = v[2 * k + 1] * qscale;
      const float h0 = bf16_round(x0), h1 = bf16_round(x1);
      hi[k] = pack_bf16x2(h0, h1);
      lo[k] = pack_bf16x2(x0 - h0, x1 - h1);
    }
    *reinterpret_cast<uint4*>(sh.qa + hh * D + ((c ^ hh) * 8)) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    *reinterpret_cast<uint4*>(sh.qa + (hh + 8) * D + ((c ^ hh) * 8)) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }
  split_issue_last<EPL>(p, kv, g, ring_all);  // q has arrived: its issue hidden in the barrier's wait
  __syncthreads();
  // A fragments per 16-dim slice kk (ldmatrix.x4: matrices rows 0-7 / 8-15 x dims 0-7 / 8-15 of the slice)
  uint32_t qa[D / 16][4];
  {
    const unsigned qs = static_cast<unsigned>(__cvta_generic_to_shared(sh.qa));
    const int j = lane >> 3, row = (lane & 7) + 8 * (j & 1);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(qa[kk], qs + row * kRow + (((2 * kk + (j >> 1)) ^ (row & 7)) << 4));
  }
  trace_stamp_at(scratch.trace_split, blockIdx.x + blockIdx.y * gridDim.x, 1);
  float o[D / 16][4] = {};          // O^T m-tile mt: {dim 16 mt + hq, heads 2tq, 2tq + 1}, {dim + 8, same heads}
  float m = -INFINITY, l = 0.f;     // head hq: running max (quad-uniform), this lane's share of the running sum
  // this lane's ldmatrix row address in a stage: row (lane & 7) of matrix (lane >> 3), chunk 4 i + (lane >> 3)
  const int lr = lane & 7;
  const unsigned row_off = lr * kRow;

  int stage = 0;
  for (int i = 0; i < n_my; ++i) {
    ring_next<EPL>(kv, g, first, n_my, len, i, stage, ring, lane);
    if (i == p.i_own) own_row_patch<EPL>(ring + stage * kStageElems, (len - 1) % kStep, own);
    const unsigned kst = ring_s + stage * kStageElems * 2 + row_off, vst = kst + kStep * kRow;
    // S = [q_hi; q_lo] K^T, two accumulators (even / odd slices) for shorter dependency chains
    float sa[4] = {}, sb[4] = {};
#pragma unroll
    for (int i4 = 0; i4 < D / 32; ++i4) {
      uint32_t kb[4];
      ldsm_x4(kb, kst + (((4 * i4 + (lane >> 3)) ^ lr) << 4));
      mma_k16(sa, qa[2 * i4], kb[0], kb[1]);
      mma_k16(sb, qa[2 * i4 + 1], kb[2], kb[3]);
    }
    const int tok = (first + i * kWarps) * kStep + 2 * tq;
    const float s0 = tok < len ? (sa[0] + sa[2]) + (sb[0] + sb[2]) : -INFINITY;
    const float s1 = tok + 1 < len ? (sa[1] + sa[3]) + (sb[1] + sb[3]) : -INFINITY;
    // online softmax of head hq over the step's 8 tokens (the quad holds them; the first token is always valid)
    float mx = fmaxf(s0, s1);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m, mx);
    const float corr = exp2f(m - m_new);  // 0 on the first step (m = -inf)
    const float p0 = exp2f(s0 - m_new), p1 = exp2f(s1 - m_new);
    l = fmaf(l, corr, p0 + p1);
    m = m_new;
    // rescale O only when some head's max moved (rare once the context is long); its columns are heads 2tq, 2tq+1
    if (__any_sync(0xffffffffu, corr != 1.f)) {
      const float c0 = __shfl_sync(0xffffffffu, corr, 8 * tq), c1 = __shfl_sync(0xffffffffu, corr, 8 * tq + 4);
#pragma unroll
      for (int mt = 0; mt < D / 16; ++mt) o[mt][0] *= c0, o[mt][1] *= c1, o[mt][2] *= c0, o[mt][3] *= c1;
    }
    const float p0h = bf16_round(p0), p1h = bf16_round(p1);
    const uint32_t ph = pack_bf16x2(p0h, p1h), pl = pack_bf16x2(p0 - p0h, p1 - p1h);
#pragma unroll
    for (int i4 = 0; i4 < D / 32; ++i4) {
      uint32_t va[4];
      ldsm_x4_trans(va, vst + (((4 * i4 + (lane >> 3)) ^ lr) << 4));
      mma_k8(o[2 * i4], va[0], va[1], ph);
      mma_k8(o[2 * i4], va[0], va[1], pl);
      mma_k8(o[2 * i4 + 1], va[2], va[3], ph);
      mma_k8(o[2 * i4 + 1], va[2], va[3], pl);
    }
    __syncwarp();  // this stage is rewritten by the next steps
    stage = stage == kStages - 1 ? 0 : stage + 1;
  }
  trace_stamp_at(scratch.trace_split, blockIdx.x + blockIdx.y * gridDim.x, 3);
  cp_async_wait<0>();

  // merge_warps
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (tq == 0) {
    sh.m[warp][hq] = m;
    sh.l[warp][hq] = l;
  }
  __syncthreads();
  float* accw = reinterpret_cast<float*>(ring);  // [kMaxGroup][acc_stride] fp32 in the warp's own ring
  const int h0 = 2 * tq, h1 = 2 * tq + 1;
  const float f0 = merge_weight(sh, warp, h0), f1 = merge_weight(sh, warp, h1);
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) {
    const int d = 16 * mt + hq;
    accw[h0 * acc_stride<D>() + d] = o[mt][0] * f0;
    accw[h1 * acc_stride<D>() + d] = o[mt][1] * f1;
    accw[h0 * acc_stride<D>() + d + 8] = o[mt][2] * f0;
    accw[h1 * acc_stride<D>() + d + 8] = o[mt][3] * f1;
  }
  write_partial<D>(sh, ring_all, g, split, group, scratch);
}

template <int EPL>
__device__ __forceinline__ void split_run(const SplitPlan& p, const AttnIn& in, const LaneRope<EPL>& lr,
                                          const KvPages& kv, int g, int split, int group, const AttnScratch& scratch,
                                          uint16_t* ring_all, SplitShared& sh) {
  if constexpr (EPL == 8) {
    split_run_mma(p, in, lr, kv, g, split, group, scratch, ring_all, sh);
  } else {
    split_run_scalar<EPL>(p, in, lr, kv, g, split, group, scratch, ring_all, sh);
  }
}

template <int EPL>
__device__ __forceinline__ void split_body(const AttnIn& in, const KvPages& kv, int pos, int n_splits,
                                           const AttnScratch& scratch, int group, bool pdl, uint16_t* ring_all,
                                           SplitShared& sh) {
  const int g = blockIdx.y, split = blockIdx.x;
  // The position is written between steps only, never by the previous launch. Launched with PDL, the first K/V
  // copies start before the wait (rows of earlier tokens are final; the token's own row is this kernel's to
  // write, own_row_append). The combine (launched with PDL) is let in only at the end: its blocks scheduled next
  // to running split blocks slow them.
  const int tb = blockIdx.x + blockIdx.y * gridDim.x;
  trace_stamp_at(scratch.trace_split, tb, 0);
  const SplitPlan p = split_plan(pos + 1, split, n_splits);
  if (!p.active) {
    trace_stamp_at(scratch.trace_split, tb, 15, false);
    trace_stamp_at(scratch.trace_split, tb, 1, false);
    trace_stamp_at(scratch.trace_split, tb, 2, false);
    return;
  }
  LaneRope<EPL> lr;
  lane_rope_weights<EPL>(in, lr, p.i_own >= 0);  // constant: requested ahead of the copies
  split_issue_first<EPL>(p, kv, g, ring_all);  // the first loads before anything else
  lane_rope_angles<EPL>(in, pos, lr);          // while they are in flight
  if (pdl) dep_wait();
  trace_stamp_at(scratch.trace_split, tb, 15);
  split_run<EPL>(p, in, lr, kv, g, split, group, scratch, ring_all, sh);
  trace_stamp_at(scratch.trace_split, tb, 2);
  dep_trigger();  // (a block without work exits above, which counts as its trigger)
}

template <int EPL>
__global__ void __launch_bounds__(kThreads, 1) attention_split_kernel(
    const __grid_constant__ AttnIn in, KvPages kv, const int* __restrict__ pos_ptr, AttnScratch scratch, int group,
    bool pdl) {
  extern __shared__ __align__(16) uint16_t ring_all[];  // [kWarps][ring_elems<D>()]
  __shared__ SplitShared sh;
  if (!pdl) dep_wait();
  split_body<EPL>(in, kv, *pos_ptr, gridDim.x, scratch, group, pdl, ring_all, sh);
}

// blockIdx.z: sequence q of several one-token rows (AttnRows): its row's inputs, KV pages, position and its own
// share of the scratch; its split count from its own length alone (attention_row_splits), so a row's result does
// not depend on the other rows of the launch. Launched with PDL in a decode pass, it waits at entry: there every
// kernel lets the next in at entry (launch.cuh launch_pdl), so it may start while kernels several launches back
// still run, and its rows, positions and pages change between passes.
template <int EPL>
__global__ void __launch_bounds__(kThreads, 1) attention_split_rows_kernel(
    const __grid_constant__ AttnIn in, KvPages kv, AttnRows rows, AttnScratch scratch, int group) {
  extern __shared__ __align__(16) uint16_t ring_all[];
  __shared__ SplitShared sh;
  dep_wait();
  constexpr int D = EPL * 32;
  const int q = blockIdx.z;
  const size_t r = (size_t)rows.row[q];
  const int n_heads = kv.n_kv * group;
  AttnIn at = in;
  at.qg += r * n_heads * 2 * D;
  at.k += r * kv.n_kv * D;
  at.v += r * kv.n_kv * D;
  kv.pages = rows.pages[q];
  scratch.partial += (size_t)q * kv.n_kv * scratch.max_splits * group * (D + 2);
  const int pos = rows.pos[q];
  split_body<EPL>(at, kv, pos, min(attention_row_splits(pos + 1), (int)gridDim.x), scratch, group, false, ring_all,
                  sh);
}

template <int EPL>
void launch_split(const AttnIn& in, KvPages kv, const int* pos, AttnScratch scratch, int splits, int group,
                  cudaStream_t s) {
  constexpr size_t smem = (size_t)kWarps * ring_elems<EPL * 32>() * sizeof(uint16_t);
  // note: set on every call (cheap, not a stream operation, legal during graph capture): no static state
  CUDA_CHECK(cudaFuncSetAttribute(attention_split_kernel<EPL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem));
  const bool pdl = true;  // the kernel's dep_wait placement assumes it (mixers.h)
  launch_ex(attention_split_kernel<EPL>, dim3(splits, kv.n_kv), dim3(kThreads), smem, s, LaunchOpts{pdl, 1, false},
            in, kv, pos, scratch, group, pdl);
}

template <int EPL>
void launch_split_rows(const AttnIn& in, KvPages kv, AttnRows rows, int n_rows, AttnScratch scratch, int splits,
                       int group, cudaStream_t s) {
  constexpr size_t smem = (size_t)kWarps * ring_elems<EPL * 32>() * sizeof(uint16_t);
  CUDA_CHECK(cudaFuncSetAttribute(attention_split_rows_kernel<EPL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem));
  launch_ex(attention_split_rows_kernel<EPL>, dim3(splits, kv.n_kv, n_rows), dim3(kThreads), smem, s,
            LaunchOpts{true, 1, false}, in, kv, rows, scratch, group);
}

void check_shapes(const char* what, const AttnIn& in, const KvPages& kv, int n_heads, int splits,
                  const AttnScratch& scratch) {
  const int group = n_heads / kv.n_kv;
  LILY_CHECK(n_heads % kv.n_kv == 0 && group <= kMaxGroup && splits >= 1 && splits <= scratch.max_splits &&
                 splits <= kMaxSplits && kv.page_tokens % kStep == 0,
             what, ": unsupported n_heads ", n_heads, " n_kv ", kv.n_kv, " splits ", splits);
  const int epl = kv.head_dim / 32;
  LILY_CHECK(in.rope_dim > 0 && in.rope_dim <= kv.head_dim && kv.head_dim % 32 == 0 &&
                 (in.rope_dim / 2) % std::max(epl, 1) == 0,
             what, ": rope_dim ", in.rope_dim, " with head_dim ", kv.head_dim,
             " (rope_dim / 2 must be a multiple of head_dim / 32)");
}

}  // namespace

size_t attn_scratch_floats(int n_kv, int max_splits, int group, int head_dim) {
  return (size_t)n_kv * max_splits * group * (head_dim + 2);
}

size_t kv_page_elems(int page_tokens, int n_kv, int head_dim) {
  return (size_t)2 * n_kv * page_tokens * head_dim;
}

void attn_in_rope(AttnIn& in, int rope_dim, double theta) {
  LILY_CHECK(rope_dim > 0 && rope_dim % 2 == 0 && rope_dim / 2 <= kAttnMaxRopeHalf, "attention: rope_dim ", rope_dim,
             " not supported (even, at most ", 2 * kAttnMaxRopeHalf, ")");
  in.rope_dim = rope_dim;
  for (int f = 0; f < rope_dim / 2; ++f) in.inv_freq[f] = (float)std::pow(theta, -2.0 * f / rope_dim);
}

void launch_attention_decode(const AttnIn& in, KvPages kv, const int* pos, float* out, AttnScratch scratch,
                             int splits, int n_heads, cudaStream_t s, StepTrace* trace) {
  check_shapes("attention_decode", in, kv, n_heads, splits, scratch);
  const int group = n_heads / kv.n_kv;
  scratch.trace_split = trace ? trace->take(kTraceAttnSplit) : nullptr;
  scratch.trace_comb = trace ? trace->take(kTraceAttnCombine) : nullptr;
  switch (kv.head_dim) {
    case 256: launch_split<8>(in, kv, pos, scratch, splits, group, s); break;
    case 128: launch_split<4>(in, kv, pos, scratch, splits, group, s); break;
    case 64: launch_split<2>(in, kv, pos, scratch, splits, group, s); break;
    case 32: launch_split<1>(in, kv, pos, scratch, splits, group, s); break;
    default: ::lily::fail("attention_decode: head_dim ", kv.head_dim, " not supported (256, 128, 64, 32)");
  }
  // the combine with PDL (it triggers at entry, so the o_proj + MoE launch is scheduled early), let in by the split
  // blocks' trigger at their end
  attn::launch_combine(in.qg, pos, out, scratch, splits, group, kv.head_dim, n_heads, AttnRows{}, 0, s);
}

void launch_attention_decode_rows(const AttnIn& in, KvPages kv, AttnRows rows, int n_rows, float* out,
                                  AttnScratch scratch, int splits, int n_heads, cudaStream_t s) {
  check_shapes("attention_decode_rows", in, kv, n_heads, splits, scratch);
  LILY_CHECK(splits <= kAttnRowMaxSplits, "attention_decode_rows: ", splits, " splits (at most ", kAttnRowMaxSplits,
             ")");
  LILY_CHECK(n_rows >= 1 && n_rows <= 65535, "attention_decode_rows: ", n_rows, " rows (1..65535)");
  const int group = n_heads / kv.n_kv;
  scratch.max_splits = splits;  // the scratch holds [n_rows][n_kv][splits][group][head_dim + 2]
  scratch.trace_split = scratch.trace_comb = nullptr;
  switch (kv.head_dim) {
    case 256: launch_split_rows<8>(in, kv, rows, n_rows, scratch, splits, group, s); break;
    case 128: launch_split_rows<4>(in, kv, rows, n_rows, scratch, splits, group, s); break;
    case 64: launch_split_rows<2>(in, kv, rows, n_rows, scratch, splits, group, s); break;
    case 32: launch_split_rows<1>(in, kv, rows, n_rows, scratch, splits, group, s); break;
    default: ::lily::fail("attention_decode_rows: head_dim ", kv.head_dim, " not supported (256, 128, 64, 32)");
  }
  attn::launch_combine(in.qg, rows.pos, out, scratch, splits, group, kv.head_dim, n_heads, rows, n_rows, s);
}

}  // namespace lily::cuda
