// The whole MoE block of one decode step in ONE persistent launch (model.md §2.1 + §2.4):
//   h += MoE(x),  x = RMSNorm(h) * norm_w
// for the real model's shapes (H = 2048, F = 512, top-8, q4 experts, q8 router, E <= 256). One block per SM,
// 16 warps each; phases separated by grid-wide barriers instead of kernel boundaries:
//   0  (attention layers) h += o_proj(attn): warp g computes row g of the q4 [H][4096] projection, its weights
//      requested at entry (a separate o_proj launch cost ~6 us per layer for 4.7 MB)
//   A  every block normalises h; warps compute the router logits (+ shared-gate logit) and the shared expert's
//      gate/up (unscaled silu(g) * u) — both need only x, and their weights are requested right after h
//   B  every block turns the logits into the selection (route_topk); warps request the routed experts' gate/up
//      rows (and, once those have arrived, the down-projection rows of phase C), compute the gate/up into act
//      (scaled by the routing weight); the 16 warps of block b compute act chunk b (32 consecutive values),
//      which the block stages in the streaming kernels' 16-bit input format (gemv_stream.cuh StreamX) once for
//      every block (and the last block stages the shared expert's row, times its sigmoid gate, from phase A)
//   C  every block copies the staged act into shared memory; warp g computes output row g of all 9 down
//      projections by integer dot products and adds it to h (residual fused). The shared row of act stays
//      unscaled in the scratch.
// Replaces moe_route + moe_gate_up + moe_down (three kernel boundaries of ~4-5 us each on the H200, and the
// down weights could only be requested after the last one). The 3-launch path stays for other shapes and for
// GPUs with fewer than 128 SMs. Task g of phases 0, A and C runs on warp (g / gridDim.x) of block
// (g % gridDim.x), so their work is spread over all SMs; phase B's pair tasks go block by block (a chunk of act
// per block). Tested by tests/gpu/test_moe.cu against the CPU reference.
#include <cfloat>

#include "kernels/common.cuh"
#include "kernels/gemv_impl.cuh"
#include "kernels/gemv_stream.cuh"
#include "kernels/grid_barrier.cuh"

