// The prompt path's 4-bit GEMM on x's one-term fp16 form (kernels/batched.h GemmX::h16): y[t] = 2^e_t W x~[t]
// with W's elements dequantised to fp16 in registers (fp16(s q + b): q exact, s and b exact in fp16, one rounding
// in the fused multiply-add) and x~ = fp16(x 2^-e_t), fp32 sums over the whole of K in the tensor cores. Against
// the two-term kernel (gemm.cu gemm_q4_wgmma_kernel): half the tensor-core products (one term), no per-group
// epilogue (the bias is in the dequantised weight, so no group sums either), and five groups requested ahead.
// Precision: ~11 bits of x and of each weight, within issue 28's bound (bench/RESULTS.md, 2026-12-05; the scales
// and biases must lie in fp16's normal range, 2^-14 .. 65504 in magnitude, as 4-bit checkpoints' do).
// Tile, thread mapping, work list, split-K and stores are the two-term kernel's (kernels/gemm_common.cuh); so a
// token's result is the same bits whatever the launch's other tokens (16 / 32 / 64-column shapes alike).
#include <cuda_fp16.h>

#include "kernels/gemm_common.cuh"
#include "kernels/mma.cuh"
#include "kernels/wgmma.cuh"

namespace lily::cuda::detail {
namespace {

constexpr int kF16Stages = 6;              // groups staged: 5 requested ahead of the one computed
constexpr int kF16BTile = kGemmTok * 128;  // one swizzled fp16 B tile: 64 tokens x 64 k, 8 KB
struct F16Tile {
  static constexpr int kWBytes = kGemmRows * 32;  // one group of the block's q4 rows
  static constexpr int kStage = (kF16BTile + kWBytes + kGemmRows * 4 + 1023) & ~1023;  // + scale|bias words
  static constexpr int kSmem = kF16Stages * kStage + 1024;  // + the slack to align the base to 1 KB
};
static_assert(kGemmTok * 8 == 2 * kGemmThreads, "two 16-byte x chunks per thread (x_offsets)");

// The A register of columns c0, c0 + 4 (gemm_x_col's pair j of a 32-bit word of codes, q4_pair's) as fp16
// s q + b: 0x6400 | q is the fp16 of 1024 + q, so subtracting 1024 gives q exactly; then one fused rounding.
__device__ __forceinline__ uint32_t f16_pair(uint32_t word, int j, __half2 s, __half2 b) {
  const uint32_t v = ((word >> (4 * j)) & 0x000F000Fu) | 0x64006400u;
  __half2 q = __hsub2(*reinterpret_cast<const __half2*>(&v), __floats2half2_rn(1024.f, 1024.f));
  q = __hfma2(q, s, b);
  return *reinterpret_cast<uint32_t*>(&q);
}

// A staged scale|bias word (scale bf16 in the low half, bias in the high half) as fp16 pairs.
__device__ __forceinline__ void sb_half2(uint32_t w, __half2& s, __half2& b) {
  s = __float2half2_rn(__uint_as_float(w << 16));
  b = __float2half2_rn(__uint_as_float(w & 0xFFFF0000u));
}

template <bool PAIRED>
__global__ void __launch_bounds__(kGemmThreads, 2) gemm_q4_f16_kernel(GemmArgs a) {
  using T = F16Tile;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  BlockWork bw;
  if (!block_work<PAIRED>(a, bw)) return;
  const GemmPart& part = a.part[bw.pi];
  const int r_base = bw.r_base, rows = part.rows, mat = bw.mat, t_count = bw.t_count;
  auto tile_part = [](int tr) { return PAIRED ? (tr >> 3) & 1 : 0; };
  auto tile_row = [&](int tr) { return min(PAIRED ? r_base + (tr >> 4) * 8 + (tr & 7) : r_base + tr, rows - 1); };
  const int groups = a.cols / 64;
  const uint8_t* w = part.w + mat * a.mat_w_bytes;
  const uint32_t* sb = part.sb + mat * a.mat_groups;
  const uint8_t* w1 = PAIRED ? a.part[1].w + mat * a.mat_w_bytes : nullptr;
  const uint32_t* sb1 = PAIRED ? a.part[1].sb + mat * a.mat_groups : nullptr;
  const size_t row_bytes = static_cast<size_t>(a.cols) / 2;

  // Per group and thread: one 16-byte piece of the weights (row tid / 2), two of x (token (tid + 256 i) / 8,
  // chunk tid % 8), and for threads below 128 their row's scale|bias word.
  const uint8_t* wsrc = (tile_part(tid >> 1) ? w1 : w) + tile_row(tid >> 1) * row_bytes + (tid & 1) * 16;
  int xoff[2];
  x_offsets(a, bw, tid, xoff);
  const uint32_t* sbsrc =
      tid < kGemmRows ? (tile_part(tid) ? sb1 : sb) + static_cast<size_t>(tile_row(tid)) * groups : nullptr;
  auto stage = [&](int g, int buf) {
    uint8_t* base = smem + buf * T::kStage;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (xoff[i] < 0) continue;
      mma::cp16(base + wgmma::b_chunk_offset((tid + i * kGemmThreads) >> 3, tid & 7), a.xf16 + xoff[i] + g * 64);
    }
    mma::cp16(base + kF16BTile + tid * 16, wsrc + static_cast<size_t>(g) * 32);
    if (sbsrc) mma::cp4(base + kF16BTile + T::kWBytes + tid * 4, sbsrc + g);
    mma::commit();
  };

