// The whole MoE block of one decode step in ONE persistent launch (docs/model.md §2.1 + §2.4):
//   h += MoE(x),  x = RMSNorm(h) * norm_w
// for the real model's shapes (H = 2048, F = 512, top-8, q4 experts, q8 router, E <= 256). One block per SM,
// 16 warps each; phases separated by grid-wide barriers instead of kernel boundaries:
//   0  (attention layers) h += o_proj(attn): warp w of block b < 128 computes row 16 b + w of the q4 [H][4096]
//      projection (its weights requested at entry), then the block adds its 16 new rows' part of the router
//      sums (kernels/router_partial.cuh); a grid barrier
//   A  every block reads h and the router sums (added by the launch that wrote h, by phase 0, or by
//      router_sums_kernel launched before this one) in one L2 round trip, normalises h, turns the sums into
//      logits with its 1 / rms and selects the experts right after the norm's reduction (route_topk_select_from),
//      then requests the routed experts' gate/up rows; warps g < F compute the shared expert's gate/up row g
//      (unscaled silu(g) * u, weights requested after h); the 16 warps of block b < 128 compute routed act chunk
//      b (32 consecutive values, scaled by the routing weight), which the block stages in the streaming kernels'
//      16-bit input format (gemv_stream.cuh StreamX); the down-projection rows of phase C are requested once
//      half the gate/up rows have arrived
//   C  every block copies the staged routed act and stages the shared row (times its sigmoid gate) itself;
//      warp g computes output row g of all 9 down projections by integer dot products and adds it to h
//      (residual fused). Block 0 zeroes the router sums for the next layer. The shared row of act stays
//      unscaled in the scratch.
// Replaces moe_route + moe_gate_up + moe_down (three kernel boundaries, and the down weights could only be
// requested after the last one), and a router phase with its grid barrier. The 3-launch path stays for other shapes
// and for GPUs with fewer than 128 SMs. Task g of the shared gate/up and of phase C runs on warp (g / gridDim.x)
// of block (g % gridDim.x), so their work is spread over all SMs; the routed pairs go block by block (a chunk of
// act per block). Tested by tests/gpu/test_moe.cu against the CPU reference.
#include <cfloat>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/gemv_impl.cuh"
#include "kernels/gemv_stream.cuh"
#include "kernels/grid_barrier.cuh"
#include "kernels/moe_fused_common.cuh"
#include "kernels/router_partial.cuh"

