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
//   gdn_wy_piece_kernel  a block per (piece, value head), on the tensor cores with two-term operands: K K^T and
//                        Q K^T, the solve for [W | U] blocked by 16 tokens, into the group's work area (W in fp16;
//                        Q, Kd, P as two fp16 terms; U^T, Γ in fp32).
//   gdn_wy_chain_kernel  a block per (value head, 32 value columns), eight warps (16 columns x a quarter of the key
//                        rows and of the piece's tokens each), through the group's pieces in order: the state slice
//                        S^T [16 cols][Dk / 4] stays in each warp's mma accumulators for the whole launch, its fp16
//                        term shared through shared memory; the next piece's operands come into shared memory
//                        (cp.async) while the warps work on this one.
// Precision (issue 28's bound for the prompt path: median 2e-3, top-1 99 % of fp64): every operand as two fp16
// terms (hi + lo: ~22 bits; hi x hi, lo x hi and hi x lo products) except W and the state S_0 in W S_0 and
// Q S_0, one term each (an emulation, bench/RESULTS.md: W's rounding moves the outputs ~50x less than P's or Q's
// would, S_0's not measurably); sums and the state itself in fp32.
// Tested against an fp64 recurrence and an emulation of these roundings in tests/gpu/test_mixer_kernels.cu.
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/gdn_core.cuh"
#include "kernels/gdn_prep.cuh"
#include "kernels/mma.cuh"

