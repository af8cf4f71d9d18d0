// GEMV launchers: y = W x (q4 / q8 / bf16 weights, fp32 or bf16 x, fp32 y), optional fused residual add,
// up to kMaxMulti matrices sharing x in one launch, and the fused gate+up SwiGLU. Fast paths for
// K = 512, 2048, 4096 (the model's widths) keep x in registers; other K (multiple of 64) use a generic path.
// q4 with K = 2048 / 4096 (every q4 projection and lm_head) takes the streaming kernel (gemv_stream.cuh) instead.
// Tested by tests/gpu/test_gemv.cu, timed by bench/bench_kernels.cu.
#include "kernels/common.cuh"
#include "kernels/gemv_impl.cuh"
#include "kernels/gemv_stream.cuh"
#include "kernels/mixers.h"

#include <algorithm>

namespace lily::cuda {
namespace detail {

template <QFormat F, int K, int R, typename XT>
__global__ void __launch_bounds__(kBlockThreads) gemv_kernel(MultiArgs a, const XT* x, bool accumulate) {
  using M = RowMap<F, K>;
  __shared__ __align__(16) float xsm[K];
  const int task0 = (blockIdx.x * kWarpsPerBlock + threadIdx.x / 32) * R * M::sub;
  RowBatch<F, K, R> b;
  stage_issue_rows<F, K, R>(a, task0, b);
  dep_trigger();
  dep_wait();
  stage_x_to_smem(x, K, xsm);
  if (task0 >= a.total) return;
  stage_finish_rows<F, K, R>(a, xsm, b, accumulate);
}

// Persistent, software-pipelined variant for long matrices with K = 2048 (lm_head, in_proj_qkv, q_proj...):
// each warp keeps x in registers and walks its row batches (grid-strided) with two batches of loads in flight.
template <QFormat F, int K, int R, typename XT>
__global__ void __launch_bounds__(kBlockThreads, 2) gemv_pipe_kernel(MultiArgs a, const XT* x, bool accumulate) {
  using M = RowMap<F, K>;
  __shared__ __align__(16) float xsm[K];
  constexpr int rpb = R * M::sub;
  const int stride = gridDim.x * kWarpsPerBlock * rpb;
  int t = (blockIdx.x * kWarpsPerBlock + threadIdx.x / 32) * rpb;
  RowBatch<F, K, R> b0, b1;
  stage_issue_rows<F, K, R>(a, t, b0);
  stage_issue_rows<F, K, R>(a, t + stride, b1);
  dep_trigger();
  dep_wait();
  stage_x_to_smem(x, K, xsm);
  float xr[M::nc][M::epc], xs[M::nc];
  stage_load_x<F, K>(xsm, (threadIdx.x & 31) % M::lpr, xr, xs);
  for (; t < a.total; t += 2 * stride) {
    stage_dot_store_rows<F, K, R>(a, b0, xr, xs, accumulate);
    stage_issue_rows<F, K, R>(a, t + 2 * stride, b0);
    if (t + stride >= a.total) break;
    stage_dot_store_rows<F, K, R>(a, b1, xr, xs, accumulate);
    stage_issue_rows<F, K, R>(a, t + 3 * stride, b1);
  }
}

template <typename Kern>
int resident_blocks(Kern k) {
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kBlockThreads, 0));
  return sm_count() * (per_sm > 0 ? per_sm : 1);
}

// The persistent kernel wins on tall matrices (lm_head) but loses on 8k-row ones, so it is used from
// kPipeMinRows rows on (q8 / bf16 weights; q4 streams).
inline constexpr int kPipeMinRows = 16384;
bool use_pipe(int rows) { return rows >= kPipeMinRows; }

template <QFormat F, typename XT>
void launch_pipe(const MultiArgs& a, const XT* x, bool accumulate, cudaStream_t s) {
  constexpr int K = 2048;
  constexpr int R = RowMap<F, K>::nc >= 4 ? 1 : 2;
  static const int max_blocks = resident_blocks(gemv_pipe_kernel<F, K, R, XT>);
  const int rows_per_block = kWarpsPerBlock * R * RowMap<F, K>::sub;
  const int blocks = std::min(max_blocks, (a.total + rows_per_block - 1) / rows_per_block);
  launch_kernel(gemv_pipe_kernel<F, K, R, XT>, blocks, kBlockThreads, 0, s, a, x, accumulate);
}