namespace lily::cuda {
namespace detail {
namespace {

constexpr int kH = kHidden, kF = kMoeFfn, kK = kTopK;
constexpr int kWarps = 16, kThreads = kWarps * 32;
constexpr int kMinBlocks = 128;                   // phases B and C need 2048 warp tasks
constexpr int kDownChunks = (kK + 1) * kF / 32;   // 144 chunks of 32 elements in one output row of the 9 downs
constexpr int kDownPerLane = (kDownChunks + 31) / 32;  // 5
constexpr int kRoutedChunks = kK * kF / 32;       // 128: phase B block b computes routed act chunk b
static_assert(2 * kWarps == 32 && kRoutedChunks <= kMinBlocks, "a block's 16 warps compute one chunk of act");

struct FusedArgs {
  MultiArgs router;   // router [E] + shared_expert_gate [1] rows (q8, K = H) -> logits
  PairArgs pairs;     // routed + shared gate/up (q4), selection outputs, logits
  const uint8_t* dw; const uint32_t* dsb;    // routed down stack [E][H][F] q4
  const uint8_t* sdw; const uint32_t* sdsb;  // shared down [H][F] q4
  size_t d_mat_w_bytes, d_mat_groups;
  StreamX<(kK + 1) * kF>* act_q;  // act staged in phase B: routed chunk b by block b, the shared 16 by the last block
  float* h;
  const float* norm_w;
  float eps;
  float* x_out;       // normed x (block 0 stores it), may be null
  unsigned* barrier;  // [kGridBarrierWords] (grid_barrier.cuh)
  unsigned long long* trace;  // LILY_TRACE=1: this launch's slot of phase times (grid_barrier.cuh), else null
  const uint8_t* pw; const uint32_t* psb;    // phase 0: h += P px, P q4 [H][kP] (null: no phase 0)
  const float* px;
};
constexpr int kP = 4096;  // phase 0's input width (attention heads x head_dim)

__device__ __forceinline__ void stamp(const FusedArgs& a, int i) { trace_stamp(a.trace, i); }

// Phase C weights of output row i: flat chunk t = j * 16 + c (matrix j < 9, 16-byte chunk c of the 256-byte
// row); lane l holds t = l + 32 * u.
struct DownRow {
  uint4 w[kDownPerLane];
  uint32_t sb[kDownPerLane];
};

__device__ __forceinline__ void load_down_row(const FusedArgs& a, const int* idx, int i, DownRow& d) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int u = 0; u < kDownPerLane; ++u) {
    const int t = lane + 32 * u;
    if (t >= kDownChunks) break;
    const int j = t / 16, c = t % 16;
    const bool sh = j == kK;
    const size_t e = sh ? 0 : static_cast<size_t>(idx[j]);
    const uint8_t* w = (sh ? a.sdw : a.dw + e * a.d_mat_w_bytes) + static_cast<size_t>(i) * (kF / 2);
    const uint32_t* sb = (sh ? a.sdsb : a.dsb + e * a.d_mat_groups) + static_cast<size_t>(i) * (kF / kGroupSize);
    d.w[u] = ld_stream(w + c * 16);
    d.sb[u] = ld_stream_u32(sb + c / 2);
  }
}

__global__ void __launch_bounds__(kThreads, 1) moe_fused_kernel(FusedArgs a) {
  __shared__ __align__(16) StreamX<kH> xs;           // x for the q4 stream dots
  __shared__ __align__(16) float xsm[kH];            // x for the q8 router rows
  __shared__ __align__(16) StreamX<(kK + 1) * kF> xd;  // act (the 9 down projections' input), staged
  __shared__ __align__(16) float act_chunk[32];        // phase B: this block's chunk of act
  __shared__ TopkSm topk;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int g = warp * gridDim.x + blockIdx.x;  // this warp's task index in every phase
  constexpr int G2 = kH / kGroupSize;
  stamp(a, 0);
  dep_trigger();  // PDL (grid_barrier.cuh): the next launch's blocks take the SMs as this launch's blocks leave
  const NormW<kH, kThreads> nw = stream_load_norm_w<kH, kThreads>(a.norm_w);  // constant: before the wait
  dep_wait();     // the previous launch complete, before any other load
  trace_stamp(a.trace, 15);
  GridSync gs{};  // the barrier base is read after the first loads (grid_barrier.cuh grid_sync_begin)
  // h[g], the row this warp adds to in phases 0 and C, in a register from the start: the residual adds are then
  // plain stores, not an L2 round trip on the launch's tail
  float hg = 0.f;
  if (lane == 0 && g < kH) hg = __ldcg(a.h + g);

  // ---- phase 0 (optional): h += P px ----
  if (a.pw) {
    __shared__ __align__(16) StreamX<kP> xp;
    uint4 pv[1][kP / 1024];
    uint32_t psv[1][kP / 1024];
    // px before the weight row: an SM receives its data in the order it requested it, so px requested behind the
    // rows (36 KB per SM) arrived only after them (bench_stream's phase probes: a read behind an SM's own 108 KB
    // took 2.6 us, one from an SM without loads 0.7)
    constexpr int J = kP / 4 / kThreads;
    float4 pxr[J];
#pragma unroll
    for (int j = 0; j < J; ++j) pxr[j] = x4_at(a.px, threadIdx.x + j * kThreads);
    if (g < kH)
      stream_load_row<kP>(a.pw + static_cast<size_t>(g) * (kP / 2), a.psb + static_cast<size_t>(g) * (kP / kGroupSize),
                          pv[0], psv[0]);
#pragma unroll
    for (int j = 0; j < J; ++j) stream_put_x4(xp, threadIdx.x + j * kThreads, pxr[j]);
    __syncthreads();
    gs = grid_sync_begin(a.barrier);
    if (g < kH) {
      float acc[1];
      stream_dots<kP, 1>(xp, pv, psv, acc);
      const float v = group_sum<32>(acc[0]);
      if (lane == 0) {
        hg += v;
        a.h[g] = hg;
      }
    }
    grid_sync(gs);
  }

  // ---- phase A: router logits and the shared expert's gate/up ----
  const int n_router = a.router.total;            // E + 1
  const bool router_task = g < n_router;
  const bool shared_task = !router_task && g < n_router + kF;
  HRegs<kH, kThreads> hr;  // h before everything else: its L2 reads must not queue behind other loads
  stream_load_h(a.h, hr);
  if (!a.pw) gs = grid_sync_begin(a.barrier);
  RowBatch<QFormat::q8, kH, 1> rb;
  uint4 swv[2][2];  // shared expert gate, up rows
  uint32_t ssv[2][2];
  if (router_task) stage_issue_rows<QFormat::q8, kH, 1>(a.router, g, rb);
  if (shared_task) {
    const size_t r = g - n_router;
    const uint8_t* const w[2] = {a.pairs.sgw + r * (kH / 2), a.pairs.suw + r * (kH / 2)};
    const uint32_t* const sb[2] = {a.pairs.sgsb + r * G2, a.pairs.susb + r * G2};
    stream_load_rows<kH, 2>(w, sb, swv, ssv);
  }
  NormIn n;
  n.w = a.norm_w;
  n.eps = a.eps;
  n.x_out = a.x_out;
  n.x_smem = xsm;  // the same x in plain order for the q8 router rows
  stream_stage_loaded_norm(hr, &nw, n, xs);
  stamp(a, 1);
  if (router_task) stage_finish_rows<QFormat::q8, kH, 1>(a.router, xsm, rb, false);
  if (shared_task) {
    float acc[2];
    stream_dots<kH, 2>(xs, swv, ssv, acc);
    const float gs = group_sum<32>(acc[0]), us = group_sum<32>(acc[1]);
    if (lane == 0) a.pairs.out[kK * kF + (g - n_router)] = silu(gs) * us;  // scaled by the shared gate in B
  }
  stamp(a, 2);
  grid_sync(gs);
  stamp(a, 3);

  // ---- phase B: selection, routed gate/up; the down weights of phase C requested behind the gate/up rows ----
  route_topk_select(a.pairs, topk);  // the experts (topk.idx); ends with __syncthreads
  PairArgs p = a.pairs;
  p.idx = topk.idx;
  stamp(a, 4);
  // 2 (gate, up) row pairs per warp; a block's 16 warps compute 32 consecutive act values, act chunk blockIdx.x
  const int gb = blockIdx.x * kWarps + warp;
  const bool pair_task = gb < kK * kF / 2;
  const bool down_task = g < kH;
  DownRow dr;
  uint4 wv[4][2];  // gate, up rows of the warp's two pairs
  uint32_t sv[4][2];
  if (pair_task) {
    const uint8_t* w[4];
    const uint32_t* sb[4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const PairRow pr = resolve_pair<true>(p, 2 * gb + r, kH / 2, G2);
      w[2 * r] = pr.gw, sb[2 * r] = pr.gsb, w[2 * r + 1] = pr.uw, sb[2 * r + 1] = pr.usb;
    }
    stream_load_rows<kH, 4>(w, sb, wv, sv);
  }
  p = route_topk_finish(a.pairs, topk);  // the routing weights while the rows stream
  if (!pair_task && down_task) load_down_row(a, topk.idx, g, dr);
  if (pair_task) {
    float acc[4];
    stream_dots<kH, 4>(xs, wv, sv, acc);
    // The down rows of phase C once the gate/up rows have arrived: issued before them they delayed them, and
    // issued right after them they still shared the HBM with the rows phase B waits for; from here they
    // stream during barrier 2 and the act staging (H200, 4K, binary A/B: 1279.2 -> 1277.3 us per token).
    if (down_task) load_down_row(a, topk.idx, g, dr);
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
  // the shared expert's row (written unscaled in phase A) times sigmoid(shared gate logit): warps 4..7 of the last
  // block (no pair tasks when the grid has more than kRoutedChunks blocks)
  if (blockIdx.x == gridDim.x - 1 && warp >= 4 && warp < 4 + kF / 128) {
    const int i = threadIdx.x - 128;  // float4 i of the shared row
    const float4 v = __ldcg(reinterpret_cast<const float4*>(a.pairs.out + kK * kF) + i);
    const float sh = topk.sh;
    stream_put_x4(*a.act_q, kRoutedChunks * 8 + i, make_float4(v.x * sh, v.y * sh, v.z * sh, v.w * sh));
  }
  stamp(a, 5);
  grid_sync(gs);
  stamp(a, 6);

  // ---- phase C: down projections of all 9 activations, residual add ----
  {  // act as staged in phase B: a copy (its words, then the chunks' units and sums)
    constexpr int kWords = 4 * kDownChunks;
    const StreamX<(kK + 1) * kF>& st = *a.act_q;
    uint4 q[2];
#pragma unroll
    for (int u = 0; u < 2; ++u)
      if (threadIdx.x + u * kThreads < kWords) q[u] = __ldcg(&st.xq[threadIdx.x + u * kThreads]);
    float sx = 0.f, xsum = 0.f;
    if (threadIdx.x < kDownChunks) sx = __ldcg(&st.sx[threadIdx.x]), xsum = __ldcg(&st.xsum[threadIdx.x]);
#pragma unroll
    for (int u = 0; u < 2; ++u)
      if (threadIdx.x + u * kThreads < kWords) xd.xq[threadIdx.x + u * kThreads] = q[u];
    if (threadIdx.x < kDownChunks) xd.sx[threadIdx.x] = sx, xd.xsum[threadIdx.x] = xsum;
  }
  __syncthreads();
  stamp(a, 7);
  if (!down_task) return;
  float acc = 0.f;
#pragma unroll
  for (int u = 0; u < kDownPerLane; ++u) {
    const int t = lane + 32 * u;
    if (t < kDownChunks) acc += stream_chunk_dot(xd, t, dr.w[u], dr.sb[u]);
  }
  acc = group_sum<32>(acc);
  if (lane == 0) a.h[g] = hg + acc;
  stamp(a, 8);
}

}  // namespace

bool moe_fused_takes_pre(const ResidualProj& pre) {
  return pre.W.format == QFormat::q4 && pre.W.n_mats == 1 && pre.W.rows == kH && pre.W.cols == kP;
}

bool moe_fused_supported(const MoeWeightsDev& m, const MoeScratch& s) {
  return sm_count() >= kMinBlocks && s.barrier != nullptr && m.router.format == QFormat::q8 &&
         m.shared_expert_gate.format == QFormat::q8 && m.router.cols == kH && m.router.rows <= kMaxExperts &&
         m.gate.format == QFormat::q4 && m.down.format == QFormat::q4 && m.gate.rows == kF && m.gate.cols == kH &&
         m.down.rows == kH && m.down.cols == kF && s.top_k == kK;
}

void launch_moe_fused(const MoeWeightsDev& m, float* h, const float* norm_w, float eps, float* x_out,
                      const MoeScratch& s, const ResidualProj* pre, cudaStream_t stream) {
  FusedArgs a{};
  a.router = router_args(m, s);
  a.pairs = expert_pair_args(m, s);
  a.dw = m.down.w; a.dsb = m.down.sb; a.sdw = m.sh_down.w; a.sdsb = m.sh_down.sb;
  a.d_mat_w_bytes = m.down.mat_w_bytes();
  a.d_mat_groups = m.down.mat_groups();
  a.act_q = static_cast<StreamX<(kK + 1) * kF>*>(s.act_q);
  a.h = h;
  a.norm_w = norm_w;
  a.eps = eps;
  a.x_out = x_out;
  a.barrier = s.barrier;
  a.trace = persistent_trace(0);
  if (pre) {
    a.pw = pre->W.w;
    a.psb = pre->W.sb;
    a.px = pre->x;
  }

  launch_persistent(moe_fused_kernel, a, kThreads, stream);
}

}  // namespace detail

}  // namespace lily::cuda