namespace lily::cuda {
namespace detail {
namespace {

constexpr int kH = kHidden, kF = kMoeFfn, kK = kTopK;
constexpr int kWarps = 16, kThreads = kWarps * 32;
constexpr int kMinBlocks = 128;                   // the routed pairs and phase C need 2048 warp tasks
constexpr int kRoutedChunks = kK * kF / 32;       // 128: phase A block b computes routed act chunk b
static_assert(2 * kWarps == 32 && kRoutedChunks <= kMinBlocks, "a block's 16 warps compute one chunk of act");
static_assert(kRouterRows == kWarps && kRouterBlocks <= kMinBlocks, "phase 0: a block's 16 rows, one router partial");
static_assert(kRouterMaxN <= kThreads, "one router sum per thread");

struct FusedArgs {
  PairArgs pairs;     // routed + shared gate/up (q4), selection outputs
  float* logits;      // [E + 1] block 0 stores the logits (the tests read them)
  RouterPartialDev rs;  // the router sums (read in phase A, zeroed in C; phase 0 adds them)
  const uint8_t* dw; const uint32_t* dsb;    // routed down stack [E][H][F] q4
  const uint8_t* sdw; const uint32_t* sdsb;  // shared down [H][F] q4
  size_t d_mat_w_bytes, d_mat_groups;
  StreamX<(kK + 1) * kF>* act_q;  // routed act staged in phase A (chunk b by block b; the shared chunks unused)
  float* h;
  const float* norm_w;
  float eps;
  float* x_out;       // normed x (block 0 stores it), may be null
  unsigned* barrier;  // [kGridBarrierWords] (grid_barrier.cuh)
  unsigned long long* trace;  // this launch's slot of phase times (kernels/trace.h), or null
  const uint8_t* pw; const uint32_t* psb;    // phase 0: h += P px, P q4 [H][kP] (null: no phase 0)
  const float* px;
};
constexpr int kP = 4096;  // phase 0's input width (attention heads x head_dim)

__device__ __forceinline__ void stamp(const FusedArgs& a, int i) { trace_stamp(a.trace, i); }

__global__ void __launch_bounds__(kThreads, 1) moe_fused_kernel(FusedArgs a) {
  __shared__ __align__(16) StreamX<kH> xs;           // x for the q4 stream dots
  __shared__ __align__(16) StreamX<(kK + 1) * kF> xd;  // act (the 9 down projections' input), staged
  __shared__ __align__(16) float act_chunk[32];        // phase A: this block's chunk of act
  __shared__ float hw[kRouterRows];                    // phase 0: the block's new h rows times the norm weight
  __shared__ TopkSm topk;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int g = warp * gridDim.x + blockIdx.x;  // this warp's task index (shared gate/up, phase C)
  constexpr int G2 = kH / kGroupSize;
  const int E = a.pairs.E;
  stamp(a, 0);
  dep_trigger();  // PDL (grid_barrier.cuh): the next launch's blocks take the SMs as this launch's blocks leave
  const NormW<kH, kThreads> nw = stream_load_norm_w<kH, kThreads>(a.norm_w);  // constant: before the wait
  dep_wait();     // the previous launch complete, before any other load
  trace_stamp(a.trace, 15);
  GridSync gs{};  // the barrier base is read after the first loads (grid_barrier.cuh grid_sync_begin)

  // ---- phase 0 (optional): h += P px, then the block's part of the router sums ----
  if (a.pw) {
    __shared__ __align__(16) StreamX<kP> xp;
    const int pg = blockIdx.x * kWarps + warp;  // block-contiguous rows: one router partial per block
    const bool p_task = pg < kH;
    float hg = 0.f, wn = 0.f;
    if (p_task && lane == 0) hg = __ldcg(a.h + pg), wn = __ldg(a.norm_w + pg);
    uint4 pv[1][kP / 1024];
    uint32_t psv[1][kP / 1024];
    // px before the weight row: an SM receives its data in the order it requested it, so px requested behind the
    // rows (36 KB per SM) arrived only after them
    constexpr int J = kP / 4 / kThreads;
    float4 pxr[J];
#pragma unroll
    for (int j = 0; j < J; ++j) pxr[j] = x4_at(a.px, threadIdx.x + j * kThreads);
    if (p_task)
      stream_load_row<kP>(a.pw + static_cast<size_t>(pg) * (kP / 2), a.psb + static_cast<size_t>(pg) * (kP / kGroupSize),
                          pv[0], psv[0]);
    const bool sums = blockIdx.x < kRouterBlocks;
    const RouterSlice rsl = sums ? router_slice_load(a.rs, blockIdx.x) : RouterSlice{};
#pragma unroll
    for (int j = 0; j < J; ++j) stream_put_x4(xp, threadIdx.x + j * kThreads, pxr[j]);
    __syncthreads();
    gs = grid_sync_begin(a.barrier);
    if (p_task) {
      float acc[1];
      stream_dots<kP, 1>(xp, pv, psv, acc);
      const float v = group_sum<32>(acc[0]);
      if (lane == 0) {
        a.h[pg] = hg + v;
        hw[warp] = (hg + v) * wn;
      }
    }
    __syncthreads();
    if (sums) router_partial_add(a.rs, rsl, hw);
    grid_sync(gs);
  }

  // ---- phase A: h and the router sums, the norm, the selection, the shared and routed gate/up ----
  HRegs<kH, kThreads> hr;  // h and the sums before everything else: their L2 reads must not queue behind other loads
  stream_load_h(a.h, hr);
  const int e = threadIdx.x;
  unsigned long long sum_e = 0ull, sum_sh = 0ull;
#pragma unroll
  for (int c = 0; c < kRouterCopies; ++c) {
    if (e < E) sum_e += __ldcg(a.rs.acc + c * (E + 1) + e);
    if (e == 0) sum_sh += __ldcg(a.rs.acc + c * (E + 1) + E);
  }
  const bool down_task = g < kH;
  float hg = 0.f;  // h[g], the row this warp adds to in phase C: its residual add is then a store
  if (down_task && lane == 0) hg = __ldcg(a.h + g);
  if (!a.pw) gs = grid_sync_begin(a.barrier);
  const bool shared_task = g < kF;
  uint4 swv[2][2];  // shared expert gate, up rows
  uint32_t ssv[2][2];
  if (shared_task) {
    const uint8_t* const w[2] = {a.pairs.sgw + static_cast<size_t>(g) * (kH / 2), a.pairs.suw + static_cast<size_t>(g) * (kH / 2)};
    const uint32_t* const sb[2] = {a.pairs.sgsb + static_cast<size_t>(g) * G2, a.pairs.susb + static_cast<size_t>(g) * G2};
    stream_load_rows<kH, 2>(w, sb, swv, ssv);
  }
  // 2 (gate, up) row pairs per warp; a block's 16 warps compute 32 consecutive act values, act chunk blockIdx.x
  const int gb = blockIdx.x * kWarps + warp;
  const bool pair_task = gb < kK * kF / 2;
  uint4 wv[4][2];  // gate, up rows of the warp's two pairs
  uint32_t sv[4][2];
  PairArgs p = a.pairs;
  NormIn n;
  n.w = a.norm_w;
  n.eps = a.eps;
  n.x_out = a.x_out;
  // the selection inside the norm, as soon as the block's sum of squares is known: the routed rows are then
  // requested before the rest of the norm (staging x), which their DRAM latency covers
  stream_stage_loaded_norm(hr, &nw, n, xs, [&] {
    float total = 0.f;  // the norm's own sum, in its order: the same 1 / rms
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += xs.red[w];
    const float r = rsqrtf(total / kH + a.eps);
    const float l = e < E ? router_logit(sum_e, r) : -INFINITY;
    const float l_sh = e == 0 ? router_logit(sum_sh, r) : 0.f;
    if (blockIdx.x == 0) {  // the logits for the tests
      if (e < E) a.logits[e] = l;
      if (e == 0) a.logits[E] = l_sh;
    }
    route_topk_select_from(a.pairs, topk, l, l_sh);  // the experts (topk.idx); ends with __syncthreads
    p.idx = topk.idx;
    if (pair_task) load_pair_rows(p, gb, wv, sv);
  });
  stamp(a, 1);
  p = route_topk_finish(a.pairs, topk);  // the routing weights while the rows stream
  if (shared_task) {
    float acc[2];
    stream_dots<kH, 2>(xs, swv, ssv, acc);
    const float gs = group_sum<32>(acc[0]), us = group_sum<32>(acc[1]);
    if (lane == 0) a.pairs.out[kK * kF + g] = silu(gs) * us;  // scaled by the shared gate in C
  }
  stamp(a, 2);
  DownRow dr;
  if (!pair_task && down_task) load_down_row(a, topk.idx, g, dr);
  if (pair_task) {
    float acc[4];
    // The down rows of phase C once half the gate/up rows have arrived: issued before them they delayed them, and
    // issued right after them they still shared the HBM with the rows phase A waits for
    stream_dots<kH, 4>(xs, wv, sv, acc, [&] {
      if (down_task) load_down_row(a, topk.idx, g, dr);
    });
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float gv = group_sum<32>(acc[2 * r]), uv = group_sum<32>(acc[2 * r + 1]);
      const int task = 2 * gb + r;
      const float v = topk.w[task / kF] * silu(gv) * uv;
      if (lane == 0) {
        a.pairs.out[task] = v;  // the fp32 act stays in the scratch (the tests read it)
        act_chunk[2 * warp + r] = v;
      }
    }
  }
  // the block's chunk in the down phase's input format, once, instead of every block staging all of act in C
  __syncthreads();
  if (warp == 0 && blockIdx.x < kRoutedChunks)
    stream_put_x4(*a.act_q, blockIdx.x * 8 + (lane & 7), reinterpret_cast<const float4*>(act_chunk)[lane & 7], lane < 8);
  stamp(a, 3);
  grid_sync(gs);
  stamp(a, 4);

