// The MoE block of a decode pass of n <= kMoeFusedMaxRows one-token rows in ONE persistent launch: for every row r,
//   h[r] += MoE(x_r),  x_r = RMSNorm(h[r]) * norm_w
// with each row's arithmetic that of the decode step's one-row kernel (kernels/moe_fused.cu), so a row's result
// is bit for bit what moe_block gives it alone, whatever the other rows. Replaces a pass's 13 launches per MoE
// block (norm and input preps, router, selection, grouping, work list, shared and routed gate/up, down, combine),
// which at a few rows cost more in launch gaps than in weight bytes. The router sums of every row are added by the
// launch before (the int8 out_proj / o_proj's epilogue, gemm_i8, or moe_router_sums_rows), as the one-row path's
// are (kernels/router_partial.cuh). One block per SM, 16 warps; two phases separated by a grid barrier:
//   A  every block normalises and stages all n rows of x (one reduction barrier for all of them) and requests
//      the sums; warp g < F computes the shared expert's gate/up row g for every row (its weights, requested
//      before the PDL wait, read once) while they come in; every block turns the sums into logits and selects
//      each row's experts (warp r takes row r: warp_topk, the one-row selection's experts and weights); per row
//      r, the 16 warps of block b < 128 compute routed act chunk b of row r, two rows' weights in flight at a
//      time; each chunk staged in the down phase's 16-bit input format; the first two rows' down weights
//      requested
//   C  every block copies every row's staged act (one round trip) and stages the shared rows times their gates;
//      warp g computes output row g of row r's 9 down projections, r = 0.. with the next row's weights in
//      flight, h[r][g] += it. Block 0 zeroes the router sums.
// The routed experts' rows are read per row that chose them (a repeat within a pass is an L2 hit when close in
// time): below ~8 rows few experts repeat. Tested by tests/gpu/test_moe.cu against moe_block row by row.
#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/gemv_impl.cuh"
#include "kernels/gemv_stream.cuh"
#include "kernels/grid_barrier.cuh"
#include "kernels/moe_fused_common.cuh"
#include "kernels/mma.cuh"
#include "kernels/router_partial.cuh"

