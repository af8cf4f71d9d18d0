// The whole linear-attention mixer of one decode step in ONE persistent launch (docs/model.md §2.1 + §2.2):
//   h += out_proj(gated_rmsnorm(gdn_step(in_proj(RMSNorm(h) * input_norm))))
// for the real model's shapes (H = 2048, Hk = 16, Hv = 32, Dk = Dv = 128, every projection q4). One block per
// SM, 16 warps each; three phases separated by grid barriers (kernels/grid_barrier.cuh) instead of kernel
// boundaries:
//   1  every block normalises h; warp g computes rows [6g, 6g + 6) of in_proj (qkv | z | b | a, 12352 rows) into
//      the projection scratch, their weights requested once h has arrived (in the norm); the recurrent state and
//      the conv taps / earlier values of phase 2 are requested as soon as x is staged
//   2  blocks 0..127 (threads 0..255) run the step of one (value head, 32-column tile) each
//      (kernels/gdn_core.cuh, state requested in phase 1); its warp 0 writes the tile's Σ o² and o * w * silu(z)
//      already in the out_proj's input format (gemv_stream.cuh StreamX: a tile is one 32-element chunk)
//   3  every block copies the staged chunks, scaling each chunk's unit and sum by its head's 1 / rms (Σ o² of
//      its 4 tiles), and warp w of block b < 128 computes out_proj row 16 b + w (weights requested at the end of
//      phase 1), h[row] += it; then, when the next MoE block runs fused, the block adds its 16 new rows' part of
//      that block's router sums (kernels/router_partial.cuh)
// Replaces gemv_multi_rmsnorm + launch_gdn_step + gemv (the standalone kernels stay for other shapes and GPUs
// with fewer than 129 SMs). Tested by tests/gpu/test_gdn_fused.cu against the three-launch path.
#include "kernels/gdn_fused.h"

#include "kernels/common.cuh"
#include "kernels/gdn_core.cuh"
#include "kernels/gemv_impl.cuh"
#include "kernels/gemv_stream.cuh"
#include "kernels/grid_barrier.cuh"
#include "kernels/router_partial.cuh"