  const int gq = lane >> 2, tq = lane & 3;
  const int tr0 = (warp >> 2) * 64 + (warp & 3) * 16 + gq;  // this thread's tile rows tr0, tr0 + 8
  int g0, g1;
  k_slice(a, groups, g0, g1);
  for (int i = 0; i < kF16Stages - 1; ++i) {
    if (g0 + i < g1) stage(g0 + i, i);
    else mma::commit();
  }
  auto run = [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    float acc[32];  // (the first NT / 2 used; the first product overwrites them)
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) acc[i] = 0.f;
    // Each group's products are waited for before the next group's A registers are built (they are read by the
    // tensor cores until then; building them while a batch is in flight makes ptxas serialise the wgmmas anyway):
    // the overlap comes from the block's other warpgroup and the SM's other block.
    for (int g = g0; g < g1; ++g) {
      // group g's copies done (one commit per group since), seen by the tensor cores; every warpgroup's products
      // of group g - 1 done (wait<0> below): its buffer takes group g + kF16Stages - 1
      mma::wait<kF16Stages - 2>();
      wgmma::fence_proxy_shared();
      __syncthreads();
      const int next = g + kF16Stages - 1;
      if (next < g1) stage(next, (next - g0) % kF16Stages);
      else mma::commit();
      const uint8_t* base = smem + ((g - g0) % kF16Stages) * T::kStage;
      const uint8_t* ws = base + kF16BTile;
      const uint32_t* sbs = reinterpret_cast<const uint32_t*>(ws + T::kWBytes);
      uint2 aw[2];  // the row's words 2 tq and 2 tq + 1, rows tr0 and tr0 + 8
      __half2 s2[2], b2[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        aw[rr] = *reinterpret_cast<const uint2*>(ws + (tr0 + 8 * rr) * 32 + 8 * tq);
        sb_half2(sbs[tr0 + 8 * rr], s2[rr], b2[rr]);
      }
      uint32_t af[4][4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            const int jj = 2 * ks + h;
            af[ks][2 * h + rr] = f16_pair((jj >> 2) ? aw[rr].y : aw[rr].x, jj & 3, s2[rr], b2[rr]);
          }
      const uint32_t b_addr = static_cast<uint32_t>(__cvta_generic_to_shared(base));
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma::m64k16<NT, true>(acc, af[ks], wgmma::b_desc(b_addr, 32 * ks), g > g0 || ks > 0);
      wgmma::commit();
      wgmma::wait<0>();
    }
    if (!split_finish<NT / 2>(a, acc)) return;
    // back to x's scale: token t's outputs times its row's 2^e (exact)
    float xs[NT / 8][2];
#pragma unroll
    for (int j = 0; j < NT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int slot = bw.slot0 + bw.t_base + min(8 * j + 2 * tq + e, t_count - 1);
        xs[j][e] = a.xscale[a.x_row ? a.x_row[slot] : slot];
      }
#pragma unroll
    for (int j = 0; j < NT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = 8 * j + 2 * tq + (e & 1);
        const float sc = xs[j][e & 1];
        if constexpr (PAIRED) {
          if (e < 2)
            store_out<true>(a, part, bw, t, r_base + (tr0 >> 4) * 8 + gq, acc[4 * j + e] * sc, acc[4 * j + e + 2] * sc);
        } else {
          store_out<false>(a, part, bw, t, r_base + tr0 + 8 * (e >> 1), acc[4 * j + e] * sc, 0.f);
        }
      }
  };
  if (t_count <= 16) run(std::integral_constant<int, 16>{});
  else if (t_count <= 32) run(std::integral_constant<int, 32>{});
  else run(std::integral_constant<int, 64>{});
}

}  // namespace

template <bool PAIRED>
void launch_q4_f16(const GemmArgs& a, int grid_y, int max_tokens, cudaStream_t s) {
  CUDA_CHECK(cudaFuncSetAttribute(gemm_q4_f16_kernel<PAIRED>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  F16Tile::kSmem));
  const dim3 grid(a.part[a.parts - 1].tile_end, grid_y, (max_tokens + kGemmTok - 1) / kGemmTok);
  gemm_q4_f16_kernel<PAIRED><<<grid, kGemmThreads, F16Tile::kSmem, s>>>(a);
  CUDA_CHECK_LAUNCH(s);
}
template void launch_q4_f16<false>(const GemmArgs&, int, int, cudaStream_t);
template void launch_q4_f16<true>(const GemmArgs&, int, int, cudaStream_t);

}  // namespace lily::cuda::detail
