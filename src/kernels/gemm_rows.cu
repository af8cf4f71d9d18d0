// The prompt GEMM's arithmetic for dense launches of few tokens (a batched decode step's passes: up to 64 tokens, a
// block per 16): the same two-term bf16 x, integer weight codes on mma.sync and per-group scale and bias in fp32,
// but shaped for bandwidth instead of reuse. A block takes 16 MT weight rows and all of K; its 8 warps split each
// phase of K (8 or 16 groups) between them, load their weights straight into registers (every load of the phase
// issued before any product) and read x from shared memory, which holds the phase's columns for the tile's 8 or 16
// tokens. The warps' sums meet in shared memory at the end and are added in warp order. A token's column is
// computed the same way whatever the other columns hold, so its bits do not depend on the launch's other tokens.
// Tested by tests/gpu/test_gemm_rows.cu against the CPU reference and the 64-token kernels.
#include <algorithm>
#include <type_traits>

#include "kernels/gemm_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/mma.cuh"
#include "kernels/qdot.cuh"

namespace lily::cuda::detail {
namespace {

constexpr int kRowsThreads = 256;
constexpr int kRowsWarps = kRowsThreads / 32;
constexpr int kRowsMaxTok = 16;       // tokens a block takes
constexpr int kRowsMaxDenseTok = 64;  // a dense launch's tokens: groups of 16 along the grid's y
constexpr int kRedStride = kRowsMaxTok + 1;  // floats per tile row of the warps' sums (no bank conflicts)

struct RowsArgs {
  GemmArgs g;
  int blk_end[kGemmMaxParts];  // blocks of this and the earlier parts (dense launches)
};

__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

// A lane's weights of one row and one group: q4 its 16 columns 16 tq .. 16 tq + 15 (two words), q8 the same
// columns as 16 bytes.
template <int BITS>
struct RowPiece {
  using T = std::conditional_t<BITS == 4, uint2, uint4>;
};
// The A register for k-slot pair jj (0..7) of a group (columns 8 (2 tq + jj / 4) + jj % 4 and + 4), as in gemm.cu.
__device__ __forceinline__ uint32_t a_reg(uint2 w, int jj) { return q4_pair((jj >> 2) ? w.y : w.x, jj & 3); }
__device__ __forceinline__ uint32_t a_reg(uint4 w, int jj) {  // q8: bytes 8 (jj / 4) + jj % 4 and + 4
  const uint32_t lo = (jj >> 2) ? w.z : w.x, hi = (jj >> 2) ? w.w : w.y;
  const int sh = 8 * (jj & 3);
  return mma::pack_bf16x2(static_cast<float>((lo >> sh) & 0xFFu), static_cast<float>((hi >> sh) & 0xFFu));
}

// MT: 16-row m-tiles per block (PAIRED: half gate rows, half up rows); GW: groups per warp and phase (a phase
// is 8 GW groups); NT: 8-token n-tiles (1 or 2).
template <int BITS, int MT, int GW, bool PAIRED>
__global__ void __launch_bounds__(kRowsThreads, 2) gemm_rows_kernel(RowsArgs ra) {
  constexpr int RB = 16 * MT;              // tile rows
  constexpr int P = 8 * GW;                // groups per phase
  constexpr int XS = P * 64 + 8;           // bf16 per staged x row (16 bytes of padding: ldmatrix's rows)
  using Piece = typename RowPiece<BITS>::T;
  const GemmArgs& a = ra.g;
  extern __shared__ __align__(16) uint8_t smem[];
  dep_chain();
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);                                    // [2][16][XS]
  float* gs = reinterpret_cast<float*>(smem + 2 * kRowsMaxTok * XS * 2);             // [P][16]
  float* red = reinterpret_cast<float*>(smem);                                         // [8][RB][17] at the end
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;

  int pi = 0;
  while (!PAIRED && pi + 1 < a.parts && static_cast<int>(blockIdx.x) >= ra.blk_end[pi]) ++pi;
  const int r_base = (static_cast<int>(blockIdx.x) - (pi ? ra.blk_end[pi - 1] : 0)) * (PAIRED ? RB / 2 : RB);
  const int slot0 = kRowsMaxTok * static_cast<int>(blockIdx.y);  // the block's group of 16 tokens
  const int count = min(kRowsMaxTok, a.n - slot0);
  if (count <= 0) return;
  const int nrows = count <= 8 ? 8 : 16;  // staged x rows (past count: the last token again)
  const int rows = a.part[pi].rows;
  const int groups = a.cols / 64;
  const size_t row_bytes = static_cast<size_t>(a.cols) * BITS / 8;
  // tile row -> its part and row (clamped: rows past the end load the last one and are not stored)
  auto row_of = [&](int tr) { return min(r_base + (PAIRED ? tr % (RB / 2) : tr), rows - 1); };
  auto part_of = [&](int tr) { return PAIRED ? tr / (RB / 2) : pi; };
  auto wrow = [&](int tr) {
    const int p = part_of(tr);
    const uint8_t* w = p == 0 ? a.part[0].w : p == 1 ? a.part[1].w : p == 2 ? a.part[2].w : a.part[3].w;
    return w + static_cast<size_t>(row_of(tr)) * row_bytes;
  };
  auto sbrow = [&](int tr) {
    const int p = part_of(tr);
    const uint32_t* sb = p == 0 ? a.part[0].sb : p == 1 ? a.part[1].sb : p == 2 ? a.part[2].sb : a.part[3].sb;
    return sb + static_cast<size_t>(row_of(tr)) * groups;
  };
  auto x_src_row = [&](int t) { return static_cast<size_t>(slot0 + min(t, count - 1)) * a.cols; };

