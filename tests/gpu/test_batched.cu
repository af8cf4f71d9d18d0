// GPU tests of the prompt path's launchers (kernels/batched.h; kernels/gemm.cu, kernels/batched.cu) against CPU
// references on seeded random inputs:
//   gemm            dense q4 / q8 / bf16, rows and tokens off the 128 x 64 tile, K 64..2048, y = and +=, a
//                   row stride above the rows (padding left alone), one matrix of a stack; a token's outputs the
//                   same bits whatever the launch's token count (the q4 kernel's tile shapes);
//   gemm_one_row    one q8 / q4 row over many tokens;
//   gemm_x_prep     the hi + lo split, the group sums, the fused RMSNorm;
//   gemm_grouped    a stack of experts with empty and > 64-slot ones, gathered (repeated) input rows or none;
//   gemm_swiglu, gemm_grouped_swiglu  bit for bit the two GEMMs and swiglu_rows; an expert's slots the same
//                   bits whether its tile is full or nearly empty;
//   moe_select_rows top-k by logit with ties to the lower id, renormalised softmax weights, the shared gate;
//   moe_group       offsets, slots, their token and weight, slot_of a permutation;
//   moe_route_rows  the three launches above (with gemm_grouped_tiles) in one: the same bits and lists;
//   swiglu_rows, moe_combine, embed_rows (out-of-range ids give zero rows).
// The q4 cases run twice: on x's two bf16 terms (kernels/gemm.cu) and on its fp16 form (kernels/gemm_q4f16.cu).
// The GEMM's reference takes the input the tensor cores receive (x~ = hi + lo, read back from the GemmX buffer
// and checked against x within the header's bound 2^-16 |x|) for the scale * q term and x for the bias term (the
// fp16 form: its terms against the weights as fp16(scale q + bias), gemm_ref.h's gemm_dot_f16): the
// split's error (up to 2^-17 |x| per element) is above fp32 rounding, so a reference on x alone would blur the
// tolerance rule (2x the error of a sequential fp32 reference, kernel_test_util.h close_enough).
#include <gtest/gtest.h>

#include <memory>
#include <numeric>

#include "gemm_ref.h"
#include "kernel_test_util.h"
#include "kernels/batched.h"

namespace lily::cuda::test {
namespace {

// ---- gemm (dense) ----

struct GemmCase {
  int rows, cols, n, n_mats, mat;
};

// one: the fp16 form's first term alone (GemmX::f16lo null).
void run_gemm(QFormat fmt, const GemmCase& c, bool accumulate, uint64_t seed, bool f16 = false, bool one = false) {
  const std::string name = std::string("gemm ") + fmt_name(fmt) + (f16 ? one ? " f16 one term" : " f16" : "") +
                           " mat " + std::to_string(c.mat) + "/" +
                           std::to_string(c.n_mats) + " [" + std::to_string(c.rows) + " x " + std::to_string(c.cols) +
                           "] n " + std::to_string(c.n) + (accumulate ? " +=" : " =");
  std::mt19937_64 rng(seed);
  const HostMat h = random_mat(rng, fmt, c.n_mats, c.rows, c.cols);
  DevMat d(h);
  const int K = c.cols, ldy = c.rows + 5;
  const std::vector<float> x = random_x(rng, c.n, K);
  const std::vector<float> y0 = random_vec(rng, static_cast<size_t>(c.n) * ldy, -2.f, 2.f);
  DevBuf<float> dx(x), dy(y0);
  XBuf xb(c.n, K, f16);
  gemm_x_prep(dx.p, K, c.n, nullptr, 0.f, xb.b, nullptr, nullptr);
  GemmX xv = xb.b.view();
  if (one) xv.f16lo = nullptr;
  gemm(d.m, c.mat, xv, c.n, dy.p, ldy, accumulate, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  size_t bad_split = 0;
  const F16X fx = f16 ? f16_of(xb.b, c.n, x, K, bad_split) : F16X{};  // (the fp16 form read back once)
  const std::vector<double> xt = f16 ? f16_xt(fx, K) : split_of(xb.b, c.n, x, K, bad_split);
  EXPECT_EQ(bad_split, 0u) << name << ": x~ outside its bound";
  const std::vector<float> y = dy.download();

  const size_t m = static_cast<size_t>(c.n) * c.rows;
  std::vector<double> r64(m);
  std::vector<float> r32(m), got(m);
  RowW w;
  for (int r = 0; r < c.rows; ++r) {
    row_w(h, c.mat, r, w);
    for (int t = 0; t < c.n; ++t) {
      const size_t i = static_cast<size_t>(t) * c.rows + r, iy = static_cast<size_t>(t) * ldy + r;
      const size_t xi = static_cast<size_t>(t) * K;
      if (f16)
        gemm_dot_f16(f16_row(h, c.mat, r), &fx.hi[xi], one ? nullptr : &fx.lo[xi], fx.inv[t], K, r64[i], r32[i]);
      else
        gemm_dot(w, &xt[xi], &x[xi], K, r64[i], r32[i]);
      if (accumulate) { r64[i] += y0[iy]; r32[i] += y0[iy]; }
      got[i] = y[iy];
    }
  }
  EXPECT_TRUE(close_enough(got, r64, r32, name));
  size_t touched = 0;  // the columns [rows, ldy) of every y row must keep their bits
  for (int t = 0; t < c.n; ++t)
    for (int r = c.rows; r < ldy; ++r) {
      const size_t iy = static_cast<size_t>(t) * ldy + r;
      touched += std::memcmp(&y[iy], &y0[iy], sizeof(float)) != 0;
    }
  EXPECT_EQ(touched, 0u) << name << ": padding columns beyond the rows were written";
}

// Rows off the 128-row tile (1, 37, 129, 200, 300) and tokens off the 64-token tile (1, 5, 47, 70, 130), one
// exact fit; the stacked cases take matrix 2 of 3.
const GemmCase kGemmCases[] = {
    {200, 2048, 70, 1, 0}, {1, 192, 5, 1, 0},    {37, 64, 130, 1, 0},  {300, 192, 1, 3, 2},
    {129, 2048, 47, 3, 2}, {256, 128, 64, 1, 0}, {37, 2048, 130, 1, 0},
};

TEST(Gemm, DenseAllFormatsOddShapes) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 1000;
  for (QFormat f : {QFormat::q4, QFormat::q8, QFormat::bf16})
    for (const GemmCase& c : kGemmCases) run_gemm(f, c, false, seed++);
  for (const GemmCase& c : kGemmCases) run_gemm(QFormat::q4, c, false, seed++, true);
}

TEST(Gemm, DenseAccumulate) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 2000;
  for (QFormat f : {QFormat::q4, QFormat::q8, QFormat::bf16})
    for (const GemmCase& c : kGemmCases) run_gemm(f, c, true, seed++);
  for (const GemmCase& c : kGemmCases) run_gemm(QFormat::q4, c, true, seed++, true);
}

// The fp16 form's first term alone (KernelOptions::prompt_x_one_term), against the products of that term.
TEST(Gemm, DenseF16OneTerm) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 2500;
  for (const bool acc : {false, true})
    for (const GemmCase& c : kGemmCases) run_gemm(QFormat::q4, c, acc, seed++, true, true);
}