  // ---- phase C: down projections of all 9 activations, residual add ----
  if (blockIdx.x == 0 && e <= E)  // read by every block before the barrier
#pragma unroll
    for (int c = 0; c < kRouterCopies; ++c) a.rs.acc[c * (E + 1) + e] = 0ull;
  {  // the routed act as staged in phase A (its words, then the chunks' units and sums), the shared row from the
     // scratch (fp32, unscaled), all in one round trip; the shared row staged here by warps 0..3
    constexpr int nch = StreamX<(kK + 1) * kF>::nch;  // 144
    static_assert(4 * kRoutedChunks == kThreads && kF / 4 == 128, "one routed word per thread, the shared row on 4 warps");
    const StreamX<(kK + 1) * kF>& st = *a.act_q;
    const int word = (threadIdx.x / kRoutedChunks) * nch + threadIdx.x % kRoutedChunks;
    const uint4 q = __ldcg(&st.xq[word]);
    float sx = 0.f, xsum = 0.f;
    if (threadIdx.x < kRoutedChunks) sx = __ldcg(&st.sx[threadIdx.x]), xsum = __ldcg(&st.xsum[threadIdx.x]);
    float4 shv = make_float4(0.f, 0.f, 0.f, 0.f);
    if (threadIdx.x < kF / 4) shv = __ldcg(reinterpret_cast<const float4*>(a.pairs.out + kK * kF) + threadIdx.x);
    xd.xq[word] = q;
    if (threadIdx.x < kRoutedChunks) xd.sx[threadIdx.x] = sx, xd.xsum[threadIdx.x] = xsum;
    if (warp < kF / 128) {
      const float sh = topk.sh;
      stream_put_x4(xd, kRoutedChunks * 8 + threadIdx.x, make_float4(shv.x * sh, shv.y * sh, shv.z * sh, shv.w * sh));
    }
  }
  __syncthreads();
  stamp(a, 5);
  if (!down_task) return;
  float acc = 0.f;
#pragma unroll
  for (int u = 0; u < kDownPerLane; ++u) {
    const int t = lane + 32 * u;
    if (t < kDownChunks) acc += stream_chunk_dot(xd, t, dr.w[u], dr.sb[u]);
  }
  acc = group_sum<32>(acc);
  if (lane == 0) a.h[g] = hg + acc;
  stamp(a, 6);
}

// The router sums when no fused launch before the MoE block added them: block (b, t), b < kRouterBlocks, adds
// elements 16 b .. 16 b + 15 of h row t to row t's sums (rows kRouterCopies * n apart).
constexpr int kSumsThreads = (kRouterMaxN + 31) / 32 * 32;
__global__ void router_sums_kernel(RouterPartialDev r, const float* h) {
  __shared__ float hw[kRouterRows];
  const RouterSlice s = router_slice_load(r, blockIdx.x);
  const size_t t = blockIdx.y;
  r.acc += t * kRouterCopies * r.n;
  if (threadIdx.x < kRouterRows) {
    const int i = blockIdx.x * kRouterRows + threadIdx.x;
    hw[threadIdx.x] = h[t * kH + i] * r.norm_w[i];
  }
  __syncthreads();
  router_partial_add(r, s, hw);
}

// router_slices from the router [E][H] and the shared-expert gate [1][H] (q8): one thread per (row-block b, row e).
__global__ void build_router_slices_kernel(const uint8_t* rw, const uint32_t* rsb, const uint8_t* gw, const uint32_t* gsb,
                                           int E, uint8_t* q, uint32_t* sb) {
  const int n = E + 1;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= kRouterBlocks * n) return;
  const int b = i / n, e = i % n;
  const uint8_t* row = e < E ? rw + static_cast<size_t>(e) * kH : gw;
  const uint32_t* rowsb = e < E ? rsb + static_cast<size_t>(e) * (kH / kGroupSize) : gsb;
  *reinterpret_cast<uint4*>(q + (static_cast<size_t>(b) * n + e) * 16) =
      *reinterpret_cast<const uint4*>(row + b * kRouterRows);
  if (b % (kGroupSize / kRouterRows) == 0) {
    const int grp = b / (kGroupSize / kRouterRows);
    sb[static_cast<size_t>(grp) * n + e] = rowsb[grp];
  }
}

}  // namespace

