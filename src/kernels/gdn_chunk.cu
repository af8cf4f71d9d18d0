// The Gated DeltaNet over a prompt chunk (model.md §2.2): the decode step's math (kernels/gdn_core.cuh) for n
// consecutive tokens at positions pos0.. . Two launches (and a third, small, for the conv ring):
//   gdn_chunk_kernel   a warp per (value head, 8 value columns), nothing shared between warps, so the chain per
//                      token has no barrier: every warp redoes the conv, SiLU and L2 norms of its key head's q and
//                      k for the 4 rows per lane it holds (rows lane + 32 r), keeps its 128 x 8 slice of the state
//                      in registers for the whole chunk (read once, written once), sums its columns' S^T k and
//                      S^T q with a reduce-scatter over the lanes (lane j then holds column j's S^T k, lane 8 + j
//                      its S^T q), and broadcasts the columns' updates back. Its ungated outputs o go to `out`.
//   gated_norm_kernel  a warp per (token, value head): out = RMSNorm(o) * norm_w * silu(z), in place.
// The conv taps of earlier positions come from the chunk's own rows, and from the ring for positions before the
// chunk (read at entry); the ring is brought up to date once every warp is done with it. Tested against the
// fp64 / fp32 references token by token in tests/gpu/test_mixer_kernels.cu.
#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/gdn_core.cuh"
#include "kernels/launch.cuh"

namespace lily::cuda {

namespace {

// 8 value columns per warp: 512 warps for the real model (16 columns: 256 warps, 2,836 us per 2,048-token
// chunk on the H200; 8: 2,453; 4: 2,598, each warp redoing the q / k work)
constexpr int kWarpCols = 8;
constexpr int kRowsPerLane = 4;  // Dk <= 128
constexpr int kChunkWarps = 4;   // warps per block (independent)

// One step of the reduce-scatter over 2 M values: lanes with bit M set keep the upper M, the others the lower M,
// each adding its partner's (lane ^ M) copy of the half it keeps.
template <int M, int V>
__device__ __forceinline__ void scatter_step(float (&x)[V], int lane) {
  const bool upper = lane & M;
#pragma unroll
  for (int j = 0; j < M; ++j) {
    const float send = upper ? x[j] : x[j + M];
    const float keep = upper ? x[j + M] : x[j];
    x[j] = keep + __shfl_xor_sync(0xffffffffu, send, M);
  }
}

__global__ void __launch_bounds__(kChunkWarps * 32) gdn_chunk_kernel(
    const float* __restrict__ qkv, const float* __restrict__ a_in, const float* __restrict__ b_in,
    const float* __restrict__ conv_w, const float* __restrict__ a_log, const float* __restrict__ dt_bias,
    const float* __restrict__ ring, float* __restrict__ state, float* __restrict__ out, int pos0, int n,
    GdnDims dims) {
  const int lane = threadIdx.x % 32;
  const int tiles = (dims.v_dim + kWarpCols - 1) / kWarpCols;
  const int wg = blockIdx.x * kChunkWarps + threadIdx.x / 32;
  if (wg >= dims.n_v_heads * tiles) return;
  const int h = wg / tiles, col0 = (wg % tiles) * kWarpCols;
  const int Dk = dims.k_dim, Dv = dims.v_dim, Hv = dims.n_v_heads;
  const int kh = h / (Hv / dims.n_k_heads), key_dim = dims.n_k_heads * Dk, vd = Hv * Dv;
  const int conv_dim = 2 * key_dim + vd;
  const int ncols = min(kWarpCols, Dv - col0);
  float* S = state + (size_t)h * Dk * Dv;

  // the lane's rows (lane + 32 r) x the warp's 16 columns of the state
  float s[kRowsPerLane][kWarpCols];
#pragma unroll
  for (int r = 0; r < kRowsPerLane; ++r) {
    const int i = lane + 32 * r;
#pragma unroll
    for (int j = 0; j < kWarpCols; ++j) s[r][j] = i < Dk && j < ncols ? S[(size_t)i * Dv + col0 + j] : 0.f;
  }
  // conv channels: q and k of rows lane + 32 r; lanes j < ncols also value column col0 + j
  float wq[kRowsPerLane][4], wk[kRowsPerLane][4], xq[kRowsPerLane][3], xk[kRowsPerLane][3];
  float wv[4] = {}, xv[3] = {};
  const bool has_v = lane < ncols;
  const int c_v = 2 * key_dim + h * Dv + col0 + lane;
#pragma unroll
  for (int r = 0; r < kRowsPerLane; ++r) {
    const int i = lane + 32 * r;
    const bool ok = i < Dk;
    const int cq = kh * Dk + i, ck = key_dim + kh * Dk + i;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      wq[r][t] = ok ? conv_w[(size_t)cq * 4 + t] : 0.f;
      wk[r][t] = ok ? conv_w[(size_t)ck * 4 + t] : 0.f;
    }
#pragma unroll
    for (int back = 1; back <= 3; ++back) {
      const int p = pos0 - back;
      xq[r][back - 1] = ok && p >= 0 ? ring[(size_t)(p & 3) * conv_dim + cq] : 0.f;
      xk[r][back - 1] = ok && p >= 0 ? ring[(size_t)(p & 3) * conv_dim + ck] : 0.f;
    }
  }
  if (has_v) {
#pragma unroll
    for (int t = 0; t < 4; ++t) wv[t] = conv_w[(size_t)c_v * 4 + t];
#pragma unroll
    for (int back = 1; back <= 3; ++back) {
      const int p = pos0 - back;
      xv[back - 1] = p >= 0 ? ring[(size_t)(p & 3) * conv_dim + c_v] : 0.f;
    }
  }
  const float A = __expf(a_log[h]), dtb = dt_bias[h];
  const float scale_q = rsqrtf((float)Dk);