namespace lily::cuda {

namespace {

constexpr int kPiece = 64;  // tokens per piece
constexpr int kDk = 128;    // the only key width this path takes (launcher checks)
constexpr int kGroup = 32;  // pieces per work area (~134 MB for the real model)

// One (piece, value head)'s work area: byte offsets (hi and lo: the two fp16 terms). U^T is [Dv][kPiece], Dv <= 128.
constexpr int kMat = kPiece * kDk * 2;                    // bytes of a half [kPiece][kDk]
constexpr int kOffW = 0;                                  // half [kPiece][kDk]
constexpr int kOffQ = kOffW + kMat;                       // hi, lo: half [kPiece][kDk]: q (not scaled by Γ)
constexpr int kOffKd = kOffQ + 2 * kMat;                  // hi, lo: half [kPiece][kDk]
constexpr int kOffP = kOffKd + 2 * kMat;                  // hi, lo: half [kPiece][kPiece]
constexpr int kOffGam = kOffP + 2 * kPiece * kPiece * 2;  // float [kPiece] Γ_t, then Γ_L, padded to 80 floats
constexpr int kOffU = kOffGam + 80 * 4;                   // float [Dv][kPiece]
constexpr size_t work_bytes(int Dv) { return (size_t)kOffU + (size_t)Dv * kPiece * 4; }

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

// two fp16 terms of (x, y): hi = fp16(x), lo = fp16(x - hi)
__device__ __forceinline__ void split2(__half2& hi, __half2& lo, float x, float y) {
  hi = __floats2half2_rn(x, y);
  lo = __floats2half2_rn(x - __low2float(hi), y - __high2float(hi));
}

// ldmatrix lane offsets: an A fragment from [m][k] rows; a B fragment pair (two n-tiles x one k-step) from [n][k]
// rows
__device__ __forceinline__ int a_row(int lane) { return lane % 16; }
__device__ __forceinline__ int a_col(int lane) { return 8 * (lane / 16); }
__device__ __forceinline__ int bn_row(int lane) { return (lane % 8) + 8 * (lane / 16); }
__device__ __forceinline__ int bn_col(int lane) { return 8 * ((lane / 8) % 2); }

// ---- piece kernel ----
// Eight warps. K K^T and Q K^T are 20 lower 16 x 16 blocks (10 each) spread over the warps. The solve for
// X = [W | U] = (I + A)^-1 R is blocked by 16 tokens: X_b = T_b (R_b - sum_{c < b} A_bc X_c) with
// T_b = (I + A_bb)^-1 from a forward substitution on the CUDA cores; each warp holds 32 columns of X^T in its
// accumulators (W's columns in warps 0-3, U's in 4-7), so the products need no block barrier. k and q enter the
// products scaled by powers of two, so that their fp16 terms stay clear of the subnormals.
constexpr int kPieceThreads = 256;
constexpr int kKs = kDk + 8;      // K / Q row stride in shared memory (halves: conflict-free ldmatrix)
constexpr int kNs = kPiece + 8;   // -A row stride (halves)
constexpr int kTs = 24;           // T_b row stride (halves)
constexpr int kDs = 17;           // A's diagonal blocks' row stride (floats)
constexpr float kKScale = 16.f, kQScale = 256.f;  // |k| = 1 and |q| = Dk^-1/2 from the prep
// shared memory (bytes): K hi, lo, Q hi, lo [kPiece][kKs] half | -A hi, lo [kPiece][kNs] half (the blocks below the
// diagonal) | A's diagonal blocks [kPiece][kDs] float | T_b hi, lo [kPiece][kTs] half | log Γ [kPiece] double |
// β, Γ, Γ_L / Γ [kPiece] float
constexpr int kPMat = kPiece * kKs * 2;
constexpr int kPK = 0, kPQ = kPK + 2 * kPMat, kPNa = kPQ + 2 * kPMat, kPAd = kPNa + 2 * kPiece * kNs * 2;
constexpr int kPT = kPAd + kPiece * kDs * 4, kPLg = kPT + 2 * kPiece * kTs * 2, kPBt = kPLg + kPiece * 8;
constexpr size_t kPieceSmem = kPBt + 3 * kPiece * 4;
static_assert(2 * kPieceSmem <= 227 * 1024, "two blocks per SM");
static_assert(kPNa % 16 == 0 && kPT % 16 == 0 && kPLg % 8 == 0, "ldmatrix rows and doubles aligned");

template <bool VEC>
__device__ __forceinline__ float4 load4(const float* p) {
  if constexpr (VEC) return *reinterpret_cast<const float4*>(p);
  return make_float4(p[0], p[1], p[2], p[3]);
}

__global__ void __launch_bounds__(kPieceThreads, 2) gdn_wy_piece_kernel(
    const float* __restrict__ prep, const float* __restrict__ a_in, const float* __restrict__ a_log,
    const float* __restrict__ dt_bias, uint8_t* __restrict__ work, int pos0, int n, int piece0, GdnDims dims) {
  extern __shared__ __align__(16) uint8_t smp[];
  __half* Kh = reinterpret_cast<__half*>(smp + kPK);  // lo at + kPiece * kKs; likewise Q, -A, T
  __half* Qh = reinterpret_cast<__half*>(smp + kPQ);
  __half* Na = reinterpret_cast<__half*>(smp + kPNa);
  float* Ad = reinterpret_cast<float*>(smp + kPAd);
  __half* Th = reinterpret_cast<__half*>(smp + kPT);
  double* lg = reinterpret_cast<double*>(smp + kPLg);  // log Γ_t (in double: Γ_t / Γ_s from a difference of sums)
  float* bt = reinterpret_cast<float*>(smp + kPBt);    // β_t (0 past the launch's tokens)
  float* eg = bt + kPiece;                             // Γ_t
  float* ek = eg + kPiece;                             // Γ_L / Γ_t
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int Hk = dims.n_k_heads, Hv = dims.n_v_heads, Dv = dims.v_dim;
  const int h = blockIdx.y, kh = h / (Hv / Hk), pp = blockIdx.x;
  const PrepRow L{Hk * kDk, Hv * Dv, Hk, Hv};
  const int t0 = (piece0 + pp) * kPiece - pos0;  // the launch's token at the piece's row 0 (< 0: before the launch)
  uint8_t* wk = work + ((size_t)pp * Hv + h) * work_bytes(Dv);
  auto in_launch = [&](int r) { return t0 + r >= 0 && t0 + r < n; };

  // k and q: the fp16 terms of kKScale k and kQScale q into shared memory; q's own terms into the work area. Rows
  // are clamped into the launch and zeroed after the load, so that every load of a thread is issued at once.
  auto clamp_row = [&](int r) { return prep + (size_t)min(max(t0 + r, 0), n - 1) * L.width(); };
  auto kq_rows = [&](auto vec_c) {
    constexpr bool vec = decltype(vec_c)::value;
    __half2* Qw = reinterpret_cast<__half2*>(wk + kOffQ);
#pragma unroll 8
    for (int e = tid; e < kPiece * (kDk / 4); e += kPieceThreads) {
      const int r = e / (kDk / 4), d = 4 * (e % (kDk / 4));
      const float* row = clamp_row(r);
      float4 kv = load4<vec>(row + L.k(kh) + d), qv = load4<vec>(row + L.q(kh) + d);
      if (!in_launch(r)) kv = qv = make_float4(0.f, 0.f, 0.f, 0.f);
      __half2 h2[2][2], l2[2][2];
      split2(h2[0][0], l2[0][0], kKScale * kv.x, kKScale * kv.y);
      split2(h2[0][1], l2[0][1], kKScale * kv.z, kKScale * kv.w);
      split2(h2[1][0], l2[1][0], kQScale * qv.x, kQScale * qv.y);
      split2(h2[1][1], l2[1][1], kQScale * qv.z, kQScale * qv.w);
      const int o = r * kKs + d;
      *reinterpret_cast<uint2*>(Kh + o) = *reinterpret_cast<const uint2*>(h2[0]);
      *reinterpret_cast<uint2*>(Kh + kPiece * kKs + o) = *reinterpret_cast<const uint2*>(l2[0]);
      *reinterpret_cast<uint2*>(Qh + o) = *reinterpret_cast<const uint2*>(h2[1]);
      *reinterpret_cast<uint2*>(Qh + kPiece * kKs + o) = *reinterpret_cast<const uint2*>(l2[1]);
      __half2 qh[2], ql[2];
      split2(qh[0], ql[0], qv.x, qv.y);
      split2(qh[1], ql[1], qv.z, qv.w);
      *reinterpret_cast<uint2*>(Qw + e * 2) = *reinterpret_cast<const uint2*>(qh);
      *reinterpret_cast<uint2*>(Qw + kMat / 4 + e * 2) = *reinterpret_cast<const uint2*>(ql);
    }
  };
  if (L.width() % 4 == 0)
    kq_rows(std::true_type{});
  else
    kq_rows(std::false_type{});
  if (warp == 0) {  // β and the inclusive prefix sums of the log decays (lane: rows 2 lane, 2 lane + 1); rows
                    // past the launch's tokens: k = q = v = 0, β = 0, decay 1 (they change nothing)
    float ld[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int r = 2 * lane + u, tk = t0 + r;
      const bool ok = in_launch(r);
      bt[r] = ok ? prep[(size_t)tk * L.width() + L.beta(h)] : 0.f;
      ld[u] = ok ? -__expf(a_log[h]) * gdn::softplus(a_in[(size_t)tk * Hv + h] + dt_bias[h]) : 0.f;
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
  __syncthreads();
  if (tid < kPiece) {
    eg[tid] = __expf((float)lg[tid]);
    ek[tid] = __expf((float)(lg[kPiece - 1] - lg[tid]));
  }

  // X^T = [W | U]^T in the warp's accumulators, 32 columns a warp (W's in warps 0-3, U's in 4-7): X[m][nt] = rows
  // (columns of X) col0 + 16 m + g, + 8, tokens 8 nt + 2 t, + 1. U's warps load v here (their latency covered by
  // the products below); the right-hand sides R = [diag(β Γ) K | diag(β) V] are complete after them.
  const bool w_cols = warp < 4;
  const int col0 = 32 * (warp % 4);
  const bool active = w_cols || col0 < Dv;
  float X[2][kPiece / 8][4];
  auto x_at = [&](int m, int nt, int e, int& col, int& r) {
    col = col0 + 16 * m + g + 8 * (e / 2), r = 8 * nt + 2 * t + e % 2;
  };
  auto each_x = [&](auto&& f) {  // f(m, nt, e) for each of the thread's elements X[m][nt][e]
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int nt = 0; nt < kPiece / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) f(m, nt, e);
  };
  if (!w_cols && active) {
    each_x([&](int m, int nt, int e) {
      int col, r;
      x_at(m, nt, e, col, r);
      X[m][nt][e] = clamp_row(r)[L.v(h) + col];
    });
  }

  // K K^T and Q K^T: tile 0-9 the lower blocks (bi, bj) of K K^T in row order, 10-19 those of Q K^T. A's blocks
  // below the diagonal go to shared memory negated as two fp16 terms, its diagonal blocks in fp32; P to the work
  // area as two fp16 terms (the blocks above the diagonal are never read)
  {
    __half* Pw = reinterpret_cast<__half*>(wk + kOffP);
    for (int tile = warp; tile < 20; tile += kPieceThreads / 32) {
      const bool is_p = tile >= 10;
      const int lt = tile % 10, bi = lt >= 6 ? 3 : lt >= 3 ? 2 : lt >= 1 ? 1 : 0, bj = lt - bi * (bi + 1) / 2;
      const __half* lhs = is_p ? Qh : Kh;  // (the rows of the product: q or k)
      float c[2][4] = {};
#pragma unroll
      for (int ks = 0; ks < kDk / 16; ++ks) {
        uint32_t ah[4], al[4], bh[4], bl[4];
        const int ao = (16 * bi + a_row(lane)) * kKs + 16 * ks + a_col(lane);
        const int bo = (16 * bj + bn_row(lane)) * kKs + 16 * ks + bn_col(lane);
        mma::ldsm_x4(ah, lhs + ao);
        mma::ldsm_x4(al, lhs + kPiece * kKs + ao);
        mma::ldsm_x4(bh, Kh + bo);
        mma::ldsm_x4(bl, Kh + kPiece * kKs + bo);
        mma3_pair(c[0], c[1], ah, al, bh, bl);
      }
      const float sc = 1.f / ((is_p ? kQScale : kKScale) * kKScale);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {  // rows g, g + 8 of the block
          const int i = 16 * bi + g + 8 * hr, j = 16 * bj + 8 * nt + 2 * t;
          float v[2];
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const float ratio = j + u <= i ? __expf((float)(lg[i] - lg[j + u])) : 0.f;
            const float x = c[nt][2 * hr + u] * sc;
            v[u] = is_p ? x * ratio : (j + u < i ? bt[i] * x * ratio : 0.f);
          }
          if (is_p) {
            __half2 hi, lo;
            split2(hi, lo, v[0], v[1]);
            *reinterpret_cast<__half2*>(Pw + i * kPiece + j) = hi;
            *reinterpret_cast<__half2*>(Pw + kPiece * kPiece + i * kPiece + j) = lo;
          } else if (bi > bj) {
            __half2 hi, lo;
            split2(hi, lo, -v[0], -v[1]);
            *reinterpret_cast<__half2*>(Na + i * kNs + j) = hi;
            *reinterpret_cast<__half2*>(Na + kPiece * kNs + i * kNs + j) = lo;
          } else {
            Ad[i * kDs + j - 16 * bj] = v[0], Ad[i * kDs + j + 1 - 16 * bj] = v[1];
          }
        }
    }
  }
  __syncthreads();

  // T_b = (I + A_bb)^-1 by forward substitution (a thread per column of a block)
  if (tid < kPiece) {
    const int b = tid / 16, j = tid % 16;
    float x[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      float acc = r == j ? 1.f : 0.f;
#pragma unroll
      for (int s = 0; s < r; ++s) acc = fmaf(-Ad[(16 * b + r) * kDs + s], x[s], acc);
      x[r] = acc;
      const __half hi = __float2half_rn(acc);
      Th[(16 * b + r) * kTs + j] = hi;
      Th[kPiece * kTs + (16 * b + r) * kTs + j] = __float2half_rn(acc - __half2float(hi));
    }
  }
  // Kd = k Γ_L / Γ_t as two fp16 terms (k from its scaled terms: their sum is exact in fp32); Γ_t and Γ_L
  {
    __half2* Kd = reinterpret_cast<__half2*>(wk + kOffKd);
    for (int e = tid; e < kPiece * kDk / 2; e += kPieceThreads) {
      const int r = e / (kDk / 2), d = 2 * (e % (kDk / 2));
      const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(Kh + r * kKs + d));
      const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(Kh + kPiece * kKs + r * kKs + d));
      __half2 dh, dl;
      split2(dh, dl, (hi.x + lo.x) * (1.f / kKScale) * ek[r], (hi.y + lo.y) * (1.f / kKScale) * ek[r]);
      Kd[e] = dh, Kd[kMat / 4 + e] = dl;
    }
    float* gam = reinterpret_cast<float*>(wk + kOffGam);
    if (tid < kPiece) gam[tid] = eg[tid];
    if (tid == 0) gam[kPiece] = eg[kPiece - 1];
  }
  each_x([&](int m, int nt, int e) {
    int col, r;
    x_at(m, nt, e, col, r);
    if (w_cols) {
      const float k =
          (__half2float(Kh[r * kKs + col]) + __half2float(Kh[kPiece * kKs + r * kKs + col])) * (1.f / kKScale);
      X[m][nt][e] = bt[r] * eg[r] * k;
    } else if (active) {
      X[m][nt][e] = in_launch(r) ? bt[r] * X[m][nt][e] : 0.f;
    }
  });
  __syncthreads();

