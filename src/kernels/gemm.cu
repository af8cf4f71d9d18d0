// The prompt path's GEMM over lily's weight layout (kernels/qmat.h): y[t] = W x[t] for many tokens at once on
// the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate). The weights enter as their integer codes q
// (0..15 / 0..255, exact in bf16) or, for bf16 weights, as they are; x enters split into two bf16 halves
// (hi + lo, ~16 bits of mantissa), so the products are fp32-exact but for that split. Per 64-element group the
// block finishes sum_k q x in fp32 and adds scale * that + bias * sum_k x (the group sums come with x).
// A block computes 128 weight rows x 64 tokens (8 warps of 32 rows x 32 tokens), streaming one group (64
// columns) of weights and inputs per stage through shared memory, four stages in flight (cp.async; inputs only
// for the 16-token pairs that hold a valid token, which is what an expert with few tokens streams). x is stored
// in gemm_x_col's order (kernels/batched.h), so a thread's 4-bit codes for a whole group are one 8-byte read
// per row and each A register two masks of a word.
// Dense launches take tokens [0, n); grouped launches (MoE experts) take matrix e for the slots of
// [offsets[e], offsets[e+1]) and gather their input rows. The 4-bit weights (every matrix of the 4-bit checkpoint
// but the 8-bit router) take gemm_q4_wgmma_kernel instead: the same tile and arithmetic on Hopper's warpgroup
// MMA (kernels/wgmma.cuh), ~1.8x the throughput. Tested by tests/gpu/test_batched.cu.
#include <cuda_bf16.h>

#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/gemm_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/mma.cuh"
#include "kernels/wgmma.cuh"

