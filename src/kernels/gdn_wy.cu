// The Gated DeltaNet prompt recurrence in the chunked (WY) form on the tensor cores (docs/model.md §2.2;
// KernelOptions::gdn_wy). Tokens go in pieces of kPiece at absolute multiples of kPiece, so a prompt split on that
// grid gives the whole prompt's bits. With Γ_t the product of the piece's decays up to token t, S_0 the state
// before the piece (S [Dk][Dv], o_t = S_t^T q_t), the recurrence S_t = g_t S_{t-1} + k_t δ_t^T,
// δ_t = β_t (v_t - g_t S_{t-1}^T k_t) is, for the whole piece:
//   Δ   = U - W S_0                      W = T diag(β Γ) K, U = T diag(β) V, T = (I + A)^-1,
//                                        A_ts = β_t (k_t . k_s) Γ_t / Γ_s for s < t
//   O   = diag(Γ) Q S_0 + P Δ            P_ts = (q_t . k_s) Γ_t / Γ_s for s <= t
//   S_L = Γ_L S_0 + Kd^T Δ               Kd_s = k_s Γ_L / Γ_s
// Two kernels per group of kGroup pieces:
//   gdn_wy_piece_kernel  a block per (piece, value head), fp32 on the CUDA cores: K K^T and Q K^T, the forward
//                        substitution for [W | U] (a thread per column), into the group's work area (W in fp16;
//                        Q, Kd, P as two fp16 terms; U^T, Γ in fp32).
//   gdn_wy_chain_kernel  a block per (value head, 32 value columns), four warps (16 columns x half the key rows
//                        each), through the group's pieces in order: the state slice S^T [16 cols][Dk / 2] stays in
//                        each warp's mma accumulators for the whole launch and is reused as the A operand of the
//                        next products; the next piece's operands come into shared memory (cp.async) while the
//                        warps work on this one.
// Precision (issue 28's bound for the prompt path: median 2e-3, top-1 99 % of fp64): every operand as two fp16
// terms (hi + lo: ~22 bits; hi x hi, lo x hi and hi x lo products) except W and the state S_0 in W S_0 and
// Q S_0, one term each (an emulation, bench/RESULTS.md: W's rounding moves the outputs ~50x less than P's or Q's
// would, S_0's not measurably); sums and the state itself in fp32.
// Tested against an fp64 recurrence and an emulation of these roundings in tests/gpu/test_mixer_kernels.cu.
#include <cuda_fp16.h>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/gdn_core.cuh"
#include "kernels/gdn_prep.cuh"
#include "kernels/mma.cuh"