  auto run = [&](auto nt_c) {
    constexpr int NT = decltype(nt_c)::value;
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
    for (int ph = 0; ph < groups / P; ++ph) {
      // this warp's weights of the phase: groups ph P + GW warp + j, rows (16 i + gq, + 8) of each m-tile
      Piece wv[GW][MT][2];
      uint32_t sv[GW][MT][2];
#pragma unroll
      for (int j = 0; j < GW; ++j)
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            const int tr = 16 * i + gq + 8 * rr, g = ph * P + GW * warp + j;
            if constexpr (BITS == 4) wv[j][i][rr] = ld_stream8(wrow(tr) + g * 32 + 8 * tq);
            else wv[j][i][rr] = ld_stream(wrow(tr) + g * 64 + 16 * tq);
            sv[j][i][rr] = ld_stream_u32(sbrow(tr) + g);
          }
      if (ph > 0) __syncthreads();  // everyone is done with the previous phase's x
      // the phase's x: hi and lo of nrows tokens, 16-byte pieces; then its group sums
      const int pieces = nrows * P * 8;  // per term
      for (int c = tid; c < 2 * pieces; c += kRowsThreads) {
        const int term = c / pieces, t = (c % pieces) / (P * 8), pc = c % (P * 8);
        const uint16_t* src = (term ? a.xlo : a.xhi) + x_src_row(t) + ph * P * 64 + pc * 8;
        mma::cp16(xs + (term * kRowsMaxTok + t) * XS + pc * 8, src);
      }
      for (int c = tid; c < nrows * P; c += kRowsThreads) {
        const int t = c / P, g = c % P;
        const int slot = slot0 + min(t, count - 1);
        gs[g * kRowsMaxTok + t] = a.xsum[static_cast<size_t>(slot) * groups + ph * P + g];
      }
      mma::commit();
      mma::wait<0>();
      __syncthreads();
#pragma unroll
      for (int j = 0; j < GW; ++j) {
        const int gl = GW * warp + j;  // the group within the phase
        float cg[MT][NT][4];
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) cg[i][n][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          uint32_t b[2][2 * NT];  // [hi, lo]: tokens 0..7 (k-slots 0..7, 8..15), then tokens 8..15
          const int tok = (lane >> 4) * 8 + (lane & 7), kk = gl * 64 + ks * 16 + ((lane >> 3) & 1) * 8;
#pragma unroll
          for (int term = 0; term < 2; ++term) {
            const uint16_t* p = xs + (term * kRowsMaxTok + tok) * XS + kk;
            if constexpr (NT == 2) {
              uint32_t r4[4];
              mma::ldsm_x4(r4, p);
#pragma unroll
              for (int q = 0; q < 4; ++q) b[term][q] = r4[q];
            } else {
              uint32_t r2[2];
              ldsm_x2(r2, p);
              b[term][0] = r2[0], b[term][1] = r2[1];
            }
          }
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            uint32_t af[4];
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int rr = 0; rr < 2; ++rr) af[2 * h + rr] = a_reg(wv[j][i][rr], 2 * ks + h);
#pragma unroll
            for (int term = 0; term < 2; ++term)
#pragma unroll
              for (int n = 0; n < NT; ++n) mma::bf16_16816(cg[i][n], af, b[term][2 * n], b[term][2 * n + 1]);
          }
        }
        // scale * sum q x + bias * sum x for the group, into the running sums
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            const uint32_t s = sv[j][i][rr];
            const float sc = __uint_as_float(s << 16), bi = __uint_as_float(s & 0xFFFF0000u);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
              const float2 xv = *reinterpret_cast<const float2*>(gs + gl * kRowsMaxTok + 8 * n + 2 * tq);
              acc[i][n][2 * rr] = fmaf(bi, xv.x, fmaf(sc, cg[i][n][2 * rr], acc[i][n][2 * rr]));
              acc[i][n][2 * rr + 1] = fmaf(bi, xv.y, fmaf(sc, cg[i][n][2 * rr + 1], acc[i][n][2 * rr + 1]));
            }
          }
      }
    }
    __syncthreads();  // x is read by no one any more: its space takes the warps' sums
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tr = 16 * i + gq + 8 * (e >> 1), t = 8 * n + 2 * tq + (e & 1);
          red[(warp * RB + tr) * kRedStride + t] = acc[i][n][e];
        }
  };
  if (count <= 8) run(std::integral_constant<int, 1>{});
  else run(std::integral_constant<int, 2>{});
  __syncthreads();

  // the warps' sums added in warp order; consecutive threads take consecutive rows of one token
  constexpr int OUT = PAIRED ? RB / 2 : RB;
  const GemmPart& part = a.part[pi];
  for (int c = tid; c < OUT * count; c += kRowsThreads) {
    const int t = c / OUT, tr = c % OUT, r = r_base + tr;
    if (r >= rows) continue;
    float v = 0.f, up = 0.f;
#pragma unroll
    for (int w = 0; w < kRowsWarps; ++w) v += red[(w * RB + tr) * kRedStride + t];
    if constexpr (PAIRED) {
#pragma unroll
      for (int w = 0; w < kRowsWarps; ++w) up += red[(w * RB + tr + OUT) * kRedStride + t];
    }
    const int slot = slot0 + t;
    float* dst = part.y + static_cast<size_t>(slot) * part.ldy + r;
    if constexpr (PAIRED) *dst = swiglu_value(a.scale ? a.scale[slot] : 1.f, v, up);
    else *dst = a.accumulate ? *dst + v : v;
  }
}

