// GPU tests of the 4-bit GEMM on x's one-term fp16 form (kernels/gemm_f16.cu, kernels/batched.h GemmX::h16):
//   gemm_x_prep     each row's power-of-two scale (its largest magnitude into [2^12, 2^13), rows from 1e-9 to
//                   3e7 and a zero row) and the fp16 values, bit for bit against the fp32 rows it writes;
//   gemm, grouped   against a reference on the operands the tensor cores take (fp16(s q + b), the fp16 x, fp64
//                   sums times 2^e) within the tensor cores' fp32 accumulation over K (a rounding, toward zero,
//                   per 16-term step: (K / 16 + 2) 2^-23 sum |w16 x16|), and against the exact product within
//                   the rounding bound of the two fp16 operands (2 u sum |w x|, u = 2^-11); shapes that take the
//                   16-, 32- and 64-column tiles;
//   paired (SwiGLU) bit for bit the two GEMMs then swiglu_rows, dense, split-K and grouped;
//   launch size     a token's outputs the same bits whatever the launch's other tokens, with and without split-K.
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/batched.h"

namespace lily::cuda::test {
namespace {

bool no_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) != cudaSuccess || n == 0;
}

template <typename T>
std::vector<T> to_host(const T* p, size_t n) {
  std::vector<T> v(n);
  CUDA_CHECK(cudaMemcpy(v.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost));
  return v;
}

struct XBuf {  // a GemmXBuf with the fp16 form, freed on scope exit
  GemmXBuf b;
  XBuf(int n, int K) : b(gemm_x_alloc(n, K, true)) {}
  ~XBuf() { gemm_x_free(b); }
  XBuf(const XBuf&) = delete;
  XBuf& operator=(const XBuf&) = delete;
};

struct SplitBuf {
  GemmSplit s;
  explicit SplitBuf(int blocks) : s(gemm_split_alloc(blocks)) {}
  ~SplitBuf() { gemm_split_free(s); }
  SplitBuf(const SplitBuf&) = delete;
  SplitBuf& operator=(const SplitBuf&) = delete;
};

// x [n][K]: per row a magnitude from 1e-9 to 3e7 (past fp16's 65504 and below its normal 6.1e-5), per element
// another 2^-3..2^3; row 2 all zeros (when n > 2).
std::vector<float> wide_x(std::mt19937_64& rng, int n, int K) {
  const double mags[] = {1.0, 1e-9, 0.0, 3e7, 1e5, 1e-3, 0.25, 40.0};
  std::uniform_int_distribution<int> e_el(-3, 3);
  std::vector<float> x = random_vec(rng, static_cast<size_t>(n) * K);
  for (int t = 0; t < n; ++t)
    for (int k = 0; k < K; ++k) {
      float& v = x[static_cast<size_t>(t) * K + k];
      v = static_cast<float>(std::ldexp(v * mags[t % 8], e_el(rng)));
    }
  return x;
}

int pos_of(int c) {  // the storage position of column c of a 64-element group (inverse of gemm_x_col)
  for (int p = 0; p < 64; ++p)
    if (gemm_x_col(p) == c) return p;
  return -1;
}

// The operands the kernel multiplies: x16[t][k] (column order, fp16 values as double) and 2^e per row.
struct F16X {
  std::vector<double> v;
  std::vector<float> scale;
};
F16X read_f16(const GemmXBuf& b, int n) {
  const std::vector<uint16_t> h = to_host(b.h16, static_cast<size_t>(n) * b.K);
  F16X r;
  r.scale = to_host(b.rscale, n);
  r.v.resize(h.size());
  for (int t = 0; t < n; ++t)
    for (int k = 0; k < b.K; ++k) {
      __half hv;
      std::memcpy(&hv, &h[static_cast<size_t>(t) * b.K + (k / 64) * 64 + pos_of(k % 64)], 2);
      r.v[static_cast<size_t>(t) * b.K + k] = __half2float(hv);
    }
  return r;
}