// A token's outputs must not depend on how many tokens share its launch (a prompt resumed from a prefix
// snapshot repeats the whole prompt's logits bit for bit): the q4 launches pick the tensor-core shape by the
// tile's token count (16 / 32 / 64 columns), so the first n tokens of a 1,200-token launch must equal launches
// of n tokens alone.
TEST(Gemm, TokenResultsIndependentOfLaunchSize) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  int round = 0;
  for (QFormat f : {QFormat::q4, QFormat::q8, QFormat::bf16, QFormat::q4}) {
    const bool f16 = round++ == 3;  // the second q4 round on the fp16 form
    std::mt19937_64 rng(3500 + static_cast<int>(f));
    const int rows = 4096, K = 256, n_all = 1200;
    DevMat d(random_mat(rng, f, 1, rows, K));
    const std::vector<float> x = random_x(rng, n_all, K);
    DevBuf<float> dx(x);
    XBuf xb(n_all, K, f16);
    gemm_x_prep(dx.p, K, n_all, nullptr, 0.f, xb.b, nullptr, nullptr);
    expect_first_tokens_alone_same(d.m, xb.b, n_all, rows, {1, 5, 16, 17, 33, 64, 70},
                                   f16 ? "q4 f16" : fmt_name(f));
  }
}

// gemm_one_row: a single q8 / q4 row over n tokens (the shared expert gate) against the reference on x~, written
// at a row stride (the other columns left alone), and a token's bits the same whatever the launch's n.
TEST(GemmOneRow, OneRowAgainstTheReference) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(3700);
  for (QFormat f : {QFormat::q8, QFormat::q4})
    for (int K : {512, 2048, 4096}) {
      const std::string name = std::string("gemm_one_row ") + fmt_name(f) + " K " + std::to_string(K);
      const HostMat h = random_mat(rng, f, 1, 1, K);
      DevMat d(h);
      ASSERT_TRUE(gemm_one_row_supported(d.m)) << name;
      const int n = 300, ldy = 3;
      const std::vector<float> x = random_x(rng, n, K);
      const std::vector<float> y0 = random_vec(rng, static_cast<size_t>(n) * ldy, -2.f, 2.f);
      DevBuf<float> dx(x), dy(y0), dy37(y0);
      XBuf xb(n, K);
      gemm_x_prep(dx.p, K, n, nullptr, 0.f, xb.b, nullptr, nullptr);
      gemm_one_row(d.m, xb.b.view(), n, dy.p, ldy, nullptr);
      gemm_one_row(d.m, xb.b.view(), 37, dy37.p, ldy, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      size_t bad_split = 0;
      const std::vector<double> xt = split_of(xb.b, n, x, K, bad_split);
      EXPECT_EQ(bad_split, 0u) << name << ": |x - hi - lo| > 2^-16 |x|";
      const std::vector<float> y = dy.download(), y37 = dy37.download();
      std::vector<double> r64(n);
      std::vector<float> r32(n), got(n);
      RowW w;
      row_w(h, 0, 0, w);
      size_t touched = 0, differ = 0;
      for (int t = 0; t < n; ++t) {
        gemm_dot(w, &xt[static_cast<size_t>(t) * K], &x[static_cast<size_t>(t) * K], K, r64[t], r32[t]);
        got[t] = y[static_cast<size_t>(t) * ldy];
        for (int c = 1; c < ldy; ++c) touched += std::memcmp(&y[t * ldy + c], &y0[t * ldy + c], sizeof(float)) != 0;
        if (t < 37) differ += std::memcmp(&y37[t * ldy], &y[t * ldy], sizeof(float)) != 0;
        else differ += std::memcmp(&y37[t * ldy], &y0[t * ldy], sizeof(float)) != 0;  // (past n: untouched)
      }
      EXPECT_TRUE(close_enough(got, r64, r32, name));
      EXPECT_EQ(touched, 0u) << name << ": columns past the row were written";
      EXPECT_EQ(differ, 0u) << name << ": the first 37 tokens alone differ from the same tokens among 300";
    }
}

// gemm_multi: matrices of several sizes (off the 128-row tile, one of a single row) sharing x in one launch, each
// with its own output stride, must give exactly what one gemm launch per matrix gives (checked above against the
// references): the same per-element arithmetic, only the blocks' assignment to matrices differs.
TEST(Gemm, MultiEqualsOneLaunchPerMatrix) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  int round = 0;
  for (QFormat f : {QFormat::q4, QFormat::q8, QFormat::bf16, QFormat::q4}) {
    const bool f16 = round++ == 3;  // the second q4 round on the fp16 form
    std::mt19937_64 rng(3000 + static_cast<int>(f));
    const int K = 192, n = 70;
    const int rows[4] = {37, 200, 1, 129};
    std::vector<std::unique_ptr<DevMat>> mats;
    for (int r : rows) mats.push_back(std::make_unique<DevMat>(random_mat(rng, f, 1, r, K)));
    const std::vector<float> x = random_x(rng, n, K);
    DevBuf<float> dx(x);
    XBuf xb(n, K, f16);
    gemm_x_prep(dx.p, K, n, nullptr, 0.f, xb.b, nullptr, nullptr);
    for (int parts = 1; parts <= kMaxGemmParts; ++parts) {
      GemmBatch b;
      b.n = parts;
      std::vector<std::unique_ptr<DevBuf<float>>> multi, single;
      for (int i = 0; i < parts; ++i) {
        const int ldy = rows[i] + 3 * i + 1;
        const std::vector<float> y0 = random_vec(rng, static_cast<size_t>(n) * ldy, -2.f, 2.f);
        multi.push_back(std::make_unique<DevBuf<float>>(y0));
        single.push_back(std::make_unique<DevBuf<float>>(y0));
        b.W[i] = mats[i]->m, b.y[i] = multi.back()->p, b.ldy[i] = ldy;
        gemm(mats[i]->m, 0, xb.b.view(), n, single.back()->p, ldy, true, nullptr);
      }
      gemm_multi(b, xb.b.view(), n, true, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      for (int i = 0; i < parts; ++i) {
        const std::vector<float> a = multi[i]->download(), e = single[i]->download();
        EXPECT_EQ(0, std::memcmp(a.data(), e.data(), a.size() * sizeof(float)))
            << fmt_name(f) << (f16 ? " f16" : "") << " parts " << parts << " matrix " << i;
      }
    }
  }
}