namespace lily::cuda {
namespace detail {

template <int BITS>
struct GemmTile {
  static constexpr int kRowBytes = 64 * BITS / 8;     // one group of one weight row
  static constexpr int kWStride = kRowBytes + 16;     // staged row stride (16 bytes of padding)
  static constexpr int kWBytes = kGemmRows * kWStride;
  static constexpr int kXBytes = 2 * kGemmTok * kXStride * 2;  // hi and lo
  static constexpr int kStage = kWBytes + kXBytes + kGemmRows * 4 + kGemmTok * 4;  // + scale|bias, group sums
  static constexpr int kSmem = kGemmStages * kStage;
};

// The A fragment's register for columns c0 and c0 + 4 of a staged bf16 row (low half = column c0).
__device__ __forceinline__ uint32_t a_pair16(const uint8_t* row, int c0) {
  const uint32_t lo = reinterpret_cast<const uint16_t*>(row)[c0], hi = reinterpret_cast<const uint16_t*>(row)[c0 + 4];
  return lo | (hi << 16);
}
// The same for q8 codes: byte j of wa (low half) and of wb, as bf16 built from their nibbles (q4_pair of the two
// bytes' low and high nibbles), 16 qh + ql, every step exact in bf16 (codes up to 255), without the
// integer-to-float conversions.
__device__ __forceinline__ uint32_t q8_pair(uint32_t wa, uint32_t wb, int j) {
  const uint32_t t = __byte_perm(wa, wb, j | ((4 + j) << 8));  // bytes 0 and 2: the two codes
  const uint32_t ql = q4_pair(t, 0), qh = q4_pair(t, 1);
  __nv_bfloat162 r = __hfma2(*reinterpret_cast<const __nv_bfloat162*>(&qh), __float2bfloat162_rn(16.f),
                             *reinterpret_cast<const __nv_bfloat162*>(&ql));
  return *reinterpret_cast<uint32_t*>(&r);
}

// Each warp computes 32 rows x 32 tokens of the block's 128 x 64 tile: warp w takes tile rows 32 (w % 4) .. and
// tokens 32 (w / 4) .., as 2 x 4 mma tiles. Per k-step (16 k-slots) and thread: the A registers of its 4 rows
// (r0 + 8 i), the B fragments of 32 tokens (hi and lo), 16 products.
// PAIRED (SwiGLU): part 0 is a gate, part 1 an up projection of the same shape; a block takes 64 rows of each,
// tile row 32 q + 16 m + i being row 16 q + i of part m, so every thread holds the gate and up values of the same
// rows and tokens and writes scale * silu(gate) * up.
template <int BITS, bool PAIRED>
__global__ void __launch_bounds__(kGemmThreads, 2) gemm_kernel(GemmArgs a) {
  using T = GemmTile<BITS>;
  extern __shared__ __align__(16) uint8_t smem[];
  dep_chain();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  BlockWork bw;
  if (!block_work<PAIRED>(a, bw)) return;
  const GemmPart& part = a.part[bw.pi];
  const int r_base = bw.r_base, rows = part.rows, mat = bw.mat, t_count = bw.t_count;
  // tile row -> (part, row of that part)
  auto tile_part = [](int tr) { return PAIRED ? (tr >> 4) & 1 : 0; };
  auto tile_row = [&](int tr) { return min(PAIRED ? r_base + (tr >> 5) * 16 + (tr & 15) : r_base + tr, rows - 1); };
  const int groups = a.cols / 64;
  const uint8_t* w = part.w + mat * a.mat_w_bytes;
  const uint32_t* sb = part.sb ? part.sb + mat * a.mat_groups : nullptr;
  const uint8_t* w1 = PAIRED ? a.part[1].w + mat * a.mat_w_bytes : nullptr;  // the up projection
  const uint32_t* sb1 = PAIRED && a.part[1].sb ? a.part[1].sb + mat * a.mat_groups : nullptr;
  const size_t row_bytes = static_cast<size_t>(a.cols) * BITS / 8;

  // What this thread copies per group, fixed for the whole loop (rows / tokens past the end load the last
  // valid one and are not stored): weight chunks tid + 256 i; the x chunks (token, piece) tid + 256 i of the
  // 16-token pairs that hold a valid token, hi and lo; one scale|bias word or one group sum.
  constexpr int kWCopies = kGemmRows * T::kRowBytes / 16 / kGemmThreads;  // 1 (q4), 2 (q8), 4 (bf16)
  constexpr int kPieces = T::kRowBytes / 16;
  uint32_t wsrc[kWCopies];  // byte offsets from w (w1 for the up projection's tile rows)
#pragma unroll
  for (int i = 0; i < kWCopies; ++i) {
    const int c = tid + i * kGemmThreads;
    wsrc[i] = static_cast<uint32_t>(tile_row(c / kPieces) * row_bytes + (c % kPieces) * 16);
  }
  int xoff[2];
  x_offsets(a, bw, tid, xoff);
  const uint32_t* sbsrc = nullptr;
  const float* gsrc = nullptr;
  if constexpr (BITS != 16) {
    if (tid < kGemmRows) sbsrc = (tile_part(tid) ? sb1 : sb) + static_cast<size_t>(tile_row(tid)) * groups;
    else if (tid < kGemmRows + kGemmTok) gsrc = gsum_row(a, bw, tid);
  }
  auto stage = [&](int g, int buf) {
    uint8_t* base = smem + buf * T::kStage;
#pragma unroll
    for (int i = 0; i < kWCopies; ++i) {
      const int c = tid + i * kGemmThreads;
      mma::cp16(base + (c / kPieces) * T::kWStride + (c % kPieces) * 16,
                (tile_part(c / kPieces) ? w1 : w) + wsrc[i] + static_cast<size_t>(g) * T::kRowBytes);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (xoff[i] < 0) continue;
      const int c = tid + i * kGemmThreads;
      uint8_t* dst = base + T::kWBytes + ((c >> 3) * kXStride + (c & 7) * 8) * 2;
      mma::cp16(dst, a.xhi + xoff[i] + g * 64);
      mma::cp16(dst + kGemmTok * kXStride * 2, a.xlo + xoff[i] + g * 64);
    }
    float* sbs = reinterpret_cast<float*>(base + T::kWBytes + T::kXBytes);
    if (sbsrc) mma::cp4(sbs + tid, sbsrc + g);
    else if (gsrc) mma::cp4(sbs + tid, gsrc + g);
    mma::commit();
  };

  const int rg = warp & 3, tg = warp >> 2;
  const int gq = lane >> 2, tq = lane & 3;
  const int r0 = rg * 32 + gq;  // this thread's rows in the tile: r0 + 8 i, i < 4
  const int n_pairs = min(2, max(0, (t_count - tg * 32 + 15) / 16));  // the warp's 16-token pairs with a token
  float acc[2][4][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[m][i][j] = 0.f;

  for (int i = 0; i < kGemmStages - 1; ++i) {
    if (i < groups) stage(i, i);
    else mma::commit();  // (empty groups keep the count of groups in flight uniform)
  }
  for (int g = 0; g < groups; ++g) {
    mma::wait<kGemmStages - 2>();
    __syncthreads();  // group g has landed for every thread; group g - 1's buffer is read by no one any more
    const int next = g + kGemmStages - 1;
    if (next < groups) stage(next, next % kGemmStages);
    else mma::commit();
    if (n_pairs == 0) continue;
    const uint8_t* base = smem + (g % kGemmStages) * T::kStage;
    const uint8_t* ws = base;
    const uint8_t* xs = base + T::kWBytes;
    const float* sbs = reinterpret_cast<const float*>(xs + T::kXBytes);
    float cg[2][4][4];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) cg[m][i][j] = 0.f;
    uint2 aw[4];  // q4: the row's words 2 tq and 2 tq + 1 (columns 16 tq .. 16 tq + 15), rows r0 + 8 i
    if constexpr (BITS == 4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) aw[i] = *reinterpret_cast<const uint2*>(ws + (r0 + 8 * i) * T::kWStride + 8 * tq);
    }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      // k-slots (2 tq + 8 h + e) of this k-step hold columns 8 (2 tq + (2 ks + h) / 4) + (2 ks + h) % 4 + 4 e
      uint32_t af[2][4];
      if constexpr (BITS == 8) {  // q8: the row's bytes 16 tq + 8 (ks / 2) .. + 7 (the same columns), rows r0 + 8 i
        if (ks % 2 == 0) {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            aw[i] = *reinterpret_cast<const uint2*>(ws + (r0 + 8 * i) * T::kWStride + 16 * tq + 8 * (ks / 2));
        }
      }
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            const int i = 2 * m + rr, jj = 2 * ks + h;
            if constexpr (BITS == 4) {
              af[m][2 * h + rr] = q4_pair((jj >> 2) ? aw[i].y : aw[i].x, jj & 3);
            } else if constexpr (BITS == 8) {  // bytes jj % 4 of the two words (jj / 4 = ks / 2)
              af[m][2 * h + rr] = q8_pair(aw[i].x, aw[i].y, jj & 3);
            } else {
              af[m][2 * h + rr] = a_pair16(ws + (r0 + 8 * i) * T::kWStride, 8 * (2 * tq + (jj >> 2)) + (jj & 3));
            }
          }
      uint32_t b[2][2][4];  // [pair][hi, lo]
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        if (p < n_pairs) {
          const int n = tg * 32 + p * 16 + (lane >> 4) * 8 + (lane & 7);
          const int kk = ks * 16 + ((lane >> 3) & 1) * 8;
#pragma unroll
          for (int half = 0; half < 2; ++half)
            mma::ldsm_x4(b[p][half], xs + ((half * kGemmTok + n) * kXStride + kk) * 2);
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half)  // (an accumulator's two products 8 apart)
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          if (p < n_pairs) {
#pragma unroll
            for (int m = 0; m < 2; ++m) {
              mma::bf16_16816(cg[m][2 * p], af[m], b[p][half][0], b[p][half][1]);
              mma::bf16_16816(cg[m][2 * p + 1], af[m], b[p][half][2], b[p][half][3]);
            }
          }
        }
    }
    if constexpr (BITS == 16) {
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[m][i][j] += cg[m][i][j];
    } else {
      const float* xsum = sbs + kGemmRows + tg * 32;
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const uint32_t s0 = __float_as_uint(sbs[r0 + 16 * m]), s1 = __float_as_uint(sbs[r0 + 16 * m + 8]);
        const float sc0 = __uint_as_float(s0 << 16), bi0 = __uint_as_float(s0 & 0xFFFF0000u);
        const float sc1 = __uint_as_float(s1 << 16), bi1 = __uint_as_float(s1 & 0xFFFF0000u);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 xv = *reinterpret_cast<const float2*>(xsum + i * 8 + tq * 2);
          acc[m][i][0] = fmaf(bi0, xv.x, fmaf(sc0, cg[m][i][0], acc[m][i][0]));
          acc[m][i][1] = fmaf(bi0, xv.y, fmaf(sc0, cg[m][i][1], acc[m][i][1]));
          acc[m][i][2] = fmaf(bi1, xv.x, fmaf(sc1, cg[m][i][2], acc[m][i][2]));
          acc[m][i][3] = fmaf(bi1, xv.y, fmaf(sc1, cg[m][i][3], acc[m][i][3]));
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int t = tg * 32 + i * 8 + tq * 2 + (j & 1);
      if constexpr (PAIRED) {
        store_out<true>(a, part, bw, t, r_base + rg * 16 + gq + (j < 2 ? 0 : 8), acc[0][i][j], acc[1][i][j]);
      } else {
#pragma unroll
        for (int m = 0; m < 2; ++m)
          store_out<false>(a, part, bw, t, r_base + r0 + 16 * m + (j < 2 ? 0 : 8), acc[m][i][j], 0.f);
      }
    }
}

