// One 4- or 8-bit weight row over many tokens on the prompt GEMMs' split input (kernels/batched.h gemm_one_row):
// the shared expert's gate, which as the third 128-row tile of the router's launch cost the whole router again.
// A block stages the row once (codes as floats in x's storage order, transposed so that lane g reads group g
// without bank conflicts; scale and bias per group), then each warp takes a token: lane g sums q x~ over group
// g (x~ = hi + lo, exact in fp32) in fp32, adds scale * that + bias * the group's sum, and the warp adds its
// lanes' totals. A token's bits do not depend on the launch's other tokens. Tested by tests/gpu/test_batched.cu.
#include <algorithm>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "kernels/qdot.cuh"

namespace lily::cuda {
namespace detail {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kMaxK = 4096, kMaxG = kMaxK / 64;

template <int BITS>
__global__ void __launch_bounds__(kThreads) one_row_kernel(const uint8_t* w, const uint32_t* sb, int K,
                                                            const uint16_t* xhi, const uint16_t* xlo,
                                                            const float* gsum, int n, float* y, int ldy) {
  __shared__ float wq[kMaxK];  // [position p < 64][group g < G]: the code of column gemm_x_col(p) of group g
  __shared__ float sc[kMaxG], bi[kMaxG];
  dep_chain();
  const int G = K / 64;
  for (int i = threadIdx.x; i < K; i += kThreads) {
    const int g = i >> 6, p = i & 63, c = g * 64 + gemm_x_col(p);
    const int q = BITS == 8 ? w[c] : (w[c >> 1] >> ((c & 1) * 4)) & 15;
    wq[p * G + g] = static_cast<float>(q);
  }
  for (int g = threadIdx.x; g < G; g += kThreads) {
    const uint32_t s = sb[g];
    sc[g] = __uint_as_float(s << 16);
    bi[g] = __uint_as_float(s & 0xFFFF0000u);
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int t = blockIdx.x * kWarps + warp; t < n; t += gridDim.x * kWarps) {
    const uint16_t* h = xhi + static_cast<size_t>(t) * K;
    const uint16_t* l = xlo + static_cast<size_t>(t) * K;
    float total = 0.f;
    for (int g = lane; g < G; g += 32) {
      float s = 0.f;
#pragma unroll
      for (int c8 = 0; c8 < 8; ++c8) {  // the group's storage positions 8 c8 .. 8 c8 + 7
        const uint4 hv = *reinterpret_cast<const uint4*>(h + g * 64 + c8 * 8);
        const uint4 lv = *reinterpret_cast<const uint4*>(l + g * 64 + c8 * 8);
        const uint32_t hw[4] = {hv.x, hv.y, hv.z, hv.w}, lw[4] = {lv.x, lv.y, lv.z, lv.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const uint32_t hv2 = hw[e >> 1], lv2 = lw[e >> 1];
          const float xv = (e & 1) ? bf16_hi(hv2) + bf16_hi(lv2) : bf16_lo(hv2) + bf16_lo(lv2);
          s = fmaf(wq[(c8 * 8 + e) * G + g], xv, s);
        }
      }
      total += fmaf(sc[g], s, bi[g] * gsum[static_cast<size_t>(t) * G + g]);
    }
    total = group_sum<32>(total);
    if (lane == 0) y[static_cast<size_t>(t) * ldy] = total;
  }
}

}  // namespace
}  // namespace detail

bool gemm_one_row_supported(const QMat& W) {
  return (W.format == QFormat::q4 || W.format == QFormat::q8) && W.rows == 1 && W.n_mats == 1 && W.sb &&
         W.cols % kGroupSize == 0 && W.cols <= detail::kMaxK;
}

void gemm_one_row(const QMat& W, const GemmX& x, int n, float* y, int ldy, cudaStream_t s) {
  LILY_CHECK(gemm_one_row_supported(W) && x.K == W.cols, "gemm_one_row: a ", W.bits(), "-bit matrix [", W.rows,
             " x ", W.cols, "] of ", W.n_mats, " (one q4 / q8 row of width <= ", detail::kMaxK,
             ", inputs of its width ", x.K, ")");
  if (n <= 0) return;
  const int blocks = std::min((n + detail::kWarps - 1) / detail::kWarps, 1024);
  auto* k = W.format == QFormat::q8 ? detail::one_row_kernel<8> : detail::one_row_kernel<4>;
  launch_pdl(k, dim3(blocks), dim3(detail::kThreads), 0, s, static_cast<const uint8_t*>(W.w),
             static_cast<const uint32_t*>(W.sb), W.cols, x.hi, x.lo, x.gsum, n, y, ldy);
}

}  // namespace lily::cuda
