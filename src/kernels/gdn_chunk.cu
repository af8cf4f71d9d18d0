// The Gated DeltaNet over a prompt chunk (docs/model.md §2.2): the decode step's math (kernels/gdn_core.cuh) for n
// consecutive tokens at positions pos0.. . Four launches:
//   gdn_prep_kernel    all that does not depend on the state, for every token at once (a thread per channel
//                      over 32 tokens, then a warp per token for the norms): the conv + SiLU of q, k and v, the
//                      L2 norms, k . q, beta and the decay, into the scratch rows (PrepRow); conv taps before
//                      the chunk from the ring.
//   gdn_chunk_kernel   the recurrence: a warp per (value head, 4 value columns), no barrier in the chain per
//                      token: it keeps its 128 x 4 slice of the state in registers for the whole chunk (read
//                      once, written once), each half-warp two columns over 16 lanes of 8 rows, sums its columns'
//                      S^T k and S^T q with a reduce-scatter over the lanes, and broadcasts the columns' updates
//                      back. A block's 8 warps share a value head; the prep's values come into shared memory 32
//                      tokens at a time, double-buffered, so the chain reads them there rather than from L2.
//                      Its ungated outputs o go to `out`.
//   gated_norm_kernel  a warp per (token, value head): out = RMSNorm(o) * norm_w * silu(z), in place.
//   ring_update_kernel the raw qkv of the chunk's last (up to) 4 tokens into the conv ring.
// The arithmetic is the decode step's (sums in another order), so a chunk and the decode step agree to fp32
// rounding.
// Tested against the fp64 / fp32 references token by token in tests/gpu/test_mixer_kernels.cu.
#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/gdn_core.cuh"
#include "kernels/gdn_prep.cuh"
#include "kernels/launch.cuh"
#include "kernels/mma.cuh"

