// What the prompt path's GEMM kernels share (kernels/gemm.cu: the mma.sync kernel and the 4-bit wgmma kernel on
// the split two-term x; kernels/gemm_q4f16.cu and kernels/gemm_q4ws.cu: the 4-bit kernels on x's fp16 form;
// kernels/gemm_rows.cu: the few-token kernel): the launch's arguments, a block's share of the work, the x copies'
// offsets, the fp16 form's A registers and the output store. Included by those four files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/wgmma.cuh"

namespace lily::cuda::detail {

constexpr int kGemmRows = 128;    // weight rows per block (4 row groups of warps x 32 rows)
constexpr int kGemmTok = 64;      // tokens per block (2 token groups of warps x 32 tokens)
constexpr int kGemmThreads = 256;
constexpr int kGemmStages = 4;    // groups in flight through shared memory (3 requested while one is computed)
constexpr int kXStride = 64 + 8;  // bf16 per staged x row: 144 bytes, so ldmatrix's 8 rows hit distinct banks
constexpr int kGemmMaxParts = kMaxGemmParts;

struct GemmPart {        // one matrix of a launch (several share x: gemm_multi)
  const uint8_t* w;      // its stack's matrix `mat`
  const uint32_t* sb;
  int rows;
  float* y;
  int ldy;
  int tile_end;          // row tiles of this and the earlier parts (blockIdx.x below it: this part)
};

struct GemmArgs {
  GemmPart part[kGemmMaxParts];
  int parts;
  size_t mat_w_bytes, mat_groups;  // grouped: the stride between the stack's matrices
  int cols;
  const uint16_t* xhi;
  const uint16_t* xlo;
  const float* xsum;
  const uint16_t* xf16hi;  // x's fp16 form (GemmX::f16hi; null: none): q4 launches take kernels/gemm_q4f16.cu
  const uint16_t* xf16lo;
  const float* xf16inv;
  const int* x_row;      // grouped: input row of each slot (null: the slot itself)
  const int* offsets;    // grouped: [n_mats + 1] slot ranges; null: dense over [0, n)
  const int* tiles;      // grouped: the work list (gemm_grouped_tiles), tile blockIdx.y
  int n;                 // dense: tokens
  bool accumulate;
  const float* scale;    // paired: per output row (slot) factor, null: 1
  bool rows_kernel;      // GemmX::few: dense launches of <= 64 tokens take kernels/gemm_rows.cu
  bool rows_any_size;    // GemmX::few_all: large ones too
  bool ws;               // GemmX::ws: q4 launches on the fp16 form take kernels/gemm_q4ws.cu
};

// The A fragment's register for k-slots (s, s + 1) of a k-step: the weights of columns c0 and c0 + 4 of a row
// (c0 = 8 w + j, j < 4; gemm_x_col's order, in which x is stored), low half = column c0, as bf16 codes.
// q4: one 32-bit word of the row holds columns 8 w .. 8 w + 7 (column c in bits 4 (c % 8)); 0x4300 | q is the
// bf16 of 128 + q, so subtracting 128 gives q exactly.
__device__ __forceinline__ uint32_t q4_pair(uint32_t word, int j) {
  const uint32_t v = ((word >> (4 * j)) & 0x000F000Fu) | 0x43004300u;
  __nv_bfloat162 r = *reinterpret_cast<const __nv_bfloat162*>(&v);
  r = __hsub2(r, __floats2bfloat162_rn(128.f, 128.f));
  return *reinterpret_cast<uint32_t*>(&r);
}
// q4_pair with its constants in registers, computed once by the caller: c128 = 0x43004300 (so that the mask and
// the or are one LOP3; the inline PTX keeps the compiler from folding it back into two immediates, which
// q4_pair's callers, short of registers, are better off with) and b128 = bf16x2 (128, 128).
__device__ __forceinline__ uint32_t q4_pair_or(uint32_t word, int j, uint32_t c128, __nv_bfloat162 b128) {
  uint32_t v;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(word >> (4 * j)), "n"(0x000F000F), "r"(c128));  // (a & b) | c
  __nv_bfloat162 r = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&v), b128);
  return *reinterpret_cast<uint32_t*>(&r);
}
// The A register for columns c0, c0 + 4 of a group (q4_pair's positions; kernels/gemm_q4f16.cu,
// kernels/gemm_q4ws.cu) as fp16 scale q + bias: 0x6400 | q is the fp16 of 1024 + q, less 1024 exactly q, then one
// fused multiply-add (rounded once).
__device__ __forceinline__ uint32_t f16_pair(uint32_t word, int j, uint32_t c1024, __half2 h1024, __half2 s,
                                             __half2 b) {
  uint32_t v;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(word >> (4 * j)), "n"(0x000F000F), "r"(c1024));  // (a & b) | c
  const __half2 w = __hfma2(__hsub2(*reinterpret_cast<const __half2*>(&v), h1024), s, b);
  return *reinterpret_cast<const uint32_t*>(&w);
}