// The 4-bit weights on Hopper's warpgroup tensor cores (wgmma): gemm_kernel's tile (128 weight rows x 64
// tokens, four groups in flight through shared memory) and its arithmetic per group, but each of the two
// warpgroups multiplies 64 rows at once (m64nNk16, A = the codes in registers, B = x straight from shared memory):
// no ldmatrix, a quarter of the instructions per product. x's
// rows are staged with the 128-byte swizzle the B descriptor names (wgmma.cuh). Tile row 64 wg + 16 wq + 8 rr + g
// is thread (wq, g)'s row rr of warp wq of warpgroup wg; PAIRED puts gate row i at rr 0 and up row i at rr 1, so
// a thread holds both. (Four warpgroups, 256 rows per block, halve the L2 reads of x but leave one block per SM:
// slower or equal on every shape.)
// TOK: the tokens a stage holds, 64 or 16; the 16-token shape (launches whose tiles hold at most 16 tokens: a
// batched decode step's passes) stages 9 KB a group instead of 22, so it keeps STAGES = 10 groups in flight and a
// block's walk along K waits less on memory. Same arithmetic per column: the same bits.
template <int TOK, int STAGES>
struct WgTile {
  static constexpr int kTok = TOK;
  static constexpr int kStages = STAGES;
  static constexpr int kBTile = TOK * 128;        // one swizzled bf16 B tile (hi or lo): TOK tokens x 64 k
  static constexpr int kWBytes = kGemmRows * 32;  // one group of the block's q4 rows
  static constexpr int kStage = (2 * kBTile + kWBytes + kGemmRows * 4 + TOK * 4 + 1023) & ~1023;
  static constexpr int kSmem = STAGES * kStage + 1024;  // + the slack to align the base to 1 KB
};
using WgTileWide = WgTile<kGemmTok, kGemmStages>;
using WgTileSmall = WgTile<16, 10>;
// two blocks per SM: 228 KB of shared memory, of which the system reserves 1 KB per block
static_assert(2 * (WgTileWide::kSmem + 1024) <= 228 * 1024 && 2 * (WgTileSmall::kSmem + 1024) <= 228 * 1024,
              "two blocks per SM");
