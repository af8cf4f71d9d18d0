// The Gated DeltaNet over a prompt chunk in the chunked (WY) form on the tensor cores (docs/model.md §2.2), for
// the real model's head size (Dk = Dv = 128). Tokens go in pieces of 64 at absolute positions that are multiples
// of 64 (the first and last piece of a launch may be shorter), so a prompt resumed at such a position repeats the
// whole prompt's arithmetic. Per piece and value head, with lam_i the running sum of log decays from the piece's
// start (Gam_i = e^lam_i) and the piece's start state S0 [Dk][Dv]:
//   A_ij = beta_i e^(lam_i - lam_j) k_i.k_j (j < i),  T = (I + A)^-1,
//   W = T diag(beta Gam) K,  U = T diag(beta) V,  P_ij = e^(lam_i - lam_j) q_i.k_j (j <= i),
//   Delta = U - W S0,  o = diag(Gam) Q S0 + P Delta,  S = Gam_last S0 + (diag(e^(lam_last - lam_j)) K)^T Delta,
// which is the token-by-token recurrence (kernels/gdn_core.cuh) regrouped. Two launches after the prep kernel:
//   gdn_wy_piece_kernel  every piece and value head at once (no state): the Gram matrices K K^T and Q K^T on the
//                        tensor cores, T applied by forward substitution in fp32 (a thread per column of
//                        [K | V]), W, U, P and the decays the chain needs into the work area.
//   gdn_wy_chain_kernel  a block per (value head, 32 state columns) walks the pieces in order, the state slice in
//                        the tensor cores' fp32 accumulators: Delta, o, then the state update, three products.
// Every product takes both operands as two bf16 terms (hi + lo, three mma.sync: ~2^-16 of each product's size,
// fp32 range) and sums in fp32 (errors ~20-30x the sequential fp32 kernel's, far inside the prompt path's budget);
// the running sums of log decays are kept in fp64 so that a strong decay does not blur the later ones.
// Tested against the fp64 recurrence and a CPU emulation of this arithmetic in tests/gpu/test_gdn_wy.cu.
#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/gdn_prep.cuh"
#include "kernels/mma.cuh"

namespace lily::cuda {

namespace {

constexpr int kPiece = 64;        // tokens per piece
constexpr int kD = 128;           // Dk = Dv
constexpr int kLd = kD + 4;       // row stride of [64][128] fp32 tiles in shared memory (fragment reads ~2-way)
constexpr int kLdP = kPiece + 4;  // row stride of [64][64] and [32][64] tiles
constexpr int kCols = 32;         // state columns per chain block

// x0, x1 as two bf16 terms: hi = bf16(x), lo = bf16(x - hi), the first element in the low half.
__device__ __forceinline__ void split2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const float h0 = mma::bf16_round(x0), h1 = mma::bf16_round(x1);
  hi = mma::pack_bf16x2(h0, h1);
  lo = mma::pack_bf16x2(x0 - h0, x1 - h1);
}

// The m16n8k16 A fragment (16 x 16 at r0, k0; at(row, k)) and B fragment (16 x 8 at k0, n0; at(k, col)), split.
template <class F>
__device__ __forceinline__ void frag_a(F at, int r0, int k0, uint32_t (&hi)[4], uint32_t (&lo)[4]) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  split2(at(r0 + g, k0 + 2 * t), at(r0 + g, k0 + 2 * t + 1), hi[0], lo[0]);
  split2(at(r0 + g + 8, k0 + 2 * t), at(r0 + g + 8, k0 + 2 * t + 1), hi[1], lo[1]);
  split2(at(r0 + g, k0 + 2 * t + 8), at(r0 + g, k0 + 2 * t + 9), hi[2], lo[2]);
  split2(at(r0 + g + 8, k0 + 2 * t + 8), at(r0 + g + 8, k0 + 2 * t + 9), hi[3], lo[3]);
}
template <class F>
__device__ __forceinline__ void frag_b(F at, int k0, int n0, uint32_t (&hi)[2], uint32_t (&lo)[2]) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  split2(at(k0 + 2 * t, n0 + g), at(k0 + 2 * t + 1, n0 + g), hi[0], lo[0]);
  split2(at(k0 + 2 * t + 8, n0 + g), at(k0 + 2 * t + 9, n0 + g), hi[1], lo[1]);
}
// c += a b with both split: lo hi + hi lo + hi hi (the lo lo term is below fp32's rounding of the sum)
__device__ __forceinline__ void mma3(float (&c)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                     const uint32_t (&bh)[2], const uint32_t (&bl)[2]) {
  mma::bf16_16816(c, al, bh[0], bh[1]);
  mma::bf16_16816(c, ah, bl[0], bl[1]);
  mma::bf16_16816(c, ah, bh[0], bh[1]);
}

