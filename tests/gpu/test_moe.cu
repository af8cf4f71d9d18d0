// GPU tests of the MoE block (kernels/moe.cu) against CPU references: router + softmax + top-k (ties to the
// lower expert id) + renormalisation + shared-expert sigmoid gate; experts gate/up SwiGLU; down projections with
// the fused residual add; the whole block; a decode pass's block over several rows in one launch
// (kernels/moe_fused_rows.cu) against the one-row kernel. Real widths (H 2048, F 512, k 8: the fast paths) and a
// small generic shape; seeded random weights with negative scales.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <numeric>

#include "kernel_test_util.h"
#include "kernels/batched.h"

namespace lily::cuda::test {
namespace {

struct Shape {
  int E, H, F, k;
  QFormat router_fmt, expert_fmt;
};

struct HostMoe {
  HostMat router, seg, gate, up, down, sh_gate, sh_up, sh_down;
};

struct DevMoe {
  std::vector<std::unique_ptr<DevMat>> mats;
  MoeWeightsDev w;
  explicit DevMoe(const HostMoe& h) {
    auto add = [&](const HostMat& m) {
      mats.push_back(std::make_unique<DevMat>(m));
      return mats.back()->m;
    };
    w.gate = add(h.router);
    w.shared_expert_gate = add(h.seg);
    w.experts_gate = add(h.gate);
    w.experts_up = add(h.up);
    w.experts_down = add(h.down);
    w.shared_gate = add(h.sh_gate);
    w.shared_up = add(h.sh_up);
    w.shared_down = add(h.sh_down);
    moe_build_router_slices(w, nullptr);  // the fused kernel's router layout (real shapes only)
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~DevMoe() {
    if (w.router_slices.w) qmat_free(w.router_slices);
  }
  DevMoe(const DevMoe&) = delete;
  DevMoe& operator=(const DevMoe&) = delete;
};

HostMoe random_moe(std::mt19937_64& rng, const Shape& s) {
  HostMoe m;
  m.router = random_mat(rng, s.router_fmt, 1, s.E, s.H);
  m.seg = random_mat(rng, s.router_fmt, 1, 1, s.H);
  m.gate = random_mat(rng, s.expert_fmt, s.E, s.F, s.H);
  m.up = random_mat(rng, s.expert_fmt, s.E, s.F, s.H);
  m.down = random_mat(rng, s.expert_fmt, s.E, s.H, s.F);
  m.sh_gate = random_mat(rng, s.expert_fmt, 1, s.F, s.H);
  m.sh_up = random_mat(rng, s.expert_fmt, 1, s.F, s.H);
  m.sh_down = random_mat(rng, s.expert_fmt, 1, s.H, s.F);
  return m;
}

struct Route64 {
  std::vector<double> logits;  // [E + 1]
  std::vector<int> idx;
  std::vector<double> w;
  double sh_scale;
  double gap;  // p[k-1] - p[k] in sorted order (how safe the selection is)
};

Route64 route_ref(const HostMoe& m, const Shape& s, const std::vector<float>& x) {
  Route64 r;
  r.logits.resize(s.E + 1);
  float dummy;
  for (int e = 0; e < s.E; ++e) ref_dot(m.router, 0, e, x, r.logits[e], dummy);
  ref_dot(m.seg, 0, 0, x, r.logits[s.E], dummy);
  double mx = -INFINITY, sum = 0;
  for (int e = 0; e < s.E; ++e) mx = std::max(mx, r.logits[e]);
  std::vector<double> p(s.E);
  for (int e = 0; e < s.E; ++e) sum += p[e] = std::exp(r.logits[e] - mx);
  for (auto& v : p) v /= sum;
  std::vector<int> order(s.E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  double t = 0;
  for (int j = 0; j < s.k; ++j) { r.idx.push_back(order[j]); t += p[order[j]]; }
  for (int j = 0; j < s.k; ++j) r.w.push_back(p[order[j]] / t);
  r.gap = s.k < s.E ? p[order[s.k - 1]] - p[order[s.k]] : 1.0;
  r.sh_scale = 1 / (1 + std::exp(-r.logits[s.E]));
  return r;
}

// act rows for the given selection (64- and 32-bit references); x16: the kernel streams (16-bit x).
void act_ref(const HostMoe& m, const Shape& s, const std::vector<float>& x, const std::vector<int>& idx,
             const std::vector<float>& w, float sh, bool x16, std::vector<double>& a64, std::vector<float>& a32) {
  a64.assign(static_cast<size_t>(s.k + 1) * s.F, 0);
  a32.assign(a64.size(), 0);
  for (int j = 0; j <= s.k; ++j)
    for (int r = 0; r < s.F; ++r) {
      double g, u;
      float g32, u32;
      if (j < s.k) {
        ref_dot_k(m.gate, idx[j], r, x, x16, g, g32);
        ref_dot_k(m.up, idx[j], r, x, x16, u, u32);
      } else {
        ref_dot_k(m.sh_gate, 0, r, x, x16, g, g32);
        ref_dot_k(m.sh_up, 0, r, x, x16, u, u32);
      }
      const float sc = j < s.k ? w[j] : sh;
      a64[static_cast<size_t>(j) * s.F + r] = sc * (g / (1 + std::exp(-g))) * u;
      a32[static_cast<size_t>(j) * s.F + r] = sc * (g32 / (1 + std::exp(-g32))) * u32;
    }
}

// x16: the fused kernel's down phase streams act as 16-bit x (per 32-element chunk of each matrix's input).
void down_ref(const HostMoe& m, const Shape& s, const std::vector<int>& idx, const std::vector<float>& act,
              const std::vector<float>& h0, std::vector<double>& h64, std::vector<float>& h32, bool x16 = false) {
  h64.assign(s.H, 0);
  h32.assign(s.H, 0);
  for (int i = 0; i < s.H; ++i) {
    double acc = h0[i];
    float acc32 = h0[i];
    for (int j = 0; j <= s.k; ++j) {
      const std::vector<float> a(act.begin() + static_cast<size_t>(j) * s.F, act.begin() + static_cast<size_t>(j + 1) * s.F);
      double d;
      float d32;
      ref_dot_k(j < s.k ? m.down : m.sh_down, j < s.k ? idx[j] : 0, i, a, x16, d, d32);
      acc += d;
      acc32 += d32;
    }
    h64[i] = acc;
    h32[i] = acc32;
  }
}

// x produced on the GPU against the fp64 RMSNorm of h with weight w (eps 1e-6): a few fp32 ulp.
void expect_normed(const std::vector<float>& x, const std::vector<float>& h, const std::vector<float>& w) {
  double ss = 0;
  for (float v : h) ss += static_cast<double>(v) * v;
  const double r = 1.0 / std::sqrt(ss / h.size() + 1e-6);
  for (size_t i = 0; i < h.size(); ++i)
    ASSERT_NEAR(x[i], h[i] * r * w[i], 1e-5 * std::fabs(h[i] * r * w[i]) + 1e-7) << "normed x[" << i << "]";
}

// The routing result left in the scratch against the CPU reference for input x: router logits (+ the
// shared-gate logit), the selected experts, their weights and the shared gate. require_gap: the random case
// must not be within 1e-5 of a tie (tie tests pass false). Returns the GPU's selection for the next checks.
struct GpuRoute {
  std::vector<int> idx;
  std::vector<float> w;
  float sh = 0;
};
void check_route(const HostMoe& m, const Shape& s, const std::vector<float>& x, const MoeScratch& sc,
                 bool require_gap, const std::string& what, GpuRoute& g) {
  std::vector<float> logits(s.E + 1);
  g.idx.resize(s.k);
  g.w.resize(s.k);
  CUDA_CHECK(cudaMemcpy(logits.data(), sc.logits, sizeof(float) * (s.E + 1), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(g.idx.data(), sc.topk_idx, sizeof(int) * s.k, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(g.w.data(), sc.topk_w, sizeof(float) * s.k, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(&g.sh, sc.sh_scale, sizeof(float), cudaMemcpyDeviceToHost));
  std::vector<float> l32(s.E + 1);
  std::vector<double> l64(s.E + 1);
  for (int e = 0; e <= s.E; ++e) ref_dot(e < s.E ? m.router : m.seg, 0, e < s.E ? e : 0, x, l64[e], l32[e]);
  EXPECT_TRUE(close_enough(logits, l64, l32, what + " router logits"));
  const Route64 r = route_ref(m, s, x);
  if (require_gap) ASSERT_GT(r.gap, 1e-5) << "random case too close to a tie to be a fair test";
  EXPECT_EQ(g.idx, r.idx) << what << ": top-k experts differ";
  for (int j = 0; j < s.k; ++j) EXPECT_NEAR(g.w[j], r.w[j], 2e-6 + 1e-5 * r.w[j]) << what << ": routing weight " << j;
  EXPECT_NEAR(g.sh, r.sh_scale, 1e-6) << what;
}

// fused_norm: the block input comes from moe_route_rmsnorm (x = RMSNorm(h) * w, stored by the routing kernel);
// x_out is checked against an fp64 RMSNorm, and the references use the x the GPU produced.
void run_block(const Shape& s, uint64_t seed, int tie_group, bool fused_norm = false) {
  std::mt19937_64 rng(seed);
  HostMoe m = random_moe(rng, s);
  std::vector<float> x = random_vec(rng, s.H);
  const std::vector<float> hn = random_vec(rng, s.H, -3.f, 3.f), wn = random_vec(rng, s.H, 0.5f, 1.5f);
  if (fused_norm) {  // x = the norm of hn, as the GPU must compute it
    DevBuf<float> dhn(hn), dwn(wn), dxn(s.H);
    DevMoe dm(m);
    MoeScratch sc = moe_scratch_alloc(s.E, s.k, s.F);
    dxn.poison();
    moe_route_rmsnorm(dm.w, dhn.p, dwn.p, 1e-6f, dxn.p, sc, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    x = dxn.download();
    moe_scratch_free(sc);
    expect_normed(x, hn, wn);
    if (::testing::Test::HasFatalFailure()) return;
  }
  if (tie_group > 0) {  // tie_group identical router rows that beat every other row
    std::vector<int> rows(s.E);
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng);
    rows.resize(tie_group);
    const int per = 32 / m.router.bits(), G = s.H / kGroupSize;
    for (int r : rows) {
      for (int c = 0; c < s.H; c += per) {
        uint32_t wd = 0;
        for (int t = 0; t < per; ++t)
          if (x[c + t] > 0) wd |= ((1u << m.router.bits()) - 1u) << (m.router.bits() * t);
        m.router.words[(static_cast<size_t>(r) * s.H + c) / per] = wd;
      }
      for (int g = 0; g < G; ++g) {
        m.router.scales[static_cast<size_t>(r) * G + g] = f32_to_bf16(0.01f);
        m.router.biases[static_cast<size_t>(r) * G + g] = f32_to_bf16(0.0f);
      }
    }
  }
  DevMoe d(m);
  MoeScratch sc = moe_scratch_alloc(s.E, s.k, s.F);
  DevBuf<float> dx(x);
  const std::vector<float> h0 = random_vec(rng, s.H);
  DevBuf<float> dh(h0);
  CUDA_CHECK(cudaMemset(sc.act, 0xff, sizeof(float) * (s.k + 1) * s.F));
  CUDA_CHECK(cudaMemset(sc.topk_idx, 0xff, sizeof(int) * s.k));
  DevBuf<float> dhn(hn), dwn(wn), dxn(s.H);
  if (fused_norm) {
    moe_route_rmsnorm(d.w, dhn.p, dwn.p, 1e-6f, dxn.p, sc, nullptr);
    moe_gate_up(d.w, dxn.p, sc, nullptr);
  } else {
    moe_route(d.w, dx.p, sc, nullptr);
    moe_gate_up(d.w, dx.p, sc, nullptr);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  if (fused_norm) EXPECT_EQ(dxn.download(), x) << "the normed x differs between two identical launches";

  // route
  GpuRoute g;
  check_route(m, s, x, sc, tie_group == 0, "moe_route", g);
  if (::testing::Test::HasFatalFailure()) return;
  const std::vector<int>& idx = g.idx;
  const std::vector<float>& w = g.w;
  const std::vector<float> sh{g.sh};

  // gate/up with the GPU's selection
  std::vector<double> a64;
  std::vector<float> a32;
  act_ref(m, s, x, idx, w, sh[0], moe_gate_up_streams(d.w), a64, a32);
  std::vector<float> act(a64.size());
  CUDA_CHECK(cudaMemcpy(act.data(), sc.act, sizeof(float) * act.size(), cudaMemcpyDeviceToHost));
  EXPECT_TRUE(close_enough(act, a64, a32, "experts gate/up act"));

  // down + residual
  moe_down(d.w, sc, dh.p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> h64;
  std::vector<float> h32;
  down_ref(m, s, idx, act, h0, h64, h32);
  EXPECT_TRUE(close_enough(dh.download(), h64, h32, "experts down + residual"));

  // whole block again (replays must not depend on leftover state), from h0
  dh.upload(h0);
  moe_forward(d.w, dx.p, sc, dh.p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int> idx2(s.k);
  CUDA_CHECK(cudaMemcpy(idx2.data(), sc.topk_idx, sizeof(int) * s.k, cudaMemcpyDeviceToHost));
  EXPECT_EQ(idx2, idx);
  EXPECT_TRUE(close_enough(dh.download(), h64, h32, "moe_forward"));
  moe_scratch_free(sc);
}

// moe_block: the whole MoE block with its input norm, h += MoE(RMSNorm(h) * w). On the H200 the real shapes
// run the fused persistent kernel (kernels/moe_fused.cu); every intermediate it leaves in the scratch (normed x,
// logits, selection, activations) is checked against the CPU reference, then h. Run twice: the grid barrier
// must leave its counters ready for the next launch.
void run_moe_block(const Shape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostMoe m = random_moe(rng, s);
  const std::vector<float> h0 = random_vec(rng, s.H, -3.f, 3.f), wn = random_vec(rng, s.H, 0.5f, 1.5f);
  DevMoe d(m);
  MoeScratch sc = moe_scratch_alloc(s.E, s.k, s.F);
  DevBuf<float> dh(h0), dwn(wn), dx(s.H);
  const bool fused = moe_block_is_fused(d.w, sc);
  std::printf("moe_block E=%d H=%d F=%d: %s\n", s.E, s.H, s.F, fused ? "fused kernel" : "three launches");
  for (int rep = 0; rep < 2; ++rep) {
    dh.upload(h0);
    dx.poison();
    CUDA_CHECK(cudaMemset(sc.act, 0xff, sizeof(float) * (s.k + 1) * s.F));
    moe_block(d.w, dh.p, dwn.p, 1e-6f, dx.p, sc, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> x = dx.download();
    expect_normed(x, h0, wn);
    if (::testing::Test::HasFatalFailure()) return;
    GpuRoute g;
    check_route(m, s, x, sc, true, "moe_block", g);
    if (::testing::Test::HasFatalFailure()) return;
    std::vector<float> act((s.k + 1) * s.F);
    CUDA_CHECK(cudaMemcpy(act.data(), sc.act, sizeof(float) * act.size(), cudaMemcpyDeviceToHost));
    if (fused)  // the fused kernel applies the shared gate when it stages act, not in the scratch
      for (int r = 0; r < s.F; ++r) act[static_cast<size_t>(s.k) * s.F + r] *= g.sh;
    std::vector<double> a64;
    std::vector<float> a32;
    act_ref(m, s, x, g.idx, g.w, g.sh, fused || moe_gate_up_streams(d.w), a64, a32);
    EXPECT_TRUE(close_enough(act, a64, a32, "moe_block gate/up act"));
    std::vector<double> h64;
    std::vector<float> h32;
    down_ref(m, s, g.idx, act, h0, h64, h32, fused);
    EXPECT_TRUE(close_enough(dh.download(), h64, h32, "moe_block h + MoE(norm(h))"));
  }
  moe_scratch_free(sc);
}

TEST(Moe, WholeBlockRealShapes) {
  run_moe_block({256, 2048, 512, 8, QFormat::q8, QFormat::q4}, 31);
  run_moe_block({64, 2048, 512, 8, QFormat::q8, QFormat::q4}, 32);
  run_moe_block({12, 192, 128, 3, QFormat::q8, QFormat::q4}, 33);  // other shapes: the three-launch path
}

// moe_block with a residual projection first (the attention layer's o_proj, h += W x, q4 [2048][4096]): on the
// H200 the fused kernel's phase 0, against the same projection as its own launch (gemv, checked against the
// CPU reference in test_gemv.cu) followed by moe_block without one. Both take the same 16-bit input and sum
// each row in the same order, so h and the normed x agree to fp32 rounding; a wrong row or a missing barrier
// gives O(1).
void residual_projection_case(QFormat fo) {
  const Shape s{256, 2048, 512, 8, QFormat::q8, QFormat::q4};
  std::mt19937_64 rng(41);
  HostMoe m = random_moe(rng, s);
  const HostMat wo = random_mat(rng, fo, 1, s.H, 4096);
  DevMoe d(m);
  DevMat dwo(wo);
  const std::vector<float> h0 = random_vec(rng, s.H, -3.f, 3.f), wn = random_vec(rng, s.H, 0.5f, 1.5f);
  const std::vector<float> px = random_vec(rng, 4096);
  MoeScratch sc = moe_scratch_alloc(s.E, s.k, s.F);
  DevBuf<float> dh(h0), dwn(wn), dx(s.H), dpx(px), dhB(h0), dxB(s.H);
  ResidualProj pre;
  pre.W = dwo.m;
  pre.x = dpx.p;
  std::printf("moe_block with a %s o_proj: %s\n", fo == QFormat::q4 ? "q4" : "bf16",
              moe_block_is_fused(d.w, sc, &pre) ? "phase 0 of the fused kernel" : "its own launch first");
  for (int rep = 0; rep < 2; ++rep) {
    dh.upload(h0);
    dhB.upload(h0);
    moe_block(d.w, dh.p, dwn.p, 1e-6f, dx.p, sc, nullptr, true, &pre);
    gemv(dwo.m, dpx.p, dhB.p, true, nullptr);
    moe_block(d.w, dhB.p, dwn.p, 1e-6f, dxB.p, sc, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> a = dh.download(), b = dhB.download(), xa = dx.download(), xb = dxB.download();
    double dmax = 0, scale = 0, xdmax = 0, xscale = 0;
    for (int i = 0; i < s.H; ++i) {
      dmax = std::max(dmax, std::fabs(static_cast<double>(a[i]) - b[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
      xdmax = std::max(xdmax, std::fabs(static_cast<double>(xa[i]) - xb[i]));
      xscale = std::max(xscale, std::fabs(static_cast<double>(xb[i])));
    }
    std::printf("  h: max|one launch - two| / max|h| = %.3g; x: %.3g\n", dmax / scale, xdmax / xscale);
    EXPECT_LT(dmax, 1e-5 * scale);
    EXPECT_LT(xdmax, 1e-5 * xscale);
  }
  moe_scratch_free(sc);
}

// A bf16 projection is not taken by phase 0: moe_block then runs it as its own GEMV before the fused launch.
TEST(Moe, ResidualProjectionFirst) {
  residual_projection_case(QFormat::q4);
  residual_projection_case(QFormat::bf16);
}

// moe_fused_rows (a decode pass's MoE block over n rows, one launch) against moe_block on each row alone: every
// row's h bit for bit (the same arithmetic per row, whatever the others; the router sums are integers). Rows 0 and 2
// are the same h (the same experts: their weights read by two rows), and the pass runs twice (the barrier and the
// router sums left ready for the next launch).
TEST(Moe, FusedRowsMatchTheOneRowKernel) {
  const Shape s{256, 2048, 512, 8, QFormat::q8, QFormat::q4};
  std::mt19937_64 rng(51);
  HostMoe m = random_moe(rng, s);
  DevMoe d(m);
  if (!moe_fused_rows_supported(d.w, s.k)) GTEST_SKIP() << "moe_fused_rows: fewer than 128 SMs";
  const std::vector<float> wn = random_vec(rng, s.H, 0.5f, 1.5f);
  DevBuf<float> dwn(wn), dx(s.H);
  MoeScratch sc = moe_scratch_alloc(s.E, s.k, s.F);
  MoeRowsScratch rs = moe_fused_rows_alloc(s.E);
  ASSERT_TRUE(moe_block_is_fused(d.w, sc));
  for (int n : {1, 2, 3, 5, kMoeFusedMaxRows}) {
    std::vector<float> h0 = random_vec(rng, static_cast<size_t>(n) * s.H, -3.f, 3.f);
    if (n >= 3) std::copy(h0.begin(), h0.begin() + s.H, h0.begin() + 2 * s.H);
    std::vector<float> alone(h0.size());
    DevBuf<float> d1(s.H);
    for (int r = 0; r < n; ++r) {
      d1.upload(std::vector<float>(h0.begin() + static_cast<size_t>(r) * s.H, h0.begin() + static_cast<size_t>(r + 1) * s.H));
      moe_block(d.w, d1.p, dwn.p, 1e-6f, dx.p, sc, nullptr);
      CUDA_CHECK(cudaMemcpy(alone.data() + static_cast<size_t>(r) * s.H, d1.p, sizeof(float) * s.H,
                            cudaMemcpyDeviceToHost));
    }
    DevBuf<float> dh(h0);
    for (int rep = 0; rep < 2; ++rep) {
      dh.upload(h0);
      moe_router_sums_rows(moe_fused_rows_sums(d.w, dwn.p, rs), dh.p, n, nullptr);
      moe_fused_rows(d.w, dh.p, n, dwn.p, 1e-6f, rs, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got = dh.download();
      for (int r = 0; r < n; ++r) {
        size_t differ = 0;
        double worst = 0, scale = 0;
        for (int i = 0; i < s.H; ++i) {
          const size_t k = static_cast<size_t>(r) * s.H + i;
          differ += std::memcmp(&got[k], &alone[k], sizeof(float)) != 0;
          worst = std::max(worst, std::fabs(static_cast<double>(got[k]) - alone[k]));
          scale = std::max(scale, std::fabs(static_cast<double>(alone[k] - h0[k])));
        }
        EXPECT_EQ(differ, 0u) << n << " rows, run " << rep << ", row " << r << ": " << differ
                              << " elements differ, worst " << worst << " (MoE output scale " << scale << ")";
      }
    }
    std::printf("moe_fused_rows, %d rows: every row bit for bit as alone\n", n);
  }
  moe_fused_rows_free(rs);
  moe_scratch_free(sc);
}

// The router sums of moe_fused_rows added by the int8 out projection before it (gemm_i8's epilogue: h += W x,
// then every written row's share of the router sums) against the same GEMM without them followed by
// moe_router_sums_rows: h bit for bit, the fixed-point sums equal (integers; each row's copies added), for 1, 3
// and 8 rows, twice (the accumulator zeroed in between, as moe_fused_rows leaves it).
TEST(Moe, OutProjectionAddsTheRouterSums) {
  const Shape s{256, 2048, 512, 8, QFormat::q8, QFormat::q4};
  std::mt19937_64 rng(53);
  HostMoe m = random_moe(rng, s);
  DevMoe d(m);
  if (!moe_fused_rows_supported(d.w, s.k)) GTEST_SKIP() << "moe_fused_rows: fewer than 128 SMs";
  const int K = kI8MaxK;
  DevMat W(random_mat(rng, QFormat::q4, 1, s.H, K));
  const std::vector<float> wn = random_vec(rng, s.H, 0.5f, 1.5f);
  DevBuf<float> dwn(wn);
  MoeRowsScratch rs = moe_fused_rows_alloc(s.E);
  const size_t per_row = static_cast<size_t>(2) * (s.E + 1);  // kRouterCopies copies of E + 1 sums
  for (int n : {1, 3, kI8RouterMaxTokens}) {
    const std::vector<float> x = random_vec(rng, static_cast<size_t>(n) * K, -1.f, 1.f);
    const std::vector<float> h0 = random_vec(rng, static_cast<size_t>(n) * s.H, -3.f, 3.f);
    DevBuf<float> dx(x), h1(h0), h2(h0);
    DevBuf<uint8_t> xs(n * i8x_row_bytes(K));
    i8x_prep(dx.p, K, n, K, nullptr, 0.f, xs.p, nullptr);
    GemmBatch b;
    b.n = 1, b.W[0] = W.m, b.ldy[0] = s.H;
    const RouterSums sums = moe_fused_rows_sums(d.w, dwn.p, rs);
    ASSERT_TRUE(gemm_i8_router_ok(b, sums));
    std::vector<unsigned long long> got, want, zero(static_cast<size_t>(n) * per_row, 0ull);
    for (int rep = 0; rep < 2; ++rep) {
      b.y[0] = h1.p;
      gemm_i8(b, xs.p, n, true, nullptr, 0, &sums);
      CUDA_CHECK(cudaDeviceSynchronize());
      got.resize(zero.size());
      CUDA_CHECK(cudaMemcpy(got.data(), rs.router_acc, sizeof(got[0]) * got.size(), cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemset(rs.router_acc, 0, sizeof(got[0]) * got.size()));
      b.y[0] = h2.p;
      gemm_i8(b, xs.p, n, true, nullptr, 0);
      moe_router_sums_rows(sums, h2.p, n, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      want.resize(zero.size());
      CUDA_CHECK(cudaMemcpy(want.data(), rs.router_acc, sizeof(want[0]) * want.size(), cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemset(rs.router_acc, 0, sizeof(want[0]) * want.size()));
      const std::vector<float> a = h1.download(), c = h2.download();
      EXPECT_EQ(std::memcmp(a.data(), c.data(), sizeof(float) * a.size()), 0) << n << " rows: h differs";
      size_t differ = 0, nonzero = 0;
      for (int r = 0; r < n; ++r)
        for (int e = 0; e <= s.E; ++e) {
          const size_t i = r * per_row + e, j = i + s.E + 1;
          differ += got[i] + got[j] != want[i] + want[j];
          nonzero += want[i] + want[j] != 0;
        }
      EXPECT_EQ(differ, 0u) << n << " rows, run " << rep << ": router sums differ";
      EXPECT_GT(nonzero, static_cast<size_t>(n) * s.E / 2) << n << " rows: the sums were not added";
    }
    std::printf("gemm_i8 with router sums, %d rows: h and sums as gemm_i8 + moe_router_sums_rows\n", n);
  }
  moe_fused_rows_free(rs);
}

TEST(Moe, RealWidthsQ8RouterQ4Experts) { run_block({64, 2048, 512, 8, QFormat::q8, QFormat::q4}, 11, 0); }

TEST(Moe, RealWidthsBf16) { run_block({16, 2048, 512, 8, QFormat::bf16, QFormat::bf16}, 12, 0); }

TEST(Moe, FusedRmsNormRouting) {
  run_block({256, 2048, 512, 8, QFormat::q8, QFormat::q4}, 17, 0, true);
  run_block({12, 192, 128, 3, QFormat::q8, QFormat::q4}, 18, 0, true);
}

TEST(Moe, SmallGenericShape) { run_block({12, 192, 128, 3, QFormat::q8, QFormat::q4}, 13, 0); }

TEST(Moe, SmallGenericQ8Experts) { run_block({10, 320, 64, 4, QFormat::q4, QFormat::q8}, 14, 0); }

TEST(Moe, TiesGoToTheLowerExpertId) {
  run_block({40, 2048, 512, 8, QFormat::q8, QFormat::q4}, 15, 11);
  run_block({12, 192, 128, 3, QFormat::q8, QFormat::q4}, 16, 5);
}

TEST(Moe, RouterAllExpertsRealCount) {
  const Shape s{256, 2048, 64, 8, QFormat::q8, QFormat::q4};
  for (uint64_t seed : {21, 22, 23}) {
    std::mt19937_64 rng(seed);
    HostMoe m;
    m.router = random_mat(rng, s.router_fmt, 1, s.E, s.H);
    m.seg = random_mat(rng, s.router_fmt, 1, 1, s.H);
    m.gate = random_mat(rng, s.expert_fmt, s.E, s.F, s.H);
    m.up = m.gate;
    m.down = random_mat(rng, s.expert_fmt, s.E, s.H, s.F);
    m.sh_gate = random_mat(rng, s.expert_fmt, 1, s.F, s.H);
    m.sh_up = m.sh_gate;
    m.sh_down = random_mat(rng, s.expert_fmt, 1, s.H, s.F);
    DevMoe d(m);
    MoeScratch sc = moe_scratch_alloc(s.E, s.k, s.F);
    const std::vector<float> x = random_vec(rng, s.H);
    DevBuf<float> dx(x);
    moe_route(d.w, dx.p, sc, nullptr);
    moe_gate_up(d.w, dx.p, sc, nullptr);  // the selection is made at the start of the gate/up kernel
    CUDA_CHECK(cudaDeviceSynchronize());
    const Route64 r = route_ref(m, s, x);
    std::vector<int> idx(s.k);
    std::vector<float> w(s.k);
    CUDA_CHECK(cudaMemcpy(idx.data(), sc.topk_idx, sizeof(int) * s.k, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(w.data(), sc.topk_w, sizeof(float) * s.k, cudaMemcpyDeviceToHost));
    ASSERT_GT(r.gap, 1e-6);
    EXPECT_EQ(idx, r.idx);
    for (int j = 0; j < s.k; ++j) EXPECT_NEAR(w[j], r.w[j], 2e-6 + 1e-5 * r.w[j]);
    moe_scratch_free(sc);
  }
}

}  // namespace
}  // namespace lily::cuda::test
