// bfloat16 <-> float conversions (host and device). bf16 is the top 16 bits of an IEEE float32.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LILY_HD __host__ __device__ __forceinline__
#else
#define LILY_HD inline
#endif

namespace lily {

LILY_HD float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
LILY_HD uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace lily
