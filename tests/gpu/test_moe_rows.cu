// GPU tests of the streamed routed experts of a decode pass (kernels/moe_rows.cu): the staged rows against the
// 16-bit fixed point of kernel_test_util.h (stream_x), bit for bit; gate|up with SwiGLU and down against a CPU
// reference on x~ (the decode GEMVs' rule: 2x a sequential fp32 reference's error) with experts of 0, 1, a few,
// more than one round of staged slots and more than one 64-slot tile, rows off the blocks' row counts, gathered
// token rows; a slot's bits the same when every expert keeps only its first slot; the shared expert as one more
// matrix of the work list.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gemm_ref.h"
#include "kernel_test_util.h"
#include "kernels/batched.h"

namespace lily::cuda::test {
namespace {

// Staged row of width K read back: x~ of every element and the chunk sums.
struct Staged {
  std::vector<double> xt;    // [K] sx * (256 hi + lo)
  std::vector<float> xsum;   // [K / 32]
};
Staged read_staged(const std::vector<uint8_t>& bytes, size_t at, int K) {
  const int nch = K / 32;
  const auto* xq = reinterpret_cast<const int8_t*>(bytes.data() + at);  // [4 * nch] x 16 bytes
  const auto* sx = reinterpret_cast<const float*>(bytes.data() + at + 64 * nch);
  const float* xsum = sx + nch;
  Staged s{std::vector<double>(K), std::vector<float>(xsum, xsum + nch)};
  for (int c = 0; c < nch; ++c)
    for (int k = 0; k < 4; ++k) {
      const int8_t* q = xq + 16 * (k * nch + c);  // {hi even, hi odd, lo even, lo odd} of word k, 4 bytes each
      for (int i = 0; i < 4; ++i) {
        s.xt[32 * c + 8 * k + 2 * i] = static_cast<double>(sx[c]) * (256.0 * q[i] + q[8 + i]);
        s.xt[32 * c + 8 * k + 2 * i + 1] = static_cast<double>(sx[c]) * (256.0 * q[4 + i] + q[12 + i]);
      }
    }
  return s;
}

// x [n][ldx] staged at width K into out (n * stream_row_bytes(K) bytes on the device); returns its bytes.
std::vector<uint8_t> stage(const std::vector<float>& x, int n, int ldx, int K, DevBuf<uint8_t>& out) {
  DevBuf<float> dx(x);
  stream_rows_prep(dx.p, ldx, n, K, out.p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return out.download();
}

TEST(StreamedExperts, StagedRowsAreTheDecodeFixedPoint) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(8100);
  for (int K : {2048, 512}) {
    const int n = 5, ldx = K + 64;
    const std::vector<float> x = random_x(rng, n, ldx);
    DevBuf<uint8_t> d(n * stream_row_bytes(K));
    const std::vector<uint8_t> bytes = stage(x, n, ldx, K, d);
    size_t bad = 0, bad_sum = 0;
    for (int t = 0; t < n; ++t) {
      const auto first = x.begin() + static_cast<size_t>(t) * ldx;
      const std::vector<float> row(first, first + K);
      const std::vector<double> want = stream_x(row);
      const Staged s = read_staged(bytes, t * stream_row_bytes(K), K);
      for (int i = 0; i < K; ++i) bad += s.xt[i] != want[i];
      for (int c = 0; c < K / 32; ++c) {
        double sum = 0, mag = 0;
        for (int i = 32 * c; i < 32 * c + 32; ++i) sum += row[i], mag += std::fabs(row[i]);
        bad_sum += !(std::fabs(s.xsum[c] - sum) <= 1e-6 * mag);
      }
    }
    EXPECT_EQ(bad, 0u) << "K " << K << ": staged x~ differs from the decode kernels' fixed point";
    EXPECT_EQ(bad_sum, 0u) << "K " << K << ": chunk sums";
  }
}

// Experts with 0, 1, a few, more than a round (8 / 16 slots) and more than a tile (64) of slots.
const std::vector<int> kSlots = {3, 0, 9, 1, 17, 0, 2, 70, 1};

struct Grouping {
  std::vector<int> offsets, x_row;
  int S = 0;
};
Grouping grouping(const std::vector<int>& counts, int X, std::mt19937_64& rng) {
  Grouping g;
  g.offsets.assign(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) g.offsets[e + 1] = g.offsets[e] + counts[e];
  g.S = g.offsets.back();
  for (size_t e = 0; e < counts.size(); ++e) {  // distinct tokens within an expert, as the routing gives
    std::vector<int> perm(X);
    for (int i = 0; i < X; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < counts[e]; ++j) g.x_row.push_back(perm[j]);
  }
  return g;
}
// The same slots, each expert keeping only its first (for the isolation check): which slots those were.
Grouping firsts(const Grouping& g, std::vector<int>& kept) {
  Grouping f;
  const int E = static_cast<int>(g.offsets.size()) - 1;
  f.offsets.assign(E + 1, 0);
  kept.clear();
  for (int e = 0; e < E; ++e) {
    const bool any = g.offsets[e + 1] > g.offsets[e];
    f.offsets[e + 1] = f.offsets[e] + any;
    if (any) kept.push_back(g.offsets[e]), f.x_row.push_back(g.x_row[g.offsets[e]]);
  }
  f.S = f.offsets[E];
  return f;
}

struct Tiles {
  DevBuf<int> off, tiles;
  int max_tiles;
  Tiles(const Grouping& g, int E) : off(g.offsets), tiles(1 + gemm_grouped_max_tiles(g.S, E)),
                                    max_tiles(gemm_grouped_max_tiles(g.S, E)) {
    gemm_grouped_tiles(off.p, E, tiles.p, nullptr);
  }
};

std::vector<float> run_swiglu(const DevMat& gate, const DevMat& up, const DevBuf<uint8_t>& xs, const Grouping& g,
                              const std::vector<float>& scale, int rows, const MoeRowsShared* sh = nullptr) {
  const int E = gate.m.n_mats;
  Tiles t(g, E);
  DevBuf<int> drow(g.x_row);
  DevBuf<float> dsc(scale), act(static_cast<size_t>(g.S) * (rows + 5));
  act.poison();
  moe_rows_swiglu(gate.m, up.m, xs.p, drow.p, t.off.p, t.tiles.p, t.max_tiles, dsc.p, act.p, rows + 5, nullptr, sh);
  CUDA_CHECK(cudaDeviceSynchronize());
  return act.download();
}

TEST(StreamedExperts, SwigluMatchesTheReference) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(8200);
  const int E = static_cast<int>(kSlots.size()), K = 2048, X = 80;
  for (int rows : {512, 200}) {
    const HostMat hg = random_mat(rng, QFormat::q4, E, rows, K), hu = random_mat(rng, QFormat::q4, E, rows, K);
    DevMat gate(hg), up(hu);
    const std::vector<float> x = random_x(rng, X, K);
    DevBuf<uint8_t> xs(X * stream_row_bytes(K));
    stage(x, X, K, K, xs);
    const Grouping g = grouping(kSlots, X, rng);
    const std::vector<float> scale = random_vec(rng, g.S, 0.05f, 1.f);
    const std::vector<float> got = run_swiglu(gate, up, xs, g, scale, rows);
    // reference on the staged x~ (scale terms) and x (bias terms), as ref_dot_k
    std::vector<double> r64(static_cast<size_t>(g.S) * (rows + 5), 0.0);
    std::vector<float> r32(r64.size(), 0.f), out(r64.size(), 0.f);
    for (int e = 0; e < E; ++e)
      for (int a = g.offsets[e]; a < g.offsets[e + 1]; ++a) {
        const int t = g.x_row[a];
        const std::vector<float> xr(x.begin() + static_cast<size_t>(t) * K, x.begin() + static_cast<size_t>(t + 1) * K);
        for (int r = 0; r < rows; ++r) {
          double g64, u64;
          float g32, u32;
          ref_dot_k(hg, e, r, xr, true, g64, g32);
          ref_dot_k(hu, e, r, xr, true, u64, u32);
          const size_t i = static_cast<size_t>(a) * (rows + 5) + r;
          r64[i] = scale[a] * (g64 / (1 + std::exp(-g64))) * u64;
          r32[i] = scale[a] * (g32 / (1.f + std::exp(-g32))) * u32;
          out[i] = got[i];
        }
      }
    EXPECT_TRUE(close_enough(out, r64, r32, "moe_rows_swiglu rows " + std::to_string(rows)));
    size_t touched = 0;  // the row padding (ldact > rows) keeps its poison
    for (int a = 0; a < g.S; ++a)
      for (int r = rows; r < rows + 5; ++r) touched += !std::isnan(got[static_cast<size_t>(a) * (rows + 5) + r]);
    EXPECT_EQ(touched, 0u);
    // a slot's bits without the other slots of its expert
    std::vector<int> kept;
    const Grouping f = firsts(g, kept);
    std::vector<float> fscale;
    for (int a : kept) fscale.push_back(scale[a]);
    const std::vector<float> alone = run_swiglu(gate, up, xs, f, fscale, rows);
    size_t differ = 0;
    for (size_t j = 0; j < kept.size(); ++j)
      differ += std::memcmp(&alone[j * (rows + 5)], &got[static_cast<size_t>(kept[j]) * (rows + 5)],
                            sizeof(float) * rows) != 0;
    EXPECT_EQ(differ, 0u) << "slots whose values changed with the other slots of their expert";
  }
}

std::vector<float> run_down(const DevMat& down, const DevBuf<uint8_t>& acts, const Grouping& g, int rows,
                            const MoeRowsShared* sh = nullptr) {
  Tiles t(g, down.m.n_mats);
  DevBuf<float> y(static_cast<size_t>(g.S) * (rows + 3));
  y.poison();
  moe_rows_down(down.m, acts.p, t.off.p, t.tiles.p, t.max_tiles, y.p, rows + 3, nullptr, sh);
  CUDA_CHECK(cudaDeviceSynchronize());
  return y.download();
}

TEST(StreamedExperts, DownMatchesTheReference) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(8300);
  const int E = static_cast<int>(kSlots.size()), K = 512;
  for (int rows : {2048, 300}) {
    const HostMat h = random_mat(rng, QFormat::q4, E, rows, K);
    DevMat down(h);
    const Grouping g = grouping(kSlots, 80, rng);
    const std::vector<float> act = random_x(rng, g.S, K);  // one act row per slot
    DevBuf<uint8_t> acts(g.S * stream_row_bytes(K));
    stage(act, g.S, K, K, acts);
    const std::vector<float> got = run_down(down, acts, g, rows);
    std::vector<double> r64(got.size(), 0.0);
    std::vector<float> r32(got.size(), 0.f), out(got.size(), 0.f);
    for (int e = 0; e < E; ++e)
      for (int a = g.offsets[e]; a < g.offsets[e + 1]; ++a) {
        const auto first = act.begin() + static_cast<size_t>(a) * K;
        const std::vector<float> xr(first, first + K);
        for (int r = 0; r < rows; ++r) {
          const size_t i = static_cast<size_t>(a) * (rows + 3) + r;
          ref_dot_k(h, e, r, xr, true, r64[i], r32[i]);
          out[i] = got[i];
        }
      }
    EXPECT_TRUE(close_enough(out, r64, r32, "moe_rows_down rows " + std::to_string(rows)));
    // a slot's bits without the other slots of its expert (the staged act rows follow the slots)
    std::vector<int> kept;
    const Grouping f = firsts(g, kept);
    std::vector<float> fact;
    for (int a : kept) {
      const auto first = act.begin() + static_cast<size_t>(a) * K;
      fact.insert(fact.end(), first, first + K);
    }
    DevBuf<uint8_t> facts(f.S * stream_row_bytes(K));
    stage(fact, f.S, K, K, facts);
    const std::vector<float> alone = run_down(down, facts, f, rows);
    size_t differ = 0;
    for (size_t j = 0; j < kept.size(); ++j)
      differ += std::memcmp(&alone[j * (rows + 3)], &got[static_cast<size_t>(kept[j]) * (rows + 3)],
                            sizeof(float) * rows) != 0;
    EXPECT_EQ(differ, 0u) << "slots whose values changed with the other slots of their expert";
  }
}