namespace lily::cuda {
namespace detail {
namespace {

constexpr int kH = kHidden, kF = kMoeFfn, kK = kTopK, kR = kMoeFusedMaxRows;
constexpr int kWarps = 16, kThreads = kWarps * 32;
constexpr int kMinBlocks = 128;                        // the routed chunks and phase C need 2048 warp tasks
constexpr int kRoutedChunks = kK * kF / 32;            // 128: block b computes routed act chunk b of each row
constexpr int kActFloats = (kK + 1) * kF;              // a row of act: 8 routed rows (scaled), the shared one
using ActX = StreamX<(kK + 1) * kF>;
static_assert(kRoutedChunks <= kMinBlocks, "block shapes");
static_assert(kRouterMaxN <= kThreads, "one router sum a thread");
static_assert(kR <= 32, "phase C: lane r holds row r's h[g]");
static_assert(sizeof(ActX::xq) % 16 == 0 && sizeof(ActX::sx) % 16 == 0, "phase C copies sx and xsum in 16 bytes");

struct RowsArgs {
  PairArgs pairs;     // routed + shared gate/up (q4); idx / wts set per row from the selection
  RouterPartialDev rs;  // acc: row r's router sums (complete at entry) at acc + r * kRouterCopies * rs.n
  const uint8_t* dw; const uint32_t* dsb;    // routed down stack [E][H][F] q4
  const uint8_t* sdw; const uint32_t* sdsb;  // shared down [H][F] q4
  size_t d_mat_w_bytes, d_mat_groups;
  float* act;         // [n][kActFloats] fp32 act (routed scaled by their weights, the shared row unscaled)
  ActX* act_q;        // [n] routed act staged in phase A
  float* h;           // [n][H]
  const float* norm_w;
  float eps;
  int n;
  unsigned* barrier;  // [kGridBarrierWords]
  unsigned long long* trace;  // phase stamps (kernels/trace.h) or null
};

// Dynamic shared memory: per row x staged for the gate/up dots, its act staged for the down dots, its selection.
// The larger per-row steps loop over rows with the rows' values here, not unrolled over register arrays (only the
// loads stay unrolled, in flight together): the kernel's code runs once per launch, and each unrolled copy of it
// is an instruction fetch the warps wait for.
struct Smem {
  StreamX<kH> xs[kR];
  union {
    float4 hs[kR][kH / 4];  // phase R: every row's h (the norms)
    ActX xd[kR];            // phase C
  };
  TopkSm topk[kR];
  float logit[kR][kMaxExperts];  // phase A: row r's router logit of expert e < E
  float rinv[kR];                // row r's 1 / rms
  float act_chunk[kR][32];
  float red[kR][kWarps];
};

struct PairBuf {  // the gate, up rows of a warp's two pairs (moe_fused.cu phase A)
  uint4 wv[4][2];
  uint32_t sv[4][2];
};

// The experts of every row from their logits (sm.logit, and each row's shared-expert-gate logit in its
// topk.sh_logit): warp r < n selects row r's (warp_topk: the experts and weights of the one-row kernel's
// route_topk steps), one barrier for all rows.
__device__ __forceinline__ void select_rows(const PairArgs& a, Smem& sm, int n) {
  static_assert(kR <= kWarps, "a warp per row");
  const int r = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (r < n) {
    int idx[kK];
    float w[kK];
    warp_topk<kMaxExperts / 32>(sm.logit[r], a.E, kK, idx, w);
    if (lane < kK) {
#pragma unroll
      for (int j = 0; j < kK; ++j)
        if (j == lane) sm.topk[r].idx[j] = idx[j], sm.topk[r].w[j] = w[j];
    }
    if (lane == 0) sm.topk[r].sh = 1.f / (1.f + expf(-sm.topk[r].sh_logit));
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, 1) moe_fused_rows_kernel(RowsArgs a) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, e = tid;
  const int g = warp * gridDim.x + blockIdx.x;  // this warp's task (shared gate/up, phase C)
  const int n = a.n;
  constexpr int G2 = kH / kGroupSize;
  const int E = a.pairs.E;
  trace_stamp(a.trace, 0);
  dep_trigger();
  // constant: before the wait, in flight while the previous kernel finishes: the norm weight and this warp's
  // shared expert gate/up rows (the same for every row)
  const NormW<kH, kThreads> nw = stream_load_norm_w<kH, kThreads>(a.norm_w);
  const bool shared_task = g < kF;
  uint4 swv[2][2];
  uint32_t ssv[2][2];
  if (shared_task) {
    const uint8_t* const w[2] = {a.pairs.sgw + static_cast<size_t>(g) * (kH / 2),
                                 a.pairs.suw + static_cast<size_t>(g) * (kH / 2)};
    const uint32_t* const sb[2] = {a.pairs.sgsb + static_cast<size_t>(g) * G2, a.pairs.susb + static_cast<size_t>(g) * G2};
    stream_load_rows<kH, 2>(w, sb, swv, ssv);
  }
  dep_wait();
  trace_stamp(a.trace, 15);

  // h of every row (final at entry: only phase C writes it), this warp's phase C residual (lane r: row r)
  float4 hr[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r)
    if (r < n) {
      const float4* p = reinterpret_cast<const float4*>(a.h + static_cast<size_t>(r) * kH) + tid;
      asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];"
                   : "=f"(hr[r].x), "=f"(hr[r].y), "=f"(hr[r].z), "=f"(hr[r].w)
                   : "l"(p));
    }
  const bool down_task = g < kH;
  const float hg = down_task && lane < n ? __ldcg(a.h + static_cast<size_t>(lane) * kH + g) : 0.f;
  GridSync gs = grid_sync_begin(a.barrier);

  // ---- phase A: the norms and staged x, the selections, the shared and routed gate/up ----
  // the norms (stream_stage_loaded_norm's arithmetic, one reduction barrier for all rows)
  static_assert(kH / 4 == kThreads, "one float4 of h per thread and row");
#pragma unroll
  for (int r = 0; r < kR; ++r)
    if (r < n) {
      const float4 v = hr[r];
      float ss = fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, 0.f))));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) sm.red[r][warp] = ss;
      sm.hs[r][tid] = v;
    }
  __syncthreads();
