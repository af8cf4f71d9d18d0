// CPU matrix products: hand-built MLX words (nibble order, negative scale), every format against a
// double-precision reference on odd sizes, and bit-identical results for one input vs many.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "model/matmul_cpu.h"
#include "util/bf16.h"
#include "util/check.h"

using namespace lily;

namespace {

// A matrix with its own storage, in any format; `ref` holds the exact dequantized values in double.
struct OwnedMat {
  Mat m;
  std::vector<uint16_t> bf;
  std::vector<float> f;
  std::vector<uint32_t> q;
  std::vector<uint16_t> scales, biases;
  std::vector<double> ref;  // [rows][cols]
};

OwnedMat random_mat(MatFormat fmt, int64_t rows, int64_t cols, int bits, int group, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  OwnedMat o;
  o.m.format = fmt;
  o.m.rows = rows;
  o.m.cols = cols;
  o.ref.resize(rows * cols);
  if (fmt == MatFormat::f32) {
    o.f.resize(rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i) o.ref[i] = o.f[i] = u(rng);
    o.m.data = o.f.data();
  } else if (fmt == MatFormat::bf16) {
    o.bf.resize(rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i) {
      o.bf[i] = f32_to_bf16(u(rng));
      o.ref[i] = bf16_to_f32(o.bf[i]);
    }
    o.m.data = o.bf.data();
  } else {
    const int per_word = 32 / bits;
    const int64_t groups = cols / group;
    o.q.resize(rows * cols / per_word);
    o.scales.resize(rows * groups);
    o.biases.resize(rows * groups);
    for (auto& w : o.q) w = static_cast<uint32_t>(rng());
    for (int64_t i = 0; i < rows * groups; ++i) {
      o.scales[i] = f32_to_bf16(u(rng) * 0.1f);  // about half negative
      o.biases[i] = f32_to_bf16(u(rng));
    }
    // Reference dequantization from the bytes (little-endian), independent of the word/shift code.
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(o.q.data());
    const int64_t row_bytes = cols * bits / 8;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < cols; ++i) {
        int qv;
        if (bits == 8) {
          qv = bytes[r * row_bytes + i];
        } else if (bits == 4) {
          const uint8_t b = bytes[r * row_bytes + i / 2];
          qv = (i % 2 == 0) ? (b & 0xF) : (b >> 4);
        } else {  // 2 bits: four per byte, lowest first
          const uint8_t b = bytes[r * row_bytes + i / 4];
          qv = (b >> (2 * (i % 4))) & 3;
        }
        const double s = bf16_to_f32(o.scales[r * groups + i / group]);
        const double b = bf16_to_f32(o.biases[r * groups + i / group]);
        o.ref[r * cols + i] = s * qv + b;
      }
    o.m.bits = bits;
    o.m.group_size = group;
    o.m.data = o.q.data();
    o.m.scales = o.scales.data();
    o.m.biases = o.biases.data();
  }
  return o;
}

std::vector<float> random_vec(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

void expect_matches_reference(const OwnedMat& o, int64_t n, ThreadPool& pool, const char* what) {
  const int64_t rows = o.m.rows, cols = o.m.cols, ldx = cols + 3, ldy = rows + 5;
  std::vector<float> x = random_vec(n * ldx, 99);
  std::vector<float> y(n * ldy, 12345.0f);
  matmul_rows(o.m, x.data(), n, ldx, y.data(), ldy, pool);
  double worst = 0;
  int64_t worst_t = -1, worst_r = -1;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < cols; ++i) {
        ref += o.ref[r * cols + i] * x[t * ldx + i];
        mag += std::fabs(o.ref[r * cols + i] * x[t * ldx + i]);
      }
      const double err = std::fabs(y[t * ldy + r] - ref) / (mag + 1e-30);
      if (err > worst) worst = err, worst_t = t, worst_r = r;
    }
  EXPECT_LT(worst, 2e-6) << what << ": worst relative error at t=" << worst_t << " row=" << worst_r;
  // The padding columns of y are untouched.
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = rows; r < ldy; ++r) ASSERT_EQ(y[t * ldy + r], 12345.0f) << what;
}

}  // namespace