template <int BITS, int MT, int GW, bool PAIRED>
void launch_rows(const GemmArgs& g, int grid_y, cudaStream_t s) {
  constexpr int RB = 16 * MT, P = 8 * GW, XS = P * 64 + 8;
  constexpr int smem_x = 2 * kRowsMaxTok * XS * 2 + kRowsMaxTok * P * 4;
  constexpr int smem_red = kRowsWarps * RB * kRedStride * 4;
  constexpr int smem = smem_x > smem_red ? smem_x : smem_red;
  RowsArgs ra;
  ra.g = g;
  int blocks = 0;
  for (int i = 0; i < g.parts; ++i) {
    blocks += PAIRED ? (g.part[0].rows + RB / 2 - 1) / (RB / 2) : (g.part[i].rows + RB - 1) / RB;
    ra.blk_end[i] = blocks;
    if (PAIRED) break;
  }
  for (int i = PAIRED ? 1 : g.parts; i < kGemmMaxParts; ++i) ra.blk_end[i] = blocks;
  auto* k = gemm_rows_kernel<BITS, MT, GW, PAIRED>;
  CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  launch_pdl(k, dim3(blocks, grid_y), dim3(kRowsThreads), smem, s, ra);
}

template <int BITS, bool PAIRED>
void launch_rows_mt(const GemmArgs& g, int grid_y, int mt, int gw, cudaStream_t s) {
  if constexpr (BITS == 4) {
    if (mt == 2) {
      if (gw == 2) launch_rows<BITS, 2, 2, PAIRED>(g, grid_y, s);
      else launch_rows<BITS, 2, 1, PAIRED>(g, grid_y, s);
      return;
    }
  }
  if (gw == 2) launch_rows<BITS, 1, 2, PAIRED>(g, grid_y, s);
  else launch_rows<BITS, 1, 1, PAIRED>(g, grid_y, s);
}

}  // namespace

bool gemm_rows_takes(QFormat f, const GemmArgs& a, int tokens) {
  if (!a.rows_kernel || a.offsets || !(f == QFormat::q4 || f == QFormat::q8) || tokens < 1 ||
      tokens > kRowsMaxDenseTok || a.cols % (8 * 64) != 0)
    return false;
  if (a.rows_any_size) return true;
  long long rows = 0;
  for (int i = 0; i < a.parts; ++i) rows += a.part[i].rows;
  return rows * a.cols <= kRowsMaxWeights;
}

void launch_gemm_rows(QFormat f, const GemmArgs& a, bool paired, cudaStream_t s) {
  const int grid_y = (a.n + kRowsMaxTok - 1) / kRowsMaxTok;  // the token groups
  const int gw = (a.cols / 64) % 16 == 0 ? 2 : 1;
  // two m-tiles a block (half the x traffic per weight byte) where the launch still fills the GPU twice
  int rows = 0;
  for (int i = 0; i < a.parts; ++i) rows += a.part[i].rows;
  if (paired) rows = 2 * a.part[0].rows;
  const int mt = static_cast<long long>(rows / 32) * grid_y >= 2 * sm_count() ? 2 : 1;
  if (f == QFormat::q4) {
    if (paired) launch_rows_mt<4, true>(a, grid_y, mt, gw, s);
    else launch_rows_mt<4, false>(a, grid_y, mt, gw, s);
  } else {
    if (paired) launch_rows_mt<8, true>(a, grid_y, 1, gw, s);
    else launch_rows_mt<8, false>(a, grid_y, 1, gw, s);
  }
}

}  // namespace lily::cuda::detail