#pragma unroll 1
  for (int r = 0; r < n; ++r) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += sm.red[r][w];
    const float rs = rsqrtf(total / kH + a.eps);
    if (tid == 0) sm.rinv[r] = rs;
    const float4 v = sm.hs[r][tid], w = nw.w[0];
    stream_put_x4(sm.xs[r], tid, make_float4(v.x * rs * w.x, v.y * rs * w.y, v.z * rs * w.z, v.w * rs * w.w));
  }
  __syncthreads();  // xs staged
  trace_stamp(a.trace, 1);
  // every row's router sums (added by the launch before: the int8 out_proj / o_proj, or moe_router_sums_rows),
  // thread e <= E's of router row e (E: the shared expert gate), requested before the shared expert's products
  unsigned long long part[kR][kRouterCopies];
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int c = 0; c < kRouterCopies; ++c)
      part[r][c] = r < n && e <= E ? __ldcg(a.rs.acc + (static_cast<size_t>(r) * kRouterCopies + c) * a.rs.n + e) : 0ull;
  if (shared_task)  // the shared expert's rows for every row (its weights read once) while the sums come in
#pragma unroll 1
    for (int r = 0; r < n; ++r) {
      float acc[2];
      stream_dots<kH, 2>(sm.xs[r], swv, ssv, acc);
      const float gsum = group_sum<32>(acc[0]), usum = group_sum<32>(acc[1]);
      if (lane == 0) a.act[static_cast<size_t>(r) * kActFloats + kK * kF + g] = silu(gsum) * usum;  // unscaled
    }
  trace_stamp(a.trace, 2);
#pragma unroll
  for (int r = 0; r < kR; ++r)
    if (r < n) {
      unsigned long long sum = 0ull;
#pragma unroll
      for (int c = 0; c < kRouterCopies; ++c) sum += part[r][c];
      if (e < E) sm.logit[r][e] = router_logit(sum, sm.rinv[r]);
      if (e == E) sm.topk[r].sh_logit = router_logit(sum, sm.rinv[r]);
    }
  __syncthreads();
  select_rows(a.pairs, sm, n);
  trace_stamp(a.trace, 3);
  const int gb = blockIdx.x * kWarps + warp;  // 2 (gate, up) pairs per warp: act chunk blockIdx.x of each row
  const bool pair_task = gb < kK * kF / 2;
  auto issue = [&](int r, PairBuf& b) {
    PairArgs p = a.pairs;
    p.idx = sm.topk[r].idx;
    load_pair_rows(p, gb, b.wv, b.sv);
  };
  auto compute = [&](int r, const PairBuf& b) {
    float acc[4];
    stream_dots<kH, 4>(sm.xs[r], b.wv, b.sv, acc);
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const float gv = group_sum<32>(acc[2 * q]), uv = group_sum<32>(acc[2 * q + 1]);
      const int task = 2 * gb + q;
      const float v = sm.topk[r].w[task / kF] * silu(gv) * uv;
      if (lane == 0) {
        a.act[static_cast<size_t>(r) * kActFloats + task] = v;
        sm.act_chunk[r][2 * warp + q] = v;
      }
    }
  };
  PairBuf b0, b1;
  if (pair_task)  // rows r, r + 1 computed while r + 2, r + 3 are requested (each call written once)
#pragma unroll 1
    for (int r = -2; r < n; r += 2) {
      if (r >= 0) compute(r, b0);
      if (r + 2 < n) issue(r + 2, b0);
      if (r >= 0 && r + 1 < n) compute(r + 1, b1);
      if (r + 3 < n) issue(r + 3, b1);
    }
  trace_stamp(a.trace, 4);
  DownRow d0, d1;  // phase C's first two rows' weights, in flight through the barrier
  if (down_task) {
    load_down_row(a, sm.topk[0].idx, g, d0);
    if (n > 1) load_down_row(a, sm.topk[1].idx, g, d1);
  }
  __syncthreads();
  if (warp < n && blockIdx.x < kRoutedChunks)  // warp r stages row r's chunk
    stream_put_x4(a.act_q[warp], blockIdx.x * 8 + (lane & 7), reinterpret_cast<const float4*>(sm.act_chunk[warp])[lane & 7],
                  lane < 8);
  grid_sync(gs);
  trace_stamp(a.trace, 5);

  // ---- phase C: every row's act staged, the down projections, residual adds ----
  if (blockIdx.x == 0 && e <= E)  // every block read them before the barrier
    for (int r = 0; r < n; ++r)