  // token t's raw inputs; the next token's are requested before this token's work
  float cq[kRowsPerLane], ck[kRowsPerLane], cv = 0.f, cb, ca;
  auto load = [&](int t, float (&q)[kRowsPerLane], float (&k)[kRowsPerLane], float& v, float& b, float& a) {
    const float* row = qkv + (size_t)t * conv_dim;
#pragma unroll
    for (int r = 0; r < kRowsPerLane; ++r) {
      const int i = lane + 32 * r;
      q[r] = i < Dk ? row[kh * Dk + i] : 0.f;
      k[r] = i < Dk ? row[key_dim + kh * Dk + i] : 0.f;
    }
    v = has_v ? row[c_v] : 0.f;
    b = b_in[(size_t)t * Hv + h];
    a = a_in[(size_t)t * Hv + h];
  };
  load(0, cq, ck, cv, cb, ca);
  for (int t = 0; t < n; ++t) {
    float nq[kRowsPerLane] = {}, nk[kRowsPerLane] = {}, nv = 0.f, nb = 0.f, na = 0.f;
    if (t + 1 < n) load(t + 1, nq, nk, nv, nb, na);
    // conv + SiLU (the decode step's order: the current tap, then the earlier ones), the L2 norms
    float qn[kRowsPerLane], kn[kRowsPerLane], sq = 0.f, sk = 0.f;
#pragma unroll
    for (int r = 0; r < kRowsPerLane; ++r) {
      float aq = wq[r][3] * cq[r], ak = wk[r][3] * ck[r];
      aq += wq[r][2] * xq[r][0], ak += wk[r][2] * xk[r][0];
      aq += wq[r][1] * xq[r][1], ak += wk[r][1] * xk[r][1];
      aq += wq[r][0] * xq[r][2], ak += wk[r][0] * xk[r][2];
      xq[r][2] = xq[r][1], xq[r][1] = xq[r][0], xq[r][0] = cq[r];
      xk[r][2] = xk[r][1], xk[r][1] = xk[r][0], xk[r][0] = ck[r];
      const bool ok = lane + 32 * r < Dk;
      qn[r] = ok ? gdn::silu(aq) : 0.f;
      kn[r] = ok ? gdn::silu(ak) : 0.f;
      sq = fmaf(qn[r], qn[r], sq), sk = fmaf(kn[r], kn[r], sk);
    }
    float vcur = 0.f;
    if (has_v) {
      float av = wv[3] * cv;
      av += wv[2] * xv[0];
      av += wv[1] * xv[1];
      av += wv[0] * xv[2];
      xv[2] = xv[1], xv[1] = xv[0], xv[0] = cv;
      vcur = gdn::silu(av);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      sq += __shfl_xor_sync(0xffffffffu, sq, o);
      sk += __shfl_xor_sync(0xffffffffu, sk, o);
    }
    const float rq = rsqrtf(sq + 1e-6f) * scale_q, rk = rsqrtf(sk + 1e-6f);
    float kq = 0.f;
#pragma unroll
    for (int r = 0; r < kRowsPerLane; ++r) {
      qn[r] *= rq, kn[r] *= rk;
      kq = fmaf(kn[r], qn[r], kq);
    }
    const float beta = gdn::sigmoid(cb);
    const float decay = __expf(-A * gdn::softplus(ca + dtb));
    // decayed state; partial column sums of S^T k (x[j]) and S^T q (x[16 + j]) over the lane's rows
    float x[2 * kWarpCols];
#pragma unroll
    for (int j = 0; j < 2 * kWarpCols; ++j) x[j] = 0.f;
#pragma unroll
    for (int r = 0; r < kRowsPerLane; ++r)
#pragma unroll
      for (int j = 0; j < kWarpCols; ++j) {
        s[r][j] *= decay;
        x[j] = fmaf(s[r][j], kn[r], x[j]);
        x[kWarpCols + j] = fmaf(s[r][j], qn[r], x[kWarpCols + j]);
      }
    // reduce-scatter: at each step a lane keeps the half of the values its lane bit selects and adds its
    // partner's copy of that half; lane l ends with the warp's total of value l
    constexpr int V = 2 * kWarpCols;  // lane l ends with value l % V; lanes l and l ^ V (V < 32) add theirs
    if constexpr (V >= 32) scatter_step<16>(x, lane);
    if constexpr (V >= 16) scatter_step<8>(x, lane);
    scatter_step<4>(x, lane);
    scatter_step<2>(x, lane);
    scatter_step<1>(x, lane);
    if constexpr (V <= 8) x[0] += __shfl_xor_sync(0xffffffffu, x[0], 8);
    if constexpr (V <= 16) x[0] += __shfl_xor_sync(0xffffffffu, x[0], 16);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) kq += __shfl_xor_sync(0xffffffffu, kq, o);
    // lane j < kWarpCols: column j's S^T k -> its update dlt_j = beta (v_j - mem_j); lane kWarpCols + j: column
    // j's S^T q
    const float dlt = lane < kWarpCols ? beta * (vcur - x[0]) : 0.f;
    const float dlt_of_mine = __shfl_sync(0xffffffffu, dlt, lane & (kWarpCols - 1));
    if (lane >= kWarpCols && lane - kWarpCols < ncols)  // o = S'^T q = (decay S)^T q + (k . q) dlt
      out[(size_t)t * vd + (size_t)h * Dv + col0 + lane - kWarpCols] = fmaf(kq, dlt_of_mine, x[0]);
#pragma unroll
    for (int j = 0; j < kWarpCols; ++j) {
      const float d = __shfl_sync(0xffffffffu, dlt, j);
#pragma unroll
      for (int r = 0; r < kRowsPerLane; ++r) s[r][j] = fmaf(kn[r], d, s[r][j]);
    }
#pragma unroll
    for (int r = 0; r < kRowsPerLane; ++r) cq[r] = nq[r], ck[r] = nk[r];
    cv = nv, cb = nb, ca = na;
  }
#pragma unroll
  for (int r = 0; r < kRowsPerLane; ++r) {
    const int i = lane + 32 * r;
#pragma unroll
    for (int j = 0; j < kWarpCols; ++j)
      if (i < Dk && j < ncols) S[(size_t)i * Dv + col0 + j] = s[r][j];
  }
}

