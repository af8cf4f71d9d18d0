// GPU tests of the warp-specialised 4-bit tile (kernels/gemm_q4ws.cu, GemmX::ws): its products go in the order of
// kernels/gemm_q4f16.cu's tile (tested against the references in test_batched.cu), so every launch must give that
// kernel's bits: dense over token counts on and off its 128-token tile and each tensor-core shape (16 / 32 / 64 /
// 96 / 128 columns), K from one group to more groups than its stages, x's two fp16 terms and its first alone,
// y = and +=, several matrices in one launch, SwiGLU pairs, and the experts' grouped launches on a work list of
// 128-slot tiles with gathered rows and experts of 0 to 300 slots.
#include <gtest/gtest.h>

#include "gemm_ref.h"
#include "kernel_test_util.h"
#include "kernels/batched.h"

namespace lily::cuda::test {
namespace {

size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// x's fp16 form of n random rows of width K; one: its first term alone.
struct F16Input {
  DevBuf<float> x;
  XBuf xb;
  F16Input(std::mt19937_64& rng, int n, int K) : x(random_x(rng, n, K)), xb(n, K, true) {
    gemm_x_prep(x.p, K, n, nullptr, 0.f, xb.b, nullptr, nullptr);
  }
  GemmX view(bool ws, bool one) const {
    GemmX v = xb.b.view();
    v.ws = ws;
    if (one) v.f16lo = nullptr;
    return v;
  }
};

struct DenseCase {
  int rows, K, n;
};

TEST(GemmWs, DenseSameBitsAsTheFp16Tile) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(9100);
  const DenseCase cases[] = {{200, 2048, 70},  {37, 64, 130},  {300, 192, 100}, {129, 2048, 47}, {256, 128, 128},
                             {37, 2048, 300}, {1000, 512, 257}, {64, 1024, 96}, {130, 256, 17},  {8, 640, 33}};
  for (const DenseCase& c : cases)
    for (const bool one : {false, true})
      for (const bool acc : {false, true}) {
        const std::string name = "gemm [" + std::to_string(c.rows) + " x " + std::to_string(c.K) + "] n " +
                                 std::to_string(c.n) + (one ? " one term" : "") + (acc ? " +=" : " =");
        DevMat d(random_mat(rng, QFormat::q4, 1, c.rows, c.K));
        F16Input in(rng, c.n, c.K);
        const int ldy = c.rows + 3;
        const std::vector<float> y0 = random_vec(rng, static_cast<size_t>(c.n) * ldy, -2.f, 2.f);
        DevBuf<float> want(y0), got(y0);
        ASSERT_TRUE(gemm_takes_ws(QFormat::q4, in.view(true, one))) << name;
        gemm(d.m, 0, in.view(false, one), c.n, want.p, ldy, acc, nullptr);
        gemm(d.m, 0, in.view(true, one), c.n, got.p, ldy, acc, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(differing(got.download(), want.download()), 0u) << name << ": values differ from gemm_q4f16";
      }
}

TEST(GemmWs, MultiAndSwigluSameBits) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(9200);
  for (const int n : {70, 130, 256}) {
    const int K = 512;
    F16Input in(rng, n, K);
    // three matrices of 300, 37 and 128 rows in one launch
    GemmBatch b;
    b.n = 3;
    const int rows[3] = {300, 37, 128};
    std::vector<std::unique_ptr<DevMat>> mats;
    std::vector<std::unique_ptr<DevBuf<float>>> want, got;
    for (int i = 0; i < 3; ++i) {
      mats.push_back(std::make_unique<DevMat>(random_mat(rng, QFormat::q4, 1, rows[i], K)));
      b.W[i] = mats.back()->m;
      b.ldy[i] = rows[i];
      want.push_back(std::make_unique<DevBuf<float>>(static_cast<size_t>(n) * rows[i]));
      got.push_back(std::make_unique<DevBuf<float>>(static_cast<size_t>(n) * rows[i]));
      got.back()->poison();
    }
    for (int i = 0; i < 3; ++i) b.y[i] = want[i]->p;
    gemm_multi(b, in.view(false, false), n, false, nullptr);
    for (int i = 0; i < 3; ++i) b.y[i] = got[i]->p;
    gemm_multi(b, in.view(true, false), n, false, nullptr);
    // a SwiGLU pair of the experts' shape
    const int F = 512, H = 2048;
    DevMat gate(random_mat(rng, QFormat::q4, 1, F, H)), up(random_mat(rng, QFormat::q4, 1, F, H));
    F16Input xh(rng, n, H);
    DevBuf<float> sw_want(static_cast<size_t>(n) * F), sw_got(sw_want.n);
    sw_got.poison();
    gemm_swiglu(gate.m, up.m, xh.view(false, true), n, sw_want.p, F, nullptr);
    gemm_swiglu(gate.m, up.m, xh.view(true, true), n, sw_got.p, F, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(differing(got[i]->download(), want[i]->download()), 0u) << "gemm_multi n " << n << " part " << i;
    EXPECT_EQ(differing(sw_got.download(), sw_want.download()), 0u) << "gemm_swiglu n " << n;
  }
}

// The experts: slots by expert (empty ones, the last too; one of 300 slots: three 128-slot tiles), gathered
// rows; the fp16 tile on its 64-slot work list against the warp-specialised one on its 128-slot list.
TEST(GemmWs, GroupedSameBitsOnItsWorkList) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(9300);
  const std::vector<int> counts = {5, 0, 300, 1, 0, 129, 33, 128, 97, 64, 0};
  const int E = static_cast<int>(counts.size()), X = 400, F = 192, H = 1024;
  std::vector<int> offsets(E + 1, 0);
  for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
  const int S = offsets[E], max_tiles = gemm_grouped_max_tiles(S, E);
  std::vector<int> x_row(S);
  std::uniform_int_distribution<int> pick(0, X - 1);
  for (int& r : x_row) r = pick(rng);
  DevBuf<int> doff(offsets), drow(x_row), t64(std::vector<int>(1 + max_tiles, -1)), t128(t64.n);
  gemm_grouped_tiles(doff.p, E, t64.p, nullptr);
  gemm_grouped_tiles(doff.p, E, t128.p, nullptr, kGemmWsTok);
  const std::vector<float> sc = random_vec(rng, S, 0.05f, 1.f);
  DevBuf<float> dsc(sc);
  DevMat gate(random_mat(rng, QFormat::q4, E, F, H)), up(random_mat(rng, QFormat::q4, E, F, H));
  DevMat down(random_mat(rng, QFormat::q4, E, H, F));
  F16Input xh(rng, X, H), xa(rng, S, F);
  for (const bool one : {false, true}) {
    DevBuf<float> act_want(static_cast<size_t>(S) * F), act_got(act_want.n), y_want(static_cast<size_t>(S) * H),
        y_got(y_want.n);
    act_got.poison();
    y_got.poison();
    gemm_grouped_swiglu(gate.m, up.m, xh.view(false, one), drow.p, doff.p, t64.p, max_tiles, dsc.p, act_want.p, F,
                        nullptr);
    gemm_grouped_swiglu(gate.m, up.m, xh.view(true, one), drow.p, doff.p, t128.p, max_tiles, dsc.p, act_got.p, F,
                        nullptr);
    gemm_grouped(down.m, xa.view(false, one), nullptr, doff.p, t64.p, max_tiles, y_want.p, H, nullptr);
    gemm_grouped(down.m, xa.view(true, one), nullptr, doff.p, t128.p, max_tiles, y_got.p, H, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(differing(act_got.download(), act_want.download()), 0u)
        << "gemm_grouped_swiglu" << (one ? " one term" : "");
    EXPECT_EQ(differing(y_got.download(), y_want.download()), 0u) << "gemm_grouped" << (one ? " one term" : "");
  }
  // a 128-slot list for a launch that cannot take the tile is refused
  DevMat q8(random_mat(rng, QFormat::q8, E, F, H));
  EXPECT_THROW(gemm_grouped(q8.m, xh.view(true, false), drow.p, doff.p, t128.p, max_tiles, nullptr, F, nullptr),
               std::exception);
}

}  // namespace
}  // namespace lily::cuda::test