bool moe_fused_takes_pre(const ResidualProj& pre) {
  return pre.W.format == QFormat::q4 && pre.W.n_mats == 1 && pre.W.rows == kH && pre.W.cols == kP;
}

bool moe_fused_supported(const MoeWeightsDev& m, const MoeScratch& s) {
  return sm_count() >= kMinBlocks && s.barrier != nullptr && s.router_acc != nullptr && m.router_slices.w != nullptr &&
         m.gate.format == QFormat::q8 && m.shared_expert_gate.format == QFormat::q8 && m.gate.cols == kH &&
         m.gate.rows <= kMaxExperts && m.experts_gate.format == QFormat::q4 && m.experts_down.format == QFormat::q4 &&
         m.experts_gate.rows == kF && m.experts_gate.cols == kH && m.experts_down.rows == kH &&
         m.experts_down.cols == kF && s.top_k == kK;
}

RouterPartialDev router_partial_dev(const RouterSums& s) {
  RouterPartialDev r;
  r.q = s.slices.w;
  r.sb = s.slices.sb;
  r.norm_w = s.norm_w;
  r.acc = s.acc;
  r.n = s.slices.rows;
  return r;
}

void launch_moe_fused(const MoeWeightsDev& m, float* h, const float* norm_w, float eps, float* x_out,
                      const MoeScratch& s, const ResidualProj* pre, bool sums_added, StepTrace* trace,
                      cudaStream_t stream) {
  FusedArgs a{};
  a.pairs = expert_pair_args(m, s);
  a.logits = s.logits;
  const RouterSums sums{m.router_slices, norm_w, s.router_acc};
  a.rs = router_partial_dev(sums);
  a.dw = m.experts_down.w; a.dsb = m.experts_down.sb; a.sdw = m.shared_down.w; a.sdsb = m.shared_down.sb;
  a.d_mat_w_bytes = m.experts_down.mat_w_bytes();
  a.d_mat_groups = m.experts_down.mat_groups();
  a.act_q = static_cast<StreamX<(kK + 1) * kF>*>(s.act_q);
  a.h = h;
  a.norm_w = norm_w;
  a.eps = eps;
  a.x_out = x_out;
  a.barrier = s.barrier;
  a.trace = trace ? trace->take(kTraceMoe) : nullptr;
  if (pre) {
    a.pw = pre->W.w;
    a.psb = pre->W.sb;
    a.px = pre->x;
  } else if (!sums_added) {
    moe_router_sums_add(sums, h, stream);
  }

  launch_persistent(moe_fused_kernel, a, kThreads, stream);
}

}  // namespace detail

