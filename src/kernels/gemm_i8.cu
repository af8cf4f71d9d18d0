// Dense 4-bit GEMMs of a decode pass (a few one-token rows) on the int8 tensor cores. The tiles of kernels/gemm.cu
// read x as two bf16 terms per token and spend their time on x when the tokens are few; here x is staged once per
// block as 16-bit fixed point per 64-element group (int8 hi and lo, the decode GEMVs' rule, kernels/gemv_stream.cuh,
// per group instead of per 32-element chunk), the weights' 4-bit codes go into mma.m16n8k32 as int8 unchanged and
// the integer sums are exact; scale and bias apply per group in fp32. A block takes one 16-token slice (grid.y);
// KS warps stream one 16-row tile, each over K / KS (two phases of 4 groups in flight), their partial sums added in
// warp order through shared memory; blocks per slice: the tiles in one round or what fits beside the other slices.
// A warp requests its first tile's first two phases of weights before the PDL wait (they are constant), so they
// come in while the previous kernel finishes and x is staged. At most 128 registers: two blocks an SM where the
// staged x leaves room for two (not 16 tokens at K 4096).
// A token's column is computed the same way whatever the other columns hold, so its bits do not depend on the
// launch's other tokens (only on KS). Tested by tests/gpu/test_gemm_i8.cu.
//
// The staged row of a token (i8x_prep), per group g of 64 elements: hi bytes [4 t][16], lo bytes [4 t][16], where
// the 16 bytes of lane quad t are {even, odd elements of word 2 t, even, odd elements of word 2 t + 1} (word w: the
// group's elements 8 w .. 8 w + 7; even: 8 w + 0, 2, 4, 6; odd: 8 w + 1, 3, 5, 7), the order in which
// (word & 0x0f0f0f0f) and ((word >> 4) & 0x0f0f0f0f) hold the 4-bit codes; after all groups, float sx[G] (x ~ sx
// (256 hi + lo)) and float xsum[G] (the group's sum of x in fp32, for the bias).
#include <algorithm>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/gemv_stream.cuh"
#include "kernels/mma.cuh"
#include "kernels/router_partial.cuh"

namespace lily::cuda {
namespace detail {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kPhase = 4;  // groups per phase; two phases in flight per warp

constexpr int row_bytes(int K) { return K / 64 * 136; }
constexpr int smem_stride(int K) { return row_bytes(K) + 64; }  // tokens 16 banks apart: no conflicts

// d += a (16 x 32, row) * b (32 x 8, col), int8 in, int32 sums.
__device__ __forceinline__ void mma_i8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One block per token: the row's words read once (load_row_words: thread i holds words i, i + 256, a group being 8
// consecutive lanes; normed where norm_w is given), then each group's max and sum over its 8 lanes and a word's
// bytes stored as two 8-byte words (one round trip to the L2: the launch is on a decode pass's critical path twice
// a layer).
constexpr int kPrepWords = kI8MaxK / 8 / 256;  // words a thread holds at most
__global__ void __launch_bounds__(256) prep_kernel(const float* x, int ldx, int K, const float* norm_w, float eps,
                                                   uint8_t* out) {
  dep_chain();
  const int tok = blockIdx.x, lane = threadIdx.x & 31, G = K / 64, sub = lane & 7;
  uint8_t* dst = out + static_cast<size_t>(tok) * row_bytes(K);
  float v[kPrepWords][8];
  load_row_words(x + static_cast<size_t>(tok) * ldx, norm_w, eps, K, v);
#pragma unroll
  for (int j = 0; j < kPrepWords; ++j) {
    const int wi = threadIdx.x + 256 * j, g = wi / 8;
    if (8 * wi >= K) continue;  // (warp-uniform: K a multiple of 512)
    const float(&u)[8] = v[j];
    float m = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(u[k]));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float s = group_word_sum(u);
    const float inv = m > 0.f ? 127.f / m : 0.f;
    uint32_t he = 0, ho = 0, le = 0, lo = 0;  // hi / lo bytes of the even / odd elements: 2 k, 2 k + 1 at byte k
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      int h0, l0, h1, l1;
      x16_split(u[2 * k], inv, h0, l0);
      x16_split(u[2 * k + 1], inv, h1, l1);
      he |= (h0 & 0xffu) << (8 * k), ho |= (h1 & 0xffu) << (8 * k);
      le |= (l0 & 0xffu) << (8 * k), lo |= (l1 & 0xffu) << (8 * k);
    }
    const int at = g * 128 + (sub >> 1) * 16 + (sub & 1) * 8;  // word sub of group g (the layout above)
    *reinterpret_cast<uint2*>(dst + at) = make_uint2(he, ho);
    *reinterpret_cast<uint2*>(dst + at + 64) = make_uint2(le, lo);
    if (sub == 0) {
      float* sx = reinterpret_cast<float*>(dst + G * 128);
      sx[g] = m / 32512.f, sx[G + g] = s;
    }
  }
}

