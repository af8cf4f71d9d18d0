// Device building blocks shared by the weight-streaming kernels (gemv.cu, moe.cu): streaming 16-byte loads,
// the per-format "chunk" (16 bytes of packed weights) dot products with the dequantisation in registers,
// warp reductions. A chunk holds 32 (q4), 16 (q8) or 8 (bf16) consecutive elements of one row, always inside
// one 64-element scale/bias group.
//
// q4 trick: each nibble q is placed in bits 19..22 of the float 1.0 (PRMT of a pre-shifted byte), giving
// f = 1 + q/16 exactly; S = sum x*f, and sum x*q = 16 (S - X) with X = sum x over the chunk (precomputed once
// per x). That is one PRMT + one FFMA per element plus 4 integer ops per 8 elements, all in fp32.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/qmat.h"

namespace lily::cuda::detail {

template <QFormat F>
struct Fmt {
  static constexpr int epc = F == QFormat::q4 ? 32 : F == QFormat::q8 ? 16 : 8;  // elements per 16-byte chunk
  static constexpr bool grouped = F != QFormat::bf16;
};

// Read-only streaming load that skips L1 (the weights are read once per token).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_stream8(const void* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld_stream_u32(const uint32_t* p) {
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// x values of one chunk into registers (fp32 or bf16 source), and their sum.
__device__ __forceinline__ float load_x(const float* x, int n, float* out) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < n; i += 4) {
    const float4 v = *reinterpret_cast<const float4*>(x + i);
    out[i] = v.x; out[i + 1] = v.y; out[i + 2] = v.z; out[i + 3] = v.w;
    s += (v.x + v.y) + (v.z + v.w);
  }
  return s;
}
__device__ __forceinline__ float load_x(const uint16_t* x, int n, float* out) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < n; i += 8) {
    const uint4 v = *reinterpret_cast<const uint4*>(x + i);
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[i + 2 * k] = bf16_lo(u[k]);
      out[i + 2 * k + 1] = bf16_hi(u[k]);
      s += out[i + 2 * k] + out[i + 2 * k + 1];
    }
  }
  return s;
}

// Raw dot of one chunk with x (see the header comment for what each format returns).
template <QFormat F>
__device__ __forceinline__ float chunk_raw(const uint4 w, const float* x);

// q4: returns S = sum x_i (1 + q_i / 16).
template <>
__device__ __forceinline__ float chunk_raw<QFormat::q4>(const uint4 w, const float* x) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  float a0 = 0.f, a1 = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t lo = ((ws[k] << 3) & 0x78787878u) | 0x80808080u;  // byte j: 0x80 | q[2j] << 3
    const uint32_t hi = ((ws[k] >> 1) & 0x78787878u) | 0x80808080u;  // byte j: 0x80 | q[2j+1] << 3
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float fl = __uint_as_float(__byte_perm(lo, 0x3f000000u, 0x7044u | (j << 8)));
      const float fh = __uint_as_float(__byte_perm(hi, 0x3f000000u, 0x7044u | (j << 8)));
      a0 = fmaf(x[8 * k + 2 * j], fl, a0);
      a1 = fmaf(x[8 * k + 2 * j + 1], fh, a1);
    }
  }
  return a0 + a1;
}

// q8: returns sum x_i q_i.
template <>
__device__ __forceinline__ float chunk_raw<QFormat::q8>(const uint4 w, const float* x) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  float a0 = 0.f, a1 = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
      const float f0 = __uint_as_float(__byte_perm(ws[k], 0x4b000000u, 0x7440u | j)) - 8388608.f;
      const float f1 = __uint_as_float(__byte_perm(ws[k], 0x4b000000u, 0x7440u | (j + 1))) - 8388608.f;
      a0 = fmaf(x[4 * k + j], f0, a0);
      a1 = fmaf(x[4 * k + j + 1], f1, a1);
    }
  }
  return a0 + a1;
}

// bf16: returns sum x_i w_i.
template <>
__device__ __forceinline__ float chunk_raw<QFormat::bf16>(const uint4 w, const float* x) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  float a0 = 0.f, a1 = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    a0 = fmaf(x[2 * k], bf16_lo(ws[k]), a0);
    a1 = fmaf(x[2 * k + 1], bf16_hi(ws[k]), a1);
  }
  return a0 + a1;
}

