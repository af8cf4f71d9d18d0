// The decode attention's combine (kernels/attention.cu has the split kernel and the design): one block per (query
// head, 32 dims) merges the active splits' partials in a fixed order and applies the sigmoid gate; a decode pass's
// rows take one block per (query head, row) with the same arithmetic.
// Tested with the split kernel in tests/gpu/test_mixer_kernels.cu.
#include <cfloat>

#include "kernels/attention_split.cuh"
#include "kernels/common.cuh"
#include "kernels/grid_barrier.cuh"
#include "kernels/launch.cuh"

namespace lily::cuda::attn {

namespace {

using detail::trace_stamp_at;

constexpr int kCombThreads = 256;
constexpr int kCombWarps = kCombThreads / 32;
constexpr int kCombDims = 32;  // output dims per combine block (one per lane)

// One block per (query head, 32 dims): warp w sums splits w, w + 8, ... for its lane's dim, then the warps'
// sums are added in a fixed order. The split weights exp2(m_s - max) / Σ weight·l are computed by warp 0
// while the other warps' partial loads are in flight.
__global__ void __launch_bounds__(kCombThreads) attention_combine_kernel(
    const float* __restrict__ qg, const int* __restrict__ pos_ptr, float* __restrict__ out, AttnScratch scratch,
    int splits, int group, int D) {
  __shared__ float w_sh[kMaxSplits];
  __shared__ float num_sh[kCombWarps][kCombDims];
  __shared__ float inv_den;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int h = blockIdx.x, g = h / group, hh = h % group;
  const int dim = blockIdx.y * kCombDims + lane;
  const int tb = blockIdx.x + blockIdx.y * gridDim.x;
  trace_stamp_at(scratch.trace_comb, tb, 0);
  dep_trigger();
  dep_wait();
  trace_stamp_at(scratch.trace_comb, tb, 15);
  const int len = *pos_ptr + 1;
  const int n_active = active_splits((len + kStep - 1) / kStep, splits);
  const int stride = D + 2;
  // Every load of the kernel is issued here, in one L2 round trip: the gate (written two launches earlier), this
  // block's partial values and warp 0's split maxima and sums (each read once; a second pass over them and the
  // gate read at the end cost two more round trips).
  // note: __ldcg reads through L2 only (the partials were written by the previous kernel on other SMs)
  const float gate = warp == 0 && dim < D ? __ldcg(qg + (size_t)h * 2 * D + D + dim) : 0.f;
  const float* base = scratch.partial + ((size_t)g * scratch.max_splits * group + hh) * stride;
  constexpr int kPer = kMaxSplits / kCombWarps, kPerLane = kMaxSplits / 32;
  float v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int sp = warp + i * kCombWarps;
    v[i] = sp < n_active && dim < D ? __ldcg(base + (size_t)sp * group * stride + dim) : 0.f;
  }
  if (warp == 0) {
    float m[kPerLane], l[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int sp = lane + 32 * j;
      const float* p = base + (size_t)sp * group * stride;
      m[j] = sp < n_active ? __ldcg(p + D) : -FLT_MAX;
      l[j] = sp < n_active ? __ldcg(p + D + 1) : 0.f;
    }
    float mx = -FLT_MAX;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) mx = fmaxf(mx, m[j]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float den = 0.f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int sp = lane + 32 * j;
      if (sp < n_active) {
        const float wt = exp2f(m[j] - mx);
        w_sh[sp] = wt;
        den = fmaf(wt, l[j], den);
      }
    }
    for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
    if (lane == 0) inv_den = 1.f / den;
  }
  __syncthreads();
  float num = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int sp = warp + i * kCombWarps;
    if (sp < n_active) num = fmaf(w_sh[sp], v[i], num);
  }
  num_sh[warp][lane] = num;
  __syncthreads();
  if (warp == 0 && dim < D) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kCombWarps; ++w) total += num_sh[w][lane];
    out[(size_t)h * D + dim] = total * inv_den / (1.f + __expf(-gate));
  }
  trace_stamp_at(scratch.trace_comb, tb, 1);
}