// Pieces of a launch of n tokens from position pos0: piece p covers launch rows [start, start + len).
struct Pieces {
  int pos0, n;
  __host__ __device__ int count() const { return (pos0 % kPiece + n + kPiece - 1) / kPiece; }
  __host__ __device__ int start(int p) const { return p == 0 ? 0 : p * kPiece - pos0 % kPiece; }
  __host__ __device__ int len(int p) const { return min(n, (p + 1) * kPiece - pos0 % kPiece) - start(p); }
};

// The work area per (piece, value head): W [64][128], U [64][128], P [64][64], Gam [64] = e^lam_i,
// eu [64] = e^(lam_last - lam_j) (0 past the piece), Gam_last and padding to 4 (floats).
constexpr size_t kWorkFloats = 2 * kPiece * kD + kPiece * kPiece + 2 * kPiece + 4;

constexpr int kPieceThreads = 256;
constexpr size_t kPieceSmem = sizeof(float) * (3 * kPiece * kLd + kPiece * kLdP + 2 * kPiece) + sizeof(double) * kPiece;

// Block (p, h): piece p of value head h. Shared: K, Q, V [64][kLd], A [64][kLdP], beta, the log decays, lam (fp64).
__global__ void __launch_bounds__(kPieceThreads) gdn_wy_piece_kernel(const float* __restrict__ prep,
                                                                     float* __restrict__ work, Pieces pc,
                                                                     PrepRow L, int Hv, int Hk) {
  extern __shared__ __align__(16) float sm[];
  float* Ks = sm;
  float* Qs = Ks + kPiece * kLd;
  float* Vs = Qs + kPiece * kLd;
  float* As = Vs + kPiece * kLd;
  float* beta = As + kPiece * kLdP;
  float* lg = beta + kPiece;
  double* lam = reinterpret_cast<double*>(lg + kPiece);  // (8-byte aligned: every float region above is even)
  const int p = blockIdx.x, h = blockIdx.y, kh = h / (Hv / Hk), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int s0 = pc.start(p), len = pc.len(p);
  float* out = work + ((size_t)p * Hv + h) * kWorkFloats;
  float *Wg = out, *Ug = Wg + kPiece * kD, *Pg = Ug + kPiece * kD, *gam = Pg + kPiece * kPiece, *eug = gam + kPiece;

  // q, k, v of the piece's tokens (rows past len: 0), beta and the log decay
  for (int e = tid; e < kPiece * (3 * kD / 4); e += kPieceThreads) {
    const int i = e / (3 * kD / 4), r = e % (3 * kD / 4), which = r / (kD / 4), d = 4 * (r % (kD / 4));
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (i < len) {
      const float* row = prep + (size_t)(s0 + i) * L.width();
      x = *reinterpret_cast<const float4*>(row + (which == 0 ? L.k(kh) : which == 1 ? L.q(kh) : L.v(h)) + d);
    }
    *reinterpret_cast<float4*>((which == 0 ? Ks : which == 1 ? Qs : Vs) + i * kLd + d) = x;
  }
  if (tid < kPiece) {
    const float* row = prep + (size_t)(s0 + tid) * L.width();
    beta[tid] = tid < len ? row[L.beta(h)] : 0.f;
    lg[tid] = tid < len ? fmaxf(row[L.log_decay(h)], -1e4f) : 0.f;  // (e^-1e4 is 0 as -inf's would be)
  }
  __syncthreads();
  if (warp == 0) {  // lam: inclusive running sum of the log decays in fp64, two per lane
    const double a = lg[2 * lane], b = a + lg[2 * lane + 1];
    double x = b;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    double excl = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane == 0) excl = 0.0;
    lam[2 * lane] = excl + a, lam[2 * lane + 1] = x;
  }
  __syncthreads();

  // K K^T and Q K^T: warp w takes rows 16 (w / 2) .., columns 32 (w % 2) .. (four 8-column tiles)
  {
    const int r0 = 16 * (warp >> 1), c0 = 32 * (warp & 1);
    float kk[4][4] = {}, qk[4][4] = {};
    auto kat = [&](int i, int d) { return Ks[i * kLd + d]; };
    auto qat = [&](int i, int d) { return Qs[i * kLd + d]; };
    auto kbt = [&](int d, int j) { return Ks[j * kLd + d]; };
    for (int k0 = 0; k0 < kD; k0 += 16) {
      uint32_t akh[4], akl[4], aqh[4], aql[4];
      frag_a(kat, r0, k0, akh, akl);
      frag_a(qat, r0, k0, aqh, aql);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        uint32_t bh[2], bl[2];
        frag_b(kbt, k0, c0 + 8 * nt, bh, bl);
        mma3(kk[nt], akh, akl, bh, bl);
        mma3(qk[nt], aqh, aql, bh, bl);
      }
    }
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = r0 + g + 8 * (e >> 1), j = c0 + 8 * nt + 2 * t + (e & 1);
        const float dec = j <= i ? expf((float)(lam[i] - lam[j])) : 0.f;
        As[i * kLdP + j] = j < i ? beta[i] * dec * kk[nt][e] : 0.f;
        Pg[i * kPiece + j] = dec * qk[nt][e];
      }
  }
  __syncthreads();
  // (I + A) [W | U] = [diag(beta Gam) K | diag(beta) V] by forward substitution, a thread per column, in registers
  {
    const bool is_k = tid < kD;
    const float* X = is_k ? Ks + tid : Vs + (tid - kD);
    float y[kPiece];
#pragma unroll
    for (int i = 0; i < kPiece; ++i) {
      float acc = X[i * kLd] * (is_k ? beta[i] * expf((float)lam[i]) : beta[i]);
      const float* a = As + i * kLdP;
#pragma unroll
      for (int j = 0; j < i; ++j) acc = fmaf(-a[j], y[j], acc);
      y[i] = acc;
    }
    float* dst = (is_k ? Wg + tid : Ug + (tid - kD));
#pragma unroll
    for (int i = 0; i < kPiece; ++i) dst[i * kD] = y[i];
  }
  if (tid < kPiece) {
    gam[tid] = expf((float)lam[tid]);
    eug[tid] = tid < len ? expf((float)(lam[len - 1] - lam[tid])) : 0.f;
  }
  if (tid == 0) eug[kPiece] = expf((float)lam[len - 1]);
}

