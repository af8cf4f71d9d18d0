// The fused MoE block's router logits, summed by the launch that finishes h instead of by a phase of the MoE
// launch (moe_fused.cu). The router is linear in h: logit_e = r * sum_i W[e][i] * (h_i * w_i), with r the
// RMSNorm's 1 / rms of h and w its weight. So whichever launch writes the final h rows (the GDN mixer's out_proj,
// the MoE launch's o_proj phase, or router_sums_kernel when neither does) adds, per block of 16 rows, its
// part of the sum for the E experts and the shared-expert gate into an accumulator; the MoE launch then reads
// the sums with h, multiplies by its own r and selects the experts right after its norm (no router phase, no
// grid barrier before the selection). The accumulator is 64-bit fixed point (units of 2^-32): integer adds
// are associative, so the sums are bit-identical whatever order the blocks' reductions reach the L2 in. The
// MoE launch zeroes it for the next layer after its own reads.
// Layout of the router rows for this (MoeWeightsDev::router_slices, built by moe_build_router_slices): the q8
// bytes W[e][16 b .. 16 b + 15] of row-block b at q + (b * n + e) * 16; the scale|bias word of W[e]'s group
// g = b / 4 at sb + g * n + e (n = E + 1 rows: the E experts, then the shared-expert gate).
#pragma once
#include "kernels/gemv_impl.cuh"

namespace lily::cuda::detail {

constexpr int kRouterRows = 16;                           // h rows per partial (one per warp of a 16-warp block)
constexpr int kRouterBlocks = kHidden / kRouterRows;      // 128 partials per logit
constexpr int kRouterMaxN = kMaxExperts + 1;              // E + 1 <= 257
constexpr float kRouterUnit = 4294967296.f;               // 2^32 fixed-point units per 1.0
// Copies of the accumulator: block b adds to copy b % kRouterCopies, fewer reductions queue on one address; the
// reader adds the copies (integers: the order does not matter).
constexpr int kRouterCopies = 2;

struct RouterPartialDev {
  const uint8_t* q = nullptr;     // the sliced router (above)
  const uint32_t* sb = nullptr;
  const float* norm_w = nullptr;  // [H] the MoE's input norm weight
  unsigned long long* acc = nullptr;  // [kRouterCopies][n] fixed-point sums (MoeScratch::router_acc); null: none
  int n = 0;                      // E + 1
};

struct RouterSlice {
  uint4 q;       // W[e][16 b .. 16 b + 15]
  uint32_t sb;   // scale | bias << 16 of their group
};

// Host (moe_fused.cu): the arguments for a MoE block's router_slices, its norm weight and accumulator.
RouterPartialDev router_partial_dev(const RouterSums& s);

// Thread e < n of the block summing row-block b: its 20 bytes of the router (constant: request them early).
// (e: the router row; a block of fewer than n threads takes the last rows in a second call.)
__device__ __forceinline__ RouterSlice router_slice_load(const RouterPartialDev& r, int b, int e = threadIdx.x) {
  RouterSlice s{};
  if (e < r.n) {
    s.q = ld_stream(r.q + (static_cast<size_t>(b) * r.n + e) * 16);
    s.sb = ld_stream_u32(r.sb + static_cast<size_t>(b / (kGroupSize / kRouterRows)) * r.n + e);
  }
  return s;
}

// hw[i] = h_i * w_i for the block's rows 16 b + i (shared memory, visible to every thread): thread e < n adds
// sum_i W[e][16 b + i] * hw[i] to acc[e] (a reduction in the L2: fire and forget).
__device__ __forceinline__ void router_partial_add(const RouterPartialDev& r, const RouterSlice& s, const float* hw,
                                                   int e = threadIdx.x) {
  if (e >= r.n) return;
  const uint32_t w[4] = {s.q.x, s.q.y, s.q.z, s.q.w};
  float raw = 0.f, sum = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float x = hw[4 * k + j];
      raw = fmaf(static_cast<float>((w[k] >> (8 * j)) & 0xffu), x, raw);
      sum += x;
    }
  const float p = fmaf(bf16_lo(s.sb), raw, bf16_hi(s.sb) * sum);
  const long long v = __float2ll_rn(p * kRouterUnit);
  unsigned long long* acc = r.acc + (blockIdx.x % kRouterCopies) * r.n + e;
  asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(acc), "l"(v) : "memory");
}

// The logit from a sum (fixed point) and the reading block's 1 / rms.
__device__ __forceinline__ float router_logit(unsigned long long acc, float rms_inv) {
  return static_cast<float>(static_cast<double>(static_cast<long long>(acc)) / kRouterUnit) * rms_inv;
}

}  // namespace lily::cuda::detail
