// The whole MoE block of one decode step in ONE persistent launch (model.md §2.1 + §2.4):
//   h += MoE(x),  x = RMSNorm(h) * norm_w
// for the real model's shapes (H = 2048, F = 512, top-8, q4 experts, q8 router, E <= 256). One block per SM,
// 16 warps each; phases separated by grid-wide barriers instead of kernel boundaries:
//   0  (attention layers) h += o_proj(attn): warp g computes row g of the q4 [H][4096] projection, its weights
//      requested at entry (a separate o_proj launch cost ~6 us per layer for 4.7 MB)
//   A  every block normalises h; warps compute the router logits (+ shared-gate logit) and the shared expert's
//      gate/up (unscaled silu(g) * u) — both need only x, and their weights are requested right after h
//   B  every block turns the logits into the selection (route_topk); warps request the routed experts' gate/up
//      rows and then the down-projection rows they will need in phase C, compute the gate/up into act (scaled by
//      the routing weight)
//   C  every block stages act in shared memory (the shared expert's row times its sigmoid gate); warp g computes
//      output row g of all 9 down projections and adds it to h (residual fused). The shared row of act stays
//      unscaled in the scratch.
// Replaces moe_route + moe_gate_up + moe_down (three kernel boundaries of ~4-5 us each on the H200, and the
// down weights could only be requested after the last one). The 3-launch path stays for other shapes and for
// GPUs with fewer than 128 SMs. Task g of a phase runs on warp (g / gridDim.x) of block (g % gridDim.x), so
// every phase's work is spread over all SMs. Tested by tests/gpu/test_moe.cu against the CPU reference.
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
constexpr int kActStride = 36;                    // floats per staged act chunk (32 + 4 padding: no bank conflicts)

struct FusedArgs {
  MultiArgs router;   // router [E] + shared_expert_gate [1] rows (q8, K = H) -> logits
  PairArgs pairs;     // routed + shared gate/up (q4), selection outputs, logits
  const uint8_t* dw; const uint32_t* dsb;    // routed down stack [E][H][F] q4
  const uint8_t* sdw; const uint32_t* sdsb;  // shared down [H][F] q4
  size_t d_mat_w_bytes, d_mat_groups;
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
  __shared__ __align__(16) float act_sm[kDownChunks * kActStride];
  __shared__ float act_sum[kDownChunks];
  __shared__ TopkSm topk;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int g = warp * gridDim.x + blockIdx.x;  // this warp's task index in every phase
  constexpr int G2 = kH / kGroupSize;
  stamp(a, 0);
  dep_trigger();  // PDL (grid_barrier.cuh): the next launch's blocks take the SMs as this launch's blocks leave
  dep_wait();     // the previous launch complete, before any load
  trace_stamp(a.trace, 15);
  GridSync gs = grid_sync_begin(a.barrier);
  // h[g], the row this warp adds to in phases 0 and C, in a register from the start: the residual adds are then
  // plain stores, not an L2 round trip on the launch's tail
  float hg = 0.f;
  if (lane == 0 && g < kH) hg = __ldcg(a.h + g);

