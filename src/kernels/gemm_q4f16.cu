// The prompt path's 4-bit GEMM with every group summed by the tensor cores: x enters as gemm_x_prep's fp16 form
// (each row scaled by a power of two, two fp16 terms) and the weights as fp16 (scale q + bias: with MLX's bf16
// scale and bias almost always exact), so the products of all of K go into one set of fp32 accumulators, with no
// per-group epilogue and no group sums; the output is the sum times the row's 2^-e. Without an epilogue a group's
// A registers are all the warpgroup needs from it, so two sets alternate: group g + 1's are built while group g's
// products run, and the tensor cores are not left idle between groups (the bf16 kernel, kernels/gemm.cu, waits
// for each group's sums before its epilogue and its next A registers). The tile is that kernel's: 128 weight rows x
// 64 tokens, two warpgroups of 64 rows, groups staged through shared memory by cp.async (STAGES in flight), the
// same work split, gather and stores (kernels/gemm_common.cuh). A column's arithmetic does not depend on the
// others: a token's bits do not depend on the launch. Without x's second term (GemmX::f16lo null: the families
// KernelOptions::prompt_x_one_term names) the tile stages and multiplies the first alone. Tested by
// tests/gpu/test_batched.cu.
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/gemm_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/mma.cuh"
#include "kernels/wgmma.cuh"

namespace lily::cuda {
namespace detail {
namespace {

// One stage: x's two terms (64 tokens x 128 bytes each, swizzled), the q4 rows' group (128 x 32 bytes), their
// scale|bias words.
struct F16Tile {
  static constexpr int kTok = kGemmTok;
  static constexpr int kStages = 5;  // groups g .. g + 2 staged or landing while g - 1's products may still run
  static constexpr int kBTile = kTok * 128;
  static constexpr int kWBytes = kGemmRows * 32;
  static constexpr int kWords = 2 * kBTile + kWBytes;  // offset of the scale|bias words
  static constexpr int kStage = (kWords + kGemmRows * 4 + 1023) & ~1023;
  static constexpr int kSmem = kStages * kStage + 1024;  // + the slack to align the base to 1 KB
};
static_assert(2 * (F16Tile::kSmem + 1024) <= 228 * 1024, "two blocks per SM");
static_assert(kGemmTok * 8 == 2 * kGemmThreads, "two 16-byte x chunks of each term per thread (x_offsets)");

// ONE: x's first fp16 term alone (a.xf16lo null; KernelOptions::prompt_x_one_term): half the products.
template <bool PAIRED, bool ONE>
__global__ void __launch_bounds__(kGemmThreads, 2) gemm_q4f16_kernel(GemmArgs a) {
  using T = F16Tile;
  constexpr int kStages = T::kStages;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  dep_chain();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  BlockWork bw;
  if (!block_work<PAIRED>(a, bw)) return;
  const GemmPart& part = a.part[bw.pi];
  const int t_count = bw.t_count;
  const int groups = a.cols / 64;

  // Per group and thread (q4_sources): one 16-byte piece of the weights, two of each x term, one scale|bias word
  // (tid < 128).
  const Q4Sources src = q4_sources<PAIRED>(a, bw, tid, a.xf16hi, a.xf16lo);
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  auto stage = [&](int g, int buf) {
    const uint32_t base = smem_s + buf * T::kStage;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int term = 0; term < (ONE ? 1 : 2) && src.x[i][0]; ++term)
        mma::cp16s(base + term * T::kBTile + src.xdst[i], src.x[i][term] + g * 64);
    mma::cp16s(base + 2 * T::kBTile + tid * 16, src.w + static_cast<size_t>(g) * 32);
    if (src.sb) mma::cp4s(base + T::kWords + tid * 4, src.sb + g);
    mma::commit();
  };

  const int gq = lane >> 2, tq = lane & 3;
  const int tr0 = (warp >> 2) * 64 + (warp & 3) * 16 + gq;  // this thread's tile rows tr0, tr0 + 8
  for (int i = 0; i < kStages - 2; ++i) {
    if (i < groups) stage(i, i);
    else mma::commit();
  }
  const uint32_t desc0 = wgmma::b_desc_lo(smem_s);  // stage 0's hi tile
  const uint32_t c1024 = 0x64006400u;
  const __half2 h1024 = __floats2half2_rn(1024.f, 1024.f);
  // The loop over the groups for the tile's first NT tokens (NT >= t_count: the tensor cores skip the empty
  // columns of an expert's last tile). A column's arithmetic is the same at every NT.
  auto run = [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    float acc[32];  // (the first NT / 2 used)
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) acc[i] = 0.f;
    uint32_t af[2][4][4];  // two sets of every k-step's A registers: [group % 2][k-step][register]
    int buf = 0;           // g % kStages
    // group g, its A registers in set SET: staged (the copies of g + kStages - 2 requested into group g - 2's
    // buffer, whose products every warpgroup has finished), A built, products issued; then group g - 1's products
    // awaited, which frees the other set
    auto step = [&](int g, auto set) {
      constexpr int SET = decltype(set)::value;
      mma::wait<kStages - 3>();
      wgmma::fence_proxy_shared();  // this thread's copies of group g, seen by the tensor cores' reads
      __syncthreads();              // everyone's; and every thread's wait for group g - 2's products
      const int next = g + kStages - 2;
      const int nbuf = buf >= 2 ? buf - 2 : buf + kStages - 2;
      if (next < groups) stage(next, nbuf);
      else mma::commit();
      const uint8_t* base = smem + buf * T::kStage;
      const uint8_t* ws = base + 2 * T::kBTile;
      const uint32_t* sbs = reinterpret_cast<const uint32_t*>(base + T::kWords);
      const uint32_t dlo = desc0 + buf * (T::kStage >> 4);
      buf = buf + 1 == kStages ? 0 : buf + 1;
      f16_group_a(ws, sbs, tr0, tq, c1024, h1024, af[SET]);
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        wgmma::m64k16<NT, true>(acc, af[SET][ks], wgmma::b_desc_from(dlo + 2 * ks), true);
        if constexpr (!ONE)
          wgmma::m64k16<NT, true>(acc, af[SET][ks], wgmma::b_desc_from(dlo + (T::kBTile >> 4) + 2 * ks), true);
      }
      wgmma::commit();
      wgmma::wait<1>();
    };
    alternate_sets(groups, step);
    wgmma::wait<0>();
    f16_store_tile<PAIRED, NT>(a, part, bw, acc, tr0, gq, tq);
  };
  if (t_count <= 16) run(std::integral_constant<int, 16>{});
  else if (t_count <= 32) run(std::integral_constant<int, 32>{});
  else run(std::integral_constant<int, 64>{});
}

}  // namespace

template <bool PAIRED>
void launch_q4f16(const GemmArgs& a, int grid_y, int max_tokens, cudaStream_t s) {
  auto* kernel = a.xf16lo ? gemm_q4f16_kernel<PAIRED, false> : gemm_q4f16_kernel<PAIRED, true>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, F16Tile::kSmem));
  const dim3 grid(a.part[a.parts - 1].tile_end, grid_y, (max_tokens + kGemmTok - 1) / kGemmTok);
  launch_pdl(kernel, grid, dim3(kGemmThreads), F16Tile::kSmem, s, a);
}
template void launch_q4f16<false>(const GemmArgs&, int, int, cudaStream_t);
template void launch_q4f16<true>(const GemmArgs&, int, int, cudaStream_t);

}  // namespace detail
}  // namespace lily::cuda
