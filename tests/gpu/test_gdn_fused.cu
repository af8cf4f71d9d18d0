// The one-launch linear-attention mixer (kernels/gdn_fused.cu) against the three-launch path it replaces
// (gemv_multi_rmsnorm + launch_gdn_step + gemv, each tested against CPU references in test_gemv.cu and
// test_mixer_kernels.cu), on random full-size layer weights: h, the recurrent state and the conv ring must
// agree over several consecutive positions (the ring taps, the grid barrier reused launch after launch). The
// two paths sum in different orders; from the second position on their inputs differ by fp32 ulps, which the
// streaming GEMVs' 16-bit input quantisation (gemv_stream.cuh) can turn into one step of x~ (1 / 32512 of a
// chunk's largest element): agreement to 2e-4 of the largest element (measured 2e-5 .. 4e-5 at positions 1-3;
// errors of the kind this test looks for are O(1)). The launch also adds the next MoE block's router sums, which
// must equal the standalone launch's bit for bit and the CPU's sums to fp32 rounding.
#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "kernels/gdn_fused.h"
#include "kernels/mixers.h"

namespace lily::cuda::test {
namespace {

constexpr const char* kVs = "fused - 3 launches";  // rel_diff label

TEST(GdnFused, MatchesThreeLaunchPath) {
  const GdnDims d{16, 32, 128, 128};
  const int H = 2048, conv = d.conv_dim(), V = d.n_v_heads * d.v_dim, Hv = d.n_v_heads;
  std::mt19937_64 rng(4242);
  const HostMat qkv = random_mat(rng, QFormat::q4, 1, conv, H), z = random_mat(rng, QFormat::q4, 1, V, H),
                b = random_mat(rng, QFormat::q4, 1, Hv, H), a = random_mat(rng, QFormat::q4, 1, Hv, H),
                out = random_mat(rng, QFormat::q4, 1, H, V);
  DevMat dqkv(qkv), dz(z), db(b), da(a), dout(out);
  DevBuf<float> conv_w(random_vec(rng, static_cast<size_t>(conv) * 4, -0.5f, 0.5f)), a_log(random_vec(rng, Hv)),
      dt_bias(random_vec(rng, Hv)), norm(random_vec(rng, d.v_dim, 0.9f, 1.1f)),
      input_norm(random_vec(rng, H, 0.5f, 1.5f));
  GdnMixerDev m;
  m.in_proj_qkv = dqkv.m, m.in_proj_z = dz.m, m.in_proj_b = db.m, m.in_proj_a = da.m, m.out_proj = dout.m;
  m.conv1d = conv_w.p, m.A_log = a_log.p, m.dt_bias = dt_bias.p, m.norm = norm.p;
  if (!gdn_mixer_fused_supported(m, d)) GTEST_SKIP() << "this GPU has too few SMs for the fused mixer";

  const std::vector<float> h0 = random_vec(rng, H, -2.f, 2.f);
  const std::vector<float> ring0 = random_vec(rng, static_cast<size_t>(4) * conv);
  const std::vector<float> state0 = random_vec(rng, static_cast<size_t>(Hv) * d.k_dim * d.v_dim, -0.3f, 0.3f);
  // path A: fused; path B: three launches. Separate state, ring, h, scratch.
  DevBuf<float> hA(h0), hB(h0), ringA(ring0), ringB(ring0), stA(state0), stB(state0);
  DevBuf<float> projA(conv + V + 2 * Hv), projB(conv + V + 2 * Hv), xA(H), xB(H), mixB(V),
      scratch(gdn_mixer_scratch_floats());
  DevBuf<unsigned> barrier(kGridBarrierWords);
  CUDA_CHECK(cudaMemset(barrier.p, 0, kGridBarrierWords * sizeof(unsigned)));
  DevBuf<int> pos(std::vector<int>{0});
  // the next MoE block's router sums (kernels/router_partial.cuh), added by the fused launch from the h it writes
  const int E = 256, n = E + 1;
  const HostMat router = random_mat(rng, QFormat::q8, 1, E, H), seg = random_mat(rng, QFormat::q8, 1, 1, H);
  DevMat drouter(router), dseg(seg);
  MoeWeightsDev moe;
  moe.gate = drouter.m, moe.shared_expert_gate = dseg.m;
  moe_build_router_slices(moe, nullptr);
  ASSERT_NE(moe.router_slices.w, nullptr);
  const std::vector<float> moe_norm = random_vec(rng, H, 0.5f, 1.5f);
  DevBuf<float> dmoe_norm(moe_norm);
  const size_t acc_n = 2 * static_cast<size_t>(n);  // two copies (MoeScratch::router_acc)
  DevBuf<unsigned long long> accA(acc_n), accB(acc_n);
  RouterSums sumsA, sumsB;
  sumsA.slices = sumsB.slices = moe.router_slices;
  sumsA.norm_w = sumsB.norm_w = dmoe_norm.p;
  sumsA.acc = accA.p, sumsB.acc = accB.p;
  for (int p : {0, 1, 2, 3, 4, 5, 9}) {
    pos.upload(std::vector<int>{p});
    projA.poison();
    projB.poison();
    CUDA_CHECK(cudaMemset(accA.p, 0, acc_n * sizeof(unsigned long long)));
    CUDA_CHECK(cudaMemset(accB.p, 0, acc_n * sizeof(unsigned long long)));
    const bool with_sums = p != 3;  // position 3 without them: nothing may be added then
    launch_gdn_mixer_fused(m, d, hA.p, input_norm.p, 1e-6f, xA.p, projA.p, scratch.p, barrier.p, ringA.p, stA.p,
                           pos.p, nullptr, with_sums ? &sumsA : nullptr);
    moe_router_sums_add(sumsB, hA.p, nullptr);  // the standalone launch on the same h
    GemvBatch in;
    in.n = 4;
    in.W[0] = m.in_proj_qkv, in.W[1] = m.in_proj_z, in.W[2] = m.in_proj_b, in.W[3] = m.in_proj_a;
    in.y[0] = projB.p, in.y[1] = projB.p + conv, in.y[2] = projB.p + conv + V, in.y[3] = projB.p + conv + V + Hv;
    gemv_multi_rmsnorm(in, hB.p, input_norm.p, 1e-6f, xB.p, nullptr);
    launch_gdn_step(in.y[0], in.y[1], in.y[3], in.y[2], m.conv1d, m.A_log, m.dt_bias, m.norm, ringB.p, stB.p, mixB.p,
                    pos.p, d, 1e-6f, nullptr);
    gemv(m.out_proj, mixB.p, hB.p, true, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::printf("position %d\n", p);
    EXPECT_LT(rel_diff(projA.download(), projB.download(), "proj", kVs), 2e-4) << "position " << p;
    EXPECT_LT(rel_diff(stA.download(), stB.download(), "state", kVs), 2e-4) << "position " << p;
    EXPECT_LT(rel_diff(ringA.download(), ringB.download(), "ring", kVs), 2e-4) << "position " << p;
    EXPECT_LT(rel_diff(hA.download(), hB.download(), "h", kVs), 2e-4) << "position " << p;
    // x is normed from h: equal to fp32 rounding at the first position, then h itself differs
    EXPECT_LT(rel_diff(xA.download(), xB.download(), "x", kVs), p == 0 ? 1e-6 : 2e-4) << "position " << p;
    // the sums: bit-identical to the standalone launch's (integer adds), and sum_i W[e][i] h_i w_i to fp32 rounding
    const std::vector<unsigned long long> a = accA.download(), b = accB.download();
    if (!with_sums) {
      EXPECT_EQ(a, std::vector<unsigned long long>(acc_n, 0ull)) << "router sums added without a RouterSums";
      continue;
    }
    EXPECT_EQ(a, b) << "router sums of the fused launch and of moe_router_sums_add differ, position " << p;
    const std::vector<float> h = hA.download();
    std::vector<float> hw(H), got(n), l32(n);
    std::vector<double> l64(n);
    for (int i = 0; i < H; ++i) hw[i] = h[i] * moe_norm[i];
    for (int e = 0; e < n; ++e) {
      got[e] = static_cast<float>(static_cast<double>(static_cast<long long>(a[e] + a[n + e])) / 4294967296.0);
      ref_dot(e < E ? router : seg, 0, e < E ? e : 0, hw, l64[e], l32[e]);
    }
    EXPECT_TRUE(close_enough(got, l64, l32, "router sums")) << "position " << p;
  }
  qmat_free(moe.router_slices);
}

}  // namespace
}  // namespace lily::cuda::test