namespace lily::cuda {

namespace {

constexpr int kPiece = 64;  // tokens per piece
constexpr int kDk = 128;    // the only key width this path takes (launcher checks)
constexpr int kGroup = 8;   // pieces per work area (~34 MB for the real model: mostly in L2 for the chain)

// One (piece, value head)'s work area: byte offsets (hi and lo: the two fp16 terms). U^T is [Dv][kPiece], Dv <= 128.
constexpr int kMat = kPiece * kDk * 2;                    // bytes of a half [kPiece][kDk]
constexpr int kOffW = 0;                                  // half [kPiece][kDk]
constexpr int kOffQ = kOffW + kMat;                       // hi, lo: half [kPiece][kDk]: q (not scaled by Γ)
constexpr int kOffKd = kOffQ + 2 * kMat;                  // hi, lo: half [kPiece][kDk]
constexpr int kOffP = kOffKd + 2 * kMat;                  // hi, lo: half [kPiece][kPiece]
constexpr int kOffGam = kOffP + 2 * kPiece * kPiece * 2;  // float [kPiece] Γ_t, then Γ_L, padded to 80 floats
constexpr int kOffU = kOffGam + 80 * 4;                   // float [Dv][kPiece]
constexpr size_t work_bytes(int Dv) { return (size_t)kOffU + (size_t)Dv * kPiece * 4; }

// ---- piece kernel ----
constexpr int kPieceThreads = 256;
constexpr int kRs = kDk + 4;      // K / Q row stride in shared memory (floats)
constexpr int kAs = kPiece + 4;   // A row stride (floats; float4 reads)
constexpr size_t kPieceSmem = sizeof(float) * (2 * kPiece * kRs + kPiece * kAs + 3 * kPiece) + sizeof(double) * kPiece;
static_assert(2 * kPieceSmem <= 227 * 1024, "two blocks per SM");

__global__ void __launch_bounds__(kPieceThreads, 2) gdn_wy_piece_kernel(
    const float* __restrict__ prep, const float* __restrict__ a_in, const float* __restrict__ a_log,
    const float* __restrict__ dt_bias, uint8_t* __restrict__ work, int pos0, int n, int piece0, GdnDims dims) {
  extern __shared__ __align__(16) float sm[];
  float* Ks = sm;                    // [kPiece][kRs]
  float* Qs = Ks + kPiece * kRs;     // [kPiece][kRs]
  float* As = Qs + kPiece * kRs;     // [kPiece][kAs] (v is read by the substitution straight from the rows)
  double* lg = reinterpret_cast<double*>(As + kPiece * kAs);  // [kPiece] log Γ_t (in double: Γ_t / Γ_s below
                                                              // from a difference of sums)
  float* bt = reinterpret_cast<float*>(lg + kPiece);  // [kPiece] β_t (0 past the launch's tokens)
  float* eg = bt + kPiece;           // [kPiece] Γ_t
  float* ek = eg + kPiece;           // [kPiece] Γ_L / Γ_t
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int Hk = dims.n_k_heads, Hv = dims.n_v_heads, Dv = dims.v_dim;
  const int h = blockIdx.y, kh = h / (Hv / Hk), pp = blockIdx.x;
  const PrepRow L{Hk * kDk, Hv * Dv, Hk, Hv};
  const int t0 = (piece0 + pp) * kPiece - pos0;  // the launch's token at the piece's row 0 (< 0: before the launch)
  uint8_t* wk = work + ((size_t)pp * Hv + h) * work_bytes(Dv);

  // k and q rows by asynchronous copies, all in flight at once (16 bytes where the rows allow: the real model);
  // rows past the launch's tokens: k = q = v = 0, β = 0, decay 1 (they change nothing)
  if (L.width() % 4 == 0) {
    for (int e = tid; e < kPiece * (kDk / 4); e += kPieceThreads) {
      const int r = e / (kDk / 4), d = 4 * (e % (kDk / 4)), t = t0 + r;
      float* dk = Ks + r * kRs + d;
      float* dq = Qs + r * kRs + d;
      if (t >= 0 && t < n) {
        const float* row = prep + (size_t)t * L.width();
        mma::cp16(dk, row + L.k(kh) + d);
        mma::cp16(dq, row + L.q(kh) + d);
      } else {
        const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
        *reinterpret_cast<float4*>(dk) = z, *reinterpret_cast<float4*>(dq) = z;
      }
    }
  } else {
    for (int e = tid; e < kPiece * kDk; e += kPieceThreads) {
      const int r = e / kDk, d = e % kDk, t = t0 + r;
      if (t >= 0 && t < n) {
        const float* row = prep + (size_t)t * L.width();
        mma::cp4(Ks + r * kRs + d, row + L.k(kh) + d);
        mma::cp4(Qs + r * kRs + d, row + L.q(kh) + d);
      } else {
        Ks[r * kRs + d] = 0.f, Qs[r * kRs + d] = 0.f;
      }
    }
  }
  mma::commit();
  if (warp == 0) {  // β and the inclusive prefix sums of the log decays (lane: rows 2 lane, 2 lane + 1)
    float ld[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int r = 2 * lane + u, t = t0 + r;
      const bool ok = t >= 0 && t < n;
      bt[r] = ok ? prep[(size_t)t * L.width() + L.beta(h)] : 0.f;
      ld[u] = ok ? -__expf(a_log[h]) * gdn::softplus(a_in[(size_t)t * Hv + h] + dt_bias[h]) : 0.f;
    }
    double incl = (double)ld[0] + ld[1];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    double excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = 0.0;
    const double l0 = excl + ld[0], l1 = l0 + ld[1];
    lg[2 * lane] = l0, lg[2 * lane + 1] = l1;
  }
  mma::wait<0>();
  __syncthreads();
  if (tid < kPiece) {
    eg[tid] = __expf((float)lg[tid]);
    ek[tid] = __expf((float)(lg[kPiece - 1] - lg[tid]));
  }

  // K K^T and Q K^T: thread (row i, columns j = jr + 4 m); a warp's rows are 8 w .. 8 w + 7, so columns past
  // them (m > 2 w + 1) are skipped warp-uniformly
  {
    const int i = tid / 4, jr = tid % 4;
    float kk[16], qk[16];
#pragma unroll
    for (int m = 0; m < 16; ++m) kk[m] = 0.f, qk[m] = 0.f;
    for (int d = 0; d < kDk; d += 4) {
      const float4 ki = *reinterpret_cast<const float4*>(Ks + i * kRs + d);
      const float4 qi = *reinterpret_cast<const float4*>(Qs + i * kRs + d);
#pragma unroll
      for (int m = 0; m < 16; ++m) {
        if (m > 2 * warp + 1) break;
        const float4 kj = *reinterpret_cast<const float4*>(Ks + (jr + 4 * m) * kRs + d);
        kk[m] = fmaf(ki.x, kj.x, fmaf(ki.y, kj.y, fmaf(ki.z, kj.z, fmaf(ki.w, kj.w, kk[m]))));
        qk[m] = fmaf(qi.x, kj.x, fmaf(qi.y, kj.y, fmaf(qi.z, kj.z, fmaf(qi.w, kj.w, qk[m]))));
      }
    }
    __half* P = reinterpret_cast<__half*>(wk + kOffP);
#pragma unroll
    for (int m = 0; m < 16; ++m) {
      const int j = jr + 4 * m;
      const float ratio = j <= i ? __expf((float)(lg[i] - lg[j])) : 0.f;
      As[i * kAs + j] = j < i ? bt[i] * kk[m] * ratio : 0.f;
      const float pv = j <= i ? qk[m] * ratio : 0.f;
      const __half hi = __float2half_rn(pv);
      P[i * kPiece + j] = hi;
      P[kPiece * kPiece + i * kPiece + j] = __float2half_rn(pv - __half2float(hi));
    }
  }
  __syncthreads();

  // [W | U] = (I + A)^-1 [diag(β Γ) K | diag(β) V]: a thread per column, the column in registers (x[r] holds the
  // source value until step r solves it; v's columns come straight from the rows, coalesced across the threads)
  const int col = tid;
  if (col < kDk + Dv) {
    const bool is_w = col < kDk;
    float x[kPiece];
#pragma unroll
    for (int r = 0; r < kPiece; ++r) {
      const int t = t0 + r;
      x[r] = is_w ? Ks[r * kRs + col]
                  : (t >= 0 && t < n ? prep[(size_t)t * L.width() + L.v(h) + (col - kDk)] : 0.f);
    }
#pragma unroll
    for (int r = 0; r < kPiece; ++r) {
      float acc[4] = {bt[r] * (is_w ? eg[r] : 1.f) * x[r], 0.f, 0.f, 0.f};  // (4 chains: latency)
#pragma unroll
      for (int j = 0; j < r; j += 4) {
        const float4 a = *reinterpret_cast<const float4*>(As + r * kAs + j);
        acc[0] = fmaf(-a.x, x[j], acc[0]);
        if (j + 1 < r) acc[1] = fmaf(-a.y, x[j + 1], acc[1]);
        if (j + 2 < r) acc[2] = fmaf(-a.z, x[j + 2], acc[2]);
        if (j + 3 < r) acc[3] = fmaf(-a.w, x[j + 3], acc[3]);
      }
      x[r] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
    if (is_w) {
      __half* W = reinterpret_cast<__half*>(wk + kOffW);
#pragma unroll
      for (int r = 0; r < kPiece; ++r) W[r * kDk + col] = __float2half_rn(x[r]);
    } else {
      float* U = reinterpret_cast<float*>(wk + kOffU) + (size_t)(col - kDk) * kPiece;
#pragma unroll
      for (int r = 0; r < kPiece; r += 4)
        *reinterpret_cast<float4*>(U + r) = make_float4(x[r], x[r + 1], x[r + 2], x[r + 3]);
    }
  }
  // q and Kd = k Γ_L / Γ_t as two fp16 terms; Γ_t and Γ_L
  __half2* Q = reinterpret_cast<__half2*>(wk + kOffQ);
  __half2* Kd = reinterpret_cast<__half2*>(wk + kOffKd);
  auto two_terms = [](__half2* dst, float x, float y) {
    const __half2 hi = __floats2half2_rn(x, y);
    dst[0] = hi;
    dst[kMat / 4] = __floats2half2_rn(x - __low2float(hi), y - __high2float(hi));
  };
  for (int e = tid; e < kPiece * kDk / 2; e += kPieceThreads) {
    const int r = e / (kDk / 2), d = 2 * (e % (kDk / 2));
    two_terms(Q + e, Qs[r * kRs + d], Qs[r * kRs + d + 1]);
    two_terms(Kd + e, Ks[r * kRs + d] * ek[r], Ks[r * kRs + d + 1] * ek[r]);
  }
  float* gam = reinterpret_cast<float*>(wk + kOffGam);
  if (tid < kPiece) gam[tid] = eg[tid];
  if (tid == 0) gam[kPiece] = eg[kPiece - 1];
}

// ---- chain kernel ----
// Four warps: warp w takes value columns 16 (w / 2) .. of the block's 32 and key rows 64 (w % 2) .. of the state,
// so each SM sub-partition has a warp. The products over the key rows (S^T W^T, S^T Q^T) are summed across the
// pair of warps through shared memory (a + b = b + a: both warps hold the same bits); the pair shares P's causal
// token tiles and each updates its own half of the state.
constexpr int kChainWarps = 4;
constexpr int kChainCols = 32;                // value columns per block
constexpr int kHalf = kDk / 2;                // key rows per warp
constexpr int kHs = kDk + 8;                  // W / Q / Kd row stride in shared memory (halves: conflict-free ldmatrix)
constexpr int kPs = kPiece + 8;               // P row stride (halves)
constexpr int kUs = kPiece + 4;               // U^T row stride (floats)
// one stage: W, Q hi, lo, Kd hi, lo [kPiece][kHs] half | P hi, lo [kPiece][kPs] half | U^T [kChainCols][kUs] float |
// Γ [80] float (the work area's order)
constexpr int kSMat = kPiece * kHs * 2;
constexpr int kSW = 0, kSQ = kSW + kSMat, kSKd = kSQ + 2 * kSMat, kSP = kSKd + 2 * kSMat;
constexpr int kSU = kSP + 2 * kPiece * kPs * 2, kSGam = kSU + kChainCols * kUs * 4, kStage = kSGam + 80 * 4;
constexpr size_t kChainSmem = 2 * (size_t)kStage;
static_assert(kChainSmem <= 232448, "two stages within the 227 KB of shared memory a block may have");
static_assert(kStage % 16 == 0 && kSU % 16 == 0 && kSGam % 16 == 0, "16-byte cp.async destinations");
// the warps' partial Δ^T and o^T [2][kPiece / 8][4] per lane, exchanged over the stage's W and Q (read by then)
static_assert(kChainWarps * 2 * (kPiece / 8) * 4 * 32 * 4 <= 3 * kSMat, "partials fit over W and Q");

// the two fp16 terms of a pair of accumulator fragments (n-tiles 2 j, 2 j + 1) as an A fragment (k-step j)
__device__ __forceinline__ void split_a(const float (&c0)[4], const float (&c1)[4], uint32_t (&hi)[4],
                                        uint32_t (&lo)[4]) {
  const float v[8] = {c0[0], c0[1], c0[2], c0[3], c1[0], c1[1], c1[2], c1[3]};
  float r[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) r[e] = v[e] - __half2float(__float2half_rn(v[e]));
  hi[0] = mma::pack_f16x2(v[0], v[1]), hi[1] = mma::pack_f16x2(v[2], v[3]);
  hi[2] = mma::pack_f16x2(v[4], v[5]), hi[3] = mma::pack_f16x2(v[6], v[7]);
  lo[0] = mma::pack_f16x2(r[0], r[1]), lo[1] = mma::pack_f16x2(r[2], r[3]);
  lo[2] = mma::pack_f16x2(r[4], r[5]), lo[3] = mma::pack_f16x2(r[6], r[7]);
}

// c0, c1 (n-tiles 2 j, 2 j + 1) += (a_hi + a_lo) (b_hi + b_lo) less the lo x lo product; b's registers 0-1 are
// n-tile 2 j's, 2-3 n-tile 2 j + 1's (one ldmatrix.x4)
__device__ __forceinline__ void mma3_pair(float (&c0)[4], float (&c1)[4], const uint32_t (&ah)[4],
                                          const uint32_t (&al)[4], const uint32_t (&bh)[4], const uint32_t (&bl)[4]) {
  mma::f16_16816(c0, ah, bh[0], bh[1]);
  mma::f16_16816(c0, al, bh[0], bh[1]);
  mma::f16_16816(c0, ah, bl[0], bl[1]);
  mma::f16_16816(c1, ah, bh[2], bh[3]);
  mma::f16_16816(c1, al, bh[2], bh[3]);
  mma::f16_16816(c1, ah, bl[2], bl[3]);
}

__global__ void __launch_bounds__(kChainWarps * 32) gdn_wy_chain_kernel(const uint8_t* __restrict__ work,
                                                                        float* __restrict__ state,
                                                                        float* __restrict__ out, int pos0, int n,
                                                                        int piece0, int pieces, GdnDims dims) {
  extern __shared__ __align__(16) uint8_t smc[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int Hv = dims.n_v_heads, Dv = dims.v_dim, vd = Hv * Dv;
  const int h = blockIdx.y, bcol0 = blockIdx.x * kChainCols, wc = 16 * (warp / 2);  // block's, warp's first column
  const int dh = warp % 2, d0 = kHalf * dh;  // the warp's key rows d0 .. d0 + 63
  const size_t wbytes = work_bytes(Dv);

  auto stage = [&](int p) {
    uint8_t* B = smc + (p & 1) * kStage;
    const uint8_t* src = work + ((size_t)p * Hv + h) * wbytes;
    for (int e = tid; e < 5 * kPiece * (kDk / 8); e += kChainWarps * 32) {  // W, Q, Kd rows: 16 chunks each
      const int m = e / (kPiece * (kDk / 8)), r = (e / (kDk / 8)) % kPiece, c = e % (kDk / 8);
      mma::cp16(B + kSW + m * kSMat + r * kHs * 2 + c * 16, src + kOffW + m * kMat + r * kDk * 2 + c * 16);
    }
    for (int e = tid; e < 2 * kPiece * (kPiece / 8); e += kChainWarps * 32) {  // P hi, lo rows: 8 chunks each
      const int m = e / (kPiece * (kPiece / 8)), r = (e / (kPiece / 8)) % kPiece, c = e % (kPiece / 8);
      mma::cp16(B + kSP + m * kPiece * kPs * 2 + r * kPs * 2 + c * 16,
                src + kOffP + m * kPiece * kPiece * 2 + r * kPiece * 2 + c * 16);
    }
    for (int e = tid; e < kChainCols * (kPiece / 4); e += kChainWarps * 32) {
      const int r = e / (kPiece / 4), c = e % (kPiece / 4);
      mma::cp16(B + kSU + r * kUs * 4 + c * 16, src + kOffU + (size_t)(bcol0 + r) * kPiece * 4 + c * 16);
    }
    if (tid < 80 / 4) mma::cp16(B + kSGam + tid * 16, src + kOffGam + tid * 16);
    mma::commit();
  };

  // S^T [c][d] for the warp's 16 columns and 64 key rows in accumulator layout: st[n] = rows c = g, g + 8,
  // columns d = d0 + 8 n + 2 t, + 1
  float st[kHalf / 8][4];
  float* S = state + (size_t)h * kDk * Dv;
  const int c_lo = bcol0 + wc + g, c_hi = c_lo + 8;
#pragma unroll
  for (int nt = 0; nt < kHalf / 8; ++nt) {
    const int d = d0 + 8 * nt + 2 * t;
    st[nt][0] = S[(size_t)d * Dv + c_lo], st[nt][1] = S[(size_t)(d + 1) * Dv + c_lo];
    st[nt][2] = S[(size_t)d * Dv + c_hi], st[nt][3] = S[(size_t)(d + 1) * Dv + c_hi];
  }
  // ldmatrix lane offsets: non-transposed B from [n][k] rows (two n-tiles x one k-step), transposed B from [k][n]
  const int bn_row = (lane % 8) + 8 * (lane / 16), bn_col = 8 * ((lane / 8) % 2);
  const int bt_row = (lane % 8) + 8 * ((lane / 8) % 2), bt_col = 8 * (lane / 16);

  stage(0);
  for (int p = 0; p < pieces; ++p) {
    mma::wait<0>();
    __syncthreads();  // piece p has landed; every warp is done with piece p - 1's buffer
    if (p + 1 < pieces) stage(p + 1);
    uint8_t* B = smc + (p & 1) * kStage;
    const __half* Ws = reinterpret_cast<const __half*>(B + kSW);
    const __half* Qs = reinterpret_cast<const __half*>(B + kSQ);  // hi, then lo at + kSMat / 2 halves
    const __half* Kds = reinterpret_cast<const __half*>(B + kSKd);
    const __half* Ps = reinterpret_cast<const __half*>(B + kSP);  // hi, then lo at + kPiece * kPs halves
    const float* Us = reinterpret_cast<const float*>(B + kSU);
    const float* gam = reinterpret_cast<const float*>(B + kSGam);

    // Δ^T accumulates S^T W^T (then U^T - it), o^T accumulates S^T Q^T: [16 cols][64 tokens] each, over the
    // warp's key rows, then the pair's two halves added
    float dl[kPiece / 8][4], o[kPiece / 8][4];
#pragma unroll
    for (int nt = 0; nt < kPiece / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dl[nt][e] = 0.f, o[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHalf / 16; ++kk) {
      const float(&c0)[4] = st[2 * kk];
      const float(&c1)[4] = st[2 * kk + 1];
      const uint32_t ah[4] = {mma::pack_f16x2(c0[0], c0[1]), mma::pack_f16x2(c0[2], c0[3]),
                              mma::pack_f16x2(c1[0], c1[1]), mma::pack_f16x2(c1[2], c1[3])};  // S0: one term
#pragma unroll
      for (int np = 0; np < kPiece / 16; ++np) {
        uint32_t bw[4], bq[4], bql[4];
        const int off = (16 * np + bn_row) * kHs + d0 + 16 * kk + bn_col;
        mma::ldsm_x4(bw, Ws + off);
        mma::ldsm_x4(bq, Qs + off);
        mma::ldsm_x4(bql, Qs + kSMat / 2 + off);
        mma::f16_16816(dl[2 * np], ah, bw[0], bw[1]);
        mma::f16_16816(dl[2 * np + 1], ah, bw[2], bw[3]);
        mma::f16_16816(o[2 * np], ah, bq[0], bq[1]);
        mma::f16_16816(o[2 * np], ah, bql[0], bql[1]);
        mma::f16_16816(o[2 * np + 1], ah, bq[2], bq[3]);
        mma::f16_16816(o[2 * np + 1], ah, bql[2], bql[3]);
      }
    }
    __syncthreads();  // every warp has read W and Q: their space takes the partials
    float* X = reinterpret_cast<float*>(B + kSW);
    auto part = [&](int w, int arr, int nt, int e) -> float& {  // lane-contiguous: no bank conflicts
      return X[((w * 2 + arr) * 32 + nt * 4 + e) * 32 + lane];
    };
#pragma unroll
    for (int nt = 0; nt < kPiece / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) part(warp, 0, nt, e) = dl[nt][e], part(warp, 1, nt, e) = o[nt][e];
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < kPiece / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dl[nt][e] += part(warp ^ 1, 0, nt, e), o[nt][e] += part(warp ^ 1, 1, nt, e);
    // Δ^T = U^T - S^T W^T; o^T scaled by Γ_t per token; S^T scaled by Γ_L
#pragma unroll
    for (int nt = 0; nt < kPiece / 8; ++nt) {
      const int i = 8 * nt + 2 * t;
      const float2 u0 = *reinterpret_cast<const float2*>(Us + (wc + g) * kUs + i);
      const float2 u1 = *reinterpret_cast<const float2*>(Us + (wc + g + 8) * kUs + i);
      dl[nt][0] = u0.x - dl[nt][0], dl[nt][1] = u0.y - dl[nt][1];
      dl[nt][2] = u1.x - dl[nt][2], dl[nt][3] = u1.y - dl[nt][3];
      o[nt][0] *= gam[i], o[nt][1] *= gam[i + 1], o[nt][2] *= gam[i], o[nt][3] *= gam[i + 1];
    }
    const float gam_l = gam[kPiece];
#pragma unroll
    for (int nt = 0; nt < kHalf / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nt][e] *= gam_l;
    // o^T += Δ^T P^T (P causal: token tiles from kk on; token tiles 0 and 3 in the first warp of the pair, 1 and 2
    // in the second: 5 k-steps each), S^T += Δ^T Kd over the warp's key rows
#pragma unroll
    for (int kk = 0; kk < kPiece / 16; ++kk) {
      uint32_t vh[4], vl[4];
      split_a(dl[2 * kk], dl[2 * kk + 1], vh, vl);
#pragma unroll
      for (int np = kk; np < kPiece / 16; ++np) {
        if ((np == 0 || np == 3) != (dh == 0)) continue;
        uint32_t bp[4], bpl[4];
        const int off = (16 * np + bn_row) * kPs + 16 * kk + bn_col;
        mma::ldsm_x4(bp, Ps + off);
        mma::ldsm_x4(bpl, Ps + kPiece * kPs + off);
        mma3_pair(o[2 * np], o[2 * np + 1], vh, vl, bp, bpl);
      }
#pragma unroll
      for (int np = 0; np < kHalf / 16; ++np) {
        uint32_t bk[4], bkl[4];
        const int off = (16 * kk + bt_row) * kHs + d0 + 16 * np + bt_col;
        mma::ldsm_x4_trans(bk, Kds + off);
        mma::ldsm_x4_trans(bkl, Kds + kSMat / 2 + off);
        mma3_pair(st[2 * np], st[2 * np + 1], vh, vl, bk, bkl);
      }
    }
    // the piece's outputs: the warp's token tiles, rows of the launch only
    const int tp = (piece0 + p) * kPiece - pos0;
#pragma unroll
    for (int nt = 0; nt < kPiece / 8; ++nt) {
      const int np = nt / 2;
      if ((np == 0 || np == 3) != (dh == 0)) continue;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tok = tp + 8 * nt + 2 * t + e;
        if (tok < 0 || tok >= n) continue;
        float* row = out + (size_t)tok * vd + (size_t)h * Dv;
        row[c_lo] = o[nt][e], row[c_hi] = o[nt][2 + e];
      }
    }
  }
#pragma unroll
  for (int nt = 0; nt < kHalf / 8; ++nt) {
    const int d = d0 + 8 * nt + 2 * t;
    S[(size_t)d * Dv + c_lo] = st[nt][0], S[(size_t)(d + 1) * Dv + c_lo] = st[nt][1];
    S[(size_t)d * Dv + c_hi] = st[nt][2], S[(size_t)(d + 1) * Dv + c_hi] = st[nt][3];
  }
}

}  // namespace

bool gdn_wy_supported(GdnDims dims) {
  return dims.k_dim == kDk && dims.v_dim % kChainCols == 0 && dims.v_dim <= kDk && dims.n_k_heads > 0 &&
         dims.n_v_heads % dims.n_k_heads == 0;
}

size_t gdn_wy_work_bytes(GdnDims dims) {
  return gdn_wy_supported(dims) ? (size_t)kGroup * dims.n_v_heads * work_bytes(dims.v_dim) : 0;
}

int gdn_wy_grid() { return kPiece; }

void launch_gdn_wy(const float* prep, const float* a, const float* a_log, const float* dt_bias, float* state,
                   float* out, void* work, int pos0, int n, GdnDims dims, cudaStream_t s, int parts) {
  LILY_CHECK(gdn_wy_supported(dims), "gdn_wy: unsupported dims Dk=", dims.k_dim, " Dv=", dims.v_dim);
  LILY_CHECK(reinterpret_cast<uintptr_t>(work) % 16 == 0, "gdn_wy: work area not 16-byte aligned");
  if (n <= 0) return;
  CUDA_CHECK(cudaFuncSetAttribute(gdn_wy_piece_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kPieceSmem));
  CUDA_CHECK(cudaFuncSetAttribute(gdn_wy_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kChainSmem));
  uint8_t* wk = static_cast<uint8_t*>(work);
  const int first = pos0 / kPiece, last = (pos0 + n - 1) / kPiece;
  for (int p0 = first; p0 <= last; p0 += kGroup) {
    const int pieces = std::min(kGroup, last - p0 + 1);
    if (parts & 1) {
      gdn_wy_piece_kernel<<<dim3(pieces, dims.n_v_heads), kPieceThreads, kPieceSmem, s>>>(prep, a, a_log, dt_bias,
                                                                                         wk, pos0, n, p0, dims);
      CUDA_CHECK_LAUNCH(s);
    }
    if (parts & 2) {
      gdn_wy_chain_kernel<<<dim3(dims.v_dim / kChainCols, dims.n_v_heads), kChainWarps * 32, kChainSmem, s>>>(
          wk, state, out, pos0, n, p0, pieces, dims);
      CUDA_CHECK_LAUNCH(s);
    }
  }
}

}  // namespace lily::cuda