// Row r of matrix e as the kernel dequantises it: fp16(s q + b) with s and b in fp16 (exact for these scales).
std::vector<double> row_f16(const HostMat& h, int e, int r) {
  std::vector<double> w(h.cols);
  for (int k = 0; k < h.cols; ++k) {
    const double s = __half2float(__float2half_rn(h.scale(e, r, k)));
    const double b = __half2float(__float2half_rn(h.bias(e, r, k)));
    w[k] = __half2float(__double2half(s * h.q(e, r, k) + b));  // s q + b is exact in double: one rounding
  }
  return w;
}

// The references of y[t][r] for x row xi: r64 = 2^e sum w16 x16 (fp64), acc its accumulation bound, ex = the
// exact product sum (s q + b) x (fp64) and its bound: the two fp16 roundings of each product (2 u |w x|, u =
// 2^-11), fp32 sums over K (K 2^-24 sum |w x|), and fp16 subnormal weights near zero (2^-24 sum |x|).
struct Ref {
  double r64, acc, ex, bound;
};
Ref ref_at(const HostMat& h, int e, int r, const std::vector<double>& w16, const F16X& xf, const std::vector<float>& x,
           int xi) {
  const int K = h.cols;
  Ref o{0, 0, 0, 0};
  double mag = 0, xmag = 0, mag16 = 0;
  for (int k = 0; k < K; ++k) {
    const double xv = xf.v[static_cast<size_t>(xi) * K + k];
    o.r64 += w16[k] * xv;
    mag16 += std::fabs(w16[k] * xv);
    const double wx = h.at(e, r, k) * x[static_cast<size_t>(xi) * K + k];
    o.ex += wx;
    mag += std::fabs(wx);
    xmag += std::fabs(x[static_cast<size_t>(xi) * K + k]);
  }
  const double sc = xf.scale[xi];
  o.r64 *= sc;
  o.acc = (K / 16 + 2) * std::ldexp(mag16 * sc, -23) + 1e-30;
  o.bound = (2.05 * std::ldexp(1.0, -11) + K * std::ldexp(1.0, -24)) * mag + std::ldexp(xmag, -24) + 1e-30;
  return o;
}

// Both bounds of every output (the stored value's own rounding, 2^-24 |y| and of y0 + v, allowed for).
struct Check {
  size_t n = 0, bad_ref = 0, bad_exact = 0;
  double worst_ref = 0, worst_exact = 0;
  size_t at_ref = 0, at_exact = 0;
  void add(float got, const Ref& o, double base, size_t at) {
    ++n;
    const double slack = std::ldexp(std::fabs(got) + std::fabs(base), -23);
    const double er = std::fabs(got - base - o.r64) / (o.acc + slack);
    const double ee = std::fabs(got - base - o.ex) / (o.bound + slack);
    if (!(er <= 1)) ++bad_ref;
    if (!(ee <= 1)) ++bad_exact;
    if (er > worst_ref || (std::isnan(er) && !std::isnan(worst_ref))) worst_ref = er, at_ref = at;
    if (ee > worst_exact || (std::isnan(ee) && !std::isnan(worst_exact))) worst_exact = ee, at_exact = at;
  }
  void expect(const std::string& name) const {
    EXPECT_EQ(bad_ref, 0u) << name << ": " << bad_ref << " of " << n << " outputs off the fp16-operand reference by more "
                           << "than the accumulation bound (worst " << worst_ref << "x the bound at " << at_ref << ")";
    EXPECT_EQ(bad_exact, 0u) << name << ": " << bad_exact << " of " << n << " outputs outside 2 u sum |w x| of the "
                             << "exact product (worst " << worst_exact << "x the bound at " << at_exact << ")";
    std::printf("%s: worst %.3f of the accumulation bound, %.3f of the rounding bound\n", name.c_str(), worst_ref,
                worst_exact);
  }
};