// ---- gemm_x_prep ----

// x_out: x itself (bit for bit) or the RMSNorm x * rsqrt(mean(x^2) + eps) * w against fp64; hi + lo within
// 2^-16 |x_out|; the fp16 form within 2^-20 |x_out| + 2^-24 inv, inv the power of two that takes the row's largest
// |x_out| into [2^14, 2^15); gsum the sums of x_out's 64-element groups (to 1e-6 of the sum of magnitudes).
TEST(GemmXPrep, SplitGroupSumsAndRmsNorm) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  const float eps = 1e-6f;
  uint64_t seed = 3000;
  for (int K : {4096, 2048, 512, 192, 64})
    for (bool norm : {false, true}) {
      const std::string name = std::string("gemm_x_prep K ") + std::to_string(K) + (norm ? " rmsnorm" : " plain");
      std::mt19937_64 rng(seed++);
      const int n = 5, ldx = K + 4;
      const std::vector<float> x = random_x(rng, n, ldx), w = random_vec(rng, K, 0.5f, 1.5f);
      DevBuf<float> dx(x), dw(w), dout(static_cast<size_t>(n) * K);
      dout.poison();
      XBuf xb(n, K, true);
      gemm_x_prep(dx.p, ldx, n, norm ? dw.p : nullptr, eps, xb.b, dout.p, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> xo = dout.download();
      const std::vector<float> gsum = to_host(xb.b.gsum, static_cast<size_t>(n) * (K / 64));

      std::vector<double> r64(xo.size());
      std::vector<float> r32(xo.size());
      for (int t = 0; t < n; ++t) {
        const float* row = &x[static_cast<size_t>(t) * ldx];
        double ss = 0;
        float ss32 = 0.f;
        for (int k = 0; k < K; ++k) { ss += static_cast<double>(row[k]) * row[k]; ss32 += row[k] * row[k]; }
        const double rs = norm ? 1.0 / std::sqrt(ss / K + eps) : 1.0;
        const float rs32 = norm ? 1.f / std::sqrt(ss32 / K + eps) : 1.f;
        for (int k = 0; k < K; ++k) {
          const size_t i = static_cast<size_t>(t) * K + k;
          r64[i] = norm ? row[k] * rs * w[k] : row[k];
          r32[i] = norm ? row[k] * rs32 * w[k] : row[k];
        }
      }
      if (norm) {
        EXPECT_TRUE(close_enough(xo, r64, r32, name + " x_out"));
      } else {
        size_t diff = 0;
        for (size_t i = 0; i < xo.size(); ++i) diff += xo[i] != r32[i];
        EXPECT_EQ(diff, 0u) << name << ": x_out is not x";
      }
      size_t bad_split = 0;
      split_of(xb.b, n, xo, K, bad_split);
      EXPECT_EQ(bad_split, 0u) << name << ": |x_out - hi - lo| > 2^-16 |x_out|";
      const F16X fx = f16_of(xb.b, n, xo, K, bad_split);
      EXPECT_EQ(bad_split, 0u) << name << ": |x_out - (hi + lo) inv| > 2^-20 |x_out| + 2^-24 inv (fp16 form)";
      size_t bad_inv = 0;  // inv = 2^-e with the row's largest |x_out| 2^e in [2^14, 2^15)
      for (int t = 0; t < n; ++t) {
        float m = 0.f;
        for (int k = 0; k < K; ++k) m = std::max(m, std::fabs(xo[static_cast<size_t>(t) * K + k]));
        int e = 0;
        const float f = std::frexp(fx.inv[t], &e);
        const double scaled = m / fx.inv[t];
        bad_inv += !(f == 0.5f && scaled >= 16384.0 && scaled < 32768.0);
      }
      EXPECT_EQ(bad_inv, 0u) << name << ": fp16 form's 2^-e";
      // without the two bf16 terms (hi null): the same fp16 form and sums, hi and lo left alone
      const size_t m = static_cast<size_t>(n) * K;
      const std::vector<uint16_t> fh = to_host(xb.b.f16hi, m), fl = to_host(xb.b.f16lo, m);
      CUDA_CHECK(cudaMemset(xb.b.f16hi, 0x55, m * 2));
      CUDA_CHECK(cudaMemset(xb.b.hi, 0x77, m * 2));
      GemmXBuf no_terms = xb.b;
      no_terms.hi = no_terms.lo = nullptr;
      gemm_x_prep(dx.p, ldx, n, norm ? dw.p : nullptr, eps, no_terms, nullptr, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(to_host(xb.b.f16hi, m) == fh && to_host(xb.b.f16lo, m) == fl)
          << name << ": the fp16 form without the bf16 terms";
      const std::vector<uint16_t> hi_after = to_host(xb.b.hi, m);
      EXPECT_EQ(static_cast<size_t>(std::count(hi_after.begin(), hi_after.end(), uint16_t{0x7777})), m)
          << name << ": hi written although null";
      // without the fp16 form's second term (f16lo null too): the same first term, f16lo left alone
      CUDA_CHECK(cudaMemset(xb.b.f16hi, 0x55, m * 2));
      CUDA_CHECK(cudaMemset(xb.b.f16lo, 0x66, m * 2));
      GemmXBuf first_only = no_terms;
      first_only.f16lo = nullptr;
      gemm_x_prep(dx.p, ldx, n, norm ? dw.p : nullptr, eps, first_only, nullptr, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(to_host(xb.b.f16hi, m) == fh) << name << ": the fp16 form's first term alone";
      const std::vector<uint16_t> lo_after = to_host(xb.b.f16lo, m);
      EXPECT_EQ(static_cast<size_t>(std::count(lo_after.begin(), lo_after.end(), uint16_t{0x6666})), m)
          << name << ": f16lo written although null";
      size_t bad_sum = 0;
      for (int t = 0; t < n; ++t)
        for (int g = 0; g < K / 64; ++g) {
          double s = 0, mag = 0;
          for (int k = g * 64; k < g * 64 + 64; ++k) {
            s += xo[static_cast<size_t>(t) * K + k];
            mag += std::fabs(xo[static_cast<size_t>(t) * K + k]);
          }
          const float got = gsum[static_cast<size_t>(t) * (K / 64) + g];
          if (!(std::fabs(got - s) <= 1e-6 * mag)) {
            if (bad_sum++ < 5) ADD_FAILURE() << name << " gsum[" << t << "][" << g << "] = " << got << ", want " << s;
          }
        }
      EXPECT_EQ(bad_sum, 0u) << name << ": group sums";
    }
}

// ---- gemm_grouped ----

// Slots per expert of the grouped cases: empty experts (the last too), one over a 64-slot tile.
const std::vector<int> kExpertSlots = {5, 0, 77, 1, 0, 13, 33, 2, 0};

// A stack of 9 experts [rows x K]: slots by expert with counts including zeros (the last expert too) and one
// over a 64-token tile. gather: slot a reads row x_row[a] of a 40-row x (rows repeat); else row a of an x with
// one row per slot, and the tiles' bound 3x the needed one.
void run_grouped(QFormat fmt, bool gather, uint64_t seed, int rows = 100, int K = 128, bool f16 = false) {
  const std::string name = std::string("gemm_grouped ") + fmt_name(fmt) + (f16 ? " f16" : "") +
                           (gather ? " x_row" : " x_row=null") +
                           " [" + std::to_string(rows) + " x " + std::to_string(K) + "]";
  std::mt19937_64 rng(seed);
  const int E = 9, X = 40;
  const std::vector<int> counts = kExpertSlots;
  std::vector<int> offsets(E + 1, 0);
  for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
  const int S = offsets[E];
  const int n_x = gather ? X : S;
  const HostMat h = random_mat(rng, fmt, E, rows, K);
  DevMat d(h);
  const std::vector<float> x = random_x(rng, n_x, K);
  std::vector<int> x_row(S);
  std::uniform_int_distribution<int> pick(0, X - 1);
  for (int a = 0; a < S; ++a) x_row[a] = gather ? pick(rng) : a;
  DevBuf<float> dx(x), dy(static_cast<size_t>(S) * rows);
  DevBuf<int> doff(offsets), drow(x_row);
  dy.poison();
  XBuf xb(n_x, K, f16);
  gemm_x_prep(dx.p, K, n_x, nullptr, 0.f, xb.b, nullptr, nullptr);
  const int max_tiles = gemm_grouped_max_tiles(S, E) * (gather ? 1 : 3);  // the bound, or a loose one
  DevBuf<int> dtiles(std::vector<int>(1 + max_tiles, -1));
  gemm_grouped_tiles(doff.p, E, dtiles.p, nullptr);
  gemm_grouped(d.m, xb.b.view(), gather ? drow.p : nullptr, doff.p, dtiles.p, max_tiles, dy.p, rows, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  size_t bad_split = 0;
  const F16X fx = f16 ? f16_of(xb.b, n_x, x, K, bad_split) : F16X{};  // (the fp16 form read back once)
  const std::vector<double> xt = f16 ? f16_xt(fx, K) : split_of(xb.b, n_x, x, K, bad_split);
  EXPECT_EQ(bad_split, 0u) << name << ": x~ outside its bound";

  std::vector<double> r64;
  std::vector<float> r32;
  grouped_ref(h, offsets, x_row, rows, K, xt, x, r64, r32, f16 ? &fx : nullptr);
  EXPECT_TRUE(close_enough(dy.download(), r64, r32, name));
}

// The 4-bit kernel's 16-token shape (max_per_mat <= 16: deeper pipeline) against the 64-token one on the same
// launch: experts of 0..16 slots with gathered rows, K 2048 and 512 (more groups than either pipeline holds, and
// fewer), plain and SwiGLU: the same bits.
TEST(GemmGrouped, SixteenTokenShapeSameBits) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(7100);
  const std::vector<int> counts = {3, 0, 16, 1, 7, 16, 0, 2, 11};
  const int E = static_cast<int>(counts.size()), X = 16, rows = 200;
  std::vector<int> offsets(E + 1, 0);
  for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
  const int S = offsets[E], max_tiles = gemm_grouped_max_tiles(S, E);
  std::vector<int> x_row(S);
  for (int e = 0; e < E; ++e)  // distinct tokens within an expert, as the MoE's routing gives
    for (int a = offsets[e]; a < offsets[e + 1]; ++a) x_row[a] = (a - offsets[e] + 5 * e) % X;
  DevBuf<int> doff(offsets), drow(x_row), dtiles(1 + max_tiles);
  gemm_grouped_tiles(doff.p, E, dtiles.p, nullptr);
  const std::vector<float> sc = random_vec(rng, S, 0.05f, 1.f);
  DevBuf<float> dsc(sc);
  for (int K : {2048, 512}) {
    const HostMat g_host = random_mat(rng, QFormat::q4, E, rows, K);
    DevMat g(g_host), u(random_mat(rng, QFormat::q4, E, rows, K));
    const std::vector<float> x_host = random_x(rng, X, K);
    DevBuf<float> dx(x_host);
    XBuf xb(X, K);
    gemm_x_prep(dx.p, K, X, nullptr, 0.f, xb.b, nullptr, nullptr);
    for (bool paired : {false, true}) {
      DevBuf<float> wide(static_cast<size_t>(S) * rows), small(wide.n);
      wide.poison();
      small.poison();
      for (int hint : {0, 16}) {
        float* y = hint ? small.p : wide.p;
        if (paired)
          gemm_grouped_swiglu(g.m, u.m, xb.b.view(), drow.p, doff.p, dtiles.p, max_tiles, dsc.p, y, rows, nullptr, hint);
        else
          gemm_grouped(g.m, xb.b.view(), drow.p, doff.p, dtiles.p, max_tiles, y, rows, nullptr, hint);
      }
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> a = wide.download(), b = small.download();
      size_t differ = 0;
      for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0u) << "K " << K << (paired ? " swiglu" : " plain") << ": " << differ << " of " << a.size()
                            << " values differ between the 16- and 64-token shapes";
      if (!paired) {  // and the 16-token shape against the reference (the test would pass were it never chosen)
        size_t bad_split = 0;
        const std::vector<double> xt = split_of(xb.b, X, dx.download(), K, bad_split);
        std::vector<double> r64;
        std::vector<float> r32;
        grouped_ref(g_host, offsets, x_row, rows, K, xt, x_host, r64, r32);
        EXPECT_TRUE(close_enough(b, r64, r32, "gemm_grouped 16-token shape K " + std::to_string(K)));
      }
    }
  }
}

TEST(GemmGrouped, ExpertsWithGatheredRows) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 4000;
  for (QFormat f : {QFormat::q4, QFormat::q8, QFormat::bf16}) {
    run_grouped(f, true, seed++);
    run_grouped(f, false, seed++);
  }
  // more groups than pipeline stages and more rows than one tile (the experts' real K is 2048, down's rows 2048)
  run_grouped(QFormat::q4, true, seed++, 300, 2048);
  run_grouped(QFormat::q4, true, seed++, 200, 512);
  for (bool gather : {true, false}) run_grouped(QFormat::q4, gather, seed++, 100, 128, true);
  run_grouped(QFormat::q4, true, seed++, 300, 2048, true);
  run_grouped(QFormat::q4, true, seed++, 200, 512, true);
}