// A decode pass's rows (AttnRows; head_dim <= kCombThreads): one block per (query head, row), thread t its dim t,
// where attention_combine_kernel's layout would take head_dim / 32 blocks of mostly idle warps (a short context has
// one split). The same operations in the same order: warp 0 weighs the splits as there, and a dim's numerator is the
// eight fmaf chains over splits w, w + 8, ... (w < 8) added in w's order, as there across its warps.
constexpr int kRowSplitsPerChain = kAttnRowMaxSplits / kCombWarps;
__global__ void __launch_bounds__(kCombThreads) attention_combine_rows_kernel(
    const float* __restrict__ qg, float* __restrict__ out, AttnScratch scratch, int splits, int group, int D,
    AttnRows rows) {
  __shared__ float w_sh[kAttnRowMaxSplits];
  __shared__ float inv_den;
  dep_wait();  // (the rows change between passes: read after the wait)
  dep_trigger();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int h = blockIdx.x, g = h / group, hh = h % group, q = blockIdx.y, n_heads = gridDim.x;
  const size_t r = (size_t)rows.row[q];
  qg += r * n_heads * 2 * D;
  out += r * n_heads * D;
  scratch.partial += (size_t)q * (n_heads / group) * scratch.max_splits * group * (D + 2);
  const int len = rows.pos[q] + 1;
  const int n_active = active_splits((len + kStep - 1) / kStep, min(attention_row_splits(len), splits));
  const int stride = D + 2;
  const float* base = scratch.partial + ((size_t)g * scratch.max_splits * group + hh) * stride;
  const float gate = tid < D ? __ldcg(qg + (size_t)h * 2 * D + D + tid) : 0.f;
  float v[kAttnRowMaxSplits];  // v[w + 8 i]: split w + 8 i's value of this dim
#pragma unroll
  for (int sp = 0; sp < kAttnRowMaxSplits; ++sp)
    v[sp] = sp < n_active && tid < D ? __ldcg(base + (size_t)sp * group * stride + tid) : 0.f;
  if (warp == 0) {  // attention_combine_kernel's weights (kAttnRowMaxSplits <= 32: one split a lane)
    const float* p = base + (size_t)lane * group * stride;
    const float m = lane < n_active ? __ldcg(p + D) : -FLT_MAX;
    const float l = lane < n_active ? __ldcg(p + D + 1) : 0.f;
    float mx = m;
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float den = 0.f;
    if (lane < n_active) {
      const float wt = exp2f(m - mx);
      w_sh[lane] = wt;
      den = fmaf(wt, l, den);
    }
    for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
    if (lane == 0) inv_den = 1.f / den;
  }
  __syncthreads();
  if (tid >= D) return;
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kCombWarps; ++w) {
    float num = 0.f;
#pragma unroll
    for (int i = 0; i < kRowSplitsPerChain; ++i) {
      const int sp = w + i * kCombWarps;
      if (sp < n_active) num = fmaf(w_sh[sp], v[sp], num);
    }
    total += num;
  }
  out[(size_t)h * D + tid] = total * inv_den / (1.f + __expf(-gate));
}

}  // namespace

void launch_combine(const float* qg, const int* pos, float* out, const AttnScratch& scratch, int splits, int group,
                    int head_dim, int n_heads, AttnRows rows, int n_rows, cudaStream_t s) {
  if (n_rows > 0) {  // (the split kernels take head_dim <= 256)
    LILY_CHECK(head_dim <= kCombThreads, "attention combine: head_dim ", head_dim, " over ", kCombThreads);
    launch_ex(attention_combine_rows_kernel, dim3(n_heads, n_rows), dim3(kCombThreads), 0, s,
              LaunchOpts{true, 1, false}, qg, out, scratch, splits, group, head_dim, rows);
    return;
  }
  const dim3 grid(n_heads, (head_dim + kCombDims - 1) / kCombDims);
  launch_ex(attention_combine_kernel, grid, dim3(kCombThreads), 0, s, LaunchOpts{true, 1, false}, qg, pos, out,
            scratch, splits, group, head_dim);
}

}  // namespace lily::cuda::attn