TEST(MatmulCpu, MlxNibbleOrderAndNegativeScale) {
  // One row of 64 4-bit values: word 0 holds elements 0..7 (element 0 in the lowest nibble),
  // word 1 elements 8..15. Values q_i = i for i < 16, 0 afterwards. w_i = -0.5 * q_i + 2.
  std::vector<uint32_t> q(8, 0);
  q[0] = 0x76543210u;
  q[1] = 0xFEDCBA98u;
  uint16_t scale = f32_to_bf16(-0.5f), bias = f32_to_bf16(2.0f);
  Mat m;
  m.format = MatFormat::affine;
  m.rows = 1;
  m.cols = 64;
  m.bits = 4;
  m.group_size = 64;
  m.data = q.data();
  m.scales = &scale;
  m.biases = &bias;
  ThreadPool pool(2);
  struct Case { int index; float expect; };
  for (Case c : {Case{0, 2.0f}, Case{1, 1.5f}, Case{8, -2.0f}, Case{15, -5.5f}, Case{16, 2.0f}, Case{63, 2.0f}}) {
    std::vector<float> x(64, 0.0f);
    x[c.index] = 1.0f;
    float y = 0;
    matvec(m, x.data(), &y, pool);
    EXPECT_EQ(y, c.expect) << "element " << c.index;
  }
  // All ones: sum over i<16 of (2 - 0.5 i) + 48 * 2 = 32 - 60 + 96 = 68.
  std::vector<float> ones(64, 1.0f);
  float y = 0;
  matvec(m, ones.data(), &y, pool);
  EXPECT_EQ(y, 68.0f);
  std::vector<float> row(64);
  gather_row(m, 0, row.data());
  EXPECT_EQ(row[0], 2.0f);
  EXPECT_EQ(row[1], 1.5f);
  EXPECT_EQ(row[15], -5.5f);
}

TEST(MatmulCpu, Mlx8BitByteOrder) {
  // 8-bit: word 0x04030201 holds elements 1, 2, 3, 4 (lowest byte first); scale 0.25, bias -1.
  std::vector<uint32_t> q(16, 0);
  q[0] = 0x04030201u;
  q[15] = 0xFF000000u;  // element 63 = 255
  uint16_t scale = f32_to_bf16(0.25f), bias = f32_to_bf16(-1.0f);
  Mat m;
  m.format = MatFormat::affine;
  m.rows = 1;
  m.cols = 64;
  m.bits = 8;
  m.group_size = 64;
  m.data = q.data();
  m.scales = &scale;
  m.biases = &bias;
  std::vector<float> row(64);
  gather_row(m, 0, row.data());
  EXPECT_EQ(row[0], -0.75f);
  EXPECT_EQ(row[1], -0.5f);
  EXPECT_EQ(row[3], 0.0f);
  EXPECT_EQ(row[4], -1.0f);
  EXPECT_EQ(row[63], 62.75f);
}

TEST(MatmulCpu, EveryFormatMatchesDoubleReference) {
  ThreadPool pool(3);
  struct Case { MatFormat fmt; int64_t rows, cols; int bits, group; const char* what; };
  const Case cases[] = {
      {MatFormat::f32, 37, 203, 0, 0, "f32 37x203"},
      {MatFormat::f32, 1, 5, 0, 0, "f32 1x5"},
      {MatFormat::bf16, 43, 211, 0, 0, "bf16 43x211"},
      {MatFormat::bf16, 130, 2048, 0, 0, "bf16 130x2048"},
      {MatFormat::affine, 37, 192, 4, 64, "q4 gs64 37x192"},
      {MatFormat::affine, 19, 96, 4, 32, "q4 gs32 19x96"},
      {MatFormat::affine, 29, 320, 8, 64, "q8 gs64 29x320"},
      {MatFormat::affine, 11, 128, 2, 64, "q2 gs64 11x128"},
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    OwnedMat o = random_mat(c.fmt, c.rows, c.cols, c.bits, c.group, seed++);
    for (int64_t n : {1, 3, 9}) expect_matches_reference(o, n, pool, c.what);
  }
}

TEST(MatmulCpu, ManyInputsBitIdenticalToOne) {
  ThreadPool pool(4);
  for (MatFormat fmt : {MatFormat::f32, MatFormat::bf16, MatFormat::affine}) {
    OwnedMat o = random_mat(fmt, 53, 448, 4, 64, 7);
    const int64_t n = 7, cols = 448, rows = 53;
    std::vector<float> x = random_vec(n * cols, 5);
    std::vector<float> all(n * rows), one(rows);
    matmul_rows(o.m, x.data(), n, cols, all.data(), rows, pool);
    ThreadPool serial(1);
    for (int64_t t = 0; t < n; ++t) {
      matvec(o.m, x.data() + t * cols, one.data(), serial);
      for (int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(std::memcmp(&one[r], &all[t * rows + r], 4), 0)
            << "format " << static_cast<int>(fmt) << " t=" << t << " r=" << r << ": " << one[r] << " vs "
            << all[t * rows + r];
    }
  }
}

TEST(MatmulCpu, CheckMatRejectsBadAffine) {
  OwnedMat o = random_mat(MatFormat::affine, 4, 128, 4, 64, 3);
  EXPECT_NO_THROW(check_mat(o.m, "w"));
  Mat bad = o.m;
  bad.group_size = 48;
  EXPECT_THROW(check_mat(bad, "w"), Error);
  bad = o.m;
  bad.bits = 3;
  EXPECT_THROW(check_mat(bad, "w"), Error);
}