template <QFormat F, int R, typename XT>
__global__ void __launch_bounds__(kBlockThreads) gemv_generic_kernel(MultiArgs a, const XT* x, bool accumulate) {
  dep_trigger();
  dep_wait();
  const int warp = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  gemv_warp_generic<F, R, XT>(a, x, warp * R, accumulate);
}

template <QFormat F, int K, typename XT>
void launch_fast(const MultiArgs& a, const XT* x, bool accumulate, cudaStream_t s) {
  constexpr int R = rows_per_warp<F, K>();
  const int rows_per_block = kWarpsPerBlock * R * RowMap<F, K>::sub;
  const int blocks = (a.total + rows_per_block - 1) / rows_per_block;
  launch_kernel(gemv_kernel<F, K, R, XT>, blocks, kBlockThreads, 0, s, a, x, accumulate);
}

// Streaming q4 kernel for K = 2048 / 4096 (every q4 projection of the model and lm_head), see gemv_stream.cuh:
// a warp owns R consecutive rows of the concatenated row space (clamped, so the loads are unconditional).
// NW warps per block; registers capped at 64 (R * K <= 8192) or 128.
template <int K, int R, int NW, typename XT>
__global__ void __launch_bounds__(NW * 32, (R * K <= 8192 ? 1024 : 512) / (NW * 32))
    gemv_q4_stream_kernel(MultiArgs a, const XT* x, bool accumulate, NormIn norm) {
  constexpr int nc = K / 1024;
  __shared__ __align__(16) StreamX<K> xs;
  const int task0 = (blockIdx.x * NW + threadIdx.x / 32) * R;
  uint4 wv[R][nc];
  uint32_t sv[R][nc];
  // Fused norm: the whole norm before the weight requests (h and the norm weights requested alongside every SM's
  // weight stream wait behind it in the L2). norm.pdl is never set now (no PDL for this kernel); with PDL the
  // weights would go first and h after griddepcontrol.wait.
  const bool norm_first = sizeof(XT) == 4 && norm.w != nullptr && !norm.pdl;
  if (norm_first) stream_stage_norm_first<K, NW * 32>(reinterpret_cast<const float*>(x), norm, xs);
  stream_load_multi_rows<K, R>(a, task0, wv, sv);
  dep_trigger();
  dep_wait();
  if (!norm_first) stream_stage_input<K, NW * 32>(x, norm, xs);
  float acc[R];
  stream_dots<K, R>(xs, wv, sv, acc);
  store_warp_rows(a, task0, acc, accumulate);
}

// The streaming kernel for K = 2048 matrices that one wave of one 16-warp block per SM covers with <= R rows
// per warp (the attention q|k|v, 9,216 rows: 4 or 5 per warp), launched like the persistent kernels: with
// programmatic dependent launch, so its blocks take the SMs as the previous launch's blocks leave and wait
// for it at entry, then request their rows as soon as h has arrived (in the norm, as the GDN mixer does).
// Replaces 288 blocks of 8 warps that each normalised h after a plain launch boundary. Warp g computes the
// contiguous rows [g * base + min(g, extra), +base + (g < extra)) of the row space.
template <int R, int NW>
__global__ void __launch_bounds__(NW * 32, 1) gemv_q4_stream_wave_kernel(MultiArgs a, const float* h, NormIn norm) {
  constexpr int K = 2048;
  __shared__ __align__(16) StreamX<K> xs;
  dep_trigger();
  dep_wait();
  HRegs<K, NW * 32> hr;
  stream_load_h(h, hr);
  const NormW<K, NW * 32> nw = stream_load_norm_w<K, NW * 32>(norm.w);
  const int g = blockIdx.x * NW + threadIdx.x / 32, warps = gridDim.x * NW;
  const int base = a.total / warps, extra = a.total % warps;
  const int n = base + (g < extra ? 1 : 0), task0 = g * base + min(g, extra);
  const RowPtrs<R> p = multi_row_ptrs<K, R>(a, task0);
  uint4 wv[R][K / 1024];
  uint32_t sv[R][K / 1024];
  stream_stage_loaded_norm(hr, &nw, norm, xs, [&] { stream_load_rows<K, R>(p.w, p.sb, wv, sv, n); });
  float acc[R];
  stream_dots<K, R>(xs, wv, sv, acc);
  store_warp_rows(a, task0, acc, false, n);
}