void moe_router_sums_add(const RouterSums& r, const float* h, cudaStream_t stream) {
  moe_router_sums_rows(r, h, 1, stream);
}

void moe_router_sums_rows(const RouterSums& r, const float* h, int n, cudaStream_t stream) {
  using namespace detail;
  LILY_CHECK(r.acc && r.slices.w && r.slices.cols == kH && n >= 1 && n <= kMoeFusedMaxRows, "moe_router_sums_rows: "
             "no router slices or accumulator, or ", n, " rows (1..", kMoeFusedMaxRows, ")");
  router_sums_kernel<<<dim3(kRouterBlocks, n), kSumsThreads, 0, stream>>>(router_partial_dev(r), h);
  CUDA_CHECK_LAUNCH(stream);
}

void moe_build_router_slices(MoeWeightsDev& m, cudaStream_t stream) {
  using namespace detail;
  const QMat& r = m.gate;
  const QMat& sg = m.shared_expert_gate;
  if (r.format != QFormat::q8 || sg.format != QFormat::q8 || r.cols != kH || sg.cols != kH || sg.rows != 1 ||
      r.n_mats != 1 || r.rows > kMaxExperts || !r.w || !sg.w)
    return;
  QMat q;
  q.format = QFormat::q8;
  q.rows = r.rows + 1;
  q.cols = kH;
  qmat_alloc(q);
  const int n = kRouterBlocks * q.rows;
  build_router_slices_kernel<<<(n + 255) / 256, 256, 0, stream>>>(r.w, r.sb, sg.w, sg.sb, r.rows, q.w, q.sb);
  CUDA_CHECK_LAUNCH(stream);
  m.router_slices = q;
}

}  // namespace lily::cuda
