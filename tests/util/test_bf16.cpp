// bf16 conversion: round-to-nearest-even and exact round trips.
#include <gtest/gtest.h>

#include "util/bf16.h"

using namespace lily;

TEST(Bf16, RoundTripsExactValues) {
  for (float f : {0.0f, 1.0f, -2.5f, 0.15625f, 65536.0f, -1e-3f}) {
    float r = bf16_to_f32(f32_to_bf16(f));
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(r)), r);
  }
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
}

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  // 1 + 3*2^-8 lies between 1+2^-7 and 1+2^-6: tie goes to even (1 + 2^-6).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256 + 1.0f / 4096)), 1.0f + 1.0f / 128);
}