static_assert(kGemmThreads == 2 * 128 && kGemmRows == 2 * 64, "two warpgroups of 64 rows");
static_assert(kGemmTok * 8 == 2 * kGemmThreads, "two 16-byte x chunks (of hi, of lo) per thread (x_offsets)");

template <bool PAIRED, typename T>
__global__ void __launch_bounds__(kGemmThreads, 2) gemm_q4_wgmma_kernel(GemmArgs a) {
  constexpr int kWgBTile = T::kBTile, kStages = T::kStages;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  dep_chain();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  BlockWork bw;
  if (!block_work<PAIRED>(a, bw)) return;
  if (T::kTok < kGemmTok && bw.t_count > T::kTok) __trap();  // (the launcher's bound on a tile's tokens was wrong)
  const GemmPart& part = a.part[bw.pi];
  const int r_base = bw.r_base, t_count = bw.t_count;
  const int groups = a.cols / 64;

  // Per group and thread (q4_sources): one 16-byte piece of the weights, two of hi and of lo (null where none;
  // 16-token stages: x_offsets gives tokens past 16 none, t_count <= 16), one scale|bias word (tid < 128) or one
  // group sum (128 <= tid < 128 + TOK) as one 4-byte source.
  const Q4Sources src = q4_sources<PAIRED>(a, bw, tid, a.xhi, a.xlo);
  const uint8_t* wsrc = src.w;
  const uint16_t* const(&xsrc)[2][2] = src.x;
  const uint32_t(&xdst)[2] = src.xdst;
  const uint32_t* wordsrc = src.sb;
  if (tid >= kGemmRows && tid < kGemmRows + T::kTok) wordsrc = reinterpret_cast<const uint32_t*>(gsum_row(a, bw, tid));
  // Token t's group sum sits at 128 + 16 (t / 16) + 4 ((t / 2) % 4) + 2 ((t / 8) % 2) + t % 2, so that a
  // thread's four sums of columns 16 J + 2 tq (+ 1) and 16 J + 8 + 2 tq (+ 1) are one 16-byte read.
  const int tt = tid - kGemmRows;
  const int word_slot =
      tid < kGemmRows ? tid : kGemmRows + (tt & ~15) + ((tt >> 1) & 3) * 4 + ((tt >> 3) & 1) * 2 + (tt & 1);
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  auto stage = [&](int g, int buf) {
    const uint32_t base = smem_s + buf * T::kStage;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (!xsrc[i][0]) continue;
      mma::cp16s(base + xdst[i], xsrc[i][0] + g * 64);
      mma::cp16s(base + kWgBTile + xdst[i], xsrc[i][1] + g * 64);
    }
    mma::cp16s(base + 2 * kWgBTile + tid * 16, wsrc + static_cast<size_t>(g) * 32);
    if (wordsrc) mma::cp4s(base + 2 * kWgBTile + T::kWBytes + word_slot * 4, wordsrc + g);
    mma::commit();
  };

  const int gq = lane >> 2, tq = lane & 3;
  const int tr0 = (warp >> 2) * 64 + (warp & 3) * 16 + gq;  // this thread's tile rows tr0, tr0 + 8
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < groups) stage(i, i);
    else mma::commit();
  }
  const uint32_t desc0 = wgmma::b_desc_lo(smem_s);  // stage 0's hi tile
  const uint32_t c128 = 0x43004300u;                // (q4_pair_or's constants, in registers)
  const __nv_bfloat162 b128 = __floats2bfloat162_rn(128.f, 128.f);
  // The loop over the groups for the tile's first NT tokens (NT >= t_count: the tensor cores skip the empty
  // columns of an expert's last tile). A column's arithmetic is the same at every NT.
  auto run = [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    float acc[32];  // (the first NT / 2 used)
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) acc[i] = 0.f;
    int buf = 0;  // g % kStages
    for (int g = 0; g < groups; ++g) {
      mma::wait<kStages - 2>();
      wgmma::fence_proxy_shared();  // this thread's copies of group g, seen by the tensor cores' reads
      __syncthreads();              // everyone's; group g - 1's buffer is read by no one any more
      const uint8_t* base = smem + buf * T::kStage;
      const uint8_t* ws = base + 2 * kWgBTile;
      const float* sbs = reinterpret_cast<const float*>(ws + T::kWBytes);
      const uint32_t dlo = desc0 + buf * (T::kStage >> 4);
      uint2 aw[2];  // the row's words 2 tq and 2 tq + 1, rows tr0 and tr0 + 8
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) aw[rr] = *reinterpret_cast<const uint2*>(ws + (tr0 + 8 * rr) * 32 + 8 * tq);
      uint32_t af[4][4];  // every k-step's A registers before the first product (no register writes between)
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            const int jj = 2 * ks + h;
            af[ks][2 * h + rr] = q4_pair_or((jj >> 2) ? aw[rr].y : aw[rr].x, jj & 3, c128, b128);
          }
      float cg[32];
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        wgmma::m64k16<NT>(cg, af[ks], wgmma::b_desc_from(dlo + 2 * ks), ks > 0);
        wgmma::m64k16<NT>(cg, af[ks], wgmma::b_desc_from(dlo + (kWgBTile >> 4) + 2 * ks), true);
      }
      wgmma::commit();
      // the epilogue's scale|bias words, read while the tensor cores work
      const uint32_t sw0 = __float_as_uint(sbs[tr0]), sw1 = __float_as_uint(sbs[tr0 + 8]);
      const int next = g + kStages - 1;  // (its copies issued while the tensor cores work)
      if (next < groups) stage(next, buf == 0 ? kStages - 1 : buf - 1);
      else mma::commit();
      buf = buf + 1 == kStages ? 0 : buf + 1;
      wgmma::wait<0>();
      float2 xs4[NT / 16][2];  // the group sums of columns 8 j + 2 tq, + 1 (j = 2 J + h: xs4[J][h])