struct I8Args {
  const uint8_t* w[kMaxGemmParts];
  const uint32_t* sb[kMaxGemmParts];
  float* y[kMaxGemmParts];
  int ldy[kMaxGemmParts];
  int rows[kMaxGemmParts];
  int tile_end[kMaxGemmParts];  // 16-row tiles of this part and the earlier ones
  int parts, K, n;
  const uint8_t* x;             // staged rows [n][row_bytes(K)]
  bool accumulate;
  RouterPartialDev rs;          // rs.acc set (KS 8, one matrix of kHidden rows): the next MoE block's router sums of
                                // the written rows, token t's at rs.acc + t * kRouterCopies * rs.n
};

// The shared memory of the router sums (gemm_i8 with router), after the staged x and the K split's sums: the
// tile's router slices (uint4 [kRouterMaxN], uint32_t [kRouterMaxN]) and its 16 rows' norm weights.
constexpr size_t kRouterAreaBytes = (16 + 4) * kRouterMaxN + 4 * kRouterRows;

// The router sums of a tile's written rows (gemm_i8 with router): hw [nt][16] = the rows' h, times the norm weight
// here, then thread e's router rows e, e + kThreads, .. add their partial for each token. Out of line: the
// GEMM's registers are not held for it.
__device__ __noinline__ void router_epilogue(RouterPartialDev rs, int n, const uint4* rq, float (*hw)[kRouterRows],
                                            int tok0) {
  const auto* rsb = reinterpret_cast<const uint32_t*>(rq + kRouterMaxN);
  const auto* rnw = reinterpret_cast<const float*>(rsb + kRouterMaxN);
  const int nt = min(8, n - tok0);
  if (threadIdx.x < nt * kRouterRows) {  // h * the norm weight, as the one-row path's inputs
    const int tk = threadIdx.x / kRouterRows, i = threadIdx.x % kRouterRows;
    hw[tk][i] *= rnw[i];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < rs.n; e += kThreads) {
    const RouterSlice sl{rq[e], rsb[e]};
    for (int tk = 0; tk < nt; ++tk) {
      RouterPartialDev r = rs;
      r.acc += static_cast<size_t>(tok0 + tk) * kRouterCopies * rs.n;
      router_partial_add(r, sl, hw[tk], e);
    }
  }
}