// The streaming kernel for tall K = 2048 matrices (lm_head: 248,320 rows): one block of NW warps per SM stages x
// once (with the fused norm) and walks its row batches grid-strided with two batches of R rows per warp in
// flight, instead of ~7,800 blocks that each normalise h before requesting their rows. R = 2, 16 warps (R = 4
// spills).
template <int R, int NW>
__global__ void __launch_bounds__(NW * 32, 1) gemv_q4_stream_loop_kernel(MultiArgs a, const float* x, bool accumulate,
                                                                         NormIn norm) {
  constexpr int K = 2048, nc = K / 1024;
  __shared__ __align__(16) StreamX<K> xs;
  const int stride = gridDim.x * NW * R;
  int t = (blockIdx.x * NW + threadIdx.x / 32) * R;
  dep_trigger();
  dep_wait();
  if (norm.w) stream_stage_norm_first<K, NW * 32>(x, norm, xs);
  else stream_stage_x<K, NW * 32>(x, xs);
  uint4 w[2][R][nc];
  uint32_t sb[2][R][nc];
  auto issue = [&](int task0, int b) { stream_load_multi_rows<K, R>(a, task0, w[b], sb[b]); };
  auto finish = [&](int task0, int b) {
    float acc[R];
    stream_dots<K, R>(xs, w[b], sb[b], acc);
    store_warp_rows(a, task0, acc, accumulate);
  };
  issue(t, 0);
  issue(t + stride, 1);
  for (; t < a.total; t += 2 * stride) {
    finish(t, 0);
    if (t + 2 * stride < a.total) issue(t + 2 * stride, 0);
    if (t + stride >= a.total) break;
    finish(t + stride, 1);
    if (t + 3 * stride < a.total) issue(t + 3 * stride, 1);
  }
}

// Warps per block of the streaming kernel, and the blocks per SM its rows-per-warp choice aims at.
inline constexpr int kStreamWarps = 8;
inline constexpr int kStreamBlocksPerSm = 3;

// Rows per warp: the fewest that keep the grid within three blocks per SM (more rows per warp lose on the
// model's matrices; bench/RESULTS.md). Taller matrices (lm_head) stream in waves: max_r / 2 there.
int stream_rows_per_warp(int total, int max_r, int nw) {
  const int limit = sm_count() * kStreamBlocksPerSm;
  for (int r = 1; r <= max_r; r *= 2)
    if ((total + nw * r - 1) / (nw * r) <= limit) return r;
  return max_r / 2;
}

template <int K, int R, int NW, typename XT>
void launch_stream(const MultiArgs& a, const XT* x, bool accumulate, const NormIn& n, cudaStream_t s) {
  const int rows_per_block = NW * R;
  launch_kernel(gemv_q4_stream_kernel<K, R, NW, XT>, (a.total + rows_per_block - 1) / rows_per_block, NW * 32, 0, s,
                a, x, accumulate, n);
}

// Rows from which a K = 2048 streaming GEMV runs as the looping kernel (lm_head).
inline constexpr int kLoopMinRows = 65536;

// A K = 2048 GEMV with the fused norm runs as the one-wave kernel when one wave of kWaveWarps warps per SM
// covers it with more than 3 and at most 5 rows per warp (the attention q|k|v, 9,216 rows, 4-5 per warp;
// smaller matrices are left to the multi-block kernel).
inline constexpr int kWaveRows = 5;   // rows per warp at most
inline constexpr int kWaveWarps = 16;