#pragma unroll
      for (int J = 0; J < NT / 16; ++J) {
        const float4 v = *reinterpret_cast<const float4*>(sbs + kGemmRows + 16 * J + 4 * tq);
        xs4[J][0] = make_float2(v.x, v.y);
        xs4[J][1] = make_float2(v.z, v.w);
      }
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const uint32_t sw = rr ? sw1 : sw0;
        const float sc = __uint_as_float(sw << 16), bi = __uint_as_float(sw & 0xFFFF0000u);
#pragma unroll
        for (int j = 0; j < NT / 8; ++j) {
          const float2 xv = xs4[j / 2][j % 2];
          acc[4 * j + 2 * rr] = fmaf(bi, xv.x, fmaf(sc, cg[4 * j + 2 * rr], acc[4 * j + 2 * rr]));
          acc[4 * j + 2 * rr + 1] = fmaf(bi, xv.y, fmaf(sc, cg[4 * j + 2 * rr + 1], acc[4 * j + 2 * rr + 1]));
        }
      }
    }
#pragma unroll
    for (int j = 0; j < NT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = 8 * j + 2 * tq + (e & 1);
        if constexpr (PAIRED) {
          if (e < 2) store_out<true>(a, part, bw, t, r_base + (tr0 >> 4) * 8 + gq, acc[4 * j + e], acc[4 * j + e + 2]);
        } else {
          store_out<false>(a, part, bw, t, r_base + tr0 + 8 * (e >> 1), acc[4 * j + e], 0.f);
        }
      }
  };
  if (T::kTok == 16 || t_count <= 16) run(std::integral_constant<int, 16>{});
  else if (t_count <= 32) run(std::integral_constant<int, 32>{});
  else run(std::integral_constant<int, 64>{});
}