// NTG: groups of 8 tokens (1 or 2) of the block's 16-token slice (blockIdx.y); KS: warps that split one tile's K
// (their partial sums meet in shared memory, added in warp order), so a block takes kWarps / KS tiles at a time.
template <int NTG, int KS>
__global__ void __launch_bounds__(kThreads, 2) gemm_i8_kernel(I8Args a) {
  // [NTG * 8][smem_stride(K)], then KS > 1: float [kWarps][NTG][4][32], then the router sums' kRouterAreaBytes
  extern __shared__ __align__(16) uint8_t smem[];
  const int K = a.K, G = K / 64, rb = row_bytes(K), stride = smem_stride(K);
  const int tok0 = blockIdx.y * 16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  constexpr int kTpb = kWarps / KS;  // tiles a block takes at a time
  const int ts = warp / KS, kp = warp % KS;
  const int n_tiles = a.tile_end[a.parts - 1], gpp = G / KS, n_ph = gpp / kPhase, g0 = kp * gpp;
  float* red = reinterpret_cast<float*>(smem + NTG * 8 * stride);
  __shared__ float hw[KS == 8 && NTG == 1 ? 8 : 1][kRouterRows];  // router sums: token, row (h, then h * norm w)
  constexpr uint32_t M = 0x0f0f0f0fu;
  struct Regs {
    uint2 w0[kPhase], w1[kPhase];  // words 2 t, 2 t + 1 of rows g and g + 8, per group of the phase
    uint4 s0, s1;                  // the phase's 4 scale | bias words of rows g and g + 8
  };
  struct Tile {  // this warp's tile of the round at `base`: its part, first row, and rows g, g + 8's weights
    bool active;
    int p, r0, rows;
    const uint8_t *wa, *wc;
    const uint32_t *sa, *sc;
  };
  auto tile_at = [&](int base) {
    Tile u{};
    const int tile = base + ts;
    u.active = tile < n_tiles;
    int p = 0;
    while (u.active && p + 1 < a.parts && tile >= a.tile_end[p]) ++p;
    u.p = p;
    u.r0 = u.active ? (tile - (p ? a.tile_end[p - 1] : 0)) * 16 : 0;
    u.rows = a.rows[p];
    const int ra = min(u.r0 + g, u.rows - 1), rc = min(u.r0 + g + 8, u.rows - 1);  // past the end: the last row
    u.wa = a.w[p] + static_cast<size_t>(ra) * (K / 2) + 8 * t + g0 * 32;
    u.wc = a.w[p] + static_cast<size_t>(rc) * (K / 2) + 8 * t + g0 * 32;
    u.sa = a.sb[p] + static_cast<size_t>(ra) * G + g0;
    u.sc = a.sb[p] + static_cast<size_t>(rc) * G + g0;
    return u;
  };
  auto load = [&](const Tile& u, Regs& r, int ph) {
#pragma unroll
    for (int j = 0; j < kPhase; ++j) {
      r.w0[j] = ld_stream8(u.wa + (ph * kPhase + j) * 32);
      r.w1[j] = ld_stream8(u.wc + (ph * kPhase + j) * 32);
    }
    r.s0 = ld_stream(u.sa + ph * kPhase);
    r.s1 = ld_stream(u.sc + ph * kPhase);
  };
  Regs A, B;
  auto start = [&](int base) {  // a round's tile and its first two phases of weights (n_ph even: K / KS a multiple of 512)
    const Tile v = tile_at(base);
    if (v.active) {
      load(v, A, 0);
      load(v, B, 1);
    }
    return v;
  };
  // the first round's weights (constant) before the wait: they come in while the previous kernel finishes and x
  // is staged
  const int first = blockIdx.x * kTpb;
  Tile u = start(first);
  // the router sums (KS 8: a block's tile is one router row-block): the tile's router slices (E + 1 rows) and
  // norm weights into shared memory by cp.async (no registers held through the products); constant, requested
  // before the wait as well
  const bool sums = KS == 8 && NTG == 1 && a.rs.acc != nullptr;
  auto router_area = [&] {  // (recomputed where used: no registers held through the products)
    return reinterpret_cast<uint4*>(smem + NTG * 8 * smem_stride(a.K) +
                                    (KS > 1 ? sizeof(float) * kWarps * NTG * 4 * 32 : 0));
  };
  auto slices = [&](const Tile& v) {
    if (!sums || !v.active) return;
    uint4* rq = router_area();
    auto* rsb = reinterpret_cast<uint32_t*>(rq + kRouterMaxN);
    auto* rnw = reinterpret_cast<float*>(rsb + kRouterMaxN);
    const int b = v.r0 / kRouterRows;
    for (int e = threadIdx.x; e < a.rs.n; e += kThreads) {
      mma::cp16(&rq[e], a.rs.q + (static_cast<size_t>(b) * a.rs.n + e) * 16);
      mma::cp4(&rsb[e], a.rs.sb + static_cast<size_t>(b / (kGroupSize / kRouterRows)) * a.rs.n + e);
    }
    if (threadIdx.x < kRouterRows) mma::cp4(&rnw[threadIdx.x], a.rs.norm_w + v.r0 + threadIdx.x);
    mma::commit();
  };
  slices(u);
  dep_chain();
  // x by cp.async, every piece in flight at once (the router slices' group is waited for as well)
  for (int i = threadIdx.x; i < NTG * 8 * (rb / 16); i += kThreads) {  // tokens past n: zeros
    const int tok = i / (rb / 16), q = i % (rb / 16);
    uint8_t* dst = smem + tok * stride + q * 16;
    if (tok0 + tok < a.n) mma::cp16(dst, a.x + static_cast<size_t>(tok0 + tok) * rb + q * 16);
    else *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
  }
  mma::commit();
  mma::wait<0>();
  __syncthreads();
  for (int base = first; base < n_tiles; base += gridDim.x * kTpb) {  // (every warp: the barriers)
    if (base != first) {
      u = start(base);
      slices(u);
    }
    const int p = u.p, r0 = u.r0, rows = u.rows;
    float acc[NTG][4];
#pragma unroll
    for (int j = 0; j < NTG; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    if (u.active) {
      auto compute = [&](const Regs& r, int ph) {
#pragma unroll
        for (int j = 0; j < kPhase; ++j) {
          const int gi = g0 + ph * kPhase + j;
          const uint32_t s0 = j == 0 ? r.s0.x : j == 1 ? r.s0.y : j == 2 ? r.s0.z : r.s0.w;
          const uint32_t s1 = j == 0 ? r.s1.x : j == 1 ? r.s1.y : j == 2 ? r.s1.z : r.s1.w;
          const uint32_t x0 = r.w0[j].x, y0 = r.w0[j].y, x1 = r.w1[j].x, y1 = r.w1[j].y;
#pragma unroll
          for (int tg = 0; tg < NTG; ++tg) {
            const uint8_t* xt = smem + (tg * 8 + g) * stride + gi * 128 + t * 16;
            const uint4 hi = *reinterpret_cast<const uint4*>(xt), lo = *reinterpret_cast<const uint4*>(xt + 64);
            int dh[4] = {0, 0, 0, 0}, dl[4] = {0, 0, 0, 0};
            mma_i8(dh, x0 & M, x1 & M, (x0 >> 4) & M, (x1 >> 4) & M, hi.x, hi.y);  // word 2 t
            mma_i8(dh, y0 & M, y1 & M, (y0 >> 4) & M, (y1 >> 4) & M, hi.z, hi.w);  // word 2 t + 1
            mma_i8(dl, x0 & M, x1 & M, (x0 >> 4) & M, (x1 >> 4) & M, lo.x, lo.y);
            mma_i8(dl, y0 & M, y1 & M, (y0 >> 4) & M, (y1 >> 4) & M, lo.z, lo.w);
            // d[e]: row g + 8 (e >> 1), token 8 tg + 2 t + (e & 1)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float* f = reinterpret_cast<const float*>(smem + (tg * 8 + 2 * t + (e & 1)) * stride + G * 128);
              const uint32_t s = e < 2 ? s0 : s1;
              const float sum = fmaf(256.f, static_cast<float>(dh[e]), static_cast<float>(dl[e]));
              acc[tg][e] += fmaf(bf16_lo(s) * f[gi], sum, bf16_hi(s) * f[G + gi]);
            }
          }
        }
      };
      for (int ph = 0; ph < n_ph; ph += 2) {  // phases ph, ph + 1 in A, B; each reloaded once computed
        compute(A, ph);
        if (ph + 2 < n_ph) load(u, A, ph + 2);
        compute(B, ph + 1);
        if (ph + 3 < n_ph) load(u, B, ph + 3);
      }
    }
    if constexpr (KS > 1) {  // the parts of K meet in warp order: part 0 + part 1 + ...
      if (u.active && kp > 0)
#pragma unroll
        for (int tg = 0; tg < NTG; ++tg)
#pragma unroll
          for (int e = 0; e < 4; ++e) red[((warp * NTG + tg) * 4 + e) * 32 + lane] = acc[tg][e];
      __syncthreads();
      if (u.active && kp == 0)
#pragma unroll
        for (int q = 1; q < KS; ++q)
#pragma unroll
          for (int tg = 0; tg < NTG; ++tg)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[tg][e] += red[(((warp + q) * NTG + tg) * 4 + e) * 32 + lane];
      __syncthreads();  // (red is rewritten by the next tiles)
    }
    if (u.active && kp == 0)
#pragma unroll
      for (int tg = 0; tg < NTG; ++tg)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = r0 + g + 8 * (e >> 1), tok = tok0 + tg * 8 + 2 * t + (e & 1);
          if (row >= rows || tok >= a.n) continue;
          float* dst = a.y[p] + static_cast<size_t>(tok) * a.ldy[p] + row;
          const float v = a.accumulate ? *dst + acc[tg][e] : acc[tg][e];
          *dst = v;
          if (sums) hw[tok - tok0][g + 8 * (e >> 1)] = v;
        }
    if (sums) {  // (KS 8: every warp of the block on one tile; the condition is block-uniform)
      mma::wait<0>();
      __syncthreads();
      if (u.active) router_epilogue(a.rs, a.n, router_area(), hw, tok0);
      __syncthreads();  // (hw and the slices are rewritten by the next round)
    }
  }
}