template <int NW, typename XT>
void launch_stream_nw(const MultiArgs& a, const XT* x, bool accumulate, const NormIn& n, cudaStream_t s) {
  if constexpr (sizeof(XT) == 4) {
    if (a.cols == 2048 && n.w && !accumulate &&
        a.total > sm_count() * kWaveWarps * (kWaveRows - 2) && a.total <= sm_count() * kWaveWarps * kWaveRows) {
      launch_ex(gemv_q4_stream_wave_kernel<kWaveRows, kWaveWarps>, dim3(sm_count()), dim3(kWaveWarps * 32), 0, s,
                LaunchOpts{true, 1, false}, a, x, n);
      return;
    }
    if (a.cols == 2048 && a.total >= kLoopMinRows) {
      launch_kernel(gemv_q4_stream_loop_kernel<2, 16>, sm_count(), 16 * 32, 0, s, a, x, accumulate, n);
      return;
    }
  }
  if (a.cols == 2048) {
    switch (stream_rows_per_warp(a.total, 8, NW)) {
      case 1:
      case 2: launch_stream<2048, 2, NW>(a, x, accumulate, n, s); return;
      case 4: launch_stream<2048, 4, NW>(a, x, accumulate, n, s); return;
      default: launch_stream<2048, 8, NW>(a, x, accumulate, n, s); return;
    }
  }
  if (stream_rows_per_warp(a.total, 2, NW) == 1) launch_stream<4096, 1, NW>(a, x, accumulate, n, s);
  else launch_stream<4096, 2, NW>(a, x, accumulate, n, s);
}

// Returns false when the streaming kernel does not apply (format, K).
bool stream_applies(QFormat f, int cols) { return f == QFormat::q4 && (cols == 2048 || cols == 4096); }

template <QFormat F, typename XT>
bool try_stream(const MultiArgs& a, const XT* x, bool accumulate, const NormIn& n, cudaStream_t s) {
  if (!stream_applies(F, a.cols)) return false;
  launch_stream_nw<kStreamWarps>(a, x, accumulate, n, s);
  return true;
}

// norm.w set: x is the un-normalised input h (fp32); the streaming kernel normalises in its prologue, the
// other paths run the RMSNorm kernel into norm.x_out first.
template <QFormat F, typename XT>
void launch_format(const MultiArgs& a, const XT* x, bool accumulate, const NormIn& norm, cudaStream_t s) {
  if (try_stream<F>(a, x, accumulate, norm, s)) return;
  if constexpr (sizeof(XT) == 4) {
    if (norm.w) {
      LILY_CHECK(norm.x_out != nullptr, "gemv: fused RMSNorm without a scratch for x");
      launch_add_rmsnorm(const_cast<float*>(x), nullptr, nullptr, norm.w, norm.x_out, a.cols, norm.eps, s);
      launch_format<F>(a, static_cast<const float*>(norm.x_out), accumulate, NormIn{}, s);
      return;
    }
  }
  switch (a.cols) {
    case 512: launch_fast<F, 512>(a, x, accumulate, s); return;
    case 2048:
      if (use_pipe(a.total)) launch_pipe<F>(a, x, accumulate, s);
      else launch_fast<F, 2048>(a, x, accumulate, s);
      return;
    case 4096: launch_fast<F, 4096>(a, x, accumulate, s); return;
    default: {
      constexpr int R = 4;
      const int blocks = (a.total + kWarpsPerBlock * R - 1) / (kWarpsPerBlock * R);
      launch_kernel(gemv_generic_kernel<F, R, XT>, blocks, kBlockThreads, 0, s, a, x, accumulate);
    }
  }
}

void check_mat(const QMat& m, const char* what) {
  LILY_CHECK(m.rows > 0 && m.cols > 0 && m.cols % kGroupSize == 0, what, ": bad shape ", m.rows, "x", m.cols,
             " (cols must be a positive multiple of ", kGroupSize, ")");
  LILY_CHECK(m.w != nullptr && (m.format == QFormat::bf16 || m.sb != nullptr), what, ": matrix not allocated");
}

MultiArgs multi_args(const GemvBatch& b) {
  LILY_CHECK(b.n >= 1 && b.n <= kMaxMulti, "gemv: batch of ", b.n, " matrices (1..", kMaxMulti, ")");
  MultiArgs a{};
  a.n = b.n;
  a.cols = b.W[0].cols;
  a.total = 0;
  for (int i = 0; i < b.n; ++i) {
    check_mat(b.W[i], "gemv");
    LILY_CHECK(b.W[i].format == b.W[0].format && b.W[i].cols == a.cols, "gemv: batched matrices differ in format/cols");
    a.w[i] = b.W[i].w;
    a.sb[i] = b.W[i].sb;
    a.y[i] = b.y[i];
    a.off[i] = a.total;
    a.total += b.W[i].rows;
  }
  for (int i = b.n; i < kMaxMulti; ++i) {
    a.w[i] = a.w[0]; a.sb[i] = a.sb[0]; a.y[i] = a.y[0]; a.off[i] = a.total;
  }
  return a;
}