// y = or += W x over n tokens (dense, optional split) for a q4 [rows x K] matrix.
void run_dense(int rows, int K, int n, bool accumulate, uint64_t seed, const GemmSplit* split = nullptr) {
  const std::string name = "gemm f16 [" + std::to_string(rows) + " x " + std::to_string(K) + "] n " +
                           std::to_string(n) + (accumulate ? " +=" : " =") + (split ? " split-K" : "");
  std::mt19937_64 rng(seed);
  const HostMat h = random_mat(rng, QFormat::q4, 1, rows, K);
  DevMat d(h);
  const int ldy = rows + 3;
  const std::vector<float> x = wide_x(rng, n, K);
  const std::vector<float> y0 = random_vec(rng, static_cast<size_t>(n) * ldy, -2.f, 2.f);
  DevBuf<float> dx(x), dy(y0);
  XBuf xb(n, K);
  gemm_x_prep(dx.p, K, n, nullptr, 0.f, xb.b, nullptr, nullptr);
  gemm(d.m, 0, xb.b.view(), n, dy.p, ldy, accumulate, nullptr, split);
  CUDA_CHECK(cudaDeviceSynchronize());
  const F16X xf = read_f16(xb.b, n);
  const std::vector<float> y = dy.download();
  Check chk;
  for (int r = 0; r < rows; ++r) {
    const std::vector<double> w16 = row_f16(h, 0, r);
    for (int t = 0; t < n; ++t) {
      const size_t iy = static_cast<size_t>(t) * ldy + r;
      const Ref o = ref_at(h, 0, r, w16, xf, x, t);
      chk.add(y[iy], o, accumulate ? y0[iy] : 0.0, iy);
    }
  }
  chk.expect(name);
}

TEST(GemmF16, PrepScalesRowsIntoRange) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(9100);
  const int n = 19, K = 320;
  const std::vector<float> x = wide_x(rng, n, K), nw = random_vec(rng, K, 0.5f, 2.f);
  DevBuf<float> dx(x), dnw(nw), out(static_cast<size_t>(n) * K);
  XBuf xb(n, K);
  for (bool norm : {false, true}) {
    gemm_x_prep(dx.p, K, n, norm ? dnw.p : nullptr, 1e-6f, xb.b, out.p, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> v = out.download(), sc = to_host(xb.b.rscale, n);
    const std::vector<uint16_t> h16 = to_host(xb.b.h16, static_cast<size_t>(n) * K);
    size_t bad = 0;
    for (int t = 0; t < n; ++t) {
      float m = 0.f;
      for (int k = 0; k < K; ++k) m = std::max(m, std::fabs(v[static_cast<size_t>(t) * K + k]));
      int ex = 0;
      const double frac = std::frexp(sc[t], &ex);
      EXPECT_EQ(frac, 0.5) << "row " << t << ": 2^e expected, got " << sc[t];
      if (m > 0) {
        const double mm = m / sc[t];
        EXPECT_TRUE(mm >= 4096 && mm < 8192) << "row " << t << " (norm " << norm << "): max " << m << " / " << sc[t];
      } else {
        EXPECT_EQ(sc[t], 1.f) << "zero row " << t;
      }
      for (int k = 0; k < K; ++k) {
        const __half want = __float2half_rn(v[static_cast<size_t>(t) * K + k] / sc[t]);  // (/ 2^e: exact)
        uint16_t wb;
        std::memcpy(&wb, &want, 2);
        bad += h16[static_cast<size_t>(t) * K + (k / 64) * 64 + pos_of(k % 64)] != wb;
      }
    }
    EXPECT_EQ(bad, 0u) << "fp16 values that are not fp16(x / 2^e), norm " << norm;
  }
}

TEST(GemmF16, DenseAgainstReference) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 9200;
  // 5 / 20 / 47 tokens: the 16- / 32- / 64-column tiles; 70 and 130: a full tile and a tail
  const int cases[][3] = {{200, 2048, 70}, {1, 192, 5},   {37, 64, 130},  {300, 192, 1},
                          {129, 2048, 47}, {256, 128, 64}, {130, 1024, 20}};
  for (const auto& c : cases)
    for (bool acc : {false, true}) run_dense(c[0], c[1], c[2], acc, seed++);
  SplitBuf sp(40);
  for (const auto& c : cases)
    if (c[2] <= 64) run_dense(c[0], c[1], c[2], false, seed++, &sp.s);
  run_dense(37, 4096, 64, true, seed++, &sp.s);
}

