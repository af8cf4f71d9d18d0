// GPU tests of the few-token GEMM (kernels/gemm_rows.cu, taken by dense launches of <= 64 tokens when the x
// buffer asks for it: GemmX::few) against the CPU reference of test_batched.cu (gemm_ref.h): dense q4 / q8 with
// K of 8, 16 and 24 groups (one or two groups per warp and phase, several phases), rows off the 16- and 32-row
// tiles and enough rows for the two-tile blocks, 1..64 tokens, y = and +=; a token's outputs the same bits
// whatever the launch's other tokens; gemm_multi and the paired SwiGLU bit for bit the plain ones; and the launch
// really took this kernel (its bits differ from the 64-token tile's).
#include <gtest/gtest.h>

#include <memory>

#include "gemm_ref.h"
#include "kernel_test_util.h"
#include "kernels/batched.h"

namespace lily::cuda::test {
namespace {

struct Case {
  int rows, K, n;
};

// y = or += W x for n tokens through the few-token kernel, against the reference; rows past the matrix's keep
// their bits. Returns the outputs.
// few_all: every launch the kernel can take (its large shapes too); false with few: the production rule.
std::vector<float> run_dense(QFormat f, const Case& c, bool accumulate, uint64_t seed, bool few = true,
                             bool few_all = true) {
  const std::string name = std::string("gemm_rows ") + fmt_name(f) + " [" + std::to_string(c.rows) + " x " +
                           std::to_string(c.K) + "] n " + std::to_string(c.n) + (accumulate ? " +=" : " =");
  std::mt19937_64 rng(seed);
  const HostMat h = random_mat(rng, f, 1, c.rows, c.K);
  DevMat d(h);
  const int ldy = c.rows + 3;
  const std::vector<float> x = random_x(rng, c.n, c.K);
  const std::vector<float> y0 = random_vec(rng, static_cast<size_t>(c.n) * ldy, -2.f, 2.f);
  DevBuf<float> dx(x), dy(y0);
  XBuf xb(c.n, c.K);
  xb.b.few = few;
  xb.b.few_all = few_all;
  gemm_x_prep(dx.p, c.K, c.n, nullptr, 0.f, xb.b, nullptr, nullptr);
  gemm(d.m, 0, xb.b.view(), c.n, dy.p, ldy, accumulate, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  size_t bad = 0;
  const std::vector<double> xt = split_of(xb.b, c.n, x, c.K, bad);
  const std::vector<float> y = dy.download();
  const size_t m = static_cast<size_t>(c.n) * c.rows;
  std::vector<double> r64(m);
  std::vector<float> r32(m), got(m);
  RowW w;
  for (int r = 0; r < c.rows; ++r) {
    row_w(h, 0, r, w);
    for (int t = 0; t < c.n; ++t) {
      const size_t i = static_cast<size_t>(t) * c.rows + r, iy = static_cast<size_t>(t) * ldy + r;
      gemm_dot(w, &xt[static_cast<size_t>(t) * c.K], &x[static_cast<size_t>(t) * c.K], c.K, r64[i], r32[i]);
      if (accumulate) r64[i] += y0[iy], r32[i] += y0[iy];
      got[i] = y[iy];
    }
  }
  EXPECT_TRUE(close_enough(got, r64, r32, name));
  size_t touched = 0;
  for (int t = 0; t < c.n; ++t)
    for (int r = c.rows; r < ldy; ++r) {
      const size_t iy = static_cast<size_t>(t) * ldy + r;
      touched += std::memcmp(&y[iy], &y0[iy], sizeof(float)) != 0;
    }
  EXPECT_EQ(touched, 0u) << name << ": columns past the rows were written";
  return got;
}

size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  size_t d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return d;
}

TEST(GemmRows, DenseAgainstReference) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  // K 512 (8 groups: one a warp), 1536 (24: three phases of 8), 2048 and 4096 (two groups a warp); rows off the
  // tiles; 9000 rows: two m-tiles a block on any GPU of <= 140 SMs
  const Case cases[] = {{300, 2048, 1}, {37, 512, 5},  {1, 1536, 8},   {129, 4096, 9},
                        {300, 2048, 16}, {9000, 512, 3}, {9000, 1024, 12}, {17, 2048, 16},
                        {300, 2048, 40}, {37, 512, 64}, {257, 2048, 17}};  // dense: up to 64 tokens, 16 a block
  uint64_t seed = 8000;
  for (QFormat f : {QFormat::q4, QFormat::q8})
    for (const Case& c : cases)
      for (bool acc : {false, true}) run_dense(f, c, acc, seed++);
}

// The kernel was taken: the same launch through the 64-token tile gives other bits somewhere (another order of
// the sums), and both agree with the reference (above).
TEST(GemmRows, TakenForFewTokens) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  for (QFormat f : {QFormat::q4, QFormat::q8}) {
    const Case c{300, 2048, 7};
    const std::vector<float> few = run_dense(f, c, false, 8100), wide = run_dense(f, c, false, 8100, false);
    EXPECT_GT(differing(few, wide), 0u) << fmt_name(f) << ": the few-token launch gave the 64-token tile's bits";
  }
  // The production rule (GemmX::few alone): a router-sized matrix takes it, one above kRowsMaxWeights does not.
  const Case small{256, 2048, 5}, large{4096, 2048, 5};
  ASSERT_LE(static_cast<long long>(small.rows) * small.K, kRowsMaxWeights);
  ASSERT_GT(static_cast<long long>(large.rows) * large.K, kRowsMaxWeights);
  EXPECT_GT(differing(run_dense(QFormat::q8, small, false, 8200, true, false),
                      run_dense(QFormat::q8, small, false, 8200, false, false)), 0u) << "router-sized: not taken";
  EXPECT_EQ(differing(run_dense(QFormat::q4, large, false, 8201, true, false),
                      run_dense(QFormat::q4, large, false, 8201, false, false)), 0u) << "above the bound: taken";
}

