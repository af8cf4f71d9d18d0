// GPU tests of the GEMV family (kernels/gemv.cu), the MLX upload/repack and bf16 quantisation
// (kernels/repack.cu) and the embedding gather (kernels/embed.cu), each against a CPU reference on seeded
// random inputs: fast paths (cols 512, 2048, 4096) and the generic path (other multiples of 64), odd row counts.
#include <gtest/gtest.h>

#include "kernel_test_util.h"

namespace lily::cuda::test {
namespace {

const char* fmt_name(QFormat f) { return f == QFormat::q4 ? "q4" : f == QFormat::q8 ? "q8" : "bf16"; }

struct GemvCase {
  QFormat fmt;
  int rows, cols;
};

void run_gemv(const GemvCase& c, bool bf16_x, bool accumulate, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const HostMat h = random_mat(rng, c.fmt, 1, c.rows, c.cols);
  DevMat d(h);
  std::vector<float> x = random_vec(rng, c.cols);
  std::vector<uint16_t> xb(c.cols);
  if (bf16_x)
    for (int i = 0; i < c.cols; ++i) {
      xb[i] = f32_to_bf16(x[i]);
      x[i] = bf16_to_f32(xb[i]);
    }
  const std::vector<float> y0 = random_vec(rng, c.rows);
  std::vector<double> r64(c.rows);
  std::vector<float> r32(c.rows);
  for (int r = 0; r < c.rows; ++r) {
    ref_dot_k(h, 0, r, x, gemv_streams(d.m), r64[r], r32[r]);
    if (accumulate) { r64[r] += y0[r]; r32[r] += y0[r]; }
  }
  DevBuf<float> dx(x), dy(c.rows);
  DevBuf<uint16_t> dxb(xb);
  if (accumulate) dy.upload(y0);
  else dy.poison();
  if (bf16_x) gemv(d.m, dxb.p, dy.p, accumulate, nullptr);
  else gemv(d.m, dx.p, dy.p, accumulate, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(close_enough(dy.download(), r64, r32,
                           std::string("gemv ") + fmt_name(c.fmt) + " " + std::to_string(c.rows) + "x" +
                               std::to_string(c.cols) + (bf16_x ? " x=bf16" : " x=f32") + (accumulate ? " +=" : "")));
}

const GemvCase kCases[] = {
    {QFormat::q4, 1, 2048},   {QFormat::q4, 19, 2048},  {QFormat::q4, 989, 2048}, {QFormat::q4, 111, 4096},
    {QFormat::q4, 19, 512},   {QFormat::q4, 989, 512},  {QFormat::q4, 19, 64},    {QFormat::q4, 111, 192},
    {QFormat::q4, 33, 1088},  {QFormat::q8, 1, 2048},   {QFormat::q8, 257, 2048}, {QFormat::q8, 19, 4096},
    {QFormat::q8, 111, 512},  {QFormat::q8, 19, 320},   {QFormat::bf16, 19, 2048}, {QFormat::bf16, 111, 4096},
    {QFormat::bf16, 37, 512}, {QFormat::bf16, 19, 192},
};

TEST(Gemv, AllFormatsShapesF32X) {
  uint64_t seed = 100;
  for (const auto& c : kCases) run_gemv(c, false, false, seed++);
}

TEST(Gemv, AllFormatsShapesBf16X) {
  uint64_t seed = 200;
  for (const auto& c : kCases) run_gemv(c, true, false, seed++);
}

TEST(Gemv, AccumulateIsFusedResidualAdd) {
  uint64_t seed = 300;
  for (const auto& c : kCases) run_gemv(c, false, true, seed++);
}

// Tall matrices take the persistent, software-pipelined K = 2048 kernel (several batches per warp).
TEST(Gemv, TallMatrixPersistentPath) {
  run_gemv({QFormat::q4, 20011, 2048}, false, false, 350);
  run_gemv({QFormat::q4, 16384, 2048}, true, true, 351);
  run_gemv({QFormat::q8, 17001, 2048}, false, false, 352);
  run_gemv({QFormat::q4, 70001, 2048}, true, true, 353);  // the looping streaming kernel (>= 65536 rows)
}

// Row counts that make the streaming q4 kernel pick each of its rows-per-warp variants (on a 132-SM H200:
// 3001x4096 two rows per warp, 5003x2048 four).
TEST(Gemv, StreamKernelRowsPerWarpVariants) {
  run_gemv({QFormat::q4, 3001, 4096}, false, true, 360);
  run_gemv({QFormat::q4, 5003, 2048}, true, false, 361);
}

TEST(Gemv, MultiMatrixBatchOneLaunch) {
  for (int cols : {2048, 512, 320}) {
    std::mt19937_64 rng(400 + cols);
    const int rows[4] = {19, 111, 32, 7};
    std::vector<HostMat> hs;
    for (int i = 0; i < 4; ++i) hs.push_back(random_mat(rng, QFormat::q4, 1, rows[i], cols));
    std::vector<std::unique_ptr<DevMat>> ds;
    for (auto& h : hs) ds.push_back(std::make_unique<DevMat>(h));
    const std::vector<float> x = random_vec(rng, cols);
    DevBuf<float> dx(x);
    std::vector<std::unique_ptr<DevBuf<float>>> ys;
    GemvBatch b;
    b.n = 4;
    for (int i = 0; i < 4; ++i) {
      ys.push_back(std::make_unique<DevBuf<float>>(rows[i]));
      ys.back()->poison();
      b.W[i] = ds[i]->m;
      b.y[i] = ys.back()->p;
    }
    gemv_multi(b, dx.p, false, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < 4; ++i) {
      std::vector<double> r64(rows[i]);
      std::vector<float> r32(rows[i]);
      for (int r = 0; r < rows[i]; ++r) ref_dot_k(hs[i], 0, r, x, gemv_streams(ds[i]->m), r64[r], r32[r]);
      EXPECT_TRUE(close_enough(ys[i]->download(), r64, r32,
                               "gemv_multi matrix " + std::to_string(i) + " cols " + std::to_string(cols)));
    }
  }
}

// RMSNorm fused into the GEMV prologue (q4 K = 2048 / 4096: in every block of the streaming kernel; q8 and
// other widths: the separate RMSNorm kernel first). x_out must hold the normed input (checked against an fp64
// RMSNorm); each y against the reference dot products of that x.
TEST(Gemv, FusedRmsNormPrologue) {
  struct C { QFormat fmt; int cols; std::vector<int> rows; };
  const C cases[] = {{QFormat::q4, 2048, {8192, 4096, 32, 31}},
                     {QFormat::q4, 2048, {8192, 513, 511}},  // one-wave kernel (q|k|v-like, 4-5 rows per warp)
                     {QFormat::q4, 2048, {6999, 1001, 1}},   // one-wave kernel, uneven rows per warp
                     {QFormat::q4, 4096, {2048}},
                     {QFormat::q4, 2048, {248077}},
                     {QFormat::q8, 2048, {257, 3}},
                     {QFormat::q4, 512, {77}}};
  uint64_t seed = 450;
  for (const C& c : cases) {
    std::mt19937_64 rng(seed++);
    const int n = static_cast<int>(c.rows.size());
    std::vector<HostMat> hs;
    std::vector<std::unique_ptr<DevMat>> ds;
    for (int i = 0; i < n; ++i) {
      hs.push_back(random_mat(rng, c.fmt, 1, c.rows[i], c.cols));
      ds.push_back(std::make_unique<DevMat>(hs.back()));
    }
    const std::vector<float> h = random_vec(rng, c.cols, -3.f, 3.f);
    const std::vector<float> w = random_vec(rng, c.cols, 0.5f, 1.5f);
    const float eps = 1e-6f;
    DevBuf<float> dh(h), dw(w), dx(c.cols);
    dx.poison();
    std::vector<std::unique_ptr<DevBuf<float>>> ys;
    GemvBatch b;
    b.n = n;
    for (int i = 0; i < n; ++i) {
      ys.push_back(std::make_unique<DevBuf<float>>(c.rows[i]));
      ys.back()->poison();
      b.W[i] = ds[i]->m;
      b.y[i] = ys.back()->p;
    }
    gemv_multi_rmsnorm(b, dh.p, dw.p, eps, dx.p, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::string name = std::string("rmsnorm+gemv ") + fmt_name(c.fmt) + " cols " + std::to_string(c.cols);
    // x_out against the fp64 RMSNorm (fp32 arithmetic: a few ulp)
    double ss = 0;
    for (float v : h) ss += static_cast<double>(v) * v;
    const double r = 1.0 / std::sqrt(ss / c.cols + eps);
    const std::vector<float> x = dx.download();
    for (int i = 0; i < c.cols; ++i) {
      const double want = h[i] * r * w[i];
      ASSERT_NEAR(x[i], want, 1e-5 * std::fabs(want) + 1e-7) << name << " x[" << i << "]";
    }
    for (int i = 0; i < n; ++i) {
      std::vector<double> r64(c.rows[i]);
      std::vector<float> r32(c.rows[i]);
      for (int row = 0; row < c.rows[i]; ++row)
        ref_dot_k(hs[i], 0, row, x, gemv_streams(ds[i]->m), r64[row], r32[row]);
      EXPECT_TRUE(close_enough(ys[i]->download(), r64, r32, name + " matrix " + std::to_string(i)));
    }
  }
}

TEST(Gemv, SwigluGateUp) {
  const GemvCase cases[] = {{QFormat::q4, 1, 2048},  {QFormat::q4, 19, 2048}, {QFormat::q4, 512, 2048},
                            {QFormat::q4, 111, 192}, {QFormat::q8, 19, 2048}, {QFormat::bf16, 19, 2048},
                            {QFormat::bf16, 7, 128}};
  uint64_t seed = 500;
  for (const auto& c : cases) {
    std::mt19937_64 rng(seed++);
    const HostMat g = random_mat(rng, c.fmt, 1, c.rows, c.cols), u = random_mat(rng, c.fmt, 1, c.rows, c.cols);
    DevMat dg(g), du(u);
    const std::vector<float> x = random_vec(rng, c.cols);
    DevBuf<float> dx(x), dout(c.rows);
    dout.poison();
    gemv_swiglu(dg.m, du.m, dx.p, dout.p, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> r64(c.rows);
    std::vector<float> r32(c.rows);
    for (int r = 0; r < c.rows; ++r) {
      double g64, u64;
      float g32, u32;
      ref_dot(g, 0, r, x, g64, g32);
      ref_dot(u, 0, r, x, u64, u32);
      r64[r] = g64 / (1 + std::exp(-g64)) * u64;
      r32[r] = g32 / (1 + std::exp(-g32)) * u32;
    }
    EXPECT_TRUE(close_enough(dout.download(), r64, r32,
                             std::string("swiglu ") + fmt_name(c.fmt) + " " + std::to_string(c.rows) + "x" +
                                 std::to_string(c.cols)));
  }
}

// The MLX affine quantiser (docs/model.md §4.2) with round-half-to-even, on the CPU.
void quantize_ref(const std::vector<uint16_t>& src, int bits, std::vector<uint8_t>& q, std::vector<uint32_t>& sb) {
  const size_t groups = src.size() / kGroupSize;
  const float n_bins = static_cast<float>((1 << bits) - 1);
  q.assign(src.size() * bits / 8, 0);
  sb.resize(groups);
  for (size_t g = 0; g < groups; ++g) {
    float wmax = -INFINITY, wmin = INFINITY;
    for (int i = 0; i < kGroupSize; ++i) {
      wmax = std::max(wmax, bf16_to_f32(src[g * kGroupSize + i]));
      wmin = std::min(wmin, bf16_to_f32(src[g * kGroupSize + i]));
    }
    float scale = std::max((wmax - wmin) / n_bins, 1e-7f);
    float edge = wmax;
    if (std::fabs(wmin) > std::fabs(wmax)) edge = wmin;
    else scale = -scale;
    const float q0 = std::rint(edge / scale);
    float bias = 0.f;
    if (q0 != 0.f) { scale = edge / q0; bias = edge; }
    for (int i = 0; i < kGroupSize; ++i) {
      const float v = std::min(std::max(std::rint((bf16_to_f32(src[g * kGroupSize + i]) - bias) / scale), 0.f), n_bins);
      const size_t e = g * kGroupSize + i;
      q[e * bits / 8] |= static_cast<uint8_t>(static_cast<uint32_t>(v) << (bits == 4 ? 4 * (e & 1) : 0));
    }
    sb[g] = static_cast<uint32_t>(f32_to_bf16(scale)) | (static_cast<uint32_t>(f32_to_bf16(bias)) << 16);
  }
}

TEST(Repack, QuantizeFromBf16MatchesMlxRuleBitExactly) {
  for (int bits : {4, 8}) {
    std::mt19937_64 rng(600 + bits);
    const int n = 3, rows = 37, cols = 192;
    std::vector<uint16_t> src(static_cast<size_t>(n) * rows * cols);
    for (auto& v : src) v = rand_bf16(rng, 0.0005f, 0.3f, true);
    for (int i = 0; i < kGroupSize; ++i) src[i] = rand_bf16(rng, 0.01f, 0.3f, false);  // an all-positive group
    for (int i = 0; i < kGroupSize; ++i) src[kGroupSize + i] = f32_to_bf16(-bf16_to_f32(src[i]));  // all negative
    QMat m;
    m.format = bits == 4 ? QFormat::q4 : QFormat::q8;
    m.n_mats = n; m.rows = rows; m.cols = cols;
    qmat_alloc(m);
    DevBuf<uint16_t> dsrc(src);
    from_bf16(m, dsrc.p, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> q_ref, q_got(m.w_bytes());
    std::vector<uint32_t> sb_ref, sb_got(m.sb_bytes() / 4);
    quantize_ref(src, bits, q_ref, sb_ref);
    CUDA_CHECK(cudaMemcpy(q_got.data(), m.w, m.w_bytes(), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(sb_got.data(), m.sb, m.sb_bytes(), cudaMemcpyDeviceToHost));
    qmat_free(m);
    size_t bad_q = 0, bad_sb = 0;
    for (size_t i = 0; i < q_ref.size(); ++i) bad_q += q_ref[i] != q_got[i];
    for (size_t i = 0; i < sb_ref.size(); ++i) bad_sb += sb_ref[i] != sb_got[i];
    EXPECT_EQ(bad_q, 0u) << bits << "-bit packed bytes differ";
    EXPECT_EQ(bad_sb, 0u) << bits << "-bit scale|bias words differ";
  }
}

TEST(Repack, RepackFromDeviceStagingEqualsUpload) {
  std::mt19937_64 rng(700);
  const HostMat h = random_mat(rng, QFormat::q4, 2, 19, 256);
  DevMat up(h);
  QMat m = up.m;
  m.w = nullptr; m.sb = nullptr;
  qmat_alloc(m);
  DevBuf<uint32_t> w(h.words);
  DevBuf<uint16_t> s(h.scales), b(h.biases);
  repack_mlx(m, w.p, s.p, b.p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> a1(m.w_bytes()), a2(m.w_bytes());
  std::vector<uint32_t> s1(m.sb_bytes() / 4), s2(m.sb_bytes() / 4);
  CUDA_CHECK(cudaMemcpy(a1.data(), up.m.w, m.w_bytes(), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(a2.data(), m.w, m.w_bytes(), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(s1.data(), up.m.sb, m.sb_bytes(), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(s2.data(), m.sb, m.sb_bytes(), cudaMemcpyDeviceToHost));
  qmat_free(m);
  EXPECT_EQ(a1, a2);
  EXPECT_EQ(s1, s2);
  EXPECT_EQ(s1[5], static_cast<uint32_t>(h.scales[5]) | (static_cast<uint32_t>(h.biases[5]) << 16));
}

TEST(Embed, RowGatherMatchesDequantisation) {
  for (QFormat f : {QFormat::q4, QFormat::q8, QFormat::bf16}) {
    std::mt19937_64 rng(800 + static_cast<int>(f));
    const int rows = 111, cols = 2048;
    const HostMat h = random_mat(rng, f, 1, rows, cols);
    DevMat d(h);
    for (int token : {0, 57, rows - 1, rows, -1}) {
      DevBuf<int> dt(std::vector<int>{token});
      DevBuf<float> out(cols);
      DevBuf<uint16_t> outb(cols);
      out.poison();
      outb.poison();
      embed_row(d.m, dt.p, out.p, nullptr);
      embed_row_bf16(d.m, dt.p, outb.p, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got = out.download();
      const std::vector<uint16_t> gotb = outb.download();
      size_t bad = 0;
      for (int c = 0; c < cols; ++c) {
        float ref = 0.f;
        if (token >= 0 && token < rows) {
          ref = f == QFormat::bf16 ? h.at32(0, token, c)
                                   : std::fma(h.scale(0, token, c), static_cast<float>(h.q(0, token, c)), h.bias(0, token, c));
        }
        if (got[c] != ref || gotb[c] != f32_to_bf16(ref)) {
          if (bad < 5) ADD_FAILURE() << fmt_name(f) << " token " << token << " col " << c << ": got " << got[c] << " ref " << ref;
          ++bad;
        }
      }
      EXPECT_EQ(bad, 0u) << fmt_name(f) << " token " << token;
    }
  }
}

}  // namespace
}  // namespace lily::cuda::test