  // ---- phase 0 (optional): h += P px ----
  if (a.pw) {
    __shared__ __align__(16) StreamX<kP> xp;
    uint4 pv[1][kP / 1024];
    uint32_t psv[1][kP / 1024];
    if (g < kH)
      stream_load_row<kP>(a.pw + static_cast<size_t>(g) * (kP / 2), a.psb + static_cast<size_t>(g) * (kP / kGroupSize),
                          pv[0], psv[0]);
    stream_stage_x<kP, kThreads>(a.px, xp);
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
  const NormW<kH, kThreads> nw = stream_load_norm_w<kH, kThreads>(a.norm_w);
  HRegs<kH, kThreads> hr;  // h before the weights: its L2 reads must not queue behind the weight loads
  stream_load_h(a.h, hr);
  RowBatch<QFormat::q8, kH, 1> rb;
  uint4 swv[2][2];  // shared expert gate, up rows
  uint32_t ssv[2][2];
  if (router_task) stage_issue_rows<QFormat::q8, kH, 1>(a.router, g, rb);
  if (shared_task) {
    const int r = g - n_router;
    stream_load_row<kH>(a.pairs.sgw + static_cast<size_t>(r) * (kH / 2), a.pairs.sgsb + static_cast<size_t>(r) * G2,
                        swv[0], ssv[0]);
    stream_load_row<kH>(a.pairs.suw + static_cast<size_t>(r) * (kH / 2), a.pairs.susb + static_cast<size_t>(r) * G2,
                        swv[1], ssv[1]);
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
  const bool pair_task = g < kK * kF / 2;        // 2 (gate, up) row pairs per warp
  const bool down_task = g < kH;
  DownRow dr;
  uint4 wv[4][2];  // gate, up rows of the warp's two pairs
  uint32_t sv[4][2];
  if (pair_task) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const PairRow pr = resolve_pair<true>(p, 2 * g + r, kH / 2, G2);
      stream_load_row<kH>(pr.gw, pr.gsb, wv[2 * r], sv[2 * r]);
      stream_load_row<kH>(pr.uw, pr.usb, wv[2 * r + 1], sv[2 * r + 1]);
    }
  }
  // the down rows of phase C after the gate/up rows this phase waits for (issued first, they delayed them)
  if (down_task) load_down_row(a, topk.idx, g, dr);
  p = route_topk_finish(a.pairs, topk);  // the routing weights while the rows stream
  if (pair_task) {
    float acc[4];
    stream_dots<kH, 4>(xs, wv, sv, acc);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float gv = group_sum<32>(acc[2 * r]), uv = group_sum<32>(acc[2 * r + 1]);
      const int task = 2 * g + r;
      if (lane == 0) a.pairs.out[task] = topk.w[task / kF] * silu(gv) * uv;
    }
  }
  stamp(a, 5);
  grid_sync(gs);
  stamp(a, 6);

  // ---- phase C: down projections of all 9 activations, residual add ----
  {  // float4 f = threadIdx.x + kThreads * u of act: chunk f / 8, part f % 8; all loads first
    constexpr int kF4 = kDownChunks * 8, kU = (kF4 + kThreads - 1) / kThreads;
    float4 v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int f = threadIdx.x + kThreads * u;
      v[u] = f < kF4 ? __ldcg(reinterpret_cast<const float4*>(a.pairs.out) + f) : make_float4(0.f, 0.f, 0.f, 0.f);
      if (f >= kK * kF / 4) {  // the shared expert's row: times sigmoid(shared gate logit) here
        const float sh = topk.sh;
        v[u] = make_float4(v[u].x * sh, v[u].y * sh, v[u].z * sh, v[u].w * sh);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int f = threadIdx.x + kThreads * u;
      // chunk sum over its 8 parts (8 consecutive lanes), in part order
      const float part = (v[u].x + v[u].y) + (v[u].z + v[u].w);
      float t = 0.f;
#pragma unroll
      for (int k = 0; k < 8; ++k) t += __shfl_sync(0xffffffffu, part, (lane & 24) + k);
      if (f < kF4) {
        *reinterpret_cast<float4*>(act_sm + (f / 8) * kActStride + (f % 8) * 4) = v[u];
        if (f % 8 == 0) act_sum[f / 8] = t;
      }
    }
  }
  __syncthreads();
  stamp(a, 7);
  if (!down_task) return;
  float acc = 0.f;
#pragma unroll
  for (int u = 0; u < kDownPerLane; ++u) {
    const int t = lane + 32 * u;
    if (t >= kDownChunks) break;
    float xr[32];
#pragma unroll
    for (int q = 0; q < 32; q += 4) {
      const float4 v = *reinterpret_cast<const float4*>(act_sm + t * kActStride + q);
      xr[q] = v.x, xr[q + 1] = v.y, xr[q + 2] = v.z, xr[q + 3] = v.w;
    }
    acc += chunk_dot<QFormat::q4>(dr.w[u], dr.sb[u], xr, act_sum[t]);
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