#pragma unroll
      for (int c = 0; c < kRouterCopies; ++c) a.rs.acc[(static_cast<size_t>(r) * kRouterCopies + c) * a.rs.n + e] = 0ull;
  {
    constexpr int nch = ActX::nch;  // 144
    static_assert(4 * kRoutedChunks == kThreads && kF / 4 == 128, "one routed word per thread, the shared row on 4 warps");
    const int word = (tid / kRoutedChunks) * nch + tid % kRoutedChunks;
#pragma unroll 1
    for (int r = 0; r < n; ++r) {  // the routed chunks as staged, copied as they are (one round trip for all rows)
      const ActX& st = a.act_q[r];
      ActX& xd = sm.xd[r];
      mma::cp16(&xd.xq[word], &st.xq[word]);
      if (tid < kRoutedChunks / 4) mma::cp16(&xd.sx[4 * tid], &st.sx[4 * tid]);  // (16-byte copies: L2 only)
      else if (tid < kRoutedChunks / 2) mma::cp16(&xd.xsum[4 * tid - kRoutedChunks], &st.xsum[4 * tid - kRoutedChunks]);
    }
    mma::commit();
    {  // the shared rows, times their gates: thread (i, r0) = (tid % 128, tid / 128) stages float4 i of rows r0,
       // r0 + 4 (warp-uniform rows)
      constexpr int kX4 = kF / 4, kPass = kThreads / kX4, kPer = kR / kPass;
      static_assert(kThreads % kX4 == 0 && kX4 % 32 == 0 && kR % kPass == 0, "rows per pass");
      const int i = tid % kX4, r0 = tid / kX4;
      float4 shv[kPer];
#pragma unroll
      for (int p = 0; p < kPer; ++p)
        if (r0 + kPass * p < n)
          shv[p] = __ldcg(reinterpret_cast<const float4*>(a.act + static_cast<size_t>(r0 + kPass * p) * kActFloats +
                                                          kK * kF) + i);
#pragma unroll
      for (int p = 0; p < kPer; ++p) {
        const int r = r0 + kPass * p;
        if (r < n) {
          const float sh = sm.topk[r].sh;
          const float4 v = shv[p];
          stream_put_x4(sm.xd[r], kRoutedChunks * 8 + i, make_float4(v.x * sh, v.y * sh, v.z * sh, v.w * sh));
        }
      }
    }
    mma::wait<0>();
  }
  __syncthreads();
  trace_stamp(a.trace, 6);
  if (!down_task) return;
  auto down = [&](int r, const DownRow& d) {
    float acc = 0.f;
#pragma unroll
    for (int u = 0; u < kDownPerLane; ++u) {
      const int t = lane + 32 * u;
      if (t < kDownChunks) acc += stream_chunk_dot(sm.xd[r], t, d.w[u], d.sb[u]);
    }
    acc = group_sum<32>(acc);
    const float hv = __shfl_sync(0xffffffffu, hg, r);
    if (lane == 0) a.h[static_cast<size_t>(r) * kH + g] = hv + acc;
  };
#pragma unroll 1
  for (int r = 0; r < n; r += 2) {
    down(r, d0);
    if (r + 2 < n) load_down_row(a, sm.topk[r + 2].idx, g, d0);
    if (r + 1 < n) down(r + 1, d1);
    if (r + 3 < n) load_down_row(a, sm.topk[r + 3].idx, g, d1);
  }
  trace_stamp(a.trace, 7);
}

}  // namespace
}  // namespace detail

bool moe_fused_rows_supported(const MoeWeightsDev& m, int top_k) {
  using namespace detail;
  auto q4 = [](const QMat& w, int mats, int rows, int cols) {
    return w.format == QFormat::q4 && w.n_mats == mats && w.rows == rows && w.cols == cols;
  };
  const int E = m.gate.rows;
  return sm_count() >= kMinBlocks && top_k == kK && m.router_slices.w != nullptr && m.router_slices.rows == E + 1 &&
         m.gate.format == QFormat::q8 && m.shared_expert_gate.format == QFormat::q8 && m.gate.cols == kH &&
         m.shared_expert_gate.rows == 1 && E >= kK && E <= kMaxExperts && q4(m.experts_gate, E, kF, kH) &&
         q4(m.experts_up, E, kF, kH) && q4(m.experts_down, E, kH, kF) && q4(m.shared_gate, 1, kF, kH) &&
         q4(m.shared_up, 1, kF, kH) && q4(m.shared_down, 1, kH, kF);
}

MoeRowsScratch moe_fused_rows_alloc(int n_experts) {
  using namespace detail;
  MoeRowsScratch s;
  s.n_router = n_experts + 1;
  CUDA_CHECK(cudaMalloc(&s.act, sizeof(float) * kR * kActFloats));
  CUDA_CHECK(cudaMalloc(&s.act_q, sizeof(ActX) * kR));
  CUDA_CHECK(cudaMalloc(&s.router_acc, sizeof(unsigned long long) * kR * kRouterCopies * s.n_router));
  CUDA_CHECK(cudaMemset(s.router_acc, 0, sizeof(unsigned long long) * kR * kRouterCopies * s.n_router));
  CUDA_CHECK(cudaMalloc(&s.barrier, sizeof(unsigned) * kGridBarrierWords));
  CUDA_CHECK(cudaMemset(s.barrier, 0, sizeof(unsigned) * kGridBarrierWords));
  return s;
}

void moe_fused_rows_free(MoeRowsScratch& s) {
  for (void* p : {(void*)s.act, s.act_q, (void*)s.router_acc, (void*)s.barrier})
    if (p) cudaFree(p);
  s = MoeRowsScratch{};
}

RouterSums moe_fused_rows_sums(const MoeWeightsDev& m, const float* norm_w, const MoeRowsScratch& s) {
  return RouterSums{m.router_slices, norm_w, s.router_acc};
}

void moe_fused_rows(const MoeWeightsDev& m, float* h, int n, const float* norm_w, float eps, const MoeRowsScratch& s,
                    cudaStream_t stream, unsigned long long* trace) {
  using namespace detail;
  LILY_CHECK(n >= 1 && n <= kR && moe_fused_rows_supported(m, kK) && s.n_router == m.gate.rows + 1,
             "moe_fused_rows: ", n, " rows (1..", kR, "), or shapes / scratch the kernel does not take");
  RowsArgs a{};
  a.pairs.gw = m.experts_gate.w, a.pairs.gsb = m.experts_gate.sb, a.pairs.uw = m.experts_up.w;
  a.pairs.usb = m.experts_up.sb;
  a.pairs.sgw = m.shared_gate.w, a.pairs.sgsb = m.shared_gate.sb, a.pairs.suw = m.shared_up.w;
  a.pairs.susb = m.shared_up.sb;
  a.pairs.mat_w_bytes = m.experts_gate.mat_w_bytes();
  a.pairs.mat_groups = m.experts_gate.mat_groups();
  a.pairs.E = m.gate.rows;
  a.pairs.k = kK, a.pairs.F = kF, a.pairs.cols = kH;
  a.rs = router_partial_dev(moe_fused_rows_sums(m, norm_w, s));
  a.dw = m.experts_down.w, a.dsb = m.experts_down.sb, a.sdw = m.shared_down.w, a.sdsb = m.shared_down.sb;
  a.d_mat_w_bytes = m.experts_down.mat_w_bytes();
  a.d_mat_groups = m.experts_down.mat_groups();
  a.act = s.act;
  a.act_q = static_cast<ActX*>(s.act_q);
  a.h = h;
  a.norm_w = norm_w;
  a.eps = eps;
  a.n = n;
  a.barrier = s.barrier;
  a.trace = trace;
  // set on every call (cheap, not a stream operation): no static state
  CUDA_CHECK(cudaFuncSetAttribute(moe_fused_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(sizeof(Smem))));
  launch_ex(moe_fused_rows_kernel, dim3(sm_count()), dim3(kThreads), sizeof(Smem), stream,
            LaunchOpts{true, 1, true}, a);
}

}  // namespace lily::cuda