template <typename XT>
void launch_multi(const GemvBatch& b, const XT* x, bool accumulate, cudaStream_t s, const NormIn& norm = {}) {
  const MultiArgs a = multi_args(b);
  switch (b.W[0].format) {
    case QFormat::q4: launch_format<QFormat::q4>(a, x, accumulate, norm, s); return;
    case QFormat::q8: launch_format<QFormat::q8>(a, x, accumulate, norm, s); return;
    case QFormat::bf16: launch_format<QFormat::bf16>(a, x, accumulate, norm, s); return;
  }
}

template <QFormat F, int K, int R>
__global__ void __launch_bounds__(kBlockThreads) swiglu_kernel(PairArgs a, const float* x) {
  pair_body<F, K, R, false>(a, x);
}

template <QFormat F, int R>
__global__ void __launch_bounds__(kBlockThreads) swiglu_generic_kernel(PairArgs a, const float* x) {
  dep_trigger();
  dep_wait();
  const int warp = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  swiglu_warp_generic<F, R, false>(a, x, warp * R, a.F);
}

template <QFormat F>
void launch_swiglu(const PairArgs& a, const float* x, cudaStream_t s) {
  if (a.cols == 2048) {
    constexpr int R = rows_per_warp<F, 2048>() / 2 > 0 ? rows_per_warp<F, 2048>() / 2 : 1;
    const int per_block = kWarpsPerBlock * R * RowMap<F, 2048>::sub;
    launch_kernel(swiglu_kernel<F, 2048, R>, (a.F + per_block - 1) / per_block, kBlockThreads, 0, s, a, x);
  } else {
    constexpr int R = 2;
    launch_kernel(swiglu_generic_kernel<F, R>, (a.F + kWarpsPerBlock * R - 1) / (kWarpsPerBlock * R), kBlockThreads,
                  0, s, a, x);
  }
}

}  // namespace detail

bool gemv_streams(const QMat& W) { return detail::stream_applies(W.format, W.cols); }

void gemv(const QMat& W, const float* x, float* y, bool accumulate, cudaStream_t stream) {
  GemvBatch b;
  b.n = 1;
  b.W[0] = W;
  b.y[0] = y;
  detail::launch_multi(b, x, accumulate, stream);
}

void gemv(const QMat& W, const uint16_t* x_bf16, float* y, bool accumulate, cudaStream_t stream) {
  GemvBatch b;
  b.n = 1;
  b.W[0] = W;
  b.y[0] = y;
  detail::launch_multi(b, x_bf16, accumulate, stream);
}

void gemv_multi(const GemvBatch& b, const float* x, bool accumulate, cudaStream_t stream) {
  detail::launch_multi(b, x, accumulate, stream);
}

void gemv_multi_rmsnorm(const GemvBatch& b, const float* h, const float* norm_w, float eps, float* x_out,
                        cudaStream_t stream) {
  LILY_CHECK(norm_w != nullptr && x_out != nullptr, "gemv_multi_rmsnorm: norm weight and x_out are required");
  detail::NormIn n;
  n.w = norm_w;
  n.eps = eps;
  n.x_out = x_out;
  detail::launch_multi(b, h, false, stream, n);
}

void gemv_swiglu(const QMat& gate, const QMat& up, const float* x, float* out, cudaStream_t stream) {
  detail::check_mat(gate, "gemv_swiglu gate");
  detail::check_mat(up, "gemv_swiglu up");
  LILY_CHECK(gate.format == up.format && gate.rows == up.rows && gate.cols == up.cols,
             "gemv_swiglu: gate and up differ in format or shape");
  detail::PairArgs a{};
  a.gw = gate.w; a.gsb = gate.sb; a.uw = up.w; a.usb = up.sb;
  a.F = gate.rows;
  a.cols = gate.cols;
  a.out = out;
  switch (gate.format) {
    case QFormat::q4: detail::launch_swiglu<QFormat::q4>(a, x, stream); return;
    case QFormat::q8: detail::launch_swiglu<QFormat::q8>(a, x, stream); return;
    case QFormat::bf16: detail::launch_swiglu<QFormat::bf16>(a, x, stream); return;
  }
}

}  // namespace lily::cuda