// One block: per matrix the number of its tiles of `tok` slots, an exclusive scan over the matrices (in rounds of
// kTileThreads), each matrix's tiles written at its place.
constexpr int kTileThreads = 256;
__global__ void __launch_bounds__(kTileThreads) tiles_kernel(const int* offsets, int n_mats, int* tiles, int tok,
                                                              bool last_first) {
  using Scan = cub::BlockScan<int, kTileThreads>;
  __shared__ typename Scan::TempStorage tmp;
  dep_chain();
  int base = 0;
  for (int e0 = 0; e0 < n_mats; e0 += kTileThreads) {
    const int i = e0 + static_cast<int>(threadIdx.x);
    const int e = last_first ? (i + n_mats - 1) % n_mats : i;
    const int n = i < n_mats ? (offsets[e + 1] - offsets[e] + tok - 1) / tok : 0;
    int first, total;
    Scan(tmp).ExclusiveSum(n, first, total);
    for (int j = 0; j < n; ++j) tiles[1 + base + first + j] = (e << 16) | j;
    base += total;
    __syncthreads();  // (tmp is reused by the next round)
  }
  if (threadIdx.x == 0) tiles[0] = base;
}

template <int BITS, bool PAIRED>
void launch_gemm(const GemmArgs& a, int grid_y, int max_tokens, cudaStream_t s) {
  // set on every call (cheap, not a stream operation): no static state, any device, any thread
  CUDA_CHECK(cudaFuncSetAttribute(gemm_kernel<BITS, PAIRED>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  GemmTile<BITS>::kSmem));
  const dim3 grid(a.part[a.parts - 1].tile_end, grid_y, (max_tokens + kGemmTok - 1) / kGemmTok);
  launch_pdl(gemm_kernel<BITS, PAIRED>, grid, dim3(kGemmThreads), GemmTile<BITS>::kSmem, s, a);
}

template <bool PAIRED, typename T>
void launch_q4_wgmma_as(const GemmArgs& a, int grid_y, int max_tokens, cudaStream_t s) {
  CUDA_CHECK(cudaFuncSetAttribute(gemm_q4_wgmma_kernel<PAIRED, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  T::kSmem));
  const dim3 grid(a.part[a.parts - 1].tile_end, grid_y, (max_tokens + kGemmTok - 1) / kGemmTok);
  launch_pdl(gemm_q4_wgmma_kernel<PAIRED, T>, grid, dim3(kGemmThreads), T::kSmem, s, a);
}
// tile_tokens: at most this many tokens in any tile of the launch (dense: n; grouped: the most slots one matrix
// can get), 0: unknown.
template <bool PAIRED>
void launch_q4_wgmma(const GemmArgs& a, int grid_y, int max_tokens, int tile_tokens, cudaStream_t s) {
  if (tile_tokens >= 1 && tile_tokens <= WgTileSmall::kTok) launch_q4_wgmma_as<PAIRED, WgTileSmall>(a, grid_y, max_tokens, s);
  else launch_q4_wgmma_as<PAIRED, WgTileWide>(a, grid_y, max_tokens, s);
}

