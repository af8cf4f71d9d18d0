// GPU tests of the 4-bit GEMM on x's one-term fp16 form (kernels/batched.h GemmX::h16, KernelOptions::prompt_x16)
// against CPU references on seeded random inputs:
//   gemm_x_prep     the per-row power-of-two scale (largest |x xs| in [2^14, 2^15); zero rows 1), the fp16
//                   rounding of x xs, the group sums times xs (the same bits), the two-term form unchanged beside it;
//   gemm            dense q4, rows and tokens off the tiles, = and +=; a token's outputs the same bits whatever
//                   the launch's token count; with both forms prepared a q4 launch takes the one-term form and a
//                   q8 launch the two-term form; a q8 launch without the two-term form is refused;
//   gemm_grouped    gathered and plain rows, empty and > 64-slot experts; the 16-token shape the same bits;
//   gemm_swiglu     (dense and grouped) bit for bit the two GEMMs and swiglu_rows.
// The reference takes the input the tensor cores receive (x~ = h16 / xs, read back from the buffer) for the
// scale * q term and x for the bias term, as test_batched.cu does for the two-term form; the tolerance is its rule
// (2x the error of a sequential fp32 reference on the same inputs).
#include <gtest/gtest.h>

#include <memory>

#include "gemm_ref.h"
#include "kernel_test_util.h"
#include "kernels/batched.h"