// ---- gemm_swiglu, gemm_grouped_swiglu ----

// The paired launch computes each gate and up value with the arithmetic of a gemm / gemm_grouped launch (the same
// fragments, products and group order) and SwiGLU as swiglu_rows does, so it must equal those three launches
// (checked above against the references) bit for bit. Rows off the 64-row paired tile, tokens off the 64-token
// tile; grouped: the experts of run_grouped, gathered rows, a routing weight per slot.
void run_swiglu(QFormat fmt, int rows, int K, int n, bool grouped, uint64_t seed, bool f16 = false) {
  const std::string name = std::string(grouped ? "gemm_grouped_swiglu " : "gemm_swiglu ") + fmt_name(fmt) +
                           (f16 ? " f16" : "") + " [" +
                           std::to_string(rows) + " x " + std::to_string(K) + "] n " + std::to_string(n);
  std::mt19937_64 rng(seed);
  const int E = grouped ? 9 : 1;
  const std::vector<int> counts = grouped ? kExpertSlots : std::vector<int>{n};
  std::vector<int> offsets(E + 1, 0);
  for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
  const int S = offsets[E], X = grouped ? 40 : n;
  DevMat gate(random_mat(rng, fmt, E, rows, K)), up(random_mat(rng, fmt, E, rows, K));
  const std::vector<float> x = random_x(rng, X, K), sc = random_vec(rng, S, 0.05f, 1.f);
  std::vector<int> x_row(S);
  std::uniform_int_distribution<int> pick(0, X - 1);
  for (int a = 0; a < S; ++a) x_row[a] = grouped ? pick(rng) : a;
  DevBuf<float> dx(x), dsc(sc), dg(static_cast<size_t>(S) * rows), du(dg.n), want(dg.n), got(dg.n);
  DevBuf<int> doff(offsets), drow(x_row);
  const int max_tiles = gemm_grouped_max_tiles(S, E);
  DevBuf<int> dtiles(std::vector<int>(1 + max_tiles, -1));
  got.poison();
  XBuf xb(X, K, f16);
  gemm_x_prep(dx.p, K, X, nullptr, 0.f, xb.b, nullptr, nullptr);
  if (grouped) {
    gemm_grouped_tiles(doff.p, E, dtiles.p, nullptr);
    gemm_grouped(gate.m, xb.b.view(), drow.p, doff.p, dtiles.p, max_tiles, dg.p, rows, nullptr);
    gemm_grouped(up.m, xb.b.view(), drow.p, doff.p, dtiles.p, max_tiles, du.p, rows, nullptr);
    swiglu_rows(dg.p, du.p, dsc.p, S, rows, want.p, nullptr);
    gemm_grouped_swiglu(gate.m, up.m, xb.b.view(), drow.p, doff.p, dtiles.p, max_tiles, dsc.p, got.p, rows, nullptr);
  } else {
    gemm(gate.m, 0, xb.b.view(), n, dg.p, rows, false, nullptr);
    gemm(up.m, 0, xb.b.view(), n, du.p, rows, false, nullptr);
    swiglu_rows(dg.p, du.p, nullptr, n, rows, want.p, nullptr);
    gemm_swiglu(gate.m, up.m, xb.b.view(), n, got.p, rows, nullptr);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> a = got.download(), e = want.download();
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &e[i], sizeof(float)) != 0 && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << name << ": " << differ << " of " << a.size() << " values differ from gemm + swiglu_rows"
                        << " (first: slot " << first / rows << " row " << first % rows << ": " << a[first]
                        << " vs " << e[first] << ")";
}