template <bool PAIRED>
void run_as(QFormat f, GemmArgs& a, int grid_y, int max_tokens, int tile_tokens, cudaStream_t s) {
  switch (f) {
    case QFormat::q4:
      if (a.ws) launch_q4ws<PAIRED>(a, grid_y, max_tokens, s);
      else if (a.xf16hi) launch_q4f16<PAIRED>(a, grid_y, max_tokens, s);
      else launch_q4_wgmma<PAIRED>(a, grid_y, max_tokens, tile_tokens, s);
      break;
    case QFormat::q8: launch_gemm<8, PAIRED>(a, grid_y, max_tokens, s); break;
    case QFormat::bf16: launch_gemm<16, PAIRED>(a, grid_y, max_tokens, s); break;
  }
}

void run(QFormat f, GemmArgs& a, int grid_y, int max_tokens, cudaStream_t s, bool paired = false, int tile_tokens = 0) {
  if (max_tokens <= 0 || a.part[a.parts - 1].tile_end == 0) return;
  if (!a.offsets) grid_y = 1, tile_tokens = a.n;
  if (gemm_rows_takes(f, a, tile_tokens)) return launch_gemm_rows(f, a, paired, s);
  if (paired) run_as<true>(f, a, grid_y, max_tokens, tile_tokens, s);
  else run_as<false>(f, a, grid_y, max_tokens, tile_tokens, s);
}

// The launch's arguments for matrices W[0..n) (same format and cols) with outputs y[i] (row stride ldy[i]),
// matrix `mat` of each stack.
GemmArgs args_for(const QMat* W, float* const* y, const int* ldy, int n, int mat, const GemmX& x) {
  LILY_CHECK(n >= 1 && n <= kGemmMaxParts, "gemm: ", n, " matrices in one launch (1..", kGemmMaxParts, ")");
  GemmArgs a;
  std::memset(&a, 0, sizeof a);
  int tiles = 0;
  for (int i = 0; i < n; ++i) {
    const QMat& m = W[i];
    LILY_CHECK(m.w && m.cols == x.K && m.cols % kGroupSize == 0 && (m.format == QFormat::bf16 || m.sb),
               "gemm: matrix [", m.rows, ", ", m.cols, "] does not take inputs of width ", x.K);
    LILY_CHECK(m.mat_w_bytes() < (size_t{1} << 32), "gemm: a matrix of ", m.mat_w_bytes(), " bytes (under 4 GiB)");
    LILY_CHECK(m.format == W[0].format && m.cols == W[0].cols,
               "gemm: matrices of one launch differ in format or width");
    LILY_CHECK(ldy[i] >= m.rows, "gemm: output stride ", ldy[i], " below the matrix's ", m.rows, " rows");
    LILY_CHECK(mat >= 0 && mat < m.n_mats, "gemm: matrix ", mat, " of a stack of ", m.n_mats);
    GemmPart& p = a.part[i];
    p.w = m.w + mat * m.mat_w_bytes();
    p.sb = m.sb ? m.sb + mat * m.mat_groups() : nullptr;
    p.rows = m.rows;
    p.y = y[i];
    p.ldy = ldy[i];
    tiles += (m.rows + kGemmRows - 1) / kGemmRows;
    p.tile_end = tiles;
  }
  a.parts = n;
  a.mat_w_bytes = W[0].mat_w_bytes();
  a.mat_groups = W[0].mat_groups();
  a.cols = W[0].cols;
  a.xhi = x.hi;
  a.xlo = x.lo;
  a.xsum = x.gsum;
  a.xf16hi = x.f16hi;
  a.xf16lo = x.f16lo;
  a.xf16inv = x.f16inv;
  a.rows_kernel = x.few;
  a.rows_any_size = x.few_all;
  a.ws = gemm_takes_ws(W[0].format, x);
  return a;
}

// A paired (SwiGLU) launch's arguments: gate and up of one shape, output act [ldact per row], 64-row tiles.
GemmArgs paired_args(const QMat& gate, const QMat& up, const GemmX& x, float* act, int ldact) {
  LILY_CHECK(gate.rows == up.rows && gate.cols == up.cols && gate.format == up.format && gate.n_mats == up.n_mats,
             "gemm swiglu: gate [", gate.rows, ", ", gate.cols, "] and up [", up.rows, ", ", up.cols,
             "] differ in shape, format or stack");
  const QMat W[2] = {gate, up};
  float* y[2] = {act, act};
  const int ld[2] = {ldact, ldact};
  GemmArgs a = args_for(W, y, ld, 2, 0, x);
  a.part[0].tile_end = a.part[1].tile_end = (gate.rows + kGemmRows / 2 - 1) / (kGemmRows / 2);
  return a;
}