  // the blocked solve
  if (active) {
#pragma unroll
    for (int b = 0; b < kPiece / 16; ++b) {
#pragma unroll
      for (int c = 0; c < b; ++c) {
        uint32_t bh[4], bl[4];
        const int off = (16 * b + bn_row(lane)) * kNs + 16 * c + bn_col(lane);
        mma::ldsm_x4(bh, Na + off);
        mma::ldsm_x4(bl, Na + kPiece * kNs + off);
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          uint32_t ah[4], al[4];
          split_a(X[m][2 * c], X[m][2 * c + 1], ah, al);
          mma3_pair(X[m][2 * b], X[m][2 * b + 1], ah, al, bh, bl);
        }
      }
      uint32_t bh[4], bl[4];
      const int off = (16 * b + bn_row(lane)) * kTs + bn_col(lane);
      mma::ldsm_x4(bh, Th + off);
      mma::ldsm_x4(bl, Th + kPiece * kTs + off);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        uint32_t ah[4], al[4];
        split_a(X[m][2 * b], X[m][2 * b + 1], ah, al);
        float z0[4] = {}, z1[4] = {};
        mma3_pair(z0, z1, ah, al, bh, bl);
#pragma unroll
        for (int e = 0; e < 4; ++e) X[m][2 * b][e] = z0[e], X[m][2 * b + 1][e] = z1[e];
      }
    }
  }
  // W (one fp16 term, staged over Q's terms: read by now) and U^T (fp32) into the work area
  if (active) {
    float* U = reinterpret_cast<float*>(wk + kOffU);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int nt = 0; nt < kPiece / 8; ++nt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int col = col0 + 16 * m + g + 8 * hr, r = 8 * nt + 2 * t;
          if (w_cols) {
            Qh[r * kKs + col] = __float2half_rn(X[m][nt][2 * hr]);
            Qh[(r + 1) * kKs + col] = __float2half_rn(X[m][nt][2 * hr + 1]);
          } else {
            *reinterpret_cast<float2*>(U + (size_t)col * kPiece + r) =
                make_float2(X[m][nt][2 * hr], X[m][nt][2 * hr + 1]);
          }
        }
  }
  __syncthreads();
  for (int e = tid; e < kPiece * kDk / 8; e += kPieceThreads) {
    const int r = e / (kDk / 8), c = 8 * (e % (kDk / 8));
    *reinterpret_cast<uint4*>(wk + kOffW + (r * kDk + c) * 2) = *reinterpret_cast<const uint4*>(Qh + r * kKs + c);
  }
}

