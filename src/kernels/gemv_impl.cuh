// GEMV kernel bodies shared by gemv.cu and moe.cu, as __device__ stages: load x into registers, issue every
// weight load of the warp's rows up front, dequantise + dot, reduce across the lanes of a row, store.
// Fast paths take K (cols) at compile time (x lives in registers); gemv_warp_generic handles any K % 64 == 0.
#pragma once
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

// Stage 1: this lane's x chunks into registers (+ their sums).
template <QFormat F, int K, typename XT>
__device__ __forceinline__ void stage_load_x(const XT* x, int li, float (&xr)[RowMap<F, K>::nc][Fmt<F>::epc],
                                             float (&xs)[RowMap<F, K>::nc]) {
  using M = RowMap<F, K>;
#pragma unroll
  for (int c = 0; c < M::nc; ++c) xs[c] = load_x(x + (li + c * M::lpr) * M::epc, M::epc, xr[c]);
}

// Stage 2: issue the loads of one row (its NC chunks and their scale|bias words).
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

// Stage 3: this lane's part of the row dot product, then the sum over the row's LPR lanes.
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

// One warp computes R * SUB consecutive rows of the concatenated row space starting at task0.
template <QFormat F, int K, int R, typename XT>
__device__ __forceinline__ void gemv_warp(const MultiArgs& a, const XT* x, int task0, bool accumulate) {
  using M = RowMap<F, K>;
  const int lane = threadIdx.x & 31, sub = lane / M::lpr, li = lane % M::lpr;
  const int total = a.total;
  const size_t row_bytes = static_cast<size_t>(K) * static_cast<int>(F) / 8;
  constexpr int G = K / kGroupSize;
  float xr[M::nc][M::epc], xs[M::nc];
  stage_load_x<F, K>(x, li, xr, xs);
  uint4 wv[R][M::nc];
  uint32_t sv[R][M::nc];
  int mat[R], row[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int task = task0 + r * M::sub + sub;
    const bool valid = task < total;
    mat[r] = valid ? find_mat(a, task) : 0;
    row[r] = valid ? task - pick(a.off, mat[r]) : -1;
    const uint8_t* wrow = pick(a.w, mat[r]) + static_cast<size_t>(row[r] < 0 ? 0 : row[r]) * row_bytes;
    const uint32_t* sbrow =
        Fmt<F>::grouped ? pick(a.sb, mat[r]) + static_cast<size_t>(row[r] < 0 ? 0 : row[r]) * G : nullptr;
    stage_load_row<F, K>(wrow, sbrow, li, valid, wv[r], sv[r]);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = stage_dot_row<F, K>(wv[r], sv[r], xr, xs);
    if (li == 0 && row[r] >= 0) {
      float* y = pick(a.y, mat[r]) + row[r];
      *y = accumulate ? *y + v : v;
    }
  }
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
  const int* idx; const float* wts; const float* sh_scale;
  int k;      // routed experts per token (MoE)
  int F;      // rows per matrix
  int cols;
  float* out;
};

struct PairRow {
  const uint8_t* gw; const uint32_t* gsb; const uint8_t* uw; const uint32_t* usb;
  float scale;
};

template <bool MOE>
__device__ __forceinline__ PairRow resolve_pair(const PairArgs& a, int task, size_t row_bytes, int G) {
  const int j = MOE ? task / a.F : 0, r = MOE ? task % a.F : task;
  PairRow p;
  if (!MOE || j < a.k) {
    const size_t e = MOE ? static_cast<size_t>(__ldg(a.idx + j)) : 0;
    p.gw = a.gw + e * a.mat_w_bytes + r * row_bytes;
    p.uw = a.uw + e * a.mat_w_bytes + r * row_bytes;
    p.gsb = a.gsb ? a.gsb + e * a.mat_groups + static_cast<size_t>(r) * G : nullptr;
    p.usb = a.usb ? a.usb + e * a.mat_groups + static_cast<size_t>(r) * G : nullptr;
    p.scale = MOE ? __ldg(a.wts + j) : 1.f;
  } else {
    p.gw = a.sgw + r * row_bytes;
    p.uw = a.suw + r * row_bytes;
    p.gsb = a.sgsb ? a.sgsb + static_cast<size_t>(r) * G : nullptr;
    p.usb = a.susb ? a.susb + static_cast<size_t>(r) * G : nullptr;
    p.scale = __ldg(a.sh_scale);
  }
  return p;
}

template <QFormat F, int K, int R, bool MOE>
__device__ __forceinline__ void swiglu_warp(const PairArgs& a, const float* x, int task0, int total) {
  using M = RowMap<F, K>;
  const int lane = threadIdx.x & 31, sub = lane / M::lpr, li = lane % M::lpr;
  const size_t row_bytes = static_cast<size_t>(K) * static_cast<int>(F) / 8;
  constexpr int G = K / kGroupSize;
  float xr[M::nc][M::epc], xs[M::nc];
  stage_load_x<F, K>(x, li, xr, xs);
  uint4 gv[R][M::nc], uv[R][M::nc];
  uint32_t gs[R][M::nc], us[R][M::nc];
  float scale[R];
  int task[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    task[r] = task0 + r * M::sub + sub;
    const bool valid = task[r] < total;
    const PairRow p = resolve_pair<MOE>(a, valid ? task[r] : 0, row_bytes, G);
    scale[r] = p.scale;
    stage_load_row<F, K>(p.gw, p.gsb, li, valid, gv[r], gs[r]);
    stage_load_row<F, K>(p.uw, p.usb, li, valid, uv[r], us[r]);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float g = stage_dot_row<F, K>(gv[r], gs[r], xr, xs);
    const float u = stage_dot_row<F, K>(uv[r], us[r], xr, xs);
    if (li == 0 && task[r] < total) a.out[task[r]] = scale[r] * silu(g) * u;
  }
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
    if (lane == 0) a.out[task] = p.scale * silu(g) * u;
  }
}

}  // namespace lily::cuda::detail