namespace lily::cuda {
namespace detail {
namespace {

constexpr int kH = kHidden;
constexpr int kHv = 32, kHk = 16, kD = 128, kTiles = kD / gdn::kCols;  // 4 column tiles per value head
constexpr int kConv = 2 * kHk * kD + kHv * kD;                        // 8192
constexpr int kV = kHv * kD;                                           // 4096
constexpr int kInRows = kConv + kV + 2 * kHv;                          // 12352
constexpr int kWarps = 16, kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 6;                                        // 6 * 16 * 129 SMs >= 12352
constexpr int kMinBlocks = (kInRows + kWarps * kRowsPerWarp - 1) / (kWarps * kRowsPerWarp);  // 129

struct Args {
  MultiArgs in;           // qkv, z, b, a rows -> proj scratch
  const float* input_norm;
  float eps;
  float* x_out;           // normed block input (block 0 stores it), may be null
  gdn::StepArgs step;     // qkv / a / b point into the proj scratch
  const float* z;         // proj scratch z [Hv * Dv]
  const float* norm_w;    // gated RMSNorm weight [Dv]
  StreamX<kV>* o_staged;  // scratch: o * w * silu(z) before the 1 / rms of the head, staged for out_proj
  float* tile_ss;         // [Hv * kTiles] scratch
  const uint8_t* ow; const uint32_t* osb;  // out_proj [H][Hv * Dv] q4
  float* h;
  const int* pos;
  unsigned* barrier;       // [kGridBarrierWords] (grid_barrier.cuh)
  unsigned long long* trace;  // this launch's slot of phase times (kernels/trace.h), or null
  RouterPartialDev rs;        // the next MoE block's router sums (router_partial.cuh); rs.acc null: none
};
static_assert(kRouterRows == kWarps && kRouterBlocks <= kMinBlocks, "phase 3: a block's 16 rows, one router partial");

__global__ void __launch_bounds__(kThreads, 1) gdn_fused_kernel(Args a) {
  __shared__ __align__(16) StreamX<kH> xs;
  __shared__ __align__(16) StreamX<kV> xo;
  __shared__ gdn::Shared gsh;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = warp * gridDim.x + blockIdx.x;  // this warp's task in phase 1
  trace_stamp(a.trace, 0);
  dep_trigger();  // PDL (grid_barrier.cuh): the next launch's blocks take the SMs as this launch's blocks leave
  const NormW<kH, kThreads> nw = stream_load_norm_w<kH, kThreads>(a.input_norm);  // constant: before the wait
  dep_wait();     // the previous launch complete, before any other load
  trace_stamp(a.trace, 15);

  // ---- phase 1: x = RMSNorm(h) with the requests of the in_proj rows issued once h has arrived (in the
  // norm, after its first barrier), then this tile's state and the step's other inputs, then in_proj. Not
  // before h has arrived: h and the norm weights then wait behind ~16 MB of weight rows in the L2. Not after the
  // whole norm either: the rest of the norm (issue-bound) is covered by the rows' DRAM latency. ----
  HRegs<kH, kThreads> hr;
  stream_load_h(a.h, hr);
  // phase 3's rows are block-contiguous (row 16 b + w on warp w of block b < 128): a block's 16 new rows of h are
  // one partial of the next MoE block's router sums
  const bool out_task = blockIdx.x < kH / kWarps;  // every warp of blocks 0..127
  const int pos = *a.pos;
  GridSync gs = grid_sync_begin(a.barrier);  // after the first loads (grid_barrier.cuh)
  const int row0 = g * kRowsPerWarp;
  const RowPtrs<kRowsPerWarp> rows = multi_row_ptrs<kH, kRowsPerWarp>(a.in, row0);  // while h is in flight
  uint4 wv[kRowsPerWarp][2];
  uint32_t sv[kRowsPerWarp][2];
  NormIn n;
  n.w = a.input_norm;
  n.eps = a.eps;
  n.x_out = a.x_out;
  // chunk 0 of the rows in the norm, chunk 1 after it: the norm's shared-memory work no longer queues behind all
  // 24 loads of the warp
  stream_stage_loaded_norm(hr, &nw, n, xs, [&] { stream_load_rows<kH, kRowsPerWarp, 0, 1>(rows.w, rows.sb, wv, sv); });
  stream_load_rows<kH, kRowsPerWarp, 1, 2>(rows.w, rows.sb, wv, sv);
  trace_stamp(a.trace, 1);
  const bool step_block = blockIdx.x < kHv * kTiles && tid < gdn::kThreads;
  const int head = blockIdx.x / kTiles, col0 = (blockIdx.x % kTiles) * gdn::kCols;
  float4 s[gdn::kRowsPerThread];
  if (step_block) {
    gdn::load_state(a.step, head, col0, tid, s);
    gdn::prefetch_inputs(a.step, a.norm_w, head, col0, pos, tid, gsh);
  }
  uint4 ov[1][kV / 1024];
  uint32_t osv[1][kV / 1024];
  {
    float acc[kRowsPerWarp];
    stream_dots<kH, kRowsPerWarp>(xs, wv, sv, acc);
    store_warp_rows(a.in, row0, acc, false);
  }
  // The out_proj row is requested only now: issued at entry it shared the HBM with the in_proj rows that phase
  // 1 waits for; from here it streams during barrier 1 and phase 2.
  if (out_task) {
    const int og = blockIdx.x * kWarps + warp;
    stream_load_row<kV>(a.ow + static_cast<size_t>(og) * (kV / 2), a.osb + static_cast<size_t>(og) * (kV / kGroupSize),
                        ov[0], osv[0]);
  }
  trace_stamp(a.trace, 2);
  grid_sync(gs);
  trace_stamp(a.trace, 3);

  // ---- phase 2: the GDN step of one (head, tile) per block ----
  if (step_block) {
    auto sync = [] { asm volatile("bar.sync 1, 256;" ::: "memory"); };  // threads 0..255 only
    const bool writes_qk = col0 == 0 && head % (kHv / kHk) == 0;
    // warp 0 stages the tile's 32 outputs o * w * silu(z) (before the head's 1 / rms) as chunk blockIdx.x of the
    // out_proj input: lane l holds column quad l % 8, lanes 0..7 store; z requested before the step's barriers
    const int i = head * kD + col0 + 4 * (tid & 7);
    const float4 z = tid < 32 ? __ldcg(reinterpret_cast<const float4*>(a.z + i)) : float4{};
    const float4 o = gdn::step(a.step, head, col0, pos, writes_qk, tid, s, gsh, sync);
    gdn::store_state(a.step, head, col0, tid, s);
    if (tid < 32) {
      // the tile's Σ o²: each quad's 4 squares, then over the 8 quads (lanes c4 = lane % 8 hold quad c4)
      float t = fmaf(o.x, o.x, fmaf(o.y, o.y, fmaf(o.z, o.z, o.w * o.w)));
#pragma unroll
      for (int m = 1; m < 8; m <<= 1) t += __shfl_xor_sync(0xffffffffu, t, m);
      if (tid == 0) a.tile_ss[blockIdx.x] = t;
      const float* w = gsh.norm_w + 4 * (tid & 7);
      const float4 g = make_float4(o.x * (w[0] * gdn::silu(z.x)), o.y * (w[1] * gdn::silu(z.y)),
                                   o.z * (w[2] * gdn::silu(z.z)), o.w * (w[3] * gdn::silu(z.w)));
      stream_put_x4(*a.o_staged, blockIdx.x * 8 + (tid & 7), g, tid < 8);
    }
  }
  trace_stamp(a.trace, 4);
  grid_sync(gs);
  trace_stamp(a.trace, 5);

  // ---- phase 3: the staged outputs with the gated RMSNorm's 1 / rms of each head, out_proj row og, residual.
  // The chunks' fixed-point bytes are scale-free; the head's 1 / rms only scales each chunk's unit and sum. ----
  static_assert(4 * StreamX<kV>::nch == kThreads && StreamX<kV>::nch == kHv * kTiles, "one word per thread");
  const StreamX<kV>& st = *a.o_staged;
  const uint4 q = __ldcg(&st.xq[tid]);  // every load of the phase first: one L2 round trip
  const int og = blockIdx.x * kWarps + warp;
  const bool sums = a.rs.acc != nullptr && out_task;
  float hg = 0.f, wn = 0.f;  // h[og], the row this warp adds to, in the same round trip
  if (lane == 0 && out_task) hg = __ldcg(a.h + og);
  float sx = 0.f, xsum = 0.f, ss[kTiles] = {};
  if (tid < StreamX<kV>::nch) {  // chunk tid = tile tid: its unit and sum, and its head's 4 tile sums of squares
    sx = __ldcg(&st.sx[tid]), xsum = __ldcg(&st.xsum[tid]);
#pragma unroll
    for (int k = 0; k < kTiles; ++k) ss[k] = __ldcg(a.tile_ss + (tid / kTiles) * kTiles + k);
  }
  // the router slices and the norm weight behind the phase's critical reads (needed only at its end; requested
  // with the out_proj rows they delayed barrier 1 and the step)
  const RouterSlice rsl = sums ? router_slice_load(a.rs, blockIdx.x) : RouterSlice{};
  if (lane == 0 && sums) wn = __ldg(a.rs.norm_w + og);
  xo.xq[tid] = q;
  if (tid < StreamX<kV>::nch) {
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < kTiles; ++k) t += ss[k];
    const float r = rsqrtf(t / kD + a.eps);
    xo.sx[tid] = sx * r;
    xo.xsum[tid] = xsum * r;
  }
  __syncthreads();
  trace_stamp(a.trace, 6);
  if (!out_task) {  // blocks >= 128, whole
    trace_stamp(a.trace, 7);
    return;
  }
  float acc[1];
  stream_dots<kV, 1>(xo, ov, osv, acc);
  const float v = group_sum<32>(acc[0]);
  __shared__ float hw[kRouterRows];
  if (lane == 0) {
    a.h[og] = hg + v;
    hw[warp] = (hg + v) * wn;
  }
  if (sums) {
    __syncthreads();
    router_partial_add(a.rs, rsl, hw);
  }
  trace_stamp(a.trace, 7);
}

}  // namespace
}  // namespace detail