// Matrix e of a stack as a one-matrix HostMat, and the stack with matrix e drawn again.
HostMat slice(const HostMat& h, int e) {
  HostMat m = h;
  m.n = 1;
  const size_t w = h.words.size() / h.n, g = h.scales.size() / h.n;
  m.words.assign(h.words.begin() + e * w, h.words.begin() + (e + 1) * w);
  m.scales.assign(h.scales.begin() + e * g, h.scales.begin() + (e + 1) * g);
  m.biases.assign(h.biases.begin() + e * g, h.biases.begin() + (e + 1) * g);
  return m;
}
HostMat redrawn(const HostMat& h, int e, std::mt19937_64& rng) {
  HostMat m = h;
  const HostMat r = random_mat(rng, h.fmt, 1, h.rows, h.cols);
  std::copy(r.words.begin(), r.words.end(), m.words.begin() + e * r.words.size());
  std::copy(r.scales.begin(), r.scales.end(), m.scales.begin() + e * r.scales.size());
  std::copy(r.biases.begin(), r.biases.end(), m.biases.begin() + e * r.biases.size());
  return m;
}

// The shared expert as matrix e of the work list (MoeRowsShared): its slots (more than a round of staged slots)
// take its own weights, bit for bit what the same weights give at index e of the stack, whatever the stack holds
// there; the other experts' slots are unchanged.
TEST(StreamedExperts, SharedExpertTakesItsOwnWeights) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(8500);
  std::vector<int> counts = kSlots;
  counts.back() = 20;
  const int E = static_cast<int>(counts.size()), e = E - 1, H = 2048, F = 512, X = 80;
  const HostMat hg = random_mat(rng, QFormat::q4, E, F, H), hu = random_mat(rng, QFormat::q4, E, F, H);
  const HostMat hd = random_mat(rng, QFormat::q4, E, H, F);
  DevMat gate(hg), up(hu), down(hd), gate2(redrawn(hg, e, rng)), up2(redrawn(hu, e, rng)), down2(redrawn(hd, e, rng));
  DevMat sg(slice(hg, e)), su(slice(hu, e)), sd(slice(hd, e));
  const MoeRowsShared sh{e, &sg.m, &su.m, &sd.m};
  const std::vector<float> x = random_x(rng, X, H);
  DevBuf<uint8_t> xs(X * stream_row_bytes(H));
  stage(x, X, H, H, xs);
  const Grouping g = grouping(counts, X, rng);
  const std::vector<float> scale = random_vec(rng, g.S, 0.05f, 1.f);
  // (byte compares: the rows' padding holds NaN poison)
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
  };
  const std::vector<float> want = run_swiglu(gate, up, xs, g, scale, F);
  EXPECT_TRUE(same(run_swiglu(gate2, up2, xs, g, scale, F, &sh), want)) << "gate|up: the shared expert's slots";
  EXPECT_FALSE(same(run_swiglu(gate2, up2, xs, g, scale, F), want)) << "gate|up: the redrawn matrix changes nothing";
  const std::vector<float> act = random_x(rng, g.S, F);
  DevBuf<uint8_t> acts(g.S * stream_row_bytes(F));
  stage(act, g.S, F, F, acts);
  const std::vector<float> want_y = run_down(down, acts, g, H);
  EXPECT_TRUE(same(run_down(down2, acts, g, H, &sh), want_y)) << "down: the shared expert's slots";
  EXPECT_FALSE(same(run_down(down2, acts, g, H), want_y)) << "down: the redrawn matrix changes nothing";
}

TEST(StreamedExperts, SupportsTheRealShapesOnly) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(8400);
  DevMat g(random_mat(rng, QFormat::q4, 2, 512, 2048)), u(random_mat(rng, QFormat::q4, 2, 512, 2048)),
      d(random_mat(rng, QFormat::q4, 2, 2048, 512)), g8(random_mat(rng, QFormat::q8, 2, 512, 2048)),
      narrow(random_mat(rng, QFormat::q4, 2, 256, 2048));
  EXPECT_TRUE(moe_rows_supported(g.m, u.m, d.m));
  EXPECT_FALSE(moe_rows_supported(g8.m, u.m, d.m));
  EXPECT_FALSE(moe_rows_supported(narrow.m, narrow.m, d.m));
  EXPECT_FALSE(moe_rows_supported(g.m, u.m, g.m));
}

}  // namespace
}  // namespace lily::cuda::test