// ---- chain kernel ----
// Eight warps over the block's 32 value columns: warp w takes columns 16 (w / 4) .. (its column group) and, of a
// piece, the 16 tokens 16 q .. (q = w % 4) and the state's key rows 32 q .. . Each piece:
//   1. for its tokens, over all key rows: Δ^T = U^T - S^T W^T and o^T = Γ S^T Q^T, S^T read from shared memory
//      (one fp16 term, as the products take it); Δ^T into shared memory as two fp16 terms;
//   2. after a barrier, with the column group's whole Δ^T: o^T += Δ^T P^T over the causal token tiles, and its
//      key rows of the state S^T = Γ_L S^T + Δ^T Kd in its accumulators, then their fp16 term into shared memory
//      for the next piece.
// So no partial sums cross warps, and each SM scheduler has two warps. W, Kd, P, U^T and Γ are double-buffered;
// Q has one buffer, filled for the next piece once every warp is past step 1.
constexpr int kChainWarps = 8;
constexpr int kChainCols = 32;                // value columns per block
constexpr int kQuarter = kDk / 4;             // key rows per warp
constexpr int kHs = kDk + 8;                  // W / Q / Kd / S^T row stride in shared memory (halves: conflict-free)
constexpr int kPs = kPiece + 8;               // P / Δ^T row stride (halves)
constexpr int kUs = kPiece + 4;               // U^T row stride (floats)
// one stage: W, Kd hi, lo [kPiece][kHs] half | P hi, lo [kPiece][kPs] half | U^T [kChainCols][kUs] float | Γ [80]
// float; then the two stages, Q hi, lo [kPiece][kHs] half, S^T [kChainCols][kHs] half, Δ^T hi, lo
// [kChainCols][kPs] half
constexpr int kSMat = kPiece * kHs * 2;
constexpr int kSW = 0, kSKd = kSW + kSMat, kSP = kSKd + 2 * kSMat;
constexpr int kSU = kSP + 2 * kPiece * kPs * 2, kSGam = kSU + kChainCols * kUs * 4, kStage = kSGam + 80 * 4;
constexpr int kSQ = 2 * kStage, kSS = kSQ + 2 * kSMat, kSD = kSS + kChainCols * kHs * 2;
constexpr size_t kChainSmem = kSD + 2 * (size_t)kChainCols * kPs * 2;
static_assert(kChainSmem <= 232448, "within the 227 KB of shared memory a block may have");
static_assert(kStage % 16 == 0 && kSU % 16 == 0 && kSGam % 16 == 0 && kSQ % 16 == 0 && kSS % 16 == 0 &&
                  kSD % 16 == 0,
              "16-byte cp.async destinations and ldmatrix rows");