// A token's outputs do not depend on the launch's other tokens (1..64 of them: one or two n-tiles, one to four
// blocks along the tokens).
TEST(GemmRows, TokenResultsIndependentOfLaunchSize) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  for (QFormat f : {QFormat::q4, QFormat::q8}) {
    std::mt19937_64 rng(8200 + static_cast<int>(f));
    const int rows = 9000, K = 2048, n_all = 64;
    DevMat d(random_mat(rng, f, 1, rows, K));
    DevBuf<float> dx(random_x(rng, n_all, K));
    XBuf xb(n_all, K);
    xb.b.few = xb.b.few_all = true;
    gemm_x_prep(dx.p, K, n_all, nullptr, 0.f, xb.b, nullptr, nullptr);
    expect_first_tokens_alone_same(d.m, xb.b, n_all, rows, {1, 5, 8, 9, 15, 16, 17, 40, 63}, fmt_name(f));
  }
}

// gemm_multi (4 matrices, one of 1 row, one big enough for two-tile blocks) equals one launch per matrix; the
// paired SwiGLU equals the two GEMMs and swiglu_rows.
TEST(GemmRows, MultiAndSwigluEqualThePlainLaunches) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  for (QFormat f : {QFormat::q4, QFormat::q8}) {
    std::mt19937_64 rng(8300 + static_cast<int>(f));
    const int K = 2048, n = 11;
    const int rows[4] = {8192, 37, 1, 4096};
    std::vector<std::unique_ptr<DevMat>> mats;
    for (int r : rows) mats.push_back(std::make_unique<DevMat>(random_mat(rng, f, 1, r, K)));
    DevBuf<float> dx(random_x(rng, n, K));
    XBuf xb(n, K);
    xb.b.few = xb.b.few_all = true;
    gemm_x_prep(dx.p, K, n, nullptr, 0.f, xb.b, nullptr, nullptr);
    GemmBatch b;
    b.n = 4;
    std::vector<std::unique_ptr<DevBuf<float>>> multi, single;
    for (int i = 0; i < 4; ++i) {
      const int ldy = rows[i] + i;
      const std::vector<float> y0 = random_vec(rng, static_cast<size_t>(n) * ldy, -2.f, 2.f);
      multi.push_back(std::make_unique<DevBuf<float>>(y0));
      single.push_back(std::make_unique<DevBuf<float>>(y0));
      b.W[i] = mats[i]->m, b.y[i] = multi.back()->p, b.ldy[i] = ldy;
      gemm(mats[i]->m, 0, xb.b.view(), n, single.back()->p, ldy, true, nullptr);
    }
    gemm_multi(b, xb.b.view(), n, true, nullptr);
    // SwiGLU of matrices 0 and 3's first 512 rows as gate and up (K 2048, the shared expert's shape)
    DevMat gate(random_mat(rng, f, 1, 512, K)), up(random_mat(rng, f, 1, 512, K));
    DevBuf<float> g(static_cast<size_t>(n) * 512), u(g.n), want(g.n), got(g.n);
    gemm(gate.m, 0, xb.b.view(), n, g.p, 512, false, nullptr);
    gemm(up.m, 0, xb.b.view(), n, u.p, 512, false, nullptr);
    swiglu_rows(g.p, u.p, nullptr, n, 512, want.p, nullptr);
    gemm_swiglu(gate.m, up.m, xb.b.view(), n, got.p, 512, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(differing(multi[i]->download(), single[i]->download()), 0u) << fmt_name(f) << " multi matrix " << i;
    EXPECT_EQ(differing(got.download(), want.download()), 0u) << fmt_name(f) << " swiglu";
  }
}

}  // namespace
}  // namespace lily::cuda::test