bool gdn_mixer_fused_supported(const GdnMixerDev& m, GdnDims d) {
  auto q4 = [](const QMat& w, int rows, int cols) {
    return w.format == QFormat::q4 && w.n_mats == 1 && w.rows == rows && w.cols == cols;
  };
  return sm_count() >= detail::kMinBlocks && d.n_k_heads == detail::kHk && d.n_v_heads == detail::kHv &&
         d.k_dim == detail::kD && d.v_dim == detail::kD && q4(m.in_proj_qkv, detail::kConv, kHidden) &&
         q4(m.in_proj_z, detail::kV, kHidden) && q4(m.in_proj_b, detail::kHv, kHidden) &&
         q4(m.in_proj_a, detail::kHv, kHidden) && q4(m.out_proj, kHidden, detail::kV);
}

size_t gdn_mixer_scratch_floats() {
  return sizeof(detail::StreamX<detail::kV>) / sizeof(float) + detail::kHv * detail::kTiles;
}

void launch_gdn_mixer_fused(const GdnMixerDev& m, GdnDims d, float* h, const float* input_norm, float eps,
                            float* x_out, float* proj, float* scratch, unsigned* barrier, float* conv_ring,
                            float* state, const int* pos, cudaStream_t stream, const RouterSums* next_router,
                            StepTrace* trace) {
  LILY_CHECK(gdn_mixer_fused_supported(m, d), "gdn mixer: shapes not supported by the fused kernel");
  using namespace detail;
  Args a{};
  float* ys[4] = {proj, proj + kConv, proj + kConv + kV, proj + kConv + kV + kHv};
  GemvBatch in;
  in.n = 4;
  in.W[0] = m.in_proj_qkv, in.W[1] = m.in_proj_z, in.W[2] = m.in_proj_b, in.W[3] = m.in_proj_a;
  for (int i = 0; i < 4; ++i) in.y[i] = ys[i];
  a.in = multi_args(in);
  a.input_norm = input_norm;
  a.eps = eps;
  a.x_out = x_out;
  a.step = gdn::StepArgs{proj, ys[3], ys[2], m.conv1d, m.A_log, m.dt_bias, conv_ring, state, d};
  a.z = ys[1];
  a.norm_w = m.norm;
  a.o_staged = reinterpret_cast<StreamX<kV>*>(scratch);
  a.tile_ss = scratch + sizeof(StreamX<kV>) / sizeof(float);
  a.ow = m.out_proj.w;
  a.osb = m.out_proj.sb;
  a.h = h;
  a.pos = pos;
  a.barrier = barrier;
  a.trace = trace ? trace->take(kTraceGdn) : nullptr;
  if (next_router && next_router->acc) a.rs = router_partial_dev(*next_router);

  launch_persistent(gdn_fused_kernel, a, kThreads, stream);
}

}  // namespace lily::cuda