__global__ void __launch_bounds__(kChainWarps * 32) gdn_wy_chain_kernel(const uint8_t* __restrict__ work,
                                                                        float* __restrict__ state,
                                                                        float* __restrict__ out, int pos0, int n,
                                                                        int piece0, int pieces, GdnDims dims) {
  extern __shared__ __align__(16) uint8_t smc[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int Hv = dims.n_v_heads, Dv = dims.v_dim, vd = Hv * Dv;
  const int h = blockIdx.y, bcol0 = blockIdx.x * kChainCols, wc = 16 * (warp / 4);  // block's, warp's first column
  const int q = warp % 4, d0 = kQuarter * q;  // the warp's tokens 16 q .., key rows d0 .. d0 + 31
  const size_t wbytes = work_bytes(Dv);
  __half* Qs = reinterpret_cast<__half*>(smc + kSQ);  // hi, then lo at + kPiece * kHs
  __half* Ss = reinterpret_cast<__half*>(smc + kSS);  // S^T [column][key row]
  __half* Ds = reinterpret_cast<__half*>(smc + kSD);  // Δ^T [column][token] hi, then lo at + kChainCols * kPs

  // a thread's copies are the same for every piece but for the source and the stage: W, Kd, Q and U^T rows
  // r16 + 16 j (16 chunks of 16 bytes a row: chunk c16), P rows r8 + 32 j (8 chunks: c8)
  static_assert(kChainWarps * 32 == 256 && kChainCols % 16 == 0, "the copy pattern below");
  const int c16 = tid % 16, r16 = tid / 16, c8 = tid % 8, r8 = tid / 8;
  const uint32_t s0 = static_cast<uint32_t>(__cvta_generic_to_shared(smc));
  const uint32_t d_mat = s0 + kSW + r16 * kHs * 2 + c16 * 16, d_p = s0 + kSP + r8 * kPs * 2 + c8 * 16;
  const uint32_t d_u = s0 + kSU + r16 * kUs * 4 + c16 * 16, d_q = s0 + kSQ + r16 * kHs * 2 + c16 * 16;
  const size_t s_mat = r16 * kDk * 2 + c16 * 16, s_p = kOffP + r8 * kPiece * 2 + c8 * 16;
  const size_t s_u = kOffU + (size_t)(bcol0 + r16) * kPiece * 4 + c16 * 16;
  auto src_of = [&](int p) { return work + ((size_t)p * Hv + h) * wbytes; };
  auto stage = [&](int p) {  // W, Kd, P, U^T, Γ of piece p
    const uint32_t b = (p & 1) * kStage;
    const uint8_t* src = src_of(p);
#pragma unroll
    for (int j = 0; j < kPiece / 16; ++j)  // W
      mma::cp16s(d_mat + b + j * 16 * kHs * 2, src + kOffW + s_mat + j * 16 * kDk * 2);
#pragma unroll
    for (int m = 0; m < 2; ++m)  // Kd hi, lo
#pragma unroll
      for (int j = 0; j < kPiece / 16; ++j)
        mma::cp16s(d_mat + b + kSKd - kSW + m * kSMat + j * 16 * kHs * 2,
                   src + kOffKd + m * kMat + s_mat + j * 16 * kDk * 2);
#pragma unroll
    for (int m = 0; m < 2; ++m)  // P hi, lo
#pragma unroll
      for (int j = 0; j < kPiece / 32; ++j)
        mma::cp16s(d_p + b + m * kPiece * kPs * 2 + j * 32 * kPs * 2,
                   src + s_p + m * kPiece * kPiece * 2 + j * 32 * kPiece * 2);
#pragma unroll
    for (int j = 0; j < kChainCols / 16; ++j) mma::cp16s(d_u + b + j * 16 * kUs * 4, src + s_u + j * 16 * kPiece * 4);
    if (tid < 80 / 4) mma::cp16s(s0 + b + kSGam + tid * 16, src + kOffGam + tid * 16);
    mma::commit();
  };
  auto stage_q = [&](int p) {  // Q hi, lo of piece p
    const uint8_t* src = src_of(p);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int j = 0; j < kPiece / 16; ++j)
        mma::cp16s(d_q + m * kSMat + j * 16 * kHs * 2, src + kOffQ + m * kMat + s_mat + j * 16 * kDk * 2);
    mma::commit();
  };

  // the warp's 16 columns x 32 key rows of S^T in accumulator layout: st[nt] = rows c = g, g + 8, columns (key
  // rows) d = d0 + 8 nt + 2 t, + 1; their fp16 term into Ss
  float st[kQuarter / 8][4];
  float* S = state + (size_t)h * kDk * Dv;
  const int c_lo = bcol0 + wc + g, c_hi = c_lo + 8;
  auto store_s = [&] {
#pragma unroll
    for (int nt = 0; nt < kQuarter / 8; ++nt) {
      const int d = d0 + 8 * nt + 2 * t;
      *reinterpret_cast<__half2*>(Ss + (wc + g) * kHs + d) = __floats2half2_rn(st[nt][0], st[nt][1]);
      *reinterpret_cast<__half2*>(Ss + (wc + g + 8) * kHs + d) = __floats2half2_rn(st[nt][2], st[nt][3]);
    }
  };
#pragma unroll
  for (int nt = 0; nt < kQuarter / 8; ++nt) {
    const int d = d0 + 8 * nt + 2 * t;
    st[nt][0] = S[(size_t)d * Dv + c_lo], st[nt][1] = S[(size_t)(d + 1) * Dv + c_lo];
    st[nt][2] = S[(size_t)d * Dv + c_hi], st[nt][3] = S[(size_t)(d + 1) * Dv + c_hi];
  }
  store_s();
  // ldmatrix lane offsets of a transposed B pair from [k][n] rows
  const int bt_row = (lane % 8) + 8 * ((lane / 8) % 2), bt_col = 8 * (lane / 16);

  stage(0);
  stage_q(0);
  for (int p = 0; p < pieces; ++p) {
    mma::wait<0>();
    __syncthreads();  // piece p has landed, S^T is complete; every warp is done with piece p - 1's buffers
    if (p + 1 < pieces) stage(p + 1);
    const uint8_t* B = smc + (p & 1) * kStage;
    const __half* Ws = reinterpret_cast<const __half*>(B + kSW);
    const __half* Kds = reinterpret_cast<const __half*>(B + kSKd);  // hi, then lo at + kSMat / 2 halves
    const __half* Ps = reinterpret_cast<const __half*>(B + kSP);    // hi, then lo at + kPiece * kPs halves
    const float* Us = reinterpret_cast<const float*>(B + kSU);
    const float* gam = reinterpret_cast<const float*>(B + kSGam);

    // 1. the warp's tokens over all key rows: Δ^T accumulates S^T W^T, o^T S^T Q^T ([16 columns][16 tokens])
    float dl[2][4] = {}, o[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < kDk / 16; ++kk) {
      uint32_t a[4], bw[4], bq[4], bql[4];
      mma::ldsm_x4(a, Ss + (wc + a_row(lane)) * kHs + 16 * kk + a_col(lane));
      const int off = (16 * q + bn_row(lane)) * kHs + 16 * kk + bn_col(lane);
      mma::ldsm_x4(bw, Ws + off);
      mma::ldsm_x4(bq, Qs + off);
      mma::ldsm_x4(bql, Qs + kSMat / 2 + off);
      mma::f16_16816(dl[0], a, bw[0], bw[1]);
      mma::f16_16816(dl[1], a, bw[2], bw[3]);
      mma::f16_16816(o[0], a, bq[0], bq[1]);
      mma::f16_16816(o[0], a, bql[0], bql[1]);
      mma::f16_16816(o[1], a, bq[2], bq[3]);
      mma::f16_16816(o[1], a, bql[2], bql[3]);
    }
    // Δ^T = U^T - S^T W^T (into shared memory as two fp16 terms); o^T scaled by Γ_t
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int i = 16 * q + 8 * nt + 2 * t;
      const float2 u0 = *reinterpret_cast<const float2*>(Us + (wc + g) * kUs + i);
      const float2 u1 = *reinterpret_cast<const float2*>(Us + (wc + g + 8) * kUs + i);
      __half2 hi, lo;
      split2(hi, lo, u0.x - dl[nt][0], u0.y - dl[nt][1]);
      *reinterpret_cast<__half2*>(Ds + (wc + g) * kPs + i) = hi;
      *reinterpret_cast<__half2*>(Ds + kChainCols * kPs + (wc + g) * kPs + i) = lo;
      split2(hi, lo, u1.x - dl[nt][2], u1.y - dl[nt][3]);
      *reinterpret_cast<__half2*>(Ds + (wc + g + 8) * kPs + i) = hi;
      *reinterpret_cast<__half2*>(Ds + kChainCols * kPs + (wc + g + 8) * kPs + i) = lo;
      o[nt][0] *= gam[i], o[nt][1] *= gam[i + 1], o[nt][2] *= gam[i], o[nt][3] *= gam[i + 1];
    }
    __syncthreads();  // Δ^T complete; every warp is done with Q and S^T
    if (p + 1 < pieces) stage_q(p + 1);

    // 2. o^T += Δ^T P^T over the token tiles up to the warp's (P causal); S^T = Γ_L S^T + Δ^T Kd over its key rows
    const float gam_l = gam[kPiece];
#pragma unroll
    for (int nt = 0; nt < kQuarter / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nt][e] *= gam_l;
#pragma unroll
    for (int kk = 0; kk < kPiece / 16; ++kk) {
      uint32_t vh[4], vl[4];
      const int aoff = (wc + a_row(lane)) * kPs + 16 * kk + a_col(lane);
      mma::ldsm_x4(vh, Ds + aoff);
      mma::ldsm_x4(vl, Ds + kChainCols * kPs + aoff);
      if (kk <= q) {
        uint32_t bp[4], bpl[4];
        const int off = (16 * q + bn_row(lane)) * kPs + 16 * kk + bn_col(lane);
        mma::ldsm_x4(bp, Ps + off);
        mma::ldsm_x4(bpl, Ps + kPiece * kPs + off);
        mma3_pair(o[0], o[1], vh, vl, bp, bpl);
      }
#pragma unroll
      for (int np = 0; np < kQuarter / 16; ++np) {
        uint32_t bk[4], bkl[4];
        const int off = (16 * kk + bt_row) * kHs + d0 + 16 * np + bt_col;
        mma::ldsm_x4_trans(bk, Kds + off);
        mma::ldsm_x4_trans(bkl, Kds + kSMat / 2 + off);
        mma3_pair(st[2 * np], st[2 * np + 1], vh, vl, bk, bkl);
      }
    }
    store_s();  // (S^T is read again only after the next piece's first barrier)
    // the warp's outputs, rows of the launch only
    const int tp = (piece0 + p) * kPiece - pos0 + 16 * q;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tok = tp + 8 * nt + 2 * t + e;
        if (tok < 0 || tok >= n) continue;
        float* row = out + (size_t)tok * vd + (size_t)h * Dv;
        row[c_lo] = o[nt][e], row[c_hi] = o[nt][2 + e];
      }
  }
#pragma unroll
  for (int nt = 0; nt < kQuarter / 8; ++nt) {
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