TEST(GemmSwiglu, EqualsGemmsThenSwigluRows) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 4500;
  for (QFormat f : {QFormat::q4, QFormat::q8, QFormat::bf16}) {
    run_swiglu(f, 100, 128, 70, false, seed++);
    run_swiglu(f, 37, 192, 5, false, seed++);
    run_swiglu(f, 129, 128, 0, true, seed++);
  }
  run_swiglu(QFormat::q4, 512, 2048, 130, false, seed++);  // the real experts' shape, more groups than stages
  run_swiglu(QFormat::q4, 512, 2048, 0, true, seed++);
  // a few tokens (a decode pass's shapes)
  for (QFormat f : {QFormat::q4, QFormat::q8, QFormat::bf16}) run_swiglu(f, 100, 1024, 7, false, seed++);
  run_swiglu(QFormat::q4, 512, 2048, 7, false, seed++);
  // on the fp16 form
  run_swiglu(QFormat::q4, 100, 128, 70, false, seed++, true);
  run_swiglu(QFormat::q4, 129, 128, 0, true, seed++, true);
  run_swiglu(QFormat::q4, 512, 2048, 130, false, seed++, true);
  run_swiglu(QFormat::q4, 512, 2048, 0, true, seed++, true);
  run_swiglu(QFormat::q4, 512, 2048, 7, false, seed++, true);
}