template <int NTG>
using I8Kernel = void (*)(I8Args);
template <int NTG>
I8Kernel<NTG> i8_kernel(int ks) {
  return ks == 1 ? gemm_i8_kernel<NTG, 1> : ks == 2 ? gemm_i8_kernel<NTG, 2> : ks == 4 ? gemm_i8_kernel<NTG, 4>
                                                                                         : gemm_i8_kernel<NTG, 8>;
}

}  // namespace
}  // namespace detail

size_t i8x_row_bytes(int K) { return static_cast<size_t>(detail::row_bytes(K)); }

bool gemm_i8_router_ok(const GemmBatch& b, const RouterSums& r) {
  return b.n == 1 && b.W[0].rows == kHidden && b.W[0].cols == kI8MaxK && r.slices.w != nullptr &&
         r.slices.cols == kHidden && r.slices.rows >= 1 && r.slices.rows <= detail::kRouterMaxN && r.norm_w != nullptr &&
         r.acc != nullptr;
}

void i8x_prep(const float* x, int ldx, int n, int K, const float* norm_w, float eps, void* out, cudaStream_t s) {
  LILY_CHECK(K % 512 == 0 && K <= kI8MaxK && ldx >= K && ldx % 4 == 0 && n >= 0 && n <= kI8MaxTokens, "i8x_prep: n ",
             n, " K ", K, " ldx ", ldx, " (K a multiple of 512 up to ", kI8MaxK, ", ldx a multiple of 4, n up to ",
             kI8MaxTokens, ")");
  if (n == 0) return;
  launch_pdl(detail::prep_kernel, dim3(n), dim3(256), 0, s, x, ldx, K, norm_w, eps, static_cast<uint8_t*>(out));
}