// A group's A registers, its four k-steps', for tile rows tr0 and tr0 + 8 (tq = lane % 4) from the staged q4 rows
// ws (32 bytes a row) and their scale|bias words sbs; c1024, h1024 as f16_pair takes them.
__device__ __forceinline__ void f16_group_a(const uint8_t* ws, const uint32_t* sbs, int tr0, int tq, uint32_t c1024,
                                            __half2 h1024, uint32_t (&af)[4][4]) {
  uint2 aw[2];  // the row's words 2 tq and 2 tq + 1, rows tr0 and tr0 + 8
  __half2 sc[2], bi[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    aw[rr] = *reinterpret_cast<const uint2*>(ws + (tr0 + 8 * rr) * 32 + 8 * tq);
    const uint32_t sw = sbs[tr0 + 8 * rr];
    sc[rr] = __float2half2_rn(__uint_as_float(sw << 16));
    bi[rr] = __float2half2_rn(__uint_as_float(sw & 0xFFFF0000u));
  }
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int jj = 2 * ks + h;
        af[ks][2 * h + rr] = f16_pair((jj >> 2) ? aw[rr].y : aw[rr].x, jj & 3, c1024, h1024, sc[rr], bi[rr]);
      }
}

// The block's share of a launch: its matrix part and first row (blockIdx.x), the stack's matrix and the slots of
// its TOK-token tile (grouped: blockIdx.y's entry of the work list, counted in tiles of TOK; dense: tokens from
// TOK blockIdx.z); false when the tile holds no token.
struct BlockWork {
  int pi, r_base, mat, slot0, t_base, t_count;  // t_base: within the matrix's slots
};
template <bool PAIRED, int TOK = kGemmTok>
__device__ __forceinline__ bool block_work(const GemmArgs& a, BlockWork& b) {
  int pi = 0;
  while (!PAIRED && pi + 1 < a.parts && static_cast<int>(blockIdx.x) >= a.part[pi].tile_end) ++pi;
  b.pi = pi;
  b.r_base = (blockIdx.x - (pi ? a.part[pi - 1].tile_end : 0)) * (PAIRED ? kGemmRows / 2 : kGemmRows);
  int count = a.n;
  b.mat = 0, b.slot0 = 0, b.t_base = blockIdx.z * TOK;
  if (a.offsets) {
    if (static_cast<int>(blockIdx.y) >= a.tiles[0]) return false;
    const int tile = a.tiles[1 + blockIdx.y];
    b.mat = tile >> 16;
    b.t_base = (tile & 0xFFFF) * TOK;
    b.slot0 = a.offsets[b.mat];
    count = a.offsets[b.mat + 1] - b.slot0;
  }
  if (b.t_base >= count) return false;
  b.t_count = min(TOK, count - b.t_base);
  return true;
}

// Element offsets in hi / lo of the x chunks this thread copies per group: chunk tid + 256 i is piece tid % 8 of
// the tile's token (tid + 256 i) / 8, for the 16-token pairs that hold a valid token (past the tile's last
// token: that token again); -1: none.
__device__ __forceinline__ void x_offsets(const GemmArgs& a, const BlockWork& bw, int tid, int (&xoff)[2]) {
  const int x_rows = (bw.t_count + 15) & ~15;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int t = (tid + i * kGemmThreads) >> 3;
    xoff[i] = -1;
    if (t < x_rows) {
      const int slot = bw.slot0 + bw.t_base + min(t, bw.t_count - 1);
      xoff[i] = (a.x_row ? a.x_row[slot] : slot) * a.cols + (tid & 7) * 8;
    }
  }
}
// The group sums thread tid (kGemmRows <= tid < kGemmRows + kGemmTok) copies: token tid - kGemmRows's (past the
// tile's last token: that token's).
__device__ __forceinline__ const float* gsum_row(const GemmArgs& a, const BlockWork& bw, int tid) {
  const int slot = bw.slot0 + bw.t_base + min(tid - kGemmRows, bw.t_count - 1);
  return a.xsum + static_cast<size_t>(a.x_row ? a.x_row[slot] : slot) * (a.cols / 64);
}
// What a thread of a 4-bit wgmma tile (kernels/gemm.cu, kernels/gemm_q4f16.cu) copies per group, at group 0: one
// 16-byte piece of the weights (tile row tid / 2; PAIRED: gate rows at tile rows 16 q + i, up rows at 16 q + 8 + i),
// two of each x term (token (tid + 256 i) / 8, chunk tid % 8; null where none) with their offsets in a swizzled
// tile, and tile row tid's scale|bias words (tid < kGemmRows; else null).
struct Q4Sources {
  const uint8_t* w;
  const uint32_t* sb;
  const uint16_t* x[2][2];  // [chunk i][term]
  uint32_t xdst[2];
};
// Tile row tr's q4 row (its first byte) and scale|bias words: row r_base + tr of the part; PAIRED: gate rows at
// tile rows 16 q + i, up rows at 16 q + 8 + i (i < 8), r_base + 8 q + i of each. Past the part's rows: its last.
struct Q4Row {
  const uint8_t* w;
  const uint32_t* sb;
};
template <bool PAIRED>
__device__ __forceinline__ Q4Row q4_tile_row(const GemmArgs& a, const BlockWork& bw, int tr) {
  const GemmPart& part = a.part[PAIRED ? (tr >> 3) & 1 : bw.pi];
  const int r = min(PAIRED ? bw.r_base + (tr >> 4) * 8 + (tr & 7) : bw.r_base + tr, a.part[bw.pi].rows - 1);
  return {part.w + bw.mat * a.mat_w_bytes + r * (static_cast<size_t>(a.cols) / 2),
          part.sb + bw.mat * a.mat_groups + static_cast<size_t>(r) * (a.cols / 64)};
}
template <bool PAIRED>
__device__ __forceinline__ Q4Sources q4_sources(const GemmArgs& a, const BlockWork& bw, int tid, const uint16_t* x0,
                                                const uint16_t* x1) {
  Q4Sources q;
  q.w = q4_tile_row<PAIRED>(a, bw, tid >> 1).w + (tid & 1) * 16;
  q.sb = tid < kGemmRows ? q4_tile_row<PAIRED>(a, bw, tid).sb : nullptr;
  int xoff[2];
  x_offsets(a, bw, tid, xoff);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    q.x[i][0] = xoff[i] < 0 ? nullptr : x0 + xoff[i];
    q.x[i][1] = xoff[i] < 0 || !x1 ? nullptr : x1 + xoff[i];
    q.xdst[i] = wgmma::b_chunk_offset((tid + i * kGemmThreads) >> 3, tid & 7);
  }
  return q;
}

