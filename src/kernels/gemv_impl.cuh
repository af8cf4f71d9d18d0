// GEMV kernel bodies shared by gemv.cu, moe.cu and the persistent kernels (moe_fused.cu, gdn_fused.cu; also the
// MoE routing selection route_topk), as __device__ stages: load x into registers, issue every
// weight load of the warp's rows up front, dequantise + dot, reduce across the lanes of a row, store.
// Fast paths take K (cols) at compile time (x lives in registers); gemv_warp_generic handles any K % 64 == 0.
#pragma once
#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "kernels/qdot.cuh"

namespace lily::cuda::detail {

inline constexpr int kWarpsPerBlock = 8;
inline constexpr int kBlockThreads = kWarpsPerBlock * 32;

// Up to kMaxMulti matrices (same format and cols) viewed as one concatenated row space [0, total).
struct MultiArgs {
  const uint8_t* w[kMaxMulti];
  const uint32_t* sb[kMaxMulti];
  float* y[kMaxMulti];
  int off[kMaxMulti];  // first row of each matrix in the concatenated space (unused entries = total)
  int n;
  int total;  // off[n]
  int cols;
};
// Host: the argument block of a GemvBatch (checked: 1..kMaxMulti matrices of one format and width; unused
// entries repeat the first matrix with off = total). kernels/gemv.cu.
MultiArgs multi_args(const GemvBatch& b);

// arr[m] with a compile-time-indexed select chain (a run-time index into a kernel parameter would copy the
// whole struct to local memory).
template <typename T>
__device__ __forceinline__ T pick(const T (&arr)[kMaxMulti], int m) {
  T r = arr[0];
#pragma unroll
  for (int i = 1; i < kMaxMulti; ++i) r = (m == i) ? arr[i] : r;
  return r;
}

__device__ __forceinline__ int find_mat(const MultiArgs& a, int task) {
  int m = 0;
#pragma unroll
  for (int i = 1; i < kMaxMulti; ++i) m += (i < a.n && task >= a.off[i]) ? 1 : 0;
  return m;
}

// After a warp's R row dot products (acc[r]: this lane's part of row task0 + r of the concatenated row space):
// sums each over the warp and stores row task0 + r from lane r (y = or y +=); rows past a.total or past the
// warp's first n are skipped.
template <int R>
__device__ __forceinline__ void store_warp_rows(const MultiArgs& a, int task0, float (&acc)[R], bool accumulate,
                                                int n = R) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = group_sum<32>(acc[r]);
  float v = acc[0];
#pragma unroll
  for (int r = 1; r < R; ++r) v = lane == r ? acc[r] : v;
  const int task = task0 + lane;
  if (lane < n && task < a.total) {  // n <= R
    const int m = find_mat(a, task);
    float* y = pick(a.y, m) + (task - pick(a.off, m));
    *y = accumulate ? *y + v : v;
  }
}

// Stage: x [K] (fp32 or bf16) into fp32 shared memory by the whole block (16-byte aligned x).
__device__ __forceinline__ void stage_x_to_smem(const float* x, int K, float* xsm) {
  for (int i = threadIdx.x * 4; i < K; i += blockDim.x * 4)
    *reinterpret_cast<float4*>(xsm + i) = *reinterpret_cast<const float4*>(x + i);
  __syncthreads();
}
__device__ __forceinline__ void stage_x_to_smem(const uint16_t* x, int K, float* xsm) {
  for (int i = threadIdx.x * 4; i < K; i += blockDim.x * 4) {
    const uint2 v = *reinterpret_cast<const uint2*>(x + i);
    *reinterpret_cast<float4*>(xsm + i) = make_float4(bf16_lo(v.x), bf16_hi(v.x), bf16_lo(v.y), bf16_hi(v.y));
  }
  __syncthreads();
}