TEST(GemmF16, GroupedAgainstReference) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  for (const auto& [rows, K, gather] : std::vector<std::tuple<int, int, bool>>{{100, 128, true}, {300, 2048, true},
                                                                                {64, 256, false}}) {
    const std::string name = "gemm_grouped f16 [" + std::to_string(rows) + " x " + std::to_string(K) + "]" +
                             (gather ? " x_row" : " x_row=null");
    std::mt19937_64 rng(9300 + K);
    const std::vector<int> counts = {5, 0, 77, 1, 0, 13, 33, 2, 0};
    const int E = static_cast<int>(counts.size());
    std::vector<int> offsets(E + 1, 0);
    for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
    const int S = offsets[E], X = gather ? 40 : S;
    const HostMat h = random_mat(rng, QFormat::q4, E, rows, K);
    DevMat d(h);
    const std::vector<float> x = wide_x(rng, X, K);
    std::vector<int> x_row(S);
    std::uniform_int_distribution<int> pick(0, X - 1);
    for (int a = 0; a < S; ++a) x_row[a] = gather ? pick(rng) : a;
    DevBuf<float> dx(x), dy(static_cast<size_t>(S) * rows);
    DevBuf<int> doff(offsets), drow(x_row);
    dy.poison();
    XBuf xb(X, K);
    gemm_x_prep(dx.p, K, X, nullptr, 0.f, xb.b, nullptr, nullptr);
    const int max_tiles = gemm_grouped_max_tiles(S, E);
    DevBuf<int> dtiles(std::vector<int>(1 + max_tiles, -1));
    gemm_grouped_tiles(doff.p, E, dtiles.p, nullptr);
    gemm_grouped(d.m, xb.b.view(), gather ? drow.p : nullptr, doff.p, dtiles.p, max_tiles, dy.p, rows, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const F16X xf = read_f16(xb.b, X);
    const std::vector<float> y = dy.download();
    Check chk;
    for (int e = 0; e < E; ++e)
      for (int r = 0; r < rows; ++r) {
        const std::vector<double> w16 = row_f16(h, e, r);
        for (int a = offsets[e]; a < offsets[e + 1]; ++a) {
          const size_t i = static_cast<size_t>(a) * rows + r;
          chk.add(y[i], ref_at(h, e, r, w16, xf, x, x_row[a]), 0.0, i);
        }
      }
    chk.expect(name);
  }
}