// out[t][h] = RMSNorm(o[t][h]) * norm_w * silu(z[t][h]) in place, a warp per (token, head).
__global__ void gated_norm_kernel(float* o, const float* z, const float* norm_w, int n, int Hv, int Dv, float eps) {
  const int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (w >= n * Hv) return;
  float* row = o + (size_t)w * Dv;
  const float* zr = z + (size_t)w * Dv;
  float ss = 0.f;
  for (int j = lane; j < Dv; j += 32) ss = fmaf(row[j], row[j], ss);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const float rs = rsqrtf(ss / Dv + eps);
  for (int j = lane; j < Dv; j += 32) row[j] = row[j] * rs * norm_w[j] * gdn::silu(zr[j]);
}

// The ring after the chunk: the raw qkv of its last (up to) 4 tokens in their slots (position % 4).
__global__ void ring_update_kernel(const float* qkv, float* ring, int pos0, int n, int conv_dim) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int t = n - 1 - blockIdx.y;
  if (c >= conv_dim || t < 0) return;
  ring[(size_t)((pos0 + t) & 3) * conv_dim + c] = qkv[(size_t)t * conv_dim + c];
}

}  // namespace

void launch_gdn_chunk(const float* qkv, const float* z, const float* a, const float* b, const float* conv_w,
                      const float* a_log, const float* dt_bias, const float* norm_w, float* conv_ring, float* state,
                      float* out, int pos0, int n, GdnDims dims, float eps, cudaStream_t s) {
  LILY_CHECK(dims.k_dim >= 1 && dims.k_dim <= 32 * kRowsPerLane && dims.v_dim >= 1 && dims.n_k_heads > 0 &&
                 dims.n_v_heads % dims.n_k_heads == 0 && pos0 >= 0,
             "gdn_chunk: unsupported dims Dk=", dims.k_dim, " Dv=", dims.v_dim, " Hk=", dims.n_k_heads,
             " Hv=", dims.n_v_heads);
  if (n <= 0) return;
  const int warps = dims.n_v_heads * ((dims.v_dim + kWarpCols - 1) / kWarpCols);
  gdn_chunk_kernel<<<(warps + kChunkWarps - 1) / kChunkWarps, kChunkWarps * 32, 0, s>>>(
      qkv, a, b, conv_w, a_log, dt_bias, conv_ring, state, out, pos0, n, dims);
  CUDA_CHECK_LAUNCH();
  const int rows = n * dims.n_v_heads;
  gated_norm_kernel<<<(rows + 7) / 8, 256, 0, s>>>(out, z, norm_w, n, dims.n_v_heads, dims.v_dim, eps);
  CUDA_CHECK_LAUNCH();
  const int conv_dim = dims.conv_dim();
  ring_update_kernel<<<dim3((conv_dim + 255) / 256, 4), 256, 0, s>>>(qkv, conv_ring, pos0, n, conv_dim);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda
