// The sparse MoE block on the GPU (docs/model.md §2.4) in three launches, no host sync:
//   moe_route   : router GEMV (8-bit in MLX) + the shared-expert-gate logit, optionally with the RMSNorm of the
//                 block input fused in front (every block normalises; block 0 stores x for the experts).
//   moe_gate_up : every block first turns the logits into the selection (route_topk: top-k by logit with ties
//                 to the lower id, the softmax weights renormalised over the k, sigmoid gate; 8 warps),
//                 then the gate/up GEMVs of the k selected experts and the shared expert with SwiGLU, scaled by
//                 the routing weight (shared: sigmoid gate), into act [(k+1)][F]. Block 0 stores the selection.
//   moe_down    : h += sum over the k+1 down projections of act (residual add fused).
// Tested by tests/gpu/test_moe.cu, timed by bench/bench_kernels.cu.
#include "kernels/common.cuh"
#include "kernels/gemv_impl.cuh"
#include "kernels/gemv_stream.cuh"
#include "kernels/mixers.h"
#include "kernels/router_partial.cuh"

namespace lily::cuda {
namespace detail {

// Router logits (+ the shared-expert-gate logit) of x, or of x = RMSNorm(h) when norm_w is set (block 0 then
// stores x to x_out for the expert kernels). The selection (softmax, top-k) runs at the start of moe_gate_up.
template <QFormat F, int K>
__global__ void __launch_bounds__(kBlockThreads) route_kernel(MultiArgs a, const float* x, const float* norm_w,
                                                               float eps, float* x_out) {
  using M = RowMap<F, K>;
  constexpr int R = 1;
  __shared__ __align__(16) float xsm[K];
  __shared__ float red[kWarpsPerBlock];
  const int task0 = (blockIdx.x * kWarpsPerBlock + threadIdx.x / 32) * R * M::sub;
  RowBatch<F, K, R> b;
  stage_issue_rows<F, K, R>(a, task0, b);
  dep_trigger();
  dep_wait();
  if (norm_w) stage_x_norm_to_smem(x, norm_w, eps, x_out, K, xsm, red);
  else stage_x_to_smem(x, K, xsm);
  if (task0 < a.total) stage_finish_rows<F, K, R>(a, xsm, b, false);
}

template <QFormat F>
__global__ void __launch_bounds__(kBlockThreads) route_generic_kernel(MultiArgs a, const float* x) {
  dep_trigger();
  dep_wait();
  const int warp = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  gemv_warp_generic<F, 1, float>(a, x, warp, false);
}

template <QFormat F>
void launch_route(const MultiArgs& a, const float* x, const float* norm_w, float eps, float* x_out, cudaStream_t s) {
  const int rows = a.total;
  if (a.cols == 2048) {
    const int per_block = kWarpsPerBlock * RowMap<F, 2048>::sub;
    launch_kernel(route_kernel<F, 2048>, (rows + per_block - 1) / per_block, kBlockThreads, 0, s, a, x, norm_w, eps,
                  x_out);
    return;
  }
  if (norm_w) {  // other widths: the RMSNorm kernel first
    launch_add_rmsnorm(const_cast<float*>(x), nullptr, nullptr, norm_w, x_out, a.cols, eps, s);
    x = x_out;
  }
  launch_kernel(route_generic_kernel<F>, (rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kBlockThreads, 0, s, a, x);
}

template <QFormat F, int K, int R>
__global__ void __launch_bounds__(kBlockThreads) gate_up_kernel(PairArgs a, const float* x) {
  pair_body<F, K, R, true>(a, x);
}

template <QFormat F, int R>
__global__ void __launch_bounds__(kBlockThreads) gate_up_generic_kernel(PairArgs a_in, const float* x) {
  __shared__ TopkSm topk;
  dep_trigger();
  dep_wait();
  const PairArgs a = route_topk(a_in, topk);
  const int warp = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  swiglu_warp_generic<F, R, true>(a, x, warp * R, (a.k + 1) * a.F);
}

// q4, K = 2048 (the model's H): the streaming layout of gemv_stream.cuh, R (gate, up) row pairs per warp.
// Warps on the shared expert's rows issue their loads before waiting for the routing kernel (those weights do
// not depend on it); the others load after the selection (route_topk) is known.
template <int K, int R>
__global__ void __launch_bounds__(kBlockThreads, (2 * R * K <= 8192 ? 3 : 2)) gate_up_stream_kernel(PairArgs a_in,
                                                                                                   const float* x) {
  constexpr int nc = K / 1024, G = K / kGroupSize;
  __shared__ __align__(16) StreamX<K> xs;
  __shared__ TopkSm topk;
  const int lane = threadIdx.x & 31;
  const int total = (a_in.k + 1) * a_in.F;
  const int task0 = (blockIdx.x * kWarpsPerBlock + threadIdx.x / 32) * R;
  const bool shared_rows = task0 >= a_in.k * a_in.F;  // the whole warp is on the shared expert (F % R == 0)
  uint4 wv[2 * R][nc];
  uint32_t sv[2 * R][nc];
  auto issue = [&](const PairArgs& a) {
    const uint8_t* w[2 * R];
    const uint32_t* sb[2 * R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const PairRow p = resolve_pair<true>(a, min(task0 + r, total - 1), K / 2, G);
      w[2 * r] = p.gw, sb[2 * r] = p.gsb, w[2 * r + 1] = p.uw, sb[2 * r + 1] = p.usb;
    }
    stream_load_rows<K, 2 * R>(w, sb, wv, sv);
  };
  if (shared_rows) issue(a_in);  // resolve_pair reads no routing data for shared rows
  dep_wait();
  const PairArgs a = route_topk(a_in, topk);
  if (!shared_rows) issue(a);
  dep_trigger();
  stream_stage_x<K, kBlockThreads>(x, xs);
  float acc[2 * R];
  stream_dots<K, 2 * R>(xs, wv, sv, acc);
#pragma unroll
  for (int r = 0; r < 2 * R; ++r) acc[r] = group_sum<32>(acc[r]);
  float v = 0.f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int task = min(task0 + r, total - 1), j = task / a.F;
    const float scale = j < a.k ? topk.w[j] : topk.sh;
    v = lane == r ? scale * silu(acc[2 * r]) * acc[2 * r + 1] : v;
  }
  if (lane < R && task0 + lane < total) a.out[task0 + lane] = v;
}

bool gate_up_streams(QFormat f, int cols) { return f == QFormat::q4 && cols == 2048; }

template <QFormat F>
void launch_gate_up(const PairArgs& a, const float* x, cudaStream_t s) {
  const int total = (a.k + 1) * a.F;
  if (gate_up_streams(F, a.cols)) {
    constexpr int R = 2;
    const int per_block = kWarpsPerBlock * R;
    launch_kernel(gate_up_stream_kernel<2048, R>, (total + per_block - 1) / per_block, kBlockThreads, 0, s, a, x);
    return;
  }
  if (a.cols == 2048) {
    constexpr int R = 2;
    const int per_block = kWarpsPerBlock * R * RowMap<F, 2048>::sub;
    launch_kernel(gate_up_kernel<F, 2048, R>, (total + per_block - 1) / per_block, kBlockThreads, 0, s, a, x);
  } else {
    constexpr int R = 2;
    launch_kernel(gate_up_generic_kernel<F, R>, (total + kWarpsPerBlock * R - 1) / (kWarpsPerBlock * R),
                  kBlockThreads, 0, s, a, x);
  }
}

// Down projections: output row i = sum_j D_j[i] . act[j], j < k routed (expert idx[j]), j == k shared.
struct DownArgs {
  const uint8_t* w; const uint32_t* sb;     // routed stack [E][H][F]
  const uint8_t* sw; const uint32_t* ssb;   // shared [H][F]
  size_t mat_w_bytes, mat_groups;
  const int* idx; const float* act;
  int k, rows, cols;                        // rows = H, cols = F
  float* h;
};

inline constexpr int kDownRowsPerWarp = 2;

__device__ __forceinline__ const uint8_t* down_row(const DownArgs& a, int j, int i, size_t row_bytes,
                                                    const uint32_t*& sb, int G) {
  if (j < a.k) {
    const size_t e = static_cast<size_t>(__ldg(a.idx + j));
    sb = a.sb ? a.sb + e * a.mat_groups + static_cast<size_t>(i) * G : nullptr;
    return a.w + e * a.mat_w_bytes + static_cast<size_t>(i) * row_bytes;
  }
  sb = a.ssb ? a.ssb + static_cast<size_t>(i) * G : nullptr;
  return a.sw + static_cast<size_t>(i) * row_bytes;
}

// Stage: act [(k+1)][F] into shared memory, each chunk padded by 4 floats (no bank conflicts on the
// 16-byte reads of lanes that hold consecutive chunks), plus the per-chunk sums.
template <int EPC>
__device__ void stage_act_to_smem(const float* act, int n_chunks, float* xs_smem, float* xsum_smem) {
  for (int c = threadIdx.x; c < n_chunks; c += blockDim.x) {
    float v[EPC];
    xsum_smem[c] = load_x(act + static_cast<size_t>(c) * EPC, EPC, v);
#pragma unroll
    for (int i = 0; i < EPC; i += 4)
      *reinterpret_cast<float4*>(xs_smem + c * (EPC + 4) + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
  }
  __syncthreads();
}

template <QFormat F, int KF, int NM>
__global__ void __launch_bounds__(kBlockThreads) down_kernel(DownArgs a) {
  using M = RowMap<F, KF>;
  constexpr int EPC = M::epc, J = (NM + M::sub - 1) / M::sub, G = KF / kGroupSize;
  extern __shared__ float4 smem4[];
  float* xsm = reinterpret_cast<float*>(smem4);
  float* xsum = xsm + NM * M::ch * (EPC + 4);
  dep_trigger();
  dep_wait();
  stage_act_to_smem<EPC>(a.act, NM * M::ch, xsm, xsum);
  const int lane = threadIdx.x & 31, sub = lane / M::lpr, li = lane % M::lpr;
  const size_t row_bytes = static_cast<size_t>(KF) * static_cast<int>(F) / 8;
  const int row0 = (blockIdx.x * kWarpsPerBlock + threadIdx.x / 32) * kDownRowsPerWarp;
  uint4 wv[kDownRowsPerWarp][J][M::nc];
  uint32_t sv[kDownRowsPerWarp][J][M::nc];
#pragma unroll
  for (int r = 0; r < kDownRowsPerWarp; ++r)
#pragma unroll
    for (int t = 0; t < J; ++t) {
      const int j = t * M::sub + sub, i = row0 + r;
      const bool valid = j < NM && i < a.rows;
      const uint32_t* sbrow = nullptr;
      const uint8_t* wrow = down_row(a, valid ? j : 0, valid ? i : 0, row_bytes, sbrow, G);
      stage_load_row<F, KF>(wrow, sbrow, li, valid, wv[r][t], sv[r][t]);
    }
#pragma unroll
  for (int r = 0; r < kDownRowsPerWarp; ++r) {
    float acc = 0.f;
#pragma unroll
    for (int t = 0; t < J; ++t) {
      const int j = t * M::sub + sub;
      if (j >= NM) continue;
#pragma unroll
      for (int c = 0; c < M::nc; ++c) {
        const int chunk = j * M::ch + li + c * M::lpr;
        float xr[EPC];
#pragma unroll
        for (int q = 0; q < EPC; q += 4) {
          const float4 v = *reinterpret_cast<const float4*>(xsm + chunk * (EPC + 4) + q);
          xr[q] = v.x; xr[q + 1] = v.y; xr[q + 2] = v.z; xr[q + 3] = v.w;
        }
        acc += chunk_dot<F>(wv[r][t][c], sv[r][t][c], xr, xsum[chunk]);
      }
    }
    acc = group_sum<32>(acc);
    if (lane == 0 && row0 + r < a.rows) a.h[row0 + r] += acc;
  }
}

// Any F (multiple of 64) and k: one output row per warp, matrices and chunks walked in loops.
template <QFormat F>
__global__ void __launch_bounds__(kBlockThreads) down_generic_kernel(DownArgs a) {
  constexpr int EPC = Fmt<F>::epc;
  dep_trigger();
  dep_wait();
  const int ch = a.cols / EPC, G = a.cols / kGroupSize, nm = a.k + 1;
  const size_t row_bytes = static_cast<size_t>(a.cols) * static_cast<int>(F) / 8;
  const int i = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (i >= a.rows) return;
  float acc = 0.f;
  for (int t = lane; t < nm * ch; t += 32) {
    const int j = t / ch, c = t % ch;
    const uint32_t* sbrow = nullptr;
    const uint8_t* wrow = down_row(a, j, i, row_bytes, sbrow, G);
    float xr[EPC];
    const float xs = load_x(a.act + static_cast<size_t>(j) * a.cols + c * EPC, EPC, xr);
    acc += chunk_dot<F>(ld_stream(wrow + static_cast<size_t>(c) * 16),
                        sbrow ? ld_stream_u32(sbrow + c * EPC / kGroupSize) : 0u, xr, xs);
  }
  acc = group_sum<32>(acc);
  if (lane == 0) a.h[i] += acc;
}

template <QFormat F>
void launch_down(const DownArgs& a, cudaStream_t s) {
  if (a.cols == kMoeFfn && a.k == kTopK) {
    using M = RowMap<F, kMoeFfn>;
    constexpr int NM = kTopK + 1;
    const size_t smem = (static_cast<size_t>(NM) * M::ch * (M::epc + 4) + NM * M::ch) * sizeof(float);
    const int per_block = kWarpsPerBlock * kDownRowsPerWarp;
    launch_kernel(down_kernel<F, kMoeFfn, NM>, (a.rows + per_block - 1) / per_block, kBlockThreads, smem, s, a);
  } else {
    launch_kernel(down_generic_kernel<F>, (a.rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kBlockThreads, 0, s, a);
  }
}

void check(bool ok, const char* what) { LILY_CHECK(ok, "moe: ", what); }

void check_route(const MoeWeightsDev& m, const MoeScratch& s) {
  const int E = m.gate.rows, H = m.gate.cols;
  check(s.logits && s.act && s.topk_idx && s.topk_w && s.sh_scale, "scratch not allocated");
  check(E == s.n_experts && s.top_k >= 1 && s.top_k <= E, "scratch sized for another expert count");
  check(E <= kMaxExperts && s.top_k <= kMaxTopK, "more than 256 experts or 8 selected");
  check(m.gate.w && m.shared_expert_gate.w, "router weights not allocated");
  check(H % kGroupSize == 0, "H must be a multiple of 64");
  check(m.shared_expert_gate.rows == 1 && m.shared_expert_gate.cols == H &&
            m.shared_expert_gate.format == m.gate.format, "shared_expert_gate must be [1, H] in the router's format");
}

void check_moe(const MoeWeightsDev& m, const MoeScratch& s) {
  check_route(m, s);
  const int E = m.gate.rows, H = m.gate.cols, F = m.experts_gate.rows;
  check(F == s.ffn, "scratch sized for another FFN width");
  check(m.experts_gate.w && m.experts_up.w && m.experts_down.w && m.shared_gate.w && m.shared_up.w && m.shared_down.w,
        "expert weights not allocated");
  check(m.experts_gate.n_mats == E && m.experts_up.n_mats == E && m.experts_down.n_mats == E,
        "expert stacks must hold E matrices");
  check(m.experts_up.rows == F && m.experts_gate.cols == H && m.experts_up.cols == H && m.experts_down.rows == H &&
            m.experts_down.cols == F,
        "expert shapes");
  check(m.shared_gate.rows == F && m.shared_up.rows == F && m.shared_gate.cols == H && m.shared_up.cols == H &&
            m.shared_down.rows == H && m.shared_down.cols == F,
        "shared expert shapes (its FFN must equal the routed one)");
  check(m.experts_gate.format == m.experts_up.format && m.shared_gate.format == m.experts_gate.format &&
            m.shared_up.format == m.experts_gate.format,
        "gate/up formats differ");
  check(m.shared_down.format == m.experts_down.format, "down formats differ");
  check(H % kGroupSize == 0 && F % kGroupSize == 0, "H and F must be multiples of 64");
}

}  // namespace detail

MoeScratch moe_scratch_alloc(int n_experts, int top_k, int ffn) {
  MoeScratch s;
  s.n_experts = n_experts; s.top_k = top_k; s.ffn = ffn;
  CUDA_CHECK(cudaMalloc(&s.logits, sizeof(float) * (n_experts + 1)));
  CUDA_CHECK(cudaMalloc(&s.topk_idx, sizeof(int) * top_k));
  CUDA_CHECK(cudaMalloc(&s.topk_w, sizeof(float) * top_k));
  CUDA_CHECK(cudaMalloc(&s.sh_scale, sizeof(float)));
  CUDA_CHECK(cudaMalloc(&s.act, sizeof(float) * (top_k + 1) * ffn));
  static_assert(sizeof(detail::StreamX<4608>) <= 4 * 4096, "MoeScratch::act_q: 4 bytes per routed element suffice");
  CUDA_CHECK(cudaMalloc(&s.act_q, sizeof(float) * top_k * ffn));
  CUDA_CHECK(cudaMalloc(&s.barrier, kGridBarrierWords * sizeof(unsigned)));
  CUDA_CHECK(cudaMemset(s.barrier, 0, kGridBarrierWords * sizeof(unsigned)));
  const size_t acc_bytes = sizeof(unsigned long long) * detail::kRouterCopies * (n_experts + 1);
  CUDA_CHECK(cudaMalloc(&s.router_acc, acc_bytes));
  CUDA_CHECK(cudaMemset(s.router_acc, 0, acc_bytes));
  CUDA_CHECK(cudaDeviceSynchronize());  // the zeros before any launch on a non-blocking stream
  return s;
}

void moe_scratch_free(MoeScratch& s) {
  cudaFree(s.logits); cudaFree(s.topk_idx); cudaFree(s.topk_w); cudaFree(s.sh_scale); cudaFree(s.act); cudaFree(s.act_q);
  cudaFree(s.barrier); cudaFree(s.router_acc);
  s = MoeScratch{};
}

namespace detail {
MultiArgs router_args(const MoeWeightsDev& m, const MoeScratch& s) {
  GemvBatch b;
  b.n = 2;
  b.W[0] = m.gate, b.y[0] = s.logits;
  b.W[1] = m.shared_expert_gate, b.y[1] = s.logits + m.gate.rows;
  return multi_args(b);
}

PairArgs expert_pair_args(const MoeWeightsDev& m, const MoeScratch& s) {
  PairArgs a{};
  a.gw = m.experts_gate.w; a.gsb = m.experts_gate.sb; a.uw = m.experts_up.w; a.usb = m.experts_up.sb;
  a.sgw = m.shared_gate.w; a.sgsb = m.shared_gate.sb; a.suw = m.shared_up.w; a.susb = m.shared_up.sb;
  a.mat_w_bytes = m.experts_gate.mat_w_bytes();
  a.mat_groups = m.experts_gate.mat_groups();
  a.logits = s.logits;
  a.idx_out = s.topk_idx; a.w_out = s.topk_w; a.sh_out = s.sh_scale;
  a.E = m.gate.rows;
  a.k = s.top_k; a.F = m.experts_gate.rows; a.cols = m.experts_gate.cols; a.out = s.act;
  return a;
}

void route(const MoeWeightsDev& m, const float* x, const float* norm_w, float eps, float* x_out, const MoeScratch& s,
           cudaStream_t stream) {
  check_route(m, s);
  const MultiArgs a = router_args(m, s);
  switch (m.gate.format) {
    case QFormat::q4: launch_route<QFormat::q4>(a, x, norm_w, eps, x_out, stream); return;
    case QFormat::q8: launch_route<QFormat::q8>(a, x, norm_w, eps, x_out, stream); return;
    case QFormat::bf16: launch_route<QFormat::bf16>(a, x, norm_w, eps, x_out, stream); return;
  }
}
}  // namespace detail

void moe_route(const MoeWeightsDev& m, const float* x, const MoeScratch& s, cudaStream_t stream) {
  detail::route(m, x, nullptr, 0.f, nullptr, s, stream);
}

void moe_route_rmsnorm(const MoeWeightsDev& m, const float* h, const float* norm_w, float eps, float* x_out,
                       const MoeScratch& s, cudaStream_t stream) {
  LILY_CHECK(norm_w != nullptr && x_out != nullptr, "moe_route_rmsnorm: norm weight and x_out are required");
  detail::route(m, h, norm_w, eps, x_out, s, stream);
}

bool moe_gate_up_streams(const MoeWeightsDev& m) {
  return detail::gate_up_streams(m.experts_gate.format, m.experts_gate.cols);
}

void moe_gate_up(const MoeWeightsDev& m, const float* x, const MoeScratch& s, cudaStream_t stream) {
  detail::check_moe(m, s);
  const detail::PairArgs a = detail::expert_pair_args(m, s);
  switch (m.experts_gate.format) {
    case QFormat::q4: detail::launch_gate_up<QFormat::q4>(a, x, stream); return;
    case QFormat::q8: detail::launch_gate_up<QFormat::q8>(a, x, stream); return;
    case QFormat::bf16: detail::launch_gate_up<QFormat::bf16>(a, x, stream); return;
  }
}

void moe_down(const MoeWeightsDev& m, const MoeScratch& s, float* h, cudaStream_t stream) {
  detail::check_moe(m, s);
  detail::DownArgs a{};
  a.w = m.experts_down.w; a.sb = m.experts_down.sb; a.sw = m.shared_down.w; a.ssb = m.shared_down.sb;
  a.mat_w_bytes = m.experts_down.mat_w_bytes();
  a.mat_groups = m.experts_down.mat_groups();
  a.idx = s.topk_idx; a.act = s.act;
  a.k = s.top_k; a.rows = m.experts_down.rows; a.cols = m.experts_down.cols; a.h = h;
  switch (m.experts_down.format) {
    case QFormat::q4: detail::launch_down<QFormat::q4>(a, stream); return;
    case QFormat::q8: detail::launch_down<QFormat::q8>(a, stream); return;
    case QFormat::bf16: detail::launch_down<QFormat::bf16>(a, stream); return;
  }
}

namespace detail {
// moe_fused.cu: the shapes of the one-launch kernel, and the projections its phase 0 takes
bool moe_fused_supported(const MoeWeightsDev& m, const MoeScratch& s);
bool moe_fused_takes_pre(const ResidualProj& pre);
void launch_moe_fused(const MoeWeightsDev& m, float* h, const float* norm_w, float eps, float* x_out,
                      const MoeScratch& s, const ResidualProj* pre, bool sums_added, StepTrace* trace,
                      cudaStream_t stream);
}  // namespace detail

bool moe_block_is_fused(const MoeWeightsDev& m, const MoeScratch& s, const ResidualProj* pre) {
  return detail::moe_fused_supported(m, s) && (!pre || detail::moe_fused_takes_pre(*pre));
}

RouterSums moe_router_sums(const MoeWeightsDev& m, const float* norm_w, const MoeScratch& s) {
  if (!moe_block_is_fused(m, s)) return RouterSums{};
  return RouterSums{m.router_slices, norm_w, s.router_acc};
}

void moe_block(const MoeWeightsDev& m, float* h, const float* norm_w, float eps, float* x_out, const MoeScratch& s,
               cudaStream_t stream, bool allow_fused, const ResidualProj* pre, bool router_sums_added,
               StepTrace* trace) {
  detail::check_moe(m, s);
  const bool fused = allow_fused && moe_block_is_fused(m, s);
  // sums added before h changes again, or never consumed (and zeroed) by the fused launch: the next one misroutes
  LILY_CHECK(!router_sums_added || (fused && !pre),
             "moe_block: router sums added, but the block does not take the fused kernel or has a pre projection");
  if (pre && !(fused && detail::moe_fused_takes_pre(*pre))) {  // a projection the fused kernel's phase 0 does not take
    gemv(pre->W, pre->x, h, true, stream);
    pre = nullptr;
  }
  if (fused) {
    detail::launch_moe_fused(m, h, norm_w, eps, x_out, s, pre, router_sums_added, trace, stream);
    return;
  }
  moe_route_rmsnorm(m, h, norm_w, eps, x_out, s, stream);
  moe_gate_up(m, x_out, s, stream);
  moe_down(m, s, h, stream);
}

void moe_forward(const MoeWeightsDev& m, const float* x, const MoeScratch& s, float* h, cudaStream_t stream) {
  moe_route(m, x, s, stream);
  moe_gate_up(m, x, s, stream);
  moe_down(m, s, h, stream);
}

}  // namespace lily::cuda