void gemm_i8(const GemmBatch& b, const void* x, int n, bool accumulate, cudaStream_t s, int ks,
             const RouterSums* router) {
  LILY_CHECK(b.n >= 1 && b.n <= kMaxGemmParts && n >= 1 && n <= kI8MaxTokens, "gemm_i8: ", b.n, " matrices, ", n,
             " tokens (1..", kI8MaxTokens, ")");
  detail::I8Args a{};
  a.parts = b.n, a.K = b.W[0].cols, a.n = n, a.x = static_cast<const uint8_t*>(x), a.accumulate = accumulate;
  int tiles = 0;
  for (int i = 0; i < b.n; ++i) {
    const QMat& m = b.W[i];
    LILY_CHECK(m.format == QFormat::q4 && m.cols == a.K && m.w && m.sb && m.rows >= 1,
               "gemm_i8: matrix ", i, " [", m.rows, ", ", m.cols, "] is not 4-bit of width ", a.K);
    a.w[i] = m.w, a.sb[i] = m.sb, a.y[i] = b.y[i], a.ldy[i] = b.ldy[i], a.rows[i] = m.rows;
    tiles += (m.rows + 15) / 16;
    a.tile_end[i] = tiles;
  }
  LILY_CHECK(a.K % 512 == 0 && a.K <= kI8MaxK, "gemm_i8: width ", a.K, " (a multiple of 512 up to ", kI8MaxK, ")");
  constexpr int W = detail::kWarps;
  if (router) {  // a block's tile must be one router row-block: 8 warps a tile, one matrix of H rows
    LILY_CHECK(gemm_i8_router_ok(b, *router) && n <= kI8RouterMaxTokens && (ks == 0 || ks == 8), "gemm_i8: router sums "
               "need one 4-bit matrix of ", kHidden, " rows and width ", kI8MaxK, ", router slices of ", kHidden,
               " columns and an accumulator, at most ", kI8RouterMaxTokens, " tokens and 8 warps a tile (", n,
               " tokens, ks ", ks, ")");
    a.rs = detail::router_partial_dev(*router);
    ks = 8;
  }
  const int sms = sm_count();
  static_assert(kI8RouterMaxTokens == 8, "the router sums are in the instance of one 8-token group (NTG 1)");
  const int ntg = n > 8 ? 2 : 1, slices = (n + 15) / 16;
  if (ks <= 0)  // the fewest warps per tile that give every SM a block (over the slices), each warp >= 512 of K
    for (ks = 1; ks < W && a.K / (2 * ks) >= 512 && (tiles * ks + W - 1) / W * slices < sms;) ks *= 2;
  LILY_CHECK((ks == 1 || ks == 2 || ks == 4 || ks == 8) && a.K % (512 * ks) == 0, "gemm_i8: ", ks,
             " warps a tile for width ", a.K, " (1, 2, 4 or 8, each at least 512 of K)");
  const size_t smem = static_cast<size_t>(ntg) * 8 * detail::smem_stride(a.K) +
                      (ks > 1 ? sizeof(float) * W * ntg * 4 * 32 : 0) +
                      (a.rs.acc ? detail::kRouterAreaBytes : 0);
  auto* k = ntg == 1 ? detail::i8_kernel<1>(ks) : detail::i8_kernel<2>(ks);
  CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, detail::kThreads, smem));
  // a slice's blocks: every tile in one round, or what fits on the GPU beside the other slices
  const int want = (tiles * ks + W - 1) / W, fit = std::max(1, sms * std::max(per_sm, 1) / slices);
  launch_pdl(k, dim3(std::min(want, fit), slices), dim3(detail::kThreads), smem, s, a);
}

}  // namespace lily::cuda