constexpr int kChainThreads = 128;
// Shared: W, Q, K [64][kLd], P [64][kLdP], U's columns [64][kCols + 4], S^T [32][kLd], Delta^T [32][kLdP], Gam,
// the update's decays eu and Gam_last.
constexpr int kLdU = kCols + 4;
constexpr size_t kChainSmem =
    sizeof(float) * (3 * kPiece * kLd + kPiece * kLdP + kPiece * kLdU + kCols * kLd + kCols * kLdP + 2 * kPiece + 4);

// Block (c, h): value head h, state columns 32 c .. 32 c + 31, every piece in order. Warp w keeps the state rows
// 32 w .. 32 w + 31 (two 16-row tiles x four 8-column tiles) in its accumulators.
__global__ void __launch_bounds__(kChainThreads) gdn_wy_chain_kernel(const float* __restrict__ prep,
                                                                     const float* __restrict__ work,
                                                                     float* __restrict__ state, float* __restrict__ out,
                                                                     Pieces pc, PrepRow L, int Hv, int Hk) {
  extern __shared__ __align__(16) float sm[];
  float* Ws = sm;
  float* Qs = Ws + kPiece * kLd;
  float* Ks = Qs + kPiece * kLd;
  float* Ps = Ks + kPiece * kLd;
  float* Us = Ps + kPiece * kLdP;
  float* St = Us + kPiece * kLdU;
  float* Dt = St + kCols * kLd;
  float* gam = Dt + kCols * kLdP;
  float* eu = gam + kPiece;  // [64] and Gam_last at [64]
  const int h = blockIdx.y, kh = h / (Hv / Hk), col0 = blockIdx.x * kCols;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int vd = Hv * kD;
  float* S = state + (size_t)h * kD * kD;
  float s[2][4][4];  // state rows 32 warp + 16 mt + .., columns col0 + 8 nt + ..
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[mt][nt][e] = S[(size_t)(32 * warp + 16 * mt + g + 8 * (e >> 1)) * kD + col0 + 8 * nt + 2 * t + (e & 1)];

  const int pieces = pc.count();
  for (int p = 0; p < pieces; ++p) {
    const int s0 = pc.start(p), len = pc.len(p);
    const float* wk = work + ((size_t)p * Hv + h) * kWorkFloats;
    const float *Wg = wk, *Ug = Wg + kPiece * kD, *Pg = Ug + kPiece * kD, *gamg = Pg + kPiece * kPiece;
    for (int e = tid; e < kPiece * kD / 4; e += kChainThreads) {
      const int i = e / (kD / 4), d = 4 * (e % (kD / 4));
      *reinterpret_cast<float4*>(Ws + i * kLd + d) = *reinterpret_cast<const float4*>(Wg + i * kD + d);
      float4 q = make_float4(0.f, 0.f, 0.f, 0.f), k = q;
      if (i < len) {
        const float* row = prep + (size_t)(s0 + i) * L.width();
        q = *reinterpret_cast<const float4*>(row + L.q(kh) + d);
        k = *reinterpret_cast<const float4*>(row + L.k(kh) + d);
      }
      *reinterpret_cast<float4*>(Qs + i * kLd + d) = q;
      *reinterpret_cast<float4*>(Ks + i * kLd + d) = k;
    }
    for (int e = tid; e < kPiece * kPiece / 4; e += kChainThreads) {
      const int i = e / (kPiece / 4), j = 4 * (e % (kPiece / 4));
      *reinterpret_cast<float4*>(Ps + i * kLdP + j) = *reinterpret_cast<const float4*>(Pg + i * kPiece + j);
    }
    for (int e = tid; e < kPiece * kCols / 4; e += kChainThreads) {
      const int i = e / (kCols / 4), c = 4 * (e % (kCols / 4));
      *reinterpret_cast<float4*>(Us + i * kLdU + c) = *reinterpret_cast<const float4*>(Ug + i * kD + col0 + c);
    }
    for (int e = tid; e <= 2 * kPiece; e += kChainThreads) gam[e] = gamg[e];  // Gam, eu, Gam_last
    // S0^T into shared memory (the B operand of W S0 and Q S0)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          St[(8 * nt + 2 * t + (e & 1)) * kLd + 32 * warp + 16 * mt + g + 8 * (e >> 1)] = s[mt][nt][e];
    __syncthreads();

    // Delta = U - W S0 and o = diag(Gam) Q S0: warp w takes rows 16 w .., all 32 columns
    float dl[4][4] = {}, o[4][4] = {};
    {
      auto wat = [&](int i, int d) { return Ws[i * kLd + d]; };
      auto qat = [&](int i, int d) { return Qs[i * kLd + d]; };
      auto sbt = [&](int d, int c) { return St[c * kLd + d]; };
      for (int k0 = 0; k0 < kD; k0 += 16) {
        uint32_t awh[4], awl[4], aqh[4], aql[4];
        frag_a(wat, 16 * warp, k0, awh, awl);
        frag_a(qat, 16 * warp, k0, aqh, aql);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t bh[2], bl[2];
          frag_b(sbt, k0, 8 * nt, bh, bl);
          mma3(dl[nt], awh, awl, bh, bl);
          mma3(o[nt], aqh, aql, bh, bl);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 16 * warp + g + 8 * (e >> 1), c = 8 * nt + 2 * t + (e & 1);
          Dt[c * kLdP + i] = Us[i * kLdU + c] - dl[nt][e];
          o[nt][e] *= gam[i];
        }
    }
    __syncthreads();
    // o += P Delta, then out
    {
      auto pat = [&](int i, int j) { return Ps[i * kLdP + j]; };
      auto dbt = [&](int j, int c) { return Dt[c * kLdP + j]; };
      for (int k0 = 0; k0 < kPiece; k0 += 16) {
        uint32_t aph[4], apl[4];
        frag_a(pat, 16 * warp, k0, aph, apl);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t bh[2], bl[2];
          frag_b(dbt, k0, 8 * nt, bh, bl);
          mma3(o[nt], aph, apl, bh, bl);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 16 * warp + g + 8 * (e >> 1), c = 8 * nt + 2 * t + (e & 1);
          if (i < len) out[(size_t)(s0 + i) * vd + h * kD + col0 + c] = o[nt][e];
        }
    }
    // S = Gam_last S0 + (diag(eu) K)^T Delta
    {
      const float gl = eu[kPiece];
      auto kat = [&](int d, int j) { return Ks[j * kLd + d] * eu[j]; };
      auto dbt = [&](int j, int c) { return Dt[c * kLdP + j]; };
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] *= gl;
      for (int k0 = 0; k0 < kPiece; k0 += 16) {
        uint32_t bh[4][2], bl[4][2];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) frag_b(dbt, k0, 8 * nt, bh[nt], bl[nt]);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          uint32_t ah[4], al[4];
          frag_a(kat, 32 * warp + 16 * mt, k0, ah, al);
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) mma3(s[mt][nt], ah, al, bh[nt], bl[nt]);
        }
      }
    }
    __syncthreads();  // every warp is done with this piece's tiles
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        S[(size_t)(32 * warp + 16 * mt + g + 8 * (e >> 1)) * kD + col0 + 8 * nt + 2 * t + (e & 1)] = s[mt][nt][e];
}

}  // namespace

