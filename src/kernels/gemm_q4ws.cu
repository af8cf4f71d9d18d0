// The prompt path's 4-bit GEMM on x's fp16 form (kernels/gemm_q4f16.cu's arithmetic) by a warp-specialised tile
// of 128 weight rows x 128 tokens: warpgroup 0 only copies (cp.async, each thread's copies of a group announced on
// the stage's "full" mbarrier when they land), warpgroups 1 and 2 only build the A registers of 64 rows each and
// issue the products, and free a stage on its "empty" mbarrier once their products over it are done. No block-wide
// barrier per group: a consumer waits only for the group it needs, the copier only for a free stage. 128 tokens
// per tile build each group's A registers once for twice the tokens of gemm_q4f16's tile. The products of a column
// go in the same order as there (groups, k-steps, x's first term then its second), so a token's bits are that
// kernel's and do not depend on the launch. Selected by KernelOptions::prompt_gemm_ws (GemmX::ws); grouped
// launches take a work list of 128-token tiles (gemm_grouped_tiles). Tested by tests/gpu/test_gemm_ws.cu.
#include <cuda_fp16.h>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/gemm_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/mma.cuh"
#include "kernels/wgmma.cuh"

namespace lily::cuda {
namespace detail {
namespace {

constexpr int kCopiers = 128;                          // warpgroup 0
constexpr int kWsThreads = kCopiers + kGemmThreads;    // + two consumer warpgroups of 64 weight rows
static_assert(kGemmWsTok * 8 == 8 * kCopiers, "eight 16-byte x chunks of each term per copier thread");

// One stage: x's terms (128 tokens x 128 bytes each, swizzled), the q4 rows' group (128 x 32 bytes), their
// scale|bias words; the mbarriers after the last stage.
template <bool ONE>
struct WsTile {
  static constexpr int kBTile = kGemmWsTok * 128;
  static constexpr int kW = (ONE ? 1 : 2) * kBTile;
  static constexpr int kSb = kW + kGemmRows * 32;
  static constexpr int kStage = (kSb + kGemmRows * 4 + 1023) & ~1023;
  static constexpr int kStages = ONE ? 8 : 5;
  static constexpr int kSmem = kStages * kStage + 2 * kStages * 8 + 1024;  // + mbarriers, + the base's alignment
};
static_assert(WsTile<true>::kSmem <= 227 * 1024 && WsTile<false>::kSmem <= 227 * 1024, "one block per SM");

// ONE: x's first fp16 term alone (a.xf16lo null).
template <bool PAIRED, bool ONE>
__global__ void __launch_bounds__(kWsThreads, 1) gemm_q4ws_kernel(GemmArgs a) {
  using T = WsTile<ONE>;
  constexpr int S = T::kStages;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  const uint32_t smem_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t full = smem_s + S * T::kStage, empty = full + 8 * S;  // mbarrier i at + 8 i
  const int tid = threadIdx.x;
  if (tid == 0)
    for (int i = 0; i < S; ++i) {
      mma::mbar_init(full + 8 * i, kCopiers);              // each copier's copies, once landed
      mma::mbar_init(empty + 8 * i, kGemmThreads / 32);    // each consumer warp, its products done
    }
  __syncthreads();
  dep_chain();
  BlockWork bw;
  if (!block_work<PAIRED, kGemmWsTok>(a, bw)) return;
  const int groups = a.cols / 64;

  if (tid < kCopiers) {
    // tile row tid's two 16-byte halves and scale|bias word; chunk tid % 8 of tokens tid / 8 + 16 i (those below
    // the tile's tokens rounded up to 16; past its last token: that token again)
    const Q4Row row = q4_tile_row<PAIRED>(a, bw, tid);
    const int x_rows = (bw.t_count + 15) & ~15;
    int xoff[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int t = (tid >> 3) + 16 * i;
      const int slot = bw.slot0 + bw.t_base + min(t, bw.t_count - 1);
      xoff[i] = t < x_rows ? (a.x_row ? a.x_row[slot] : slot) * a.cols + (tid & 7) * 8 : -1;
    }
    for (int g = 0; g < groups; ++g) {
      const int buf = g % S, use = g / S;
      if (use > 0) mma::mbar_wait(empty + 8 * buf, (use - 1) & 1);
      const uint32_t base = smem_s + buf * T::kStage;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (xoff[i] < 0) continue;
        const uint32_t dst = base + wgmma::b_chunk_offset((tid >> 3) + 16 * i, tid & 7);
        mma::cp16s(dst, a.xf16hi + xoff[i] + g * 64);
        if constexpr (!ONE) mma::cp16s(dst + T::kBTile, a.xf16lo + xoff[i] + g * 64);
      }
      mma::cp16s(base + T::kW + tid * 32, row.w + static_cast<size_t>(g) * 32);
      mma::cp16s(base + T::kW + tid * 32 + 16, row.w + static_cast<size_t>(g) * 32 + 16);
      mma::cp4s(base + T::kSb + tid * 4, row.sb + g);
      mma::mbar_arrive_copies(full + 8 * buf);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");  // (its copies land before the thread leaves)
    return;
  }

  const GemmPart& part = a.part[bw.pi];
  const int t_count = bw.t_count;
  const int ctid = tid - kCopiers, warp = ctid >> 5, lane = tid & 31;
  const int gq = lane >> 2, tq = lane & 3;
  const int tr0 = (warp >> 2) * 64 + (warp & 3) * 16 + gq;  // this thread's tile rows tr0, tr0 + 8
  const uint32_t desc0 = wgmma::b_desc_lo(smem_s);
  const uint32_t c1024 = 0x64006400u;
  const __half2 h1024 = __floats2half2_rn(1024.f, 1024.f);
  auto run = [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    float acc[64];  // (the first NT / 2 used)
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) acc[i] = 0.f;
    uint32_t af[2][4][4];  // two sets of every k-step's A registers: [group % 2][k-step][register]
    // group g, its A registers in set SET: its copies awaited, A built, products issued; then group g - 1's
    // products awaited, which frees their stage and the other set
    auto step = [&](int g, auto set) {
      constexpr int SET = decltype(set)::value;
      const int buf = g % S;
      mma::mbar_wait(full + 8 * buf, (g / S) & 1);
      wgmma::fence_proxy_shared();  // the copies, seen by the tensor cores' reads
      const uint8_t* ws = smem + buf * T::kStage + T::kW;
      const uint32_t* sbs = reinterpret_cast<const uint32_t*>(smem + buf * T::kStage + T::kSb);
      const uint32_t dlo = desc0 + buf * (T::kStage >> 4);
      f16_group_a(ws, sbs, tr0, tq, c1024, h1024, af[SET]);
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        wgmma::m64k16_f16<NT>(acc, af[SET][ks], wgmma::b_desc_from(dlo + 2 * ks), true);
        if constexpr (!ONE)
          wgmma::m64k16_f16<NT>(acc, af[SET][ks], wgmma::b_desc_from(dlo + (T::kBTile >> 4) + 2 * ks), true);
      }
      wgmma::commit();
      wgmma::wait<1>();
      if (g > 0) {
        __syncwarp();
        if (lane == 0) mma::mbar_arrive(empty + 8 * ((g - 1) % S));
      }
    };
    alternate_sets(groups, step);
    wgmma::wait<0>();
    f16_store_tile<PAIRED, NT>(a, part, bw, acc, tr0, gq, tq);
  };
  if (t_count <= 16) run(std::integral_constant<int, 16>{});
  else if (t_count <= 32) run(std::integral_constant<int, 32>{});
  else if (t_count <= 64) run(std::integral_constant<int, 64>{});
  else if (t_count <= 96) run(std::integral_constant<int, 96>{});
  else run(std::integral_constant<int, 128>{});
}

}  // namespace

template <bool PAIRED>
void launch_q4ws(const GemmArgs& a, int grid_y, int max_tokens, cudaStream_t s) {
  const bool one = a.xf16lo == nullptr;
  auto* kernel = one ? gemm_q4ws_kernel<PAIRED, true> : gemm_q4ws_kernel<PAIRED, false>;
  const int smem = one ? WsTile<true>::kSmem : WsTile<false>::kSmem;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(a.part[a.parts - 1].tile_end, grid_y, (max_tokens + kGemmWsTok - 1) / kGemmWsTok);
  launch_pdl(kernel, grid, dim3(kWsThreads), smem, s, a);
}
template void launch_q4ws<false>(const GemmArgs&, int, int, cudaStream_t);
template void launch_q4ws<true>(const GemmArgs&, int, int, cudaStream_t);

}  // namespace detail
}  // namespace lily::cuda