// The grouped launches' work list and their bound on it (a grid dimension); a list of the warp-specialised
// tile's slots only for launches that take it.
void check_grouped(const int* offsets, const int* tiles, int max_tiles, QFormat f, const GemmX& x, const char* what) {
  LILY_CHECK(offsets && tiles && max_tiles >= 1 && max_tiles <= 65535, what, ": no slot offsets or tiles, or ",
             max_tiles, " tiles (1..65535)");
  LILY_CHECK(!x.ws || gemm_takes_ws(f, x), what, ": a work list of ", kGemmWsTok,
             "-slot tiles (GemmX::ws) needs 4-bit weights and x's fp16 form");
}
// x's element offsets are 32-bit: rows x K below 2^31 (a dense launch's rows are its n tokens).
void check_rows(int n, const GemmX& x, const char* what) {
  LILY_CHECK(static_cast<size_t>(n) * x.K < (size_t{1} << 31), what, ": ", n, " rows of width ", x.K,
             " (under 2^31 elements)");
}

}  // namespace detail

void gemm_swiglu(const QMat& gate, const QMat& up, const GemmX& x, int n, float* act, int ldact, cudaStream_t s) {
  detail::check_rows(n, x, "gemm_swiglu");
  detail::GemmArgs a = detail::paired_args(gate, up, x, act, ldact);
  a.n = n;
  detail::run(gate.format, a, 1, n, s, true);
}

void gemm_grouped_swiglu(const QMat& gate, const QMat& up, const GemmX& x, const int* x_row, const int* offsets,
                         const int* tiles, int max_tiles, const float* scale, float* act, int ldact, cudaStream_t s,
                         int max_per_mat) {
  detail::check_grouped(offsets, tiles, max_tiles, gate.format, x, "gemm_grouped_swiglu");
  detail::GemmArgs a = detail::paired_args(gate, up, x, act, ldact);
  a.x_row = x_row;
  a.offsets = offsets;
  a.tiles = tiles;
  a.scale = scale;
  detail::run(gate.format, a, max_tiles, 1, s, true, max_per_mat);
}

void gemm(const QMat& W, int mat, const GemmX& x, int n, float* y, int ldy, bool accumulate, cudaStream_t s) {
  detail::check_rows(n, x, "gemm");
  detail::GemmArgs a = detail::args_for(&W, &y, &ldy, 1, mat, x);
  a.n = n;
  a.accumulate = accumulate;
  detail::run(W.format, a, 1, n, s);
}

void gemm_multi(const GemmBatch& b, const GemmX& x, int n, bool accumulate, cudaStream_t s) {
  detail::check_rows(n, x, "gemm_multi");
  detail::GemmArgs a = detail::args_for(b.W, b.y, b.ldy, b.n, 0, x);
  a.n = n;
  a.accumulate = accumulate;
  detail::run(b.W[0].format, a, 1, n, s);
}

void gemm_grouped(const QMat& W, const GemmX& x, const int* x_row, const int* offsets, const int* tiles,
                  int max_tiles, float* y, int ldy, cudaStream_t s, int max_per_mat) {
  detail::check_grouped(offsets, tiles, max_tiles, W.format, x, "gemm_grouped");
  detail::GemmArgs a = detail::args_for(&W, &y, &ldy, 1, 0, x);
  a.x_row = x_row;
  a.offsets = offsets;
  a.tiles = tiles;
  detail::run(W.format, a, max_tiles, 1, s, false, max_per_mat);
}

void gemm_grouped_tiles(const int* offsets, int n_mats, int* tiles, cudaStream_t s, int tile_tokens,
                        bool last_first) {
  LILY_CHECK(n_mats >= 1 && n_mats <= 32767, "gemm_grouped_tiles: ", n_mats, " matrices (1..32767)");
  LILY_CHECK(tile_tokens == detail::kGemmTok || tile_tokens == kGemmWsTok, "gemm_grouped_tiles: tiles of ",
             tile_tokens, " slots (", detail::kGemmTok, " or ", kGemmWsTok, ")");
  launch_pdl(detail::tiles_kernel, dim3(1), dim3(detail::kTileThreads), 0, s, offsets, n_mats, tiles, tile_tokens,
             last_first);
}

}  // namespace lily::cuda