// Stage: x = RMSNorm(h) (NormIn in gemv_stream.cuh) into fp32 shared memory by the whole block; K % 4 == 0.
// Same summation order as stream_stage_x_norm for K = 2048 and 256 threads. red: >= blockDim.x / 32 floats.
__device__ __forceinline__ void stage_x_norm_to_smem(const float* h, const float* w, float eps, float* x_out, int K,
                                                     float* xsm, float* red) {
  float ss = 0.f;
  for (int i = threadIdx.x * 4; i < K; i += blockDim.x * 4) {
    const float4 v = *reinterpret_cast<const float4*>(h + i);
    *reinterpret_cast<float4*>(xsm + i) = v;
    ss = fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, ss))));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
  for (int k = 0; k < static_cast<int>(blockDim.x / 32); ++k) total += red[k];
  const float r = rsqrtf(total / K + eps);
  const bool store = x_out != nullptr && blockIdx.x == 0;
  for (int i = threadIdx.x * 4; i < K; i += blockDim.x * 4) {
    const float4 v = *reinterpret_cast<const float4*>(xsm + i);
    const float4 g = *reinterpret_cast<const float4*>(w + i);
    const float4 x = make_float4(v.x * r * g.x, v.y * r * g.y, v.z * r * g.z, v.w * r * g.w);
    *reinterpret_cast<float4*>(xsm + i) = x;
    if (store) *reinterpret_cast<float4*>(x_out + i) = x;
  }
  __syncthreads();
}

// Stage: this lane's x chunks from shared memory into registers (+ their sums).
template <QFormat F, int K>
__device__ __forceinline__ void stage_load_x(const float* xsm, int li, float (&xr)[RowMap<F, K>::nc][Fmt<F>::epc],
                                             float (&xs)[RowMap<F, K>::nc]) {
  using M = RowMap<F, K>;
#pragma unroll
  for (int c = 0; c < M::nc; ++c) xs[c] = load_x(xsm + (li + c * M::lpr) * M::epc, M::epc, xr[c]);
}

// Stage: issue the loads of one row (its NC chunks and their scale|bias words).
template <QFormat F, int K>
__device__ __forceinline__ void stage_load_row(const uint8_t* wrow, const uint32_t* sbrow, int li, bool valid,
                                               uint4 (&wv)[RowMap<F, K>::nc], uint32_t (&sv)[RowMap<F, K>::nc]) {
  using M = RowMap<F, K>;
#pragma unroll
  for (int c = 0; c < M::nc; ++c) {
    const int chunk = li + c * M::lpr;
    wv[c] = valid ? ld_stream(wrow + static_cast<size_t>(chunk) * 16) : make_uint4(0, 0, 0, 0);
    if constexpr (Fmt<F>::grouped) sv[c] = valid ? ld_stream_u32(sbrow + chunk / M::chunks_per_group) : 0u;
    else sv[c] = 0u;
  }
}

// Stage: this lane's part of the row dot product, then the sum over the row's LPR lanes.
template <QFormat F, int K>
__device__ __forceinline__ float stage_dot_row(const uint4 (&wv)[RowMap<F, K>::nc],
                                               const uint32_t (&sv)[RowMap<F, K>::nc],
                                               const float (&xr)[RowMap<F, K>::nc][Fmt<F>::epc],
                                               const float (&xs)[RowMap<F, K>::nc]) {
  using M = RowMap<F, K>;
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < M::nc; ++c) acc += chunk_dot<F>(wv[c], sv[c], xr[c], xs[c]);
  return group_sum<M::lpr>(acc);
}

// The R * SUB consecutive rows one warp computes (from task0 of the concatenated row space), in registers.
template <QFormat F, int K, int R>
struct RowBatch {
  using M = RowMap<F, K>;
  uint4 wv[R][M::nc];
  uint32_t sv[R][M::nc];
  int mat[R], row[R];
};

// Stage: issue every weight load of the warp's rows.
template <QFormat F, int K, int R>
__device__ __forceinline__ void stage_issue_rows(const MultiArgs& a, int task0, RowBatch<F, K, R>& b) {
  using M = RowMap<F, K>;
  const int lane = threadIdx.x & 31, sub = lane / M::lpr, li = lane % M::lpr;
  const size_t row_bytes = static_cast<size_t>(K) * static_cast<int>(F) / 8;
  constexpr int G = K / kGroupSize;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int task = task0 + r * M::sub + sub;
    const bool valid = task < a.total;
    b.mat[r] = valid ? find_mat(a, task) : 0;
    b.row[r] = valid ? task - pick(a.off, b.mat[r]) : -1;
    const size_t row = static_cast<size_t>(valid ? b.row[r] : 0);
    const uint8_t* wrow = pick(a.w, b.mat[r]) + row * row_bytes;
    const uint32_t* sbrow = Fmt<F>::grouped ? pick(a.sb, b.mat[r]) + row * G : nullptr;
    stage_load_row<F, K>(wrow, sbrow, li, valid, b.wv[r], b.sv[r]);
  }
}