// An expert's slots give the same bits whether its tile is full or holds a few slots (the q4 kernel's 16 / 32 / 64
// column shapes; an expert's slot count depends on the chunk): the first 5 of 70 slots of expert 0 against the
// same 5 slots alone, with the same rows of x and routing weights.
TEST(GemmSwiglu, SlotResultsIndependentOfExpertFill) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  for (bool f16 : {false, true}) {
    SCOPED_TRACE(f16 ? "fp16 form" : "two bf16 terms");
    std::mt19937_64 rng(4600);
    const int rows = 96, K = 256, X = 80, E = 2;
    DevMat gate(random_mat(rng, QFormat::q4, E, rows, K)), up(random_mat(rng, QFormat::q4, E, rows, K));
    const std::vector<float> x = random_x(rng, X, K), sc = random_vec(rng, 73, 0.05f, 1.f);
    DevBuf<float> dx(x);
    XBuf xb(X, K, f16);
    gemm_x_prep(dx.p, K, X, nullptr, 0.f, xb.b, nullptr, nullptr);
    // slots [0, n0) of expert 0 read x rows 0.., then 3 slots of expert 1 read rows 77, 3, 50
    auto launch = [&](int n0) {
      std::vector<int> offsets{0, n0, n0 + 3}, x_row(n0 + 3);
      std::vector<float> w(n0 + 3);
      for (int a = 0; a < n0; ++a) x_row[a] = a, w[a] = sc[a];
      for (int i = 0; i < 3; ++i) x_row[n0 + i] = std::vector<int>{77, 3, 50}[i], w[n0 + i] = sc[70 + i];
      DevBuf<int> doff(offsets), drow(x_row);
      DevBuf<float> dw(w), act(static_cast<size_t>(n0 + 3) * rows);
      const int max_tiles = gemm_grouped_max_tiles(n0 + 3, E);
      DevBuf<int> dtiles(std::vector<int>(1 + max_tiles, -1));
      gemm_grouped_tiles(doff.p, E, dtiles.p, nullptr);
      gemm_grouped_swiglu(gate.m, up.m, xb.b.view(), drow.p, doff.p, dtiles.p, max_tiles, dw.p, act.p, rows, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      return act.download();
    };
    const std::vector<float> full = launch(70), few = launch(5);
    EXPECT_EQ(0, std::memcmp(few.data(), full.data(), sizeof(float) * 5 * rows))
        << "expert 0's first 5 slots alone differ from the same slots in a full tile";
    EXPECT_EQ(0, std::memcmp(few.data() + 5 * rows, full.data() + 70 * rows, sizeof(float) * 3 * rows))
        << "expert 1's slots differ between the two launches";
  }
}

// ---- MoE selection, grouping, SwiGLU, combine ----

// logits [n][E + 1] random in (-4, 4) (the last column, the shared gate's, in (-6, 6)); row 3: top_k - 2 tied
// winners and 4 tied logits for the last two places (the lower ids must win, in id order); row 7: all E equal;
// row 5: every third logit NaN (ranked below every number, so the experts stay distinct).
// Weights and gate to 1e-6 relative: a handful of fp32 roundings (an fp32 emulation measured <= 3.3e-7).
void run_select(int n, int E, int top_k, uint64_t seed) {
  const std::string name = "moe_select_rows E " + std::to_string(E) + " top_k " + std::to_string(top_k);
  std::mt19937_64 rng(seed);
  const int ld = E + 1;
  std::vector<float> logits = random_vec(rng, static_cast<size_t>(n) * ld, -4.f, 4.f);
  for (int t = 0; t < n; ++t) logits[static_cast<size_t>(t) * ld + E] = random_vec(rng, 1, -6.f, 6.f)[0];
  std::vector<int> ids(E);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  for (int j = 0; j < top_k + 2; ++j) logits[3 * ld + ids[j]] = j < top_k - 2 ? 6.f : 5.f;
  for (int e = 0; e < E; ++e) logits[7 * ld + e] = 0.25f;
  for (int e = 0; e < E; e += 3) logits[5 * ld + e] = NAN;  // row 5: NaN logits rank below every number
  DevBuf<float> dl(logits), dw(static_cast<size_t>(n) * top_k), dsh(n);
  DevBuf<int> didx(static_cast<size_t>(n) * top_k);
  dw.poison(); dsh.poison(); didx.poison();
  moe_select_rows(dl.p, ld, n, E, top_k, didx.p, dw.p, dsh.p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<int> idx = didx.download();
  const std::vector<float> wt = dw.download(), sh = dsh.download();
  for (int t = 0; t < n; ++t) {
    std::vector<float> lv(&logits[static_cast<size_t>(t) * ld], &logits[static_cast<size_t>(t) * ld] + ld);
    for (int e = 0; e < E; ++e)
      if (std::isnan(lv[e])) lv[e] = -INFINITY;
    const float* l = lv.data();
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });  // ties: lower id
    const double mx = l[order[0]];
    double sum = 0, chosen = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(l[e] - mx);
    for (int j = 0; j < top_k; ++j) chosen += std::exp(l[order[j]] - mx) / sum;
    const std::vector<int> want(order.begin(), order.begin() + top_k);
    const std::vector<int> got(&idx[static_cast<size_t>(t) * top_k], &idx[static_cast<size_t>(t) * top_k] + top_k);
    EXPECT_EQ(got, want) << name << ": experts of token " << t;
    for (int j = 0; j < top_k; ++j) {
      const double p = std::exp(l[order[j]] - mx) / sum / chosen;
      EXPECT_NEAR(wt[static_cast<size_t>(t) * top_k + j], p, 1e-6 * p + 1e-9)
          << name << ": token " << t << " weight " << j;
    }
    const double s = 1 / (1 + std::exp(-static_cast<double>(l[E])));
    EXPECT_NEAR(sh[t], s, 1e-6 * s + 1e-9) << name << ": shared gate of token " << t;
  }
}

TEST(MoeRows, SelectTopKTiesSharedGate) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  run_select(37, 256, 8, 5000);
  run_select(37, 10, 3, 5001);
  run_select(21, 300, 8, 5002);  // (more than 256 experts: 16 per lane)
}