// The paired launch on the fp16 form equals the two GEMMs and swiglu_rows bit for bit (as on the two-term form).
void run_swiglu(int rows, int K, int n, bool grouped, uint64_t seed, const GemmSplit* split = nullptr) {
  const std::string name = std::string(grouped ? "gemm_grouped_swiglu f16 [" : "gemm_swiglu f16 [") +
                           std::to_string(rows) + " x " + std::to_string(K) + "] n " + std::to_string(n) +
                           (split ? " split-K" : "");
  std::mt19937_64 rng(seed);
  const std::vector<int> counts = grouped ? std::vector<int>{5, 0, 77, 1, 0, 13, 33, 2, 0} : std::vector<int>{n};
  const int E = static_cast<int>(counts.size());
  std::vector<int> offsets(E + 1, 0);
  for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
  const int S = offsets[E], X = grouped ? 40 : n;
  DevMat gate(random_mat(rng, QFormat::q4, E, rows, K)), up(random_mat(rng, QFormat::q4, E, rows, K));
  const std::vector<float> x = wide_x(rng, X, K), sc = random_vec(rng, S, 0.05f, 1.f);
  std::vector<int> x_row(S);
  std::uniform_int_distribution<int> pick(0, X - 1);
  for (int a = 0; a < S; ++a) x_row[a] = grouped ? pick(rng) : a;
  DevBuf<float> dx(x), dsc(sc), dg(static_cast<size_t>(S) * rows), du(dg.n), want(dg.n), got(dg.n);
  DevBuf<int> doff(offsets), drow(x_row);
  const int max_tiles = gemm_grouped_max_tiles(S, E);
  DevBuf<int> dtiles(std::vector<int>(1 + max_tiles, -1));
  got.poison();
  XBuf xb(X, K);
  gemm_x_prep(dx.p, K, X, nullptr, 0.f, xb.b, nullptr, nullptr);
  if (grouped) {
    gemm_grouped_tiles(doff.p, E, dtiles.p, nullptr);
    gemm_grouped(gate.m, xb.b.view(), drow.p, doff.p, dtiles.p, max_tiles, dg.p, rows, nullptr);
    gemm_grouped(up.m, xb.b.view(), drow.p, doff.p, dtiles.p, max_tiles, du.p, rows, nullptr);
    swiglu_rows(dg.p, du.p, dsc.p, S, rows, want.p, nullptr);
    gemm_grouped_swiglu(gate.m, up.m, xb.b.view(), drow.p, doff.p, dtiles.p, max_tiles, dsc.p, got.p, rows, nullptr);
  } else {
    gemm(gate.m, 0, xb.b.view(), n, dg.p, rows, false, nullptr, split);
    gemm(up.m, 0, xb.b.view(), n, du.p, rows, false, nullptr, split);
    swiglu_rows(dg.p, du.p, nullptr, n, rows, want.p, nullptr);
    gemm_swiglu(gate.m, up.m, xb.b.view(), n, got.p, rows, nullptr, split);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> a = got.download(), e = want.download();
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &e[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << name << ": " << differ << " of " << a.size() << " values differ from gemm + swiglu_rows";
}

TEST(GemmF16, SwigluEqualsGemmsThenSwigluRows) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 9400;
  run_swiglu(100, 128, 70, false, seed++);
  run_swiglu(37, 192, 5, false, seed++);
  run_swiglu(512, 2048, 130, false, seed++);
  run_swiglu(129, 128, 0, true, seed++);
  run_swiglu(512, 2048, 0, true, seed++);
  SplitBuf sp(400);
  run_swiglu(512, 2048, 7, false, seed++, &sp.s);
}

// A token's outputs do not depend on the launch's other tokens (the 16 / 32 / 64-column shapes; split-K slices
// depend on the shape only): the first n tokens alone against the same tokens among 1,200 (64 with split-K).
TEST(GemmF16, TokenResultsIndependentOfLaunchSize) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  SplitBuf sp(40);
  for (bool split : {false, true}) {
    std::mt19937_64 rng(9500 + split);
    const int rows = split ? 300 : 4096, K = split ? 2048 : 256, n_all = split ? 64 : 1200;
    const GemmSplit* s = split ? &sp.s : nullptr;
    DevMat d(random_mat(rng, QFormat::q4, 1, rows, K));
    DevBuf<float> dx(wide_x(rng, n_all, K));
    XBuf xb(n_all, K);
    gemm_x_prep(dx.p, K, n_all, nullptr, 0.f, xb.b, nullptr, nullptr);
    DevBuf<float> all(std::vector<float>(static_cast<size_t>(n_all) * rows, 0.f));
    gemm(d.m, 0, xb.b.view(), n_all, all.p, rows, false, nullptr, s);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> ya = all.download();
    for (int n : {1, 5, 16, 17, 33, 64, 70}) {
      if (n > n_all) continue;
      DevBuf<float> part(std::vector<float>(static_cast<size_t>(n) * rows, 0.f));
      gemm(d.m, 0, xb.b.view(), n, part.p, rows, false, nullptr, s);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> yp = part.download();
      EXPECT_EQ(0, std::memcmp(yp.data(), ya.data(), yp.size() * sizeof(float)))
          << (split ? "split-K: " : "") << "the first " << n << " tokens alone differ from the same among " << n_all;
    }
  }
}

}  // namespace
}  // namespace lily::cuda::test