// Stage: dot products of a batch with x already in registers, store (y = or y +=).
template <QFormat F, int K, int R>
__device__ __forceinline__ void stage_dot_store_rows(const MultiArgs& a, const RowBatch<F, K, R>& b,
                                                     const float (&xr)[RowMap<F, K>::nc][Fmt<F>::epc],
                                                     const float (&xs)[RowMap<F, K>::nc], bool accumulate) {
  using M = RowMap<F, K>;
  const int li = (threadIdx.x & 31) % M::lpr;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = stage_dot_row<F, K>(b.wv[r], b.sv[r], xr, xs);
    if (li == 0 && b.row[r] >= 0) {
      float* y = pick(a.y, b.mat[r]) + b.row[r];
      *y = accumulate ? *y + v : v;
    }
  }
}

// Stage: x from shared memory into registers, then stage_dot_store_rows.
template <QFormat F, int K, int R>
__device__ __forceinline__ void stage_finish_rows(const MultiArgs& a, const float* xsm, const RowBatch<F, K, R>& b,
                                                  bool accumulate) {
  using M = RowMap<F, K>;
  float xr[M::nc][M::epc], xs[M::nc];
  stage_load_x<F, K>(xsm, (threadIdx.x & 31) % M::lpr, xr, xs);
  stage_dot_store_rows<F, K, R>(a, b, xr, xs, accumulate);
}

// Any K (multiple of 64): one row per warp at a time, x read through L1; R rows per warp.
template <QFormat F, int R, typename XT>
__device__ __forceinline__ void gemv_warp_generic(const MultiArgs& a, const XT* x, int task0, bool accumulate) {
  constexpr int epc = Fmt<F>::epc;
  const int lane = threadIdx.x & 31;
  const int total = a.total;
  const int K = a.cols, ch = K / epc, G = K / kGroupSize;
  const size_t row_bytes = static_cast<size_t>(K) * static_cast<int>(F) / 8;
  for (int r = 0; r < R; ++r) {
    const int task = task0 + r;
    if (task >= total) return;
    const int m = find_mat(a, task), row = task - pick(a.off, m);
    const uint8_t* wrow = pick(a.w, m) + static_cast<size_t>(row) * row_bytes;
    const uint32_t* sbm = pick(a.sb, m);
    float acc = 0.f;
    for (int c = lane; c < ch; c += 32) {
      float xr[epc];
      const float xs = load_x(x + c * epc, epc, xr);
      const uint4 w = ld_stream(wrow + static_cast<size_t>(c) * 16);
      const uint32_t sb = Fmt<F>::grouped ? ld_stream_u32(sbm + static_cast<size_t>(row) * G + c * epc / kGroupSize) : 0u;
      acc += chunk_dot<F>(w, sb, xr, xs);
    }
    acc = group_sum<32>(acc);
    if (lane == 0) {
      float* y = pick(a.y, m) + row;
      *y = accumulate ? *y + acc : acc;
    }
  }
}

// Launches kernel k (1-D grid), without PDL (launch.cuh).
template <typename... P, typename... A>
void launch_kernel(void (*k)(P...), int grid, int block, size_t smem, cudaStream_t s, A... args) {
  launch_ex(k, dim3(grid), dim3(block), smem, s, LaunchOpts{}, args...);
}

// Rows per warp for the fast paths (more bytes in flight per warp for short rows).
template <QFormat F, int K>
constexpr int rows_per_warp() {
  return RowMap<F, K>::nc >= 4 ? 2 : 4;
}