// idx [n][top_k]: distinct experts per token, half of the picks among 16 hot experts, the last 3 never picked.
void run_group(int n, int top_k, int E, uint64_t seed) {
  const std::string name =
      "moe_group n " + std::to_string(n) + " top_k " + std::to_string(top_k) + " E " + std::to_string(E);
  std::mt19937_64 rng(seed);
  const int P = n * top_k;
  std::vector<int> idx(P);
  std::uniform_int_distribution<int> hot(0, std::min(16, E - 3) - 1), any(0, E - 4);
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < top_k; ++j) {
      int* row = &idx[t * top_k];
      do {
        row[j] = (rng() & 1) ? hot(rng) : any(rng);
      } while (std::find(row, row + j, row[j]) != row + j);
    }
  const std::vector<float> w = random_vec(rng, P, 0.01f, 1.f);
  DevBuf<int> didx(idx), doff(E + 1), drow(P), dslot(P);
  DevBuf<float> dw(w), dws(P);
  doff.poison(); drow.poison(); dslot.poison(); dws.poison();
  moe_group(didx.p, dw.p, n, top_k, E, doff.p, drow.p, dws.p, dslot.p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<int> off = doff.download(), x_row = drow.download(), slot_of = dslot.download();
  const std::vector<float> w_slot = dws.download();

  std::vector<int> count(E, 0);
  for (int e : idx) ++count[e];
  std::vector<int> want_off(E + 1, 0);
  for (int e = 0; e < E; ++e) want_off[e + 1] = want_off[e] + count[e];
  ASSERT_EQ(off, want_off) << name << ": offsets are not the exclusive prefix of the counts";
  std::vector<int> seen(P, 0);
  size_t bad = 0;
  for (int p = 0; p < P; ++p) {
    const int a = slot_of[p], e = idx[p];
    const bool ok = a >= off[e] && a < off[e + 1] && x_row[a] == p / top_k && w_slot[a] == w[p];
    if (ok) ++seen[a];
    if (!ok && bad++ < 5)
      ADD_FAILURE() << name << ": pair " << p << " (expert " << e << ", slots [" << off[e] << ", " << off[e + 1]
                    << ")) got slot " << a << (a >= 0 && a < P ? ", its token " + std::to_string(x_row[a]) : "");
  }
  EXPECT_EQ(bad, 0u) << name;
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), P) << name << ": slot_of is not a permutation";
}

TEST(MoeRows, GroupPairsByExpert) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  run_group(300, 8, 256, 6000);
  run_group(2048, 8, 256, 6002);
  run_group(4096, 8, 256, 6003);  // kMoeGroupMaxPairs: a 4,096-token chunk's 32,768 pairs
  run_group(37, 3, 10, 6001);
  run_group(500, 5, 1000, 6004);  // (1,000 experts)
}

// moe_route_rows against moe_select_rows + moe_group + gemm_grouped_tiles on the same logits (ties, an all-equal
// row, NaNs as run_select's): idx, w, sh_scale, offsets and the work list equal bit for bit; every pair in a slot
// of its expert holding its token and weight, slot_of a permutation.
void run_route(int n, int E, int top_k, int tok, uint64_t seed, int n_shared = 0) {
  const std::string name = "moe_route_rows n " + std::to_string(n) + " E " + std::to_string(E) + " top_k " +
                           std::to_string(top_k) + " tiles of " + std::to_string(tok) + " shared " +
                           std::to_string(n_shared);
  std::mt19937_64 rng(seed);
  const int ld = E + 1, P = n * top_k, S = P + n_shared;
  const int T = 1 + gemm_grouped_max_tiles(P, E) + (n_shared + tok - 1) / tok;
  std::vector<float> logits = random_vec(rng, static_cast<size_t>(n) * ld, -4.f, 4.f);
  for (int e = 0; e < E && n > 7; ++e) logits[7 * ld + e] = 0.25f;
  for (int e = 0; e < E && n > 5; e += 3) logits[5 * ld + e] = NAN;
  for (int e = 0; e < E; e += 5) logits[e] = 1.5f;  // row 0: ties
  DevBuf<float> dl(logits);
  struct Out {
    std::vector<int> idx, off, x_row, slot_of, tiles;
    std::vector<float> w, sh, w_slot;
  };
  auto run = [&](bool fused) {
    DevBuf<int> didx(P), doff(E + 2), drow(S), dslot(P), dtiles(T);
    DevBuf<float> dw(P), dsh(n), dws(S);
    for (auto* b : {&didx, &doff, &drow, &dslot, &dtiles}) b->poison();
    for (auto* b : {&dw, &dsh, &dws}) b->poison();
    if (fused) {
      moe_route_rows(dl.p, ld, n, E, top_k, didx.p, dw.p, dsh.p, doff.p, drow.p, dws.p, dslot.p, dtiles.p, tok,
                     nullptr, n_shared);
    } else {
      moe_select_rows(dl.p, ld, n, E, top_k, didx.p, dw.p, dsh.p, nullptr);
      moe_group(didx.p, dw.p, n, top_k, E, doff.p, drow.p, dws.p, dslot.p, nullptr, n_shared);
      gemm_grouped_tiles(doff.p, E + (n_shared > 0), dtiles.p, nullptr, tok, n_shared > 0);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    Out o{didx.download(), doff.download(), drow.download(), dslot.download(), dtiles.download(),
          dw.download(), dsh.download(), dws.download()};
    o.tiles.resize(1 + std::max(0, o.tiles[0]));
    o.off.resize(E + 1 + (n_shared > 0));
    return o;
  };
  const Out ref = run(false), got = run(true);
  EXPECT_EQ(got.idx, ref.idx) << name << ": experts";
  EXPECT_EQ(0, std::memcmp(got.w.data(), ref.w.data(), sizeof(float) * P)) << name << ": weights";
  EXPECT_EQ(0, std::memcmp(got.sh.data(), ref.sh.data(), sizeof(float) * n)) << name << ": shared gates";
  ASSERT_EQ(got.off, ref.off) << name << ": offsets";
  EXPECT_EQ(got.tiles, ref.tiles) << name << ": work list";
  std::vector<int> seen(P, 0);
  size_t bad = 0;
  for (int p = 0; p < P; ++p) {
    const int a = got.slot_of[p], e = got.idx[p];
    const bool ok = a >= got.off[e] && a < got.off[e + 1] && got.x_row[a] == p / top_k && got.w_slot[a] == got.w[p];
    if (ok) ++seen[a];
    if (!ok && bad++ < 5) ADD_FAILURE() << name << ": pair " << p << " (expert " << e << ") got slot " << a;
  }
  EXPECT_EQ(bad, 0u) << name;
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), P) << name << ": slot_of is not a permutation";
  if (n_shared > 0) {  // the shared expert: matrix E, its slots after the pairs, token t's weight 1; its tile first
    EXPECT_EQ(got.off[E + 1], got.off[E] + n_shared) << name << ": shared slots";
    for (int t = 0; t < n_shared; ++t)
      EXPECT_TRUE(got.x_row[P + t] == t && got.w_slot[P + t] == 1.f) << name << ": shared slot " << t;
    ASSERT_GE(got.tiles.size(), 2u);
    EXPECT_EQ(got.tiles[1], E << 16) << name << ": the shared expert's tile first";
  }
}

