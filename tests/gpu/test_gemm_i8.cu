// GPU tests of the decode pass's dense GEMM on the int8 tensor cores (kernels/gemm_i8.cu): the staged x against a
// CPU emulation of its fixed point (bit for bit without the norm, within the fixed point's bound with it); the
// GEMM against a CPU reference on the staged x~ (tolerance: 2x a sequential fp32 reference's error) for K 512 /
// 2048 / 4096, 1 to 64 tokens (one to four 16-token slices), rows off the 16-row tiles, several matrices in one
// launch, y = and +=, K split between 1 to 8 warps a tile; and a token's bits the same whatever the launch's other
// tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gemm_ref.h"
#include "kernel_test_util.h"
#include "kernels/batched.h"

namespace lily::cuda::test {
namespace {

// x~ of a staged row (K values) read back through the layout of kernels/gemm_i8.cu, and its group sums.
void read_i8x(const std::vector<uint8_t>& bytes, size_t at, int K, std::vector<double>& xt, std::vector<float>& xsum) {
  const int G = K / 64;
  const auto* q = reinterpret_cast<const int8_t*>(bytes.data() + at);
  const auto* sx = reinterpret_cast<const float*>(bytes.data() + at + G * 128);
  xt.assign(K, 0.0);
  xsum.assign(sx + G, sx + 2 * G);
  for (int g = 0; g < G; ++g)
    for (int e = 0; e < 64; ++e) {
      const int w = e / 8, odd = e & 1, i = (e % 8) / 2;
      const int p = g * 128 + (w >> 1) * 16 + (w & 1) * 8 + odd * 4 + i;
      xt[g * 64 + e] = static_cast<double>(sx[g]) * (256.0 * q[p] + q[p + 64]);
    }
}

TEST(GemmI8, StagedRowsAreTheFixedPoint) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(9100);
  for (int K : {2048, 4096, 512})
    for (bool norm : {false, true}) {
      const int n = 5, ldx = K + 64;
      const std::vector<float> x = random_x(rng, n, ldx), nw = random_vec(rng, K, 0.5f, 1.5f);
      DevBuf<float> dx(x), dnw(nw);
      DevBuf<uint8_t> out(n * i8x_row_bytes(K));
      i8x_prep(dx.p, ldx, n, K, norm ? dnw.p : nullptr, 1e-6f, out.p, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<uint8_t> bytes = out.download();
      size_t bad = 0, bad_sum = 0;
      for (int t = 0; t < n; ++t) {
        std::vector<float> row(x.begin() + static_cast<size_t>(t) * ldx, x.begin() + static_cast<size_t>(t) * ldx + K);
        if (norm) {
          double ss = 0;
          for (float v : row) ss += static_cast<double>(v) * v;
          const double rs = 1 / std::sqrt(ss / K + 1e-6);
          for (int c = 0; c < K; ++c) row[c] = static_cast<float>(row[c] * rs * nw[c]);
        }
        std::vector<double> xt;
        std::vector<float> xsum;
        read_i8x(bytes, t * i8x_row_bytes(K), K, xt, xsum);
        const std::vector<double> want = stream_x(row, 64);  // the fixed point per 64-element group
        for (int g = 0; g < K / 64; ++g) {
          double sum = 0, mag = 0, gmax = 0;
          for (int e = g * 64; e < g * 64 + 64; ++e) {
            sum += row[e], mag += std::fabs(row[e]);
            gmax = std::max(gmax, static_cast<double>(std::fabs(row[e])));
          }
          bad_sum += !(std::fabs(xsum[g] - sum) <= 2e-6 * mag);
          for (int e = g * 64; e < g * 64 + 64; ++e)  // with the norm: the row's fp32 rounding differs a little
            bad += norm ? !(std::fabs(xt[e] - row[e]) <= gmax / 32000.0) : xt[e] != want[e];
        }
      }
      EXPECT_EQ(bad, 0u) << "K " << K << (norm ? " with" : " without") << " the norm: staged x~";
      EXPECT_EQ(bad_sum, 0u) << "K " << K << (norm ? " with" : " without") << " the norm: group sums";
    }
}

struct Mats {
  std::vector<HostMat> host;
  std::vector<std::unique_ptr<DevMat>> dev;
};

// y[i] = or += W[i] x over n tokens for matrices of the given rows (width K), against the reference; returns the
// outputs of matrix 0.
std::vector<float> run_case(const std::vector<int>& rows, int K, int n, bool accumulate, uint64_t seed,
                            const std::vector<float>* x_in = nullptr, int ks = 0) {
  const std::string name = "gemm_i8 K " + std::to_string(K) + " n " + std::to_string(n) + " rows " +
                           std::to_string(rows[0]) + (rows.size() > 1 ? "+" : "") + (accumulate ? " +=" : " =") +
                           " ks " + std::to_string(ks);
  std::mt19937_64 rng(seed);
  Mats m;
  for (int r : rows) {
    m.host.push_back(random_mat(rng, QFormat::q4, 1, r, K));
    m.dev.push_back(std::make_unique<DevMat>(m.host.back()));
  }
  const std::vector<float> x = x_in ? std::vector<float>(x_in->begin(), x_in->begin() + static_cast<size_t>(n) * K)
                                    : random_x(rng, n, K);
  DevBuf<float> dx(x);
  DevBuf<uint8_t> xs(n * i8x_row_bytes(K));
  i8x_prep(dx.p, K, n, K, nullptr, 0.f, xs.p, nullptr);
  GemmBatch b;
  b.n = static_cast<int>(rows.size());
  std::vector<std::unique_ptr<DevBuf<float>>> ys;
  std::vector<std::vector<float>> y0s;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int ldy = rows[i] + 3;
    y0s.push_back(random_vec(rng, static_cast<size_t>(n) * ldy, -2.f, 2.f));
    ys.push_back(std::make_unique<DevBuf<float>>(y0s.back()));
    b.W[i] = m.dev[i]->m, b.y[i] = ys.back()->p, b.ldy[i] = ldy;
  }
  gemm_i8(b, xs.p, n, accumulate, nullptr, ks);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> bytes = xs.download();
  std::vector<std::vector<double>> xt(n);
  for (int t = 0; t < n; ++t) {
    std::vector<float> xsum;
    read_i8x(bytes, t * i8x_row_bytes(K), K, xt[t], xsum);
  }
  std::vector<float> first;
  for (size_t i = 0; i < rows.size(); ++i) {
    const HostMat& h = m.host[i];
    const int ldy = rows[i] + 3;
    const std::vector<float> y = ys[i]->download();
    std::vector<double> r64;
    std::vector<float> r32, got;
    for (int t = 0; t < n; ++t)
      for (int r = 0; r < rows[i]; ++r) {
        double d64 = 0;
        float d32 = 0;
        for (int c = 0; c < K; ++c) {
          const double q = h.q(0, r, c);
          d64 += h.scale(0, r, c) * q * xt[t][c] + static_cast<double>(h.bias(0, r, c)) * x[t * K + c];
          d32 += h.scale(0, r, c) * static_cast<float>(q) * static_cast<float>(xt[t][c]) +
                 h.bias(0, r, c) * x[t * K + c];
        }
        const size_t iy = static_cast<size_t>(t) * ldy + r;
        if (accumulate) d64 += y0s[i][iy], d32 += y0s[i][iy];
        r64.push_back(d64), r32.push_back(d32), got.push_back(y[iy]);
      }
    EXPECT_TRUE(close_enough(got, r64, r32, name + " matrix " + std::to_string(i)));
    size_t touched = 0;
    for (int t = 0; t < n; ++t)
      for (int r = rows[i]; r < ldy; ++r)
        touched += std::memcmp(&y[static_cast<size_t>(t) * ldy + r], &y0s[i][static_cast<size_t>(t) * ldy + r], 4) != 0;
    EXPECT_EQ(touched, 0u) << name << ": columns past the rows were written";
    if (i == 0) first = got;
  }
  return first;
}

TEST(GemmI8, AgainstReference) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 9200;
  for (int n : {1, 5, 8, 9, 16, 17, 40, 64})
    for (bool acc : {false, true}) run_case({300}, 2048, n, acc, seed++);
  run_case({37}, 4096, 16, false, seed++);
  run_case({129}, 512, 7, true, seed++);
  run_case({1}, 2048, 3, false, seed++);
  // several matrices in one launch (the GDN input projections: rows of 4 sizes, two of them tiny)
  run_case({200, 77, 32, 32}, 2048, 12, false, seed++);
  run_case({200, 77, 32, 32}, 2048, 57, false, seed++);
  // K split between a tile's warps (1 to 8; the out_proj shape 2048 x 4096 with +=), tiles past the last block
  for (int ks : {1, 2, 4, 8}) {
    run_case({1000}, 4096, 33, true, seed++, nullptr, ks);
    run_case({45, 19}, 4096, 6, false, seed++, nullptr, ks);
  }
  run_case({2048}, 4096, 64, true, seed++);
}

// A token's outputs do not depend on the launch's other tokens: the first m of 64 tokens alone give the same bits
// (within one 16-token slice and across slices), for each split of K.
TEST(GemmI8, TokenResultsIndependentOfLaunchSize) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(9300);
  const int K = 4096, rows = 500;
  const std::vector<float> x = random_x(rng, 64, K);
  for (int ks : {1, 2, 8}) {
    const std::vector<float> all = run_case({rows}, K, 64, false, 9301, &x, ks);
    for (int m : {1, 5, 8, 9, 16, 23}) {
      const std::vector<float> few = run_case({rows}, K, m, false, 9301, &x, ks);
      size_t differ = 0;
      for (size_t i = 0; i < few.size(); ++i) differ += std::memcmp(&few[i], &all[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0u) << "the first " << m << " tokens alone, ks " << ks;
    }
  }
}

}  // namespace
}  // namespace lily::cuda::test