// Contribution of one chunk to the row's dot product: raw dot, the group's scale|bias word, x chunk sum.
template <QFormat F>
__device__ __forceinline__ float chunk_dot(const uint4 w, uint32_t sb, const float* x, float xsum) {
  const float raw = chunk_raw<F>(w, x);
  if constexpr (F == QFormat::q4) {
    const float s16 = 16.f * bf16_lo(sb);
    return fmaf(s16, raw - xsum, bf16_hi(sb) * xsum);
  } else if constexpr (F == QFormat::q8) {
    return fmaf(bf16_lo(sb), raw, bf16_hi(sb) * xsum);
  } else {
    return raw;
  }
}

// Sum over aligned groups of N lanes (N a power of two <= 32); every lane of the group gets the total.
template <int N>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = N / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// A block of 256 threads' share of one row of K <= 2048 NW fp32 values for the per-row GEMM input preps
// (kernels/batched.cu, gemm_i8.cu): thread i's words i, i + 256, .. (word w: elements 8 w .. 8 w + 7; zeros past
// K) into u, x and norm_w requested together (16-byte aligned, ldx a multiple of 4); with norm_w, u = x *
// rsqrt(mean(x²) + eps) * norm_w, the sum of squares per thread in element order, the warps' butterflies, the 8
// warps' sums in order (a barrier inside: every thread calls).
template <int NW>
__device__ __forceinline__ void load_row_words(const float* row, const float* norm_w, float eps, int K,
                                               float (&u)[NW][8]) {
  __shared__ float part[8];
  float w[NW][8];
#pragma unroll
  for (int q = 0; q < NW; ++q) {
    const int c = 8 * (threadIdx.x + 256 * q);
#pragma unroll
    for (int k = 0; k < 8; ++k) u[q][k] = 0.f, w[q][k] = 1.f;
    if (c >= K) continue;
    const float4 p0 = *reinterpret_cast<const float4*>(row + c), p1 = *reinterpret_cast<const float4*>(row + c + 4);
    u[q][0] = p0.x, u[q][1] = p0.y, u[q][2] = p0.z, u[q][3] = p0.w, u[q][4] = p1.x, u[q][5] = p1.y, u[q][6] = p1.z,
    u[q][7] = p1.w;
    if (norm_w) {
      const float4 q0 = *reinterpret_cast<const float4*>(norm_w + c);
      const float4 q1 = *reinterpret_cast<const float4*>(norm_w + c + 4);
      w[q][0] = q0.x, w[q][1] = q0.y, w[q][2] = q0.z, w[q][3] = q0.w, w[q][4] = q1.x, w[q][5] = q1.y, w[q][6] = q1.z,
      w[q][7] = q1.w;
    }
  }
  if (!norm_w) return;
  float ss = 0.f;
#pragma unroll
  for (int q = 0; q < NW; ++q)
#pragma unroll
    for (int k = 0; k < 8; ++k) ss = fmaf(u[q][k], u[q][k], ss);
  ss = group_sum<32>(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) tot += part[i];
  const float rs = rsqrtf(tot / K + eps);
#pragma unroll
  for (int q = 0; q < NW; ++q)
#pragma unroll
    for (int k = 0; k < 8; ++k) u[q][k] = u[q][k] * rs * w[q][k];
}

// The sum of a group of 64 elements held as 8 words by 8 consecutive lanes (the preps of kernels/batched.cu and
// gemm_i8.cu): a word's elements as a tree, then a butterfly over the 8 lanes (every lane gets the same sum).
__device__ __forceinline__ float group_word_sum(const float (&u)[8]) {
  float s = ((u[0] + u[1]) + (u[2] + u[3])) + ((u[4] + u[5]) + (u[6] + u[7]));
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// Lane mapping of a compile-time K: a row is split into CH chunks; LPR lanes share a row, each taking NC
// chunks (lane li gets chunks li, li + LPR, ...); a warp holds SUB = 32 / LPR rows at once.
template <QFormat F, int K>
struct RowMap {
  static constexpr int epc = Fmt<F>::epc;
  static constexpr int ch = K / epc;
  static constexpr int lpr = ch < 32 ? ch : 32;
  static constexpr int nc = ch / lpr;
  static constexpr int sub = 32 / lpr;
  static_assert(K % kGroupSize == 0 && ch % lpr == 0 && (lpr & (lpr - 1)) == 0, "unsupported K");
  static constexpr int chunks_per_group = kGroupSize / epc;
};

}  // namespace lily::cuda::detail