namespace lily::cuda::test {
namespace {

double f16_to_double(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double v = e == 0 ? std::ldexp(m, -24) : e == 31 ? INFINITY : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

struct X16Buf {  // a GemmXBuf with the one-term buffers, freed on scope exit; forms as asked
  GemmXBuf b;
  X16Buf(int n, int K, bool two_term) : b(gemm_x_alloc(n, K, true)) {
    b.one_term = true;
    b.two_term = two_term;
  }
  ~X16Buf() { gemm_x_free(b); }
  X16Buf(const X16Buf&) = delete;
  X16Buf& operator=(const X16Buf&) = delete;
};

// x~ = h16 / xs of the n rows in b; bad counts the elements off the fp16 rounding of x xs (x [n][ldx]) and the
// rows whose scale is not a power of two putting the largest |x xs| in [2^14, 2^15) (1 for a zero row).
std::vector<double> one_term_of(const GemmXBuf& b, int n, const std::vector<float>& x, int ldx, size_t& bad) {
  const size_t m = static_cast<size_t>(n) * b.K;
  const std::vector<uint16_t> h = to_host(b.h16, m);
  const std::vector<float> xinv = to_host(b.xinv, n);
  std::vector<double> xt(m);
  bad = 0;
  for (int t = 0; t < n; ++t) {
    int e = 0;
    const double f = std::frexp(static_cast<double>(xinv[t]), &e);
    const double xs = 1.0 / xinv[t];
    double mx = 0;
    for (int k = 0; k < b.K; ++k) mx = std::max(mx, std::fabs(static_cast<double>(x[static_cast<size_t>(t) * ldx + k])));
    const bool scale_ok = f == 0.5 && (mx == 0 ? xinv[t] == 1.f : mx * xs >= 16384 && mx * xs < 32768);
    if (!scale_ok) ++bad;
    for (int k = 0; k < b.K; ++k) {
      const size_t i = static_cast<size_t>(t) * b.K + k;
      const size_t p = static_cast<size_t>(t) * b.K + (k / 64) * 64 + pos_of(k % 64);
      const double hv = f16_to_double(h[p]), v = static_cast<double>(x[static_cast<size_t>(t) * ldx + k]) * xs;
      xt[i] = hv * xinv[t];
      const double bound = std::fabs(v) >= std::ldexp(1.0, -14) ? std::ldexp(std::fabs(v), -11) : std::ldexp(1.0, -25);
      if (!(std::fabs(v - hv) <= bound)) ++bad;
    }
  }
  return xt;
}

// x with varied magnitudes (random_x), row 1 zero, row 2 with one value of 3e5 among values near 1e-6 (fp16's
// subnormal range once scaled), row 3 the largest scale (values near 1e-30).
std::vector<float> x16_inputs(std::mt19937_64& rng, int n, int K) {
  std::vector<float> x = random_x(rng, n, K);
  if (n > 3) {
    for (int k = 0; k < K; ++k) {
      x[static_cast<size_t>(1) * K + k] = 0.f;
      x[static_cast<size_t>(2) * K + k] *= 1e-6f;
      x[static_cast<size_t>(3) * K + k] *= 1e-30f;
    }
    x[static_cast<size_t>(2) * K + 7] = 3e5f;
  }
  return x;
}

// close_enough per token (n blocks of `rows` values): the rows of very different scales (x16_inputs) each get
// their own tolerance instead of one set by the largest.
::testing::AssertionResult close_per_token(const std::vector<float>& got, const std::vector<double>& r64,
                                           const std::vector<float>& r32, int rows, const std::string& name) {
  for (size_t t = 0; t * rows < got.size(); ++t) {
    const size_t a = t * rows, b = a + rows;
    const ::testing::AssertionResult r =
        close_enough(std::vector<float>(got.begin() + a, got.begin() + b), std::vector<double>(r64.begin() + a, r64.begin() + b),
                     std::vector<float>(r32.begin() + a, r32.begin() + b), name + " token " + std::to_string(t));
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

// ---- gemm_x_prep ----

TEST(GemmX16, PrepScaleRoundingAndSums) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(8100);
  for (const bool norm : {false, true}) {
    const int n = 37, K = 192;
    const std::vector<float> x = x16_inputs(rng, n, K), nw = random_vec(rng, K, 0.5f, 2.f);
    DevBuf<float> dx(x), dnw(nw), dout(static_cast<size_t>(n) * K);
    X16Buf both(n, K, true);
    XBuf two(n, K);
    const float* w = norm ? dnw.p : nullptr;
    gemm_x_prep(dx.p, K, n, w, 1e-6f, both.b, dout.p, nullptr);
    gemm_x_prep(dx.p, K, n, w, 1e-6f, two.b, nullptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> v = dout.download();  // the (normed) values the forms were made of
    size_t bad = 0;
    one_term_of(both.b, n, v, K, bad);
    EXPECT_EQ(bad, 0u) << (norm ? "normed" : "plain") << ": scale or fp16 rounding off";
    const size_t m = static_cast<size_t>(n) * K, G = m / 64;
    const std::vector<float> gs = to_host(both.b.gsum, G), gs16 = to_host(both.b.gsum16, G), xinv = to_host(both.b.xinv, n);
    size_t sums_off = 0;
    for (size_t i = 0; i < G; ++i) {
      const float e = gs[i] * (1.f / xinv[i / (K / 64)]);
      sums_off += std::memcmp(&e, &gs16[i], sizeof e) != 0;
    }
    EXPECT_EQ(sums_off, 0u) << "gsum16 != xs gsum";
    EXPECT_EQ(to_host(both.b.hi, m), to_host(two.b.hi, m)) << "the two-term form changed beside the one-term form";
    EXPECT_EQ(to_host(both.b.lo, m), to_host(two.b.lo, m));
    EXPECT_EQ(to_host(both.b.gsum, G), to_host(two.b.gsum, G));
  }
}

// ---- dense ----

struct Case {
  int rows, cols, n;
};
const Case kCases[] = {{200, 2048, 70}, {1, 192, 5}, {37, 64, 130}, {129, 2048, 47}, {256, 128, 64}, {300, 512, 17}};

void run_dense(const Case& c, bool accumulate, uint64_t seed) {
  const std::string name = "gemm x16 [" + std::to_string(c.rows) + " x " + std::to_string(c.cols) + "] n " +
                           std::to_string(c.n) + (accumulate ? " +=" : " =");
  std::mt19937_64 rng(seed);
  const HostMat h = random_mat(rng, QFormat::q4, 1, c.rows, c.cols);
  DevMat d(h);
  const int K = c.cols, ldy = c.rows + 3;
  const std::vector<float> x = x16_inputs(rng, c.n, K);
  const std::vector<float> y0 = random_vec(rng, static_cast<size_t>(c.n) * ldy, -2.f, 2.f);
  DevBuf<float> dx(x), dy(y0);
  X16Buf xb(c.n, K, false);
  gemm_x_prep(dx.p, K, c.n, nullptr, 0.f, xb.b, nullptr, nullptr);
  gemm(d.m, 0, xb.b.view(), c.n, dy.p, ldy, accumulate, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  size_t bad = 0;
  const std::vector<double> xt = one_term_of(xb.b, c.n, x, K, bad);
  EXPECT_EQ(bad, 0u) << name << ": scale or fp16 rounding off";
  const std::vector<float> y = dy.download();
  const size_t m = static_cast<size_t>(c.n) * c.rows;
  std::vector<double> r64(m);
  std::vector<float> r32(m), got(m);
  RowW w;
  for (int r = 0; r < c.rows; ++r) {
    row_w(h, 0, r, w);
    for (int t = 0; t < c.n; ++t) {
      const size_t i = static_cast<size_t>(t) * c.rows + r, iy = static_cast<size_t>(t) * ldy + r;
      gemm_dot(w, &xt[static_cast<size_t>(t) * K], &x[static_cast<size_t>(t) * K], K, r64[i], r32[i]);
      if (accumulate) r64[i] += y0[iy], r32[i] += y0[iy];
      got[i] = y[iy];
    }
  }
  EXPECT_TRUE(close_per_token(got, r64, r32, c.rows, name));
  size_t touched = 0;
  for (int t = 0; t < c.n; ++t)
    for (int r = c.rows; r < ldy; ++r) {
      const size_t iy = static_cast<size_t>(t) * ldy + r;
      touched += std::memcmp(&y[iy], &y0[iy], sizeof(float)) != 0;
    }
  EXPECT_EQ(touched, 0u) << name << ": padding columns beyond the rows were written";
}

TEST(GemmX16, DenseOddShapes) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 8200;
  for (const bool acc : {false, true})
    for (const Case& c : kCases) run_dense(c, acc, seed++);
}

TEST(GemmX16, TokenResultsIndependentOfLaunchSize) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(8300);
  const int rows = 4096, K = 256, n_all = 1200;
  DevMat d(random_mat(rng, QFormat::q4, 1, rows, K));
  const std::vector<float> x = random_x(rng, n_all, K);
  DevBuf<float> dx(x);
  X16Buf xb(n_all, K, false);
  gemm_x_prep(dx.p, K, n_all, nullptr, 0.f, xb.b, nullptr, nullptr);
  expect_first_tokens_alone_same(d.m, xb.b, n_all, rows, {1, 5, 16, 17, 33, 64, 70}, "q4 x16");
}

// Both forms in one buffer (the MoE's input: the 8-bit router beside the 4-bit experts): a q4 launch gives the
// one-term-only bits, a q8 launch the two-term-only bits; a q8 launch with only the one-term form is refused.
TEST(GemmX16, EachFormatTakesItsForm) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(8400);
  const int rows = 200, K = 192, n = 70;
  const std::vector<float> x = random_x(rng, n, K);
  DevBuf<float> dx(x);
  X16Buf both(n, K, true), one(n, K, false);
  XBuf two(n, K);
  for (GemmXBuf* b : {&both.b, &one.b, &two.b}) gemm_x_prep(dx.p, K, n, nullptr, 0.f, *b, nullptr, nullptr);
  for (QFormat f : {QFormat::q4, QFormat::q8}) {
    DevMat d(random_mat(rng, f, 1, rows, K));
    DevBuf<float> ya(static_cast<size_t>(n) * rows), yb(ya.n);
    gemm(d.m, 0, both.b.view(), n, ya.p, rows, false, nullptr);
    gemm(d.m, 0, (f == QFormat::q4 ? one.b : two.b).view(), n, yb.p, rows, false, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> a = ya.download(), b = yb.download();
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << fmt_name(f);
    if (f == QFormat::q8) EXPECT_ANY_THROW(gemm(d.m, 0, one.b.view(), n, ya.p, rows, false, nullptr));
  }
}

// ---- grouped, SwiGLU ----

const std::vector<int> kSlots = {5, 0, 77, 1, 0, 13, 33, 2, 0};

struct Grouped {
  std::vector<int> offsets, x_row;
  int S = 0, max_tiles = 0;
  std::unique_ptr<DevBuf<int>> doff, drow, dtiles;
  Grouped(const std::vector<int>& counts, int X) {
    const int E = static_cast<int>(counts.size());
    offsets.assign(E + 1, 0);
    for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
    S = offsets[E];
    x_row.resize(S);
    for (int e = 0; e < E; ++e)  // distinct tokens within an expert, as the MoE's routing gives
      for (int a = offsets[e]; a < offsets[e + 1]; ++a) x_row[a] = (a - offsets[e] + 5 * e) % X;
    max_tiles = gemm_grouped_max_tiles(S, E);
    doff = std::make_unique<DevBuf<int>>(offsets);
    drow = std::make_unique<DevBuf<int>>(x_row);
    dtiles = std::make_unique<DevBuf<int>>(1 + max_tiles);
    gemm_grouped_tiles(doff->p, E, dtiles->p, nullptr);
  }
};

TEST(GemmX16, GroupedAgainstTheReference) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(8500);
  for (const int K : {128, 2048}) {
    const int X = 90, rows = 150;
    Grouped g(kSlots, X);
    const HostMat h = random_mat(rng, QFormat::q4, static_cast<int>(kSlots.size()), rows, K);
    DevMat d(h);
    const std::vector<float> x = x16_inputs(rng, X, K);
    DevBuf<float> dx(x), dy(static_cast<size_t>(g.S) * rows);
    dy.poison();
    X16Buf xb(X, K, false);
    gemm_x_prep(dx.p, K, X, nullptr, 0.f, xb.b, nullptr, nullptr);
    gemm_grouped(d.m, xb.b.view(), g.drow->p, g.doff->p, g.dtiles->p, g.max_tiles, dy.p, rows, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    size_t bad = 0;
    const std::vector<double> xt = one_term_of(xb.b, X, x, K, bad);
    EXPECT_EQ(bad, 0u);
    std::vector<double> r64;
    std::vector<float> r32;
    grouped_ref(h, g.offsets, g.x_row, rows, K, xt, x, r64, r32);
    EXPECT_TRUE(close_per_token(dy.download(), r64, r32, rows, "gemm_grouped x16 K " + std::to_string(K)));
  }
}

// Paired launches equal gate and up launches then swiglu_rows (dense and grouped), and the 16-token shape the
// 64-token one (experts of at most 16 slots), bit for bit.
TEST(GemmX16, SwigluAndSixteenTokenShapeSameBits) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(8600);
  const int K = 512, rows = 200, X = 40;
  const std::vector<int> counts = {3, 0, 16, 1, 7, 16, 0, 2, 11};
  Grouped g(counts, X);
  const int E = static_cast<int>(counts.size());
  DevMat gate(random_mat(rng, QFormat::q4, E, rows, K)), up(random_mat(rng, QFormat::q4, E, rows, K));
  const std::vector<float> x = x16_inputs(rng, X, K), sc = random_vec(rng, g.S, 0.05f, 1.f);
  DevBuf<float> dx(x), dsc(sc);
  X16Buf xb(X, K, false);
  gemm_x_prep(dx.p, K, X, nullptr, 0.f, xb.b, nullptr, nullptr);
  const size_t m = static_cast<size_t>(g.S) * rows;
  DevBuf<float> gy(m), uy(m), ref(m), wide(m), small(m);
  gemm_grouped(gate.m, xb.b.view(), g.drow->p, g.doff->p, g.dtiles->p, g.max_tiles, gy.p, rows, nullptr);
  gemm_grouped(up.m, xb.b.view(), g.drow->p, g.doff->p, g.dtiles->p, g.max_tiles, uy.p, rows, nullptr);
  swiglu_rows(gy.p, uy.p, dsc.p, g.S, rows, ref.p, nullptr);
  for (int hint : {0, 16})
    gemm_grouped_swiglu(gate.m, up.m, xb.b.view(), g.drow->p, g.doff->p, g.dtiles->p, g.max_tiles, dsc.p,
                        hint ? small.p : wide.p, rows, nullptr, hint);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> r = ref.download(), a = wide.download(), b = small.download();
  EXPECT_EQ(0, std::memcmp(r.data(), a.data(), m * sizeof(float))) << "grouped paired vs gate, up, swiglu_rows";
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), m * sizeof(float))) << "16- vs 64-token shape";
  // dense: the first X rows as tokens
  DevBuf<float> dg(static_cast<size_t>(X) * rows), du(dg.n), dref(dg.n), dpair(dg.n);
  const DevMat g0(random_mat(rng, QFormat::q4, 1, rows, K)), u0(random_mat(rng, QFormat::q4, 1, rows, K));
  gemm(g0.m, 0, xb.b.view(), X, dg.p, rows, false, nullptr);
  gemm(u0.m, 0, xb.b.view(), X, du.p, rows, false, nullptr);
  swiglu_rows(dg.p, du.p, nullptr, X, rows, dref.p, nullptr);
  gemm_swiglu(g0.m, u0.m, xb.b.view(), X, dpair.p, rows, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> dr = dref.download(), dp = dpair.download();
  EXPECT_EQ(0, std::memcmp(dr.data(), dp.data(), dr.size() * sizeof(float))) << "dense paired vs gate, up, swiglu_rows";
}

}  // namespace
}  // namespace lily::cuda::test
