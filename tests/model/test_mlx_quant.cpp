// MLX affine quantization rule (docs/model.md §4.2): hand-computed groups with a positive and a negative scale,
// nibble / byte order, zero and constant groups, and the error bound on seeded random rows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/mlx_quant.h"
#include "util/bf16.h"

namespace lily {
namespace {

uint32_t code(const std::vector<uint32_t>& packed, int64_t cols, int bits, int64_t row, int64_t col) {
  const int per = 32 / bits;
  return (packed[row * (cols / per) + col / per] >> (bits * (col % per))) & ((1u << bits) - 1);
}

// Fills a group of 64 with seeded values strictly inside (lo, hi), then pins some entries.
std::vector<float> group(float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo * 0.9f, hi * 0.9f);
  std::vector<float> g(64);
  for (auto& x : g) x = u(rng);
  return g;
}

TEST(MlxQuant, PositiveScaleGroup) {
  // |min| > |max|: edge = min = -1.5, scale = 2/15, q0 = rint(-11.25) = -11 -> scale = 1.5/11, bias = -1.5.
  std::vector<float> w = group(-1.5f, 0.5f, 1);
  w[0] = -1.5f;
  w[1] = 0.5f;
  w[2] = 0.0f;
  std::vector<uint32_t> packed(8);
  uint16_t s, b;
  mlx_affine_quantize(w.data(), 1, 64, 4, 64, packed.data(), &s, &b);
  EXPECT_EQ(s, f32_to_bf16(-1.5f / -11.0f));
  EXPECT_GT(bf16_to_f32(s), 0.0f);
  EXPECT_EQ(bf16_to_f32(b), -1.5f);
  EXPECT_EQ(code(packed, 64, 4, 0, 0), 0u);   // min -> 0
  EXPECT_EQ(code(packed, 64, 4, 0, 1), 15u);  // 2.0 / (1.5/11) = 14.67 -> 15
  EXPECT_EQ(code(packed, 64, 4, 0, 2), 11u);  // zero sits exactly on code 11
  // Nibble order: element 0 in the low nibble of byte 0, element 1 in its high nibble.
  EXPECT_EQ(packed[0] & 0xffu, 0xf0u);
}

TEST(MlxQuant, NegativeScaleGroup) {
  // |max| >= |min|: edge = max = 1.5, scale = -2/15, q0 = -11 -> scale = -1.5/11, bias = 1.5.
  std::vector<float> w = group(-0.5f, 1.5f, 2);
  w[0] = 1.5f;
  w[1] = -0.5f;
  w[63] = 0.0f;
  std::vector<uint32_t> packed(8);
  uint16_t s, b;
  mlx_affine_quantize(w.data(), 1, 64, 4, 64, packed.data(), &s, &b);
  EXPECT_LT(bf16_to_f32(s), 0.0f);
  EXPECT_EQ(s, f32_to_bf16(1.5f / -11.0f));
  EXPECT_EQ(bf16_to_f32(b), 1.5f);
  EXPECT_EQ(code(packed, 64, 4, 0, 0), 0u);    // max -> 0
  EXPECT_EQ(code(packed, 64, 4, 0, 1), 15u);   // min -> 15 (clamped from 14.67 rounding)
  EXPECT_EQ(code(packed, 64, 4, 0, 63), 11u);  // last element: high nibble of the last word
  EXPECT_EQ(packed[7] >> 28, 11u);
  // Dequantization uses scale * q + bias, never assumes a positive scale.
  EXPECT_NEAR(mlx_affine_dequant(packed.data(), &s, &b, 64, 4, 64, 0, 1), -0.5f, 0.08f);
  EXPECT_NEAR(mlx_affine_dequant(packed.data(), &s, &b, 64, 4, 64, 0, 63), 0.0f, 0.01f);
}

TEST(MlxQuant, EightBitByteOrder) {
  std::vector<float> w(64);
  for (int i = 0; i < 64; ++i) w[i] = static_cast<float>(i) - 10.0f;  // min -10, max 53
  std::vector<uint32_t> packed(16);
  uint16_t s, b;
  mlx_affine_quantize(w.data(), 1, 64, 8, 64, packed.data(), &s, &b);
  // edge = 53, scale = -63/255, q0 = rint(-214.52) = -215 -> scale = 53/-215.
  EXPECT_EQ(s, f32_to_bf16(53.0f / -215.0f));
  EXPECT_EQ(packed[0] & 0xffu, code(packed, 64, 8, 0, 0));
  EXPECT_EQ((packed[0] >> 8) & 0xffu, code(packed, 64, 8, 0, 1));
  EXPECT_EQ(code(packed, 64, 8, 0, 63), 0u);  // the edge itself
  // Half a step (0.124) plus the bf16 rounding of the scale times q (up to 255 * 0.25 * 2^-9).
  for (int i = 0; i < 64; ++i)
    EXPECT_NEAR(mlx_affine_dequant(packed.data(), &s, &b, 64, 8, 64, 0, i), w[i], 0.26f) << i;
}

TEST(MlxQuant, ZeroAndConstantGroups) {
  std::vector<float> w(128, 0.0f);
  for (int i = 64; i < 128; ++i) w[i] = 0.3f;
  std::vector<uint32_t> packed(16);
  uint16_t s[2], b[2];
  mlx_affine_quantize(w.data(), 1, 128, 4, 64, packed.data(), s, b);
  EXPECT_EQ(mlx_affine_dequant(packed.data(), s, b, 128, 4, 64, 0, 5), 0.0f);
  EXPECT_EQ(bf16_to_f32(b[0]), 0.0f);
  EXPECT_EQ(bf16_to_f32(b[1]), bf16_to_f32(f32_to_bf16(0.3f)));
  EXPECT_NEAR(mlx_affine_dequant(packed.data(), s, b, 128, 4, 64, 0, 100), 0.3f, 2e-3f);
}

TEST(MlxQuant, RandomRowsWithinOneStep) {
  const int64_t rows = 7, cols = 192;  // 3 groups per row, odd row count
  std::mt19937 rng(42);
  std::normal_distribution<float> n(0.0f, 0.3f);
  for (int bits : {4, 8}) {
    std::vector<float> w(rows * cols);
    for (auto& x : w) x = n(rng);
    std::vector<uint32_t> packed(rows * cols * bits / 32);
    std::vector<uint16_t> s(rows * 3), b(rows * 3);
    mlx_affine_quantize(w.data(), rows, cols, bits, 64, packed.data(), s.data(), b.data());
    double worst = 0;
    int64_t wi = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        float step = std::fabs(bf16_to_f32(s[r * 3 + c / 64]));
        float err = std::fabs(mlx_affine_dequant(packed.data(), s.data(), b.data(), cols, bits, 64, r, c) -
                              w[r * cols + c]);
        double ratio = err / (1.05 * step + std::fabs(bf16_to_f32(b[r * 3 + c / 64])) / 256);
        if (ratio > worst) { worst = ratio; wi = r * cols + c; }
      }
    }
    EXPECT_LE(worst, 1.0) << bits << "-bit worst element " << wi << " value " << w[wi];
  }
}

}  // namespace
}  // namespace lily