bool gdn_wy_supported(GdnDims dims) {
  return dims.k_dim == kD && dims.v_dim == kD && dims.n_k_heads > 0 && dims.n_v_heads % dims.n_k_heads == 0;
}

size_t gdn_wy_work_bytes(int n, GdnDims dims) {
  const int pieces = n / kPiece + 2;  // the most pieces n tokens can touch from any position
  return sizeof(float) * kWorkFloats * (size_t)pieces * dims.n_v_heads;
}

void launch_gdn_wy(const float* prep, float* work, float* state, float* out, int pos0, int n, GdnDims dims,
                   cudaStream_t s) {
  const PrepRow L = prep_row(dims);
  const Pieces pc{pos0, n};
  CUDA_CHECK(cudaFuncSetAttribute(gdn_wy_piece_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kPieceSmem));
  gdn_wy_piece_kernel<<<dim3(pc.count(), dims.n_v_heads), kPieceThreads, kPieceSmem, s>>>(
      prep, work, pc, L, dims.n_v_heads, dims.n_k_heads);
  CUDA_CHECK_LAUNCH(s);
  CUDA_CHECK(cudaFuncSetAttribute(gdn_wy_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kChainSmem));
  gdn_wy_chain_kernel<<<dim3(kD / kCols, dims.n_v_heads), kChainThreads, kChainSmem, s>>>(
      prep, work, state, out, pc, L, dims.n_v_heads, dims.n_k_heads);
  CUDA_CHECK_LAUNCH(s);
}

}  // namespace lily::cuda