TEST(MoeRows, RouteRowsEqualsSelectGroupTiles) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  run_route(kMoeRouteMaxRows, 256, 8, 64, 8000);
  run_route(9, 256, 8, kGemmWsTok, 8002);
  run_route(13, 10, 3, 64, 8003);
  run_route(11, 300, 8, 64, 8004);  // (more than 256 experts: 16 per lane)
  run_route(1, 256, 8, 64, 8005);
  run_route(kMoeRouteMaxRows, 256, 8, 64, 8006, kMoeRouteMaxRows);  // (the shared expert as matrix E)
  run_route(9, 300, 8, 64, 8007, 9);
  EXPECT_THROW(moe_route_rows(nullptr, 257, kMoeRouteMaxRows + 1, 256, 8, nullptr, nullptr, nullptr, nullptr, nullptr,
                              nullptr, nullptr, nullptr, 64, nullptr),
               std::exception);
}

// act = scale[a] * silu(g) * u, rows 37 x F 513 (a tail past the 256-thread block), with and without scale.
TEST(MoeRows, SwigluRows) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  const int n = 37, F = 513;
  uint64_t seed = 7000;
  for (bool scaled : {false, true}) {
    std::mt19937_64 rng(seed++);
    const std::vector<float> g = random_vec(rng, static_cast<size_t>(n) * F, -6.f, 6.f);
    const std::vector<float> u = random_vec(rng, g.size(), -2.f, 2.f), sc = random_vec(rng, n, 0.05f, 1.f);
    DevBuf<float> dg(g), du(u), dsc(sc), dact(g.size());
    dact.poison();
    swiglu_rows(dg.p, du.p, scaled ? dsc.p : nullptr, n, F, dact.p, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> r64(g.size());
    std::vector<float> r32(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      const double s = scaled ? sc[i / F] : 1.0;
      r64[i] = s * (g[i] / (1 + std::exp(-static_cast<double>(g[i])))) * u[i];
      r32[i] = static_cast<float>(s) * (g[i] / (1.f + std::exp(-g[i]))) * u[i];
    }
    EXPECT_TRUE(close_enough(dact.download(), r64, r32, scaled ? "swiglu_rows scaled" : "swiglu_rows"));
  }
}

// h[t] += sum_j y[slot_of[t][j]] + sh_scale[t] * ysh[t]: n 37, top_k 8, H 300, slot_of a random permutation.
TEST(MoeRows, CombineExpertOutputs) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(8000);
  const int n = 37, top_k = 8, H = 300, S = n * top_k;
  std::vector<int> slot_of(S);
  std::iota(slot_of.begin(), slot_of.end(), 0);
  std::shuffle(slot_of.begin(), slot_of.end(), rng);
  const std::vector<float> y = random_vec(rng, static_cast<size_t>(S) * H);
  const std::vector<float> ysh = random_vec(rng, static_cast<size_t>(n) * H), sh = random_vec(rng, n, 0.01f, 1.f);
  const std::vector<float> h0 = random_vec(rng, static_cast<size_t>(n) * H, -3.f, 3.f);
  DevBuf<float> dy(y), dysh(ysh), dsh(sh), dh(h0);
  DevBuf<int> dslot(slot_of);
  moe_combine(dy.p, dslot.p, top_k, dysh.p, dsh.p, n, H, dh.p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> r64(h0.size());
  std::vector<float> r32(h0.size());
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < H; ++i) {
      double s = 0;
      float s32 = 0.f;
      for (int j = 0; j < top_k; ++j) {
        const float v = y[static_cast<size_t>(slot_of[t * top_k + j]) * H + i];
        s += v;
        s32 += v;
      }
      const size_t o = static_cast<size_t>(t) * H + i;
      r64[o] = h0[o] + s + static_cast<double>(sh[t]) * ysh[o];
      r32[o] = h0[o] + (s32 + sh[t] * ysh[o]);
    }
  EXPECT_TRUE(close_enough(dh.download(), r64, r32, "moe_combine"));
}

// ---- embed_rows ----

// Rows of a [111 x 320] table (a tail past the 256-thread block) for ids in range and out of it (-1, rows):
// the dequantisation fma(scale, q, bias) bit for bit, zeros for the others.
TEST(EmbedRows, GatherAndOutOfRangeIds) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  const int rows = 111, cols = 320;
  const std::vector<int> tokens = {0, 57, -1, rows - 1, rows, 3, 57};
  const int n = static_cast<int>(tokens.size());
  for (QFormat f : {QFormat::q4, QFormat::q8, QFormat::bf16}) {
    std::mt19937_64 rng(9000 + static_cast<int>(f));
    const HostMat h = random_mat(rng, f, 1, rows, cols);
    DevMat d(h);
    DevBuf<int> dt(tokens);
    DevBuf<float> out(static_cast<size_t>(n) * cols);
    out.poison();
    embed_rows(d.m, dt.p, n, out.p, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> got = out.download();
    size_t bad = 0;
    for (int t = 0; t < n; ++t)
      for (int c = 0; c < cols; ++c) {
        const int id = tokens[t];
        float ref = 0.f;
        if (id >= 0 && id < rows)
          ref = f == QFormat::bf16 ? h.at32(0, id, c)
                                   : std::fma(h.scale(0, id, c), static_cast<float>(h.q(0, id, c)), h.bias(0, id, c));
        const float v = got[static_cast<size_t>(t) * cols + c];
        if (std::memcmp(&v, &ref, sizeof v) != 0 && bad++ < 5)
          ADD_FAILURE() << "embed_rows " << fmt_name(f) << " token " << t << " (id " << id << ") col " << c << ": got "
                        << v << " want " << ref;
      }
    EXPECT_EQ(bad, 0u) << "embed_rows " << fmt_name(f);
  }
}

}  // namespace
}  // namespace lily::cuda::test