// Pairs of rows (gate, up) -> silu(gate . x) * (up . x) * scale. Plain: one pair of matrices [F, K], scale 1.
// MoE: task t = j * F + r; j < k selects expert idx[j] of the stacks (scale wts[j]); j == k the shared expert
// (scale *sh_scale). out[t] receives the result.
struct PairArgs {
  const uint8_t* gw; const uint32_t* gsb; const uint8_t* uw; const uint32_t* usb;      // routed stack or plain
  const uint8_t* sgw; const uint32_t* sgsb; const uint8_t* suw; const uint32_t* susb;  // shared expert (MoE)
  size_t mat_w_bytes, mat_groups;  // stride between stacked experts
  const int* idx; const float* wts; const float* sh_scale;  // MoE selection (shared memory after route_topk)
  const float* logits;  // MoE: router logits [E] + shared-gate logit [1] (moe_route's output)
  int* idx_out; float* w_out; float* sh_out;  // MoE: block 0 stores the selection here for moe_down
  int E;      // experts (MoE)
  int k;      // routed experts per token (MoE)
  int F;      // rows per matrix
  int cols;
  float* out;
};

struct PairRow {
  const uint8_t* gw; const uint32_t* gsb; const uint8_t* uw; const uint32_t* usb;
};

// Output scale of a task: 1 (plain), the routing weight of its expert, or the shared expert's sigmoid gate.
template <bool MOE>
__device__ __forceinline__ float pair_scale(const PairArgs& a, int task) {
  if (!MOE) return 1.f;
  const int j = task / a.F;
  return j < a.k ? a.wts[j] : *a.sh_scale;
}

template <bool MOE>
__device__ __forceinline__ PairRow resolve_pair(const PairArgs& a, int task, size_t row_bytes, int G) {
  const int j = MOE ? task / a.F : 0, r = MOE ? task % a.F : task;
  PairRow p;
  if (!MOE || j < a.k) {
    const size_t e = MOE ? static_cast<size_t>(a.idx[j]) : 0;
    p.gw = a.gw + e * a.mat_w_bytes + r * row_bytes;
    p.uw = a.uw + e * a.mat_w_bytes + r * row_bytes;
    p.gsb = a.gsb ? a.gsb + e * a.mat_groups + static_cast<size_t>(r) * G : nullptr;
    p.usb = a.usb ? a.usb + e * a.mat_groups + static_cast<size_t>(r) * G : nullptr;
  } else {
    p.gw = a.sgw + r * row_bytes;
    p.uw = a.suw + r * row_bytes;
    p.gsb = a.sgsb ? a.sgsb + static_cast<size_t>(r) * G : nullptr;
    p.usb = a.susb ? a.susb + static_cast<size_t>(r) * G : nullptr;
  }
  return p;
}

template <QFormat F, int K, int R>
struct PairBatch {
  using M = RowMap<F, K>;
  uint4 gv[R][M::nc], uv[R][M::nc];
  uint32_t gs[R][M::nc], us[R][M::nc];
  float scale[R];
  int task[R];
};

// Stage: issue the gate and up rows of the warp's tasks (MoE: reads the routing result, so after dep_wait).
template <QFormat F, int K, int R, bool MOE>
__device__ __forceinline__ void stage_issue_pairs(const PairArgs& a, int task0, int total, PairBatch<F, K, R>& b) {
  using M = RowMap<F, K>;
  const int lane = threadIdx.x & 31, sub = lane / M::lpr, li = lane % M::lpr;
  const size_t row_bytes = static_cast<size_t>(K) * static_cast<int>(F) / 8;
  constexpr int G = K / kGroupSize;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    b.task[r] = task0 + r * M::sub + sub;
    const bool valid = b.task[r] < total;
    const PairRow p = resolve_pair<MOE>(a, valid ? b.task[r] : 0, row_bytes, G);
    b.scale[r] = pair_scale<MOE>(a, valid ? b.task[r] : 0);
    stage_load_row<F, K>(p.gw, p.gsb, li, valid, b.gv[r], b.gs[r]);
    stage_load_row<F, K>(p.uw, p.usb, li, valid, b.uv[r], b.us[r]);
  }
}

template <QFormat F, int K, int R>
__device__ __forceinline__ void stage_finish_pairs(const PairArgs& a, const float* xsm, int total,
                                                   const PairBatch<F, K, R>& b) {
  using M = RowMap<F, K>;
  const int li = (threadIdx.x & 31) % M::lpr;
  float xr[M::nc][M::epc], xs[M::nc];
  stage_load_x<F, K>(xsm, li, xr, xs);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float g = stage_dot_row<F, K>(b.gv[r], b.gs[r], xr, xs);
    const float u = stage_dot_row<F, K>(b.uv[r], b.us[r], xr, xs);
    if (li == 0 && b.task[r] < total) a.out[b.task[r]] = b.scale[r] * silu(g) * u;
  }
}