// The tile's output for token t, row r of the part: scale * silu(v) * up (PAIRED: v the gate, up the up
// projection) or v (y = or +=); nothing past the tile's tokens or the part's rows.
template <bool PAIRED>
__device__ __forceinline__ void store_out(const GemmArgs& a, const GemmPart& part, const BlockWork& bw, int t, int r,
                                          float v, float up) {
  if (t >= bw.t_count || r >= part.rows) return;
  const int slot = bw.slot0 + bw.t_base + t;
  float* dst = part.y + static_cast<size_t>(slot) * part.ldy + r;
  if constexpr (PAIRED) *dst = swiglu_value(a.scale ? a.scale[slot] : 1.f, v, up);
  else *dst = a.accumulate ? *dst + v : v;
}


// The fp16-form tiles' group loop: step(g, set) for g < groups, the A register set alternating with g (set a
// compile-time 0 or 1).
template <typename Step>
__device__ __forceinline__ void alternate_sets(int groups, Step&& step) {
  int g = 0;
  for (; g + 1 < groups; g += 2) {
    step(g, std::integral_constant<int, 0>{});
    step(g + 1, std::integral_constant<int, 1>{});
  }
  if (g < groups) step(g, std::integral_constant<int, 0>{});
}

// The fp16-form tiles' outputs (kernels/gemm_q4f16.cu, kernels/gemm_q4ws.cu): the accumulators of NT tokens for
// tile rows tr0 and tr0 + 8 (gq = lane / 4, tq = lane % 4) times each token's 2^-e, stored by store_out.
template <bool PAIRED, int NT, int N>
__device__ __forceinline__ void f16_store_tile(const GemmArgs& a, const GemmPart& part, const BlockWork& bw,
                                               const float (&acc)[N], int tr0, int gq, int tq) {
#pragma unroll
  for (int j = 0; j < NT / 8; ++j) {
    float inv[2];  // the 2^-e of columns 8 j + 2 tq (+ 1)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int slot = bw.slot0 + bw.t_base + min(8 * j + 2 * tq + e, bw.t_count - 1);
      inv[e] = a.xf16inv[a.x_row ? a.x_row[slot] : slot];
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int t = 8 * j + 2 * tq + (e & 1);
      if constexpr (PAIRED) {
        if (e < 2)
          store_out<true>(a, part, bw, t, bw.r_base + (tr0 >> 4) * 8 + gq, acc[4 * j + e] * inv[e & 1],
                          acc[4 * j + e + 2] * inv[e & 1]);
      } else {
        store_out<false>(a, part, bw, t, bw.r_base + tr0 + 8 * (e >> 1), acc[4 * j + e] * inv[e & 1], 0.f);
      }
    }
  }
}

// kernels/gemm_rows.cu: whether it takes a dense launch of this format over `tokens` tokens (needs a.rows_kernel,
// q4 or q8, K a multiple of 512, at most 64 tokens), and the launch.
bool gemm_rows_takes(QFormat f, const GemmArgs& a, int tokens);
void launch_gemm_rows(QFormat f, const GemmArgs& a, bool paired, cudaStream_t s);
// kernels/gemm_q4f16.cu: a q4 launch on x's fp16 form (a.xf16hi set).
template <bool PAIRED>
void launch_q4f16(const GemmArgs& a, int grid_y, int max_tokens, cudaStream_t s);
// kernels/gemm_q4ws.cu: the same by the warp-specialised tile of kGemmWsTok tokens (a.ws).
template <bool PAIRED>
void launch_q4ws(const GemmArgs& a, int grid_y, int max_tokens, cudaStream_t s);

}  // namespace lily::cuda::detail