namespace lily::cuda {

namespace {

// 4 value columns per warp: 1,024 warps for the real model, two per scheduler.
constexpr int kWarpCols = 4;

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

// Everything of a token that does not depend on the state, for kPrepTok tokens per block, each input row read
// once: block (x, y < Hk) runs key head y's q channels on threads [0, 128) and its k channels on [128, 256), a
// thread per channel walking the block's tokens with the conv taps in registers (the decode step's order: the
// current tap, then the earlier ones; taps before the chunk from the ring) into shared memory, then a warp per
// token the L2 norms and k . q (lane sums over channels l + 32 r, then a butterfly); block (x, y >= Hk) runs
// 256 v channels the same way (conv + SiLU), and its first slice also beta and the decay of every value head.
// The norms keep the per-(token, key head) summation order of the decode step's arithmetic, so the outputs are
// the same bits as the former prep kernel's.
constexpr int kPrepTok = 32;
constexpr int kPrepThreads = 256;
constexpr int kQkMax = kPrepThreads / 2;  // Dk <= 128

__global__ void __launch_bounds__(kPrepThreads) gdn_prep_kernel(
    const float* __restrict__ qkv, const float* __restrict__ a_in, const float* __restrict__ b_in,
    const float* __restrict__ conv_w, const float* __restrict__ a_log, const float* __restrict__ dt_bias,
    const float* __restrict__ ring, float* __restrict__ prep, int pos0, int n, GdnDims dims) {
  __shared__ float us[kPrepTok][2 * kQkMax];  // q / k blocks: the conv + SiLU of q (0..127) and of k (128..255)
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int Hk = dims.n_k_heads, Dk = dims.k_dim, Dv = dims.v_dim, Hv = dims.n_v_heads;
  const int key_dim = Hk * Dk, vd = Hv * Dv, conv_dim = 2 * key_dim + vd;
  const PrepRow L{key_dim, vd, Hk, Hv};
  const int t0 = blockIdx.x * kPrepTok, cnt = min(kPrepTok, n - t0);
  // conv + SiLU of channel c for the block's tokens (tokens past the chunk: garbage, never stored)
  auto conv_run = [&](int c, float (&u)[kPrepTok]) {
    auto before = [&](int back) {  // the raw input `back` tokens before the block's first token
      const int tt = t0 - back;
      if (tt >= 0) return qkv[(size_t)tt * conv_dim + c];
      const int p = pos0 + tt;
      return p >= 0 ? ring[(size_t)(p & 3) * conv_dim + c] : 0.f;
    };
    const float w0 = conv_w[(size_t)c * 4], w1 = conv_w[(size_t)c * 4 + 1];
    const float w2 = conv_w[(size_t)c * 4 + 2], w3 = conv_w[(size_t)c * 4 + 3];
    float x1 = before(1), x2 = before(2), x3 = before(3);
#pragma unroll
    for (int i = 0; i < kPrepTok; ++i) {
      const float x = i < cnt ? qkv[(size_t)(t0 + i) * conv_dim + c] : 0.f;
      float acc = w3 * x;
      acc += w2 * x1;
      acc += w1 * x2;
      acc += w0 * x3;
      u[i] = gdn::silu(acc);
      x3 = x2, x2 = x1, x1 = x;
    }
  };
  float u[kPrepTok];
  if (blockIdx.y < Hk) {  // q and k of key head kh
    const int kh = blockIdx.y, i_ch = tid % kQkMax;
    if (i_ch < Dk) {
      conv_run((tid >= kQkMax ? key_dim : 0) + kh * Dk + i_ch, u);
#pragma unroll
      for (int i = 0; i < kPrepTok; ++i) us[i][tid] = u[i];
    }
    __syncthreads();
    // then a warp per token: the L2 norms and k . q over lanes l + 32 r (sums per lane, then a butterfly)
    for (int i = warp; i < cnt; i += kPrepThreads / 32) {
      float qn[kQkMax / 32], kn[kQkMax / 32], sq = 0.f, sk = 0.f;
#pragma unroll
      for (int r = 0; r < kQkMax / 32; ++r) {
        const int c = lane + 32 * r;
        qn[r] = c < Dk ? us[i][c] : 0.f;
        kn[r] = c < Dk ? us[i][kQkMax + c] : 0.f;
        sq = fmaf(qn[r], qn[r], sq), sk = fmaf(kn[r], kn[r], sk);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, o);
        sk += __shfl_xor_sync(0xffffffffu, sk, o);
      }
      const float rq = rsqrtf(sq + 1e-6f) * rsqrtf((float)Dk), rk = rsqrtf(sk + 1e-6f);
      float* out = prep + (size_t)(t0 + i) * L.width();
      float kq = 0.f;
#pragma unroll
      for (int r = 0; r < kQkMax / 32; ++r) {
        const int c = lane + 32 * r;
        qn[r] *= rq, kn[r] *= rk;
        kq = fmaf(kn[r], qn[r], kq);
        if (c < Dk) out[L.q(kh) + c] = qn[r], out[L.k(kh) + c] = kn[r];
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) kq += __shfl_xor_sync(0xffffffffu, kq, o);
      if (lane == 0) out[L.kq(kh)] = kq;
    }
  } else {  // 256 v channels; the first slice also the gates
    const int j = (blockIdx.y - Hk) * kPrepThreads + tid;  // v channel (head j / Dv, column j % Dv)
    if (j < vd) {
      conv_run(2 * key_dim + j, u);
      float* out = prep + (size_t)t0 * L.width() + L.v(0) + j;
#pragma unroll
      for (int i = 0; i < kPrepTok; ++i)
        if (i < cnt) out[(size_t)i * L.width()] = u[i];
    }
    if (blockIdx.y == Hk) {
      for (int e = tid; e < cnt * Hv; e += kPrepThreads) {
        const int i = e / Hv, h = e % Hv, t = t0 + i;
        float* row = prep + (size_t)t * L.width();
        row[L.beta(h)] = gdn::sigmoid(b_in[(size_t)t * Hv + h]);
        row[L.decay(h)] = __expf(-__expf(a_log[h]) * gdn::softplus(a_in[(size_t)t * Hv + h] + dt_bias[h]));
      }
    }
  }
}

// The recurrence: a warp per (value head, kWarpCols value columns); a block's warps share the value head, and
// the prep's values of kBatch tokens at a time (q, k, the block's v columns, k . q, beta, decay) come into
// shared memory (cp.async, double-buffered) while the warps work through the previous batch.
// Within a warp, half f = lane / 16 takes columns 2 f, 2 f + 1 and lane i = lane % 16 of the half the state rows
// 4 i .. 4 i + 3 and 64 + 4 i .. 64 + 4 i + 3 (q and k as two 16-byte reads each, conflict-free): a column's sums
// S^T k and S^T q reduce over 16 lanes (4 shuffle steps, not 5).
constexpr int kStageWarps = 8;
constexpr int kBatch = 32;  // tokens per staged batch
constexpr int kBlockCols = kStageWarps * kWarpCols;
constexpr int kDkMax = 128;  // q and k slots hold 128 floats (zero past Dk)
static_assert(kQkMax >= kDkMax, "the prep kernel's q / k threads cover every Dk the launcher accepts");
constexpr int kTokFloats = (2 * kDkMax + kBlockCols + 3 + 3) & ~3;  // q | k | v | k . q, beta, decay (16-byte slots)
static_assert(kWarpCols == 4, "two columns per half-warp");

__global__ void __launch_bounds__(kStageWarps * 32) gdn_chunk_kernel(const float* __restrict__ prep,
                                                                      float* __restrict__ state,
                                                                      float* __restrict__ out, int n, GdnDims dims) {
  // 74,752 bytes of static shared memory: above the 48 KB other architectures allow, fine for sm_90a (the only
  // target of the GPU build)
  __shared__ __align__(16) float buf[2][kBatch * kTokFloats];
  const int tid = threadIdx.x, lane = tid % 32, half = lane >> 4, li = lane & 15;
  const int Dk = dims.k_dim, Dv = dims.v_dim, Hv = dims.n_v_heads;
  const int h = blockIdx.y, kh = h / (Hv / dims.n_k_heads), vd = Hv * Dv;
  const int bcol0 = blockIdx.x * kBlockCols, bcols = min(kBlockCols, Dv - bcol0);
  const int col0 = bcol0 + (tid / 32) * kWarpCols;
  const int ncols = max(0, min(kWarpCols, Dv - col0));  // 0: a warp past the head's columns (stages, syncs)
  const PrepRow L{dims.n_k_heads * Dk, vd, dims.n_k_heads, Hv};
  constexpr int kQ = 0, kK = kDkMax, kV = 2 * kDkMax, kS = kV + kBlockCols;  // offsets in a token's slot
  float* S = state + (size_t)h * Dk * Dv;

  for (int e = tid; e < 2 * kBatch * kTokFloats; e += kStageWarps * 32) (&buf[0][0])[e] = 0.f;  // (the pads)
  __syncthreads();
  // the real model's shapes (Dk = 128, whole 32-column slices; the prep rows' q, k and v offsets are then
  // multiples of 4 floats): q, k and v by 16-byte copies
  const bool fast = Dk == kDkMax && bcols == kBlockCols && L.width() % 4 == 0 && L.v(h) % 4 == 0;
  auto stage = [&](int b) {
    float* B = buf[b & 1];
    const int t0 = b * kBatch, cnt = min(kBatch, n - t0);
    if (fast) {  // 16-byte copies, index arithmetic by shifts
      constexpr int kQ4 = kDkMax / 4, kV4 = kBlockCols / 4;  // float4 per q (or k), per v slice
      for (int e = tid; e < cnt * 2 * kQ4; e += kStageWarps * 32) {
        const int i = e / (2 * kQ4), r = e % (2 * kQ4), is_k = r / kQ4, d = 4 * (r % kQ4);
        const float* row = prep + (size_t)(t0 + i) * L.width();
        mma::cp16(B + i * kTokFloats + (is_k ? kK : kQ) + d, row + (is_k ? L.k(kh) : L.q(kh)) + d);
      }
      for (int e = tid; e < cnt * kV4; e += kStageWarps * 32) {
        const int i = e / kV4, c = 4 * (e % kV4);
        mma::cp16(B + i * kTokFloats + kV + c, prep + (size_t)(t0 + i) * L.width() + L.v(h) + bcol0 + c);
      }
    } else {
      for (int e = tid; e < cnt * Dk; e += kStageWarps * 32) {
        const int i = e / Dk, d = e % Dk;
        const float* row = prep + (size_t)(t0 + i) * L.width();
        mma::cp4(B + i * kTokFloats + kQ + d, row + L.q(kh) + d);
        mma::cp4(B + i * kTokFloats + kK + d, row + L.k(kh) + d);
      }
      for (int e = tid; e < cnt * bcols; e += kStageWarps * 32) {
        const int i = e / bcols, c = e % bcols;
        mma::cp4(B + i * kTokFloats + kV + c, prep + (size_t)(t0 + i) * L.width() + L.v(h) + bcol0 + c);
      }
    }
    for (int e = tid; e < cnt * 3; e += kStageWarps * 32) {
      const int i = e / 3, f = e % 3;
      const float* row = prep + (size_t)(t0 + i) * L.width();
      mma::cp4(B + i * kTokFloats + kS + f, row + (f == 0 ? L.kq(kh) : f == 1 ? L.beta(h) : L.decay(h)));
    }
    mma::commit();
  };

  // the lane's rows (row_of(r), r < 8) x its half's two columns of the state
  auto row_of = [&](int r) { return (r >> 2) * 64 + 4 * li + (r & 3); };
  const int my_col = 2 * half + (lane & 1);  // the column whose update (lane % 4 < 2) or output (>= 2) it makes
  float s[8][2];
#pragma unroll
  for (int r = 0; r < 8; ++r)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int i = row_of(r), j = 2 * half + c;
      s[r][c] = i < Dk && j < ncols ? S[(size_t)i * Dv + col0 + j] : 0.f;
    }
  // lanes 16 f + 2, + 3 store column 2 f, 2 f + 1's output (one copy per column)
  const bool stores = (lane & 15) >= 2 && (lane & 15) < 4 && my_col < ncols;
  float* o_ptr = out + (size_t)h * Dv + col0 + my_col;
  const int batches = (n + kBatch - 1) / kBatch;
  stage(0);
  for (int b = 0; b < batches; ++b) {
    mma::wait<0>();
    __syncthreads();  // batch b has landed; every warp is done with batch b - 1's buffer
    if (b + 1 < batches) stage(b + 1);
    if (ncols == 0) continue;
    const float* B = buf[b & 1];
    const int cnt = min(kBatch, n - b * kBatch);
    for (int tt = 0; tt < cnt; ++tt, o_ptr += vd) {
      const float* tok = B + tt * kTokFloats;
      float q[8], k[8];
      *reinterpret_cast<float4*>(q) = *reinterpret_cast<const float4*>(tok + kQ + 4 * li);
      *reinterpret_cast<float4*>(q + 4) = *reinterpret_cast<const float4*>(tok + kQ + 64 + 4 * li);
      *reinterpret_cast<float4*>(k) = *reinterpret_cast<const float4*>(tok + kK + 4 * li);
      *reinterpret_cast<float4*>(k + 4) = *reinterpret_cast<const float4*>(tok + kK + 64 + 4 * li);
      const float v = tok[kV + col0 - bcol0 + min(my_col, ncols - 1)];
      const float kq = tok[kS], beta = tok[kS + 1], decay = tok[kS + 2];
      // decayed state; partial column sums of S^T k (x[c]) and S^T q (x[2 + c]) over the lane's rows
      float x[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          s[r][c] *= decay;
          x[c] = fmaf(s[r][c], k[r], x[c]);
          x[2 + c] = fmaf(s[r][c], q[r], x[2 + c]);
        }
      // reduce-scatter over lane bits 1, 0 (lane keeps value lane % 4), then the sum over lane bits 2, 3
      scatter_step<2>(x, lane);
      scatter_step<1>(x, lane);
      x[0] += __shfl_xor_sync(0xffffffffu, x[0], 4);
      x[0] += __shfl_xor_sync(0xffffffffu, x[0], 8);
      // lane % 4 = c < 2: column 2 f + c's S^T k -> its update dlt = beta (v - mem); lane % 4 = 2 + c: its S^T q
      const float dlt = (lane & 3) < 2 ? beta * (v - x[0]) : 0.f;
      const float dlt_of_mine = __shfl_sync(0xffffffffu, dlt, lane & ~2);
      if (stores) *o_ptr = fmaf(kq, dlt_of_mine, x[0]);  // o = S'^T q = (decay S)^T q + (k . q) dlt
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float d = __shfl_sync(0xffffffffu, dlt, 16 * half + c);
#pragma unroll
        for (int r = 0; r < 8; ++r) s[r][c] = fmaf(k[r], d, s[r][c]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 8; ++r)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int i = row_of(r), j = 2 * half + c;
      if (i < Dk && j < ncols) S[(size_t)i * Dv + col0 + j] = s[r][c];
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

// the prep rows' bytes, rounded up to 256 (the chunked form's work area follows them)
size_t prep_bytes(int n, GdnDims dims) {
  const int key_dim = dims.n_k_heads * dims.k_dim, vd = dims.n_v_heads * dims.v_dim;
  const size_t prep = sizeof(float) * (size_t)n * PrepRow{key_dim, vd, dims.n_k_heads, dims.n_v_heads}.width();
  return (prep + 255) / 256 * 256;
}
}  // namespace

size_t gdn_chunk_scratch_bytes(int n, GdnDims dims, bool wy) {
  return prep_bytes(n, dims) + (wy ? gdn_wy_work_bytes(dims) : 0);
}

void launch_gdn_chunk(const float* qkv, const float* z, const float* a, const float* b, const float* conv_w,
                      const float* a_log, const float* dt_bias, const float* norm_w, float* conv_ring, float* state,
                      float* out, void* scratch, int pos0, int n, GdnDims dims, float eps, bool wy, cudaStream_t s) {
  LILY_CHECK(dims.k_dim >= 1 && dims.k_dim <= kDkMax && dims.v_dim >= 4 && dims.v_dim % 4 == 0 &&
                 dims.n_k_heads > 0 && dims.n_v_heads % dims.n_k_heads == 0 && dims.n_v_heads / dims.n_k_heads <= 32 && pos0 >= 0,
             "gdn_chunk: unsupported dims Dk=", dims.k_dim, " Dv=", dims.v_dim, " Hk=", dims.n_k_heads,
             " Hv=", dims.n_v_heads);
  if (n <= 0) return;
  LILY_CHECK(reinterpret_cast<uintptr_t>(scratch) % 16 == 0, "gdn_chunk: scratch not 16-byte aligned");  // (cp16)
  float* prep = static_cast<float*>(scratch);
  const dim3 prep_grid((n + kPrepTok - 1) / kPrepTok,
                       dims.n_k_heads + (dims.n_v_heads * dims.v_dim + kPrepThreads - 1) / kPrepThreads);
  gdn_prep_kernel<<<prep_grid, kPrepThreads, 0, s>>>(qkv, a, b, conv_w, a_log, dt_bias, conv_ring, prep, pos0, n,
                                                     dims);
  CUDA_CHECK_LAUNCH(s);
  if (wy && gdn_wy_supported(dims)) {
    uint8_t* work = static_cast<uint8_t*>(scratch) + prep_bytes(n, dims);
    launch_gdn_wy(prep, a, a_log, dt_bias, state, out, work, pos0, n, dims, s);
  } else {
    const dim3 grid((dims.v_dim + kBlockCols - 1) / kBlockCols, dims.n_v_heads);
    gdn_chunk_kernel<<<grid, kStageWarps * 32, 0, s>>>(prep, state, out, n, dims);
    CUDA_CHECK_LAUNCH(s);
  }
  const int rows = n * dims.n_v_heads;
  gated_norm_kernel<<<(rows + 7) / 8, 256, 0, s>>>(out, z, norm_w, n, dims.n_v_heads, dims.v_dim, eps);
  CUDA_CHECK_LAUNCH(s);
  const int conv_dim = dims.conv_dim();
  ring_update_kernel<<<dim3((conv_dim + 255) / 256, 4), 256, 0, s>>>(qkv, conv_ring, pos0, n, conv_dim);
  CUDA_CHECK_LAUNCH(s);
}

}  // namespace lily::cuda