inline constexpr int kMaxExperts = 256;  // route_topk: one logit per thread, 8 warps
inline constexpr int kMaxTopK = 8;  // route_topk keeps each warp's 8 best as candidates

// The routing selection in shared memory (route_topk's result) and its work space.
struct TopkSm {
  int idx[kMaxTopK];
  float w[kMaxTopK];
  float sh;
  float sh_logit;                        // route_topk_select -> route_topk_finish
  __align__(16) float cand_l[kMaxExperts / 32 * kMaxTopK];  // each warp's 8 best (logit, expert)
  __align__(16) int cand_e[kMaxExperts / 32 * kMaxTopK];
};

// (value, index) order of the selection: larger value first, ties to the lower index.
__device__ __forceinline__ bool ranks_before(float v2, int i2, float v, int i) { return v2 > v || (v2 == v && i2 < i); }

// One warp's selection of one row's top_k <= MK of E <= 32 NE logits l (global or shared memory), the steps of
// route_topk below giving the same experts in the same order and the same weights: lane holds experts lane + 32 i
// in registers; each of the top_k rounds takes the warp's best available one ((value, index) order, ties to the
// lower id) and the lane holding it marks it taken; the weights exp(l - l_max) / their sum in rank order. Every
// lane gets idx and w (ranks j < top_k). NaN logits count as -inf (NaN compares false: lanes would disagree and a
// row could take one expert twice).
template <int NE, int MK>
__device__ __forceinline__ void warp_topk(const float* l, int E, int top_k, int (&idx)[MK], float (&w)[MK]) {
  const int lane = threadIdx.x & 31;
  float v[NE];
  unsigned avail = 0;  // bit i: expert lane + 32 i present and not taken
#pragma unroll
  for (int i = 0; i < NE; ++i) {
    const int e = lane + 32 * i;
    const float x = e < E ? l[e] : 0.f;
    v[i] = isnan(x) ? -INFINITY : x;
    if (e < E) avail |= 1u << i;
  }
#pragma unroll
  for (int j = 0; j < MK; ++j) {
    if (j >= top_k) break;
    float best = -INFINITY;
    int bid = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < NE; ++i)  // ascending ids: the first of equal logits stays
      if ((avail >> i & 1u) && (v[i] > best || bid == 0x7fffffff)) best = v[i], bid = lane + 32 * i;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bid, o);
      if (oi != 0x7fffffff && (bid == 0x7fffffff || ob > best || (ob == best && oi < bid))) best = ob, bid = oi;
    }
    if ((bid & 31) == lane) avail &= ~(1u << (bid >> 5));
    idx[j] = bid;
    w[j] = best;
  }
  const float l0 = w[0];  // the largest chosen logit (rank order)
  float total = 0.f;
#pragma unroll
  for (int j = 0; j < MK; ++j) {
    if (j >= top_k) break;
    w[j] = expf(w[j] - l0);
    total += w[j];
  }
#pragma unroll
  for (int j = 0; j < MK; ++j) {
    if (j >= top_k) break;
    w[j] = w[j] / total;
  }
}

// docs/model.md §2.4 routing from the router logits: fp32 softmax over all E experts, the top k by probability
// (ties: lower expert id), renormalised over the k; sigmoid of the shared-expert-gate logit. The softmax is
// monotonic and its denominator cancels in the renormalisation, so the k are selected by logit and weighted
// exp(l - l_max) / sum over the k of exp(l' - l_max): no reduction over all E before the selection. (Only where
// two different logits round to the same probability can this differ from the reference's order: it then
// keeps the larger logit where the reference keeps the lower id.) Thread e < 256 holds expert e (the block
// must have >= 256 threads; every thread must call; barriers inside). Selection without a serial argmax loop:
// each warp ranks its 32 experts with shuffles and keeps its 8 best; an expert of the overall top 8 is among
// those 64 candidates and its rank among them is its overall rank (every expert above it is a candidate too),
// so candidate c is selected at rank #{candidates before c} if that is < k. Block 0 also stores the selection
// to a.idx_out / w_out / sh_out for moe_down. Returns a with idx / wts / sh_scale pointing at t. In two steps:
// route_topk_select leaves the experts in t.idx (and their logits in t.w), so a caller can request the
// experts' weights before route_topk_finish computes the routing weights.
__device__ __forceinline__ PairArgs route_topk_finish(const PairArgs& a, TopkSm& t);
__device__ __forceinline__ void route_topk_select(const PairArgs& a, TopkSm& t);
__device__ __forceinline__ PairArgs route_topk(const PairArgs& a, TopkSm& t) {
  route_topk_select(a, t);
  return route_topk_finish(a, t);
}

// The same from logits already in registers: thread e < a.E holds expert e's logit l (the others -inf), thread
// 0 also the shared-expert-gate logit l_sh.
__device__ __forceinline__ void route_topk_select_from(const PairArgs& a, TopkSm& t, float l, float l_sh);
__device__ __forceinline__ void route_topk_select(const PairArgs& a, TopkSm& t) {
  const int e = threadIdx.x;
  const float l = e < a.E ? __ldcg(a.logits + e) : -INFINITY;
  const float l_sh = e == 0 ? __ldcg(a.logits + a.E) : 0.f;  // shared-expert-gate logit, loaded with the others
  route_topk_select_from(a, t, l, l_sh);
}

// The selection's steps, each for one row's TopkSm (moe_fused_rows.cu runs them for several rows between the same
// barriers; e: the thread's index in the row's threads, threadIdx.x where one row has the block). 1: expert e's
// logit l ranked within its warp; each warp's 8 best become candidates (no barrier).
__device__ __forceinline__ void topk_candidates(TopkSm& t, float l, int e) {
  const int lane = e & 31, warp = e >> 5;
  const bool mine = e < kMaxExperts;
  if (e < kMaxTopK) {  // defined even if NaN logits leave ranks unfilled
    t.idx[e] = 0;
    t.w[e] = 0.f;
  }
  int r = 0;
#pragma unroll
  for (int d = 1; d < 32; ++d) {
    const int l2 = (lane + d) & 31;
    const float q = __shfl_sync(0xffffffffu, l, l2);
    r += ranks_before(q, (e & ~31) + l2, l, e) ? 1 : 0;
  }
  if (mine && r < kMaxTopK) {
    t.cand_l[warp * kMaxTopK + r] = l;
    t.cand_e[warp * kMaxTopK + r] = e;
  }
}
// 2 (after a barrier): thread e < 64 ranks candidate e among all; the top k land in t.idx, their logits in t.w.
__device__ __forceinline__ void topk_rank(const PairArgs& a, TopkSm& t, int e) {
  constexpr int NW = kMaxExperts / 32;
  if (e >= NW * kMaxTopK) return;
  const float lc = t.cand_l[e];
  const int ec = t.cand_e[e];
  int rank = 0;
#pragma unroll
  for (int c = 0; c < NW * kMaxTopK; c += 4) {  // unrolled: the shared-memory reads stay in flight together
    const float4 q = *reinterpret_cast<const float4*>(t.cand_l + c);
    const int4 qi = *reinterpret_cast<const int4*>(t.cand_e + c);
    rank += (ranks_before(q.x, qi.x, lc, ec) ? 1 : 0) + (ranks_before(q.y, qi.y, lc, ec) ? 1 : 0) +
            (ranks_before(q.z, qi.z, lc, ec) ? 1 : 0) + (ranks_before(q.w, qi.w, lc, ec) ? 1 : 0);
  }
  if (rank < a.k) {
    t.idx[rank] = ec < a.E ? ec : 0;  // NaN logits select nothing: never index past the expert stack
    t.w[rank] = lc;
  }
}
// 3 (after a barrier): the routing weight of rank e < k (route_topk: thread e's); every caller sums the k weights
// in rank order (same result); t.w[0] is the max.
__device__ __forceinline__ float topk_weight(const PairArgs& a, const TopkSm& t, int e) {
  if (e >= a.k) return 0.f;
  const float l0 = t.w[0];
  float total = 0.f;
  for (int j = 0; j < a.k; ++j) total += expf(t.w[j] - l0);
  return expf(t.w[e] - l0) / total;
}
// 4 (after a barrier): weight e in place; e == 0 also the shared expert's gate from its logit.
__device__ __forceinline__ void topk_set_weight(const PairArgs& a, TopkSm& t, float wj, int e) {
  if (e < a.k) t.w[e] = wj;
  if (e == 0) t.sh = 1.f / (1.f + expf(-t.sh_logit));
}

__device__ __forceinline__ void route_topk_select_from(const PairArgs& a, TopkSm& t, float l, float l_sh) {
  topk_candidates(t, l, threadIdx.x);
  __syncthreads();
  topk_rank(a, t, threadIdx.x);
  if (threadIdx.x == 0) t.sh_logit = l_sh;
  __syncthreads();
}

__device__ __forceinline__ PairArgs route_topk_finish(const PairArgs& a, TopkSm& t) {
  const int e = threadIdx.x;
  const float wj = topk_weight(a, t, e);
  __syncthreads();
  topk_set_weight(a, t, wj, e);
  __syncthreads();
  if (blockIdx.x == 0 && e < a.k) {
    a.idx_out[e] = t.idx[e];
    a.w_out[e] = t.w[e];
    if (e == 0) *a.sh_out = t.sh;
  }
  PairArgs res = a;
  res.idx = t.idx;
  res.wts = t.w;
  res.sh_scale = &t.sh;
  return res;
}

// Host: the argument blocks of the MoE kernels (moe.cu): the router rows [E] + shared-expert gate [1] writing
// s.logits (the three-launch path), and the gate/up pairs of the routed and shared experts reading the
// selection inputs from s (shared with the fused kernel, moe_fused.cu).
MultiArgs router_args(const MoeWeightsDev& m, const MoeScratch& s);
PairArgs expert_pair_args(const MoeWeightsDev& m, const MoeScratch& s);

// The whole pair kernel body (plain SwiGLU or MoE gate/up).
template <QFormat F, int K, int R, bool MOE>
__device__ __forceinline__ void pair_body(const PairArgs& a_in, const float* x) {
  using M = RowMap<F, K>;
  __shared__ __align__(16) float xsm[K];
  __shared__ TopkSm topk;
  const int total = MOE ? (a_in.k + 1) * a_in.F : a_in.F;
  const int task0 = (blockIdx.x * kWarpsPerBlock + threadIdx.x / 32) * R * M::sub;
  PairBatch<F, K, R> b;
  PairArgs a = a_in;
  if (MOE) {
    dep_wait();  // the router logits come from the routing kernel
    a = route_topk(a_in, topk);
  }
  stage_issue_pairs<F, K, R, MOE>(a, task0, total, b);
  // Trigger only after this block's loads are issued: dependents scheduled earlier would sit on the SMs
  // (waiting) and take residency from this kernel's later blocks.
  dep_trigger();
  if (!MOE) dep_wait();
  stage_x_to_smem(x, K, xsm);
  if (task0 >= total) return;
  stage_finish_pairs<F, K, R>(a, xsm, total, b);
}

template <QFormat F, int R, bool MOE>
__device__ __forceinline__ void swiglu_warp_generic(const PairArgs& a, const float* x, int task0, int total) {
  constexpr int epc = Fmt<F>::epc;
  const int lane = threadIdx.x & 31;
  const int K = a.cols, ch = K / epc, G = K / kGroupSize;
  const size_t row_bytes = static_cast<size_t>(K) * static_cast<int>(F) / 8;
  for (int r = 0; r < R; ++r) {
    const int task = task0 + r;
    if (task >= total) return;
    const PairRow p = resolve_pair<MOE>(a, task, row_bytes, G);
    float g = 0.f, u = 0.f;
    for (int c = lane; c < ch; c += 32) {
      float xr[epc];
      const float xs = load_x(x + c * epc, epc, xr);
      const int gi = c * epc / kGroupSize;
      g += chunk_dot<F>(ld_stream(p.gw + static_cast<size_t>(c) * 16), p.gsb ? ld_stream_u32(p.gsb + gi) : 0u, xr, xs);
      u += chunk_dot<F>(ld_stream(p.uw + static_cast<size_t>(c) * 16), p.usb ? ld_stream_u32(p.usb + gi) : 0u, xr, xs);
    }
    g = group_sum<32>(g);
    u = group_sum<32>(u);
    if (lane == 0) a.out[task] = pair_scale<MOE>(a, task) * silu(g) * u;
  }
}

}  // namespace lily::cuda::detail
