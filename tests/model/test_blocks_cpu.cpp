// Forward-pass blocks with hand-checkable numbers: one RoPE rotation, one delta-rule step on a 2x2 state,
// a routing decision with ties, the two RMSNorm flavours, l2 normalisation and a two-position attention.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/blocks_cpu.h"

using namespace lily;

TEST(BlocksCpu, RopeOneRotationByHand) {
  // rope_dim 4 (pairs (0,2), (1,3)), theta 100: inv_freq = [1, 100^-0.5 = 0.1]; pos 1 -> angles 1 and 0.1.
  float x[5] = {1, 2, 3, 4, 5};
  rope_neox(x, 4, 1, 100.0);
  EXPECT_NEAR(x[0], std::cos(1.0) - 3 * std::sin(1.0), 1e-6);
  EXPECT_NEAR(x[2], 3 * std::cos(1.0) + std::sin(1.0), 1e-6);
  EXPECT_NEAR(x[1], 2 * std::cos(0.1) - 4 * std::sin(0.1), 1e-6);
  EXPECT_NEAR(x[3], 4 * std::cos(0.1) + 2 * std::sin(0.1), 1e-6);
  EXPECT_EQ(x[4], 5.0f);  // beyond rope_dim: untouched
  float y[4] = {1, 2, 3, 4};
  rope_neox(y, 4, 0, 1e7);  // position 0 is the identity
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[3], 4.0f);
}

TEST(BlocksCpu, RopePreservesPairNormsAtLargePosition) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> a(256), b(256);
  for (auto& v : a) v = n(rng);
  b = a;
  rope_neox(a.data(), 64, 1000, 1e7);
  for (int i = 0; i < 32; ++i)
    EXPECT_NEAR(std::hypot(a[i], a[i + 32]), std::hypot(b[i], b[i + 32]), 1e-5) << "pair " << i;
  for (int i = 64; i < 256; ++i) ASSERT_EQ(a[i], b[i]);
  // Pair 0 has inv_freq 1: position 1000 rotates it by 1000 rad.
  EXPECT_NEAR(a[0], b[0] * std::cos(1000.0) - b[32] * std::sin(1000.0), 1e-4);
}

TEST(BlocksCpu, DeltaRuleStepOn2x2ByHand) {
  // S = [[1,2],[3,4]] (S[i][j], i = key dim), decay 0.5, beta 0.5, k = [0.6, 0.8], v = [5, 6], q = [1, -1].
  // decayed S = [[0.5,1],[1.5,2]];  mem = S^T k = [1.5, 2.2];  delta = 0.5 (v - mem) = [1.75, 1.9]
  // S += k delta^T -> [[1.55, 2.14], [2.9, 3.52]];  out = S^T q = [-1.35, -1.38].
  float S[4] = {1, 2, 3, 4};
  const float k[2] = {0.6f, 0.8f}, v[2] = {5, 6}, q[2] = {1, -1};
  float out[2];
  delta_rule_step(S, k, v, q, 0.5f, 0.5f, 2, 2, out);
  EXPECT_NEAR(S[0], 1.55f, 1e-6);
  EXPECT_NEAR(S[1], 2.14f, 1e-6);
  EXPECT_NEAR(S[2], 2.9f, 1e-6);
  EXPECT_NEAR(S[3], 3.52f, 1e-6);
  EXPECT_NEAR(out[0], -1.35f, 1e-6);
  EXPECT_NEAR(out[1], -1.38f, 1e-6);
}

TEST(BlocksCpu, DeltaRuleNonSquareMatchesClosedForm) {
  // S_t = decay (I - beta k k^T) S + beta k v^T, o = S_t^T q, on a 3x5 state with random values.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  const int dk = 3, dv = 5;
  std::vector<float> S(dk * dv), k(dk), v(dv), q(dk), out(dv);
  for (auto* vec : {&S, &k, &v, &q})
    for (auto& x : *vec) x = u(rng);
  const float decay = 0.8f, beta = 0.3f;
  std::vector<double> ref(dk * dv);
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) {
      double s = 0;
      for (int m = 0; m < dk; ++m) s += ((i == m) - beta * k[i] * k[m]) * S[m * dv + j];
      ref[i * dv + j] = decay * s + beta * k[i] * v[j];
    }
  delta_rule_step(S.data(), k.data(), v.data(), q.data(), decay, beta, dk, dv, out.data());
  for (int i = 0; i < dk * dv; ++i) EXPECT_NEAR(S[i], ref[i], 1e-6) << i;
  for (int j = 0; j < dv; ++j) {
    double o = 0;
    for (int i = 0; i < dk; ++i) o += ref[i * dv + j] * q[i];
    EXPECT_NEAR(out[j], o, 1e-6) << j;
  }
}

TEST(BlocksCpu, RoutingTiesPickLowerIndexAndRenormalise) {
  const float logits[6] = {1, 3, 3, 0, 3, 2};
  int idx[4];
  float w[4];
  route_top_k(logits, 6, 2, idx, w);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 2);
  EXPECT_FLOAT_EQ(w[0], 0.5f);
  EXPECT_FLOAT_EQ(w[1], 0.5f);
  route_top_k(logits, 6, 4, idx, w);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 2);
  EXPECT_EQ(idx[2], 4);
  EXPECT_EQ(idx[3], 5);
  const double e = std::exp(1.0);  // probabilities proportional to e^3, e^3, e^3, e^2
  EXPECT_NEAR(w[0], e / (3 * e + 1), 1e-7);
  EXPECT_NEAR(w[3], 1 / (3 * e + 1), 1e-7);
}

TEST(BlocksCpu, RmsNormOnePlusWeight) {
  // x = [3, 4]: mean square 12.5, rms sqrt(12.5). HF offsets w = [0, 1] -> effective multipliers [1, 2].
  const float x[2] = {3, 4}, w_eff[2] = {1.0f + 0.0f, 1.0f + 1.0f};
  float y[2];
  rms_norm(x, w_eff, 2, 0.0f, y);
  EXPECT_NEAR(y[0], 3 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(y[1], 2 * 4 / std::sqrt(12.5), 1e-6);
  // eps enters inside the rsqrt of the mean.
  rms_norm(x, w_eff, 2, 0.5f, y);
  EXPECT_NEAR(y[0], 3 / std::sqrt(13.0), 1e-6);
}

TEST(BlocksCpu, GatedRmsNormPlainWeightTimesSiluGate) {
  // o = [3, 4], z = [0, 2], w = [1, 0.5]: y0 = 0 (silu(0) = 0), y1 = 0.5 * 4/sqrt(12.5) * 2 sigmoid(2).
  const float o[2] = {3, 4}, z[2] = {0, 2}, w[2] = {1, 0.5f};
  float y[2];
  rms_norm_gated(o, z, w, 2, 0.0f, y);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1], 0.5 * 4 / std::sqrt(12.5) * 2 / (1 + std::exp(-2.0)), 1e-6);
}

TEST(BlocksCpu, L2NormSoftplusSigmoid) {
  float x[2] = {3, 4};
  l2_normalize(x, 2, 1e-6f);
  EXPECT_NEAR(x[0], 0.6f, 1e-6);
  EXPECT_NEAR(x[1], 0.8f, 1e-6);
  EXPECT_NEAR(softplus_f32(0.0f), std::log(2.0), 1e-7);
  EXPECT_EQ(softplus_f32(30.0f), 30.0f);
  EXPECT_NEAR(sigmoid_f32(std::log(3.0f)), 0.75f, 1e-7);
  EXPECT_NEAR(silu(1.0f), 1 / (1 + std::exp(-1.0)), 1e-7);
}

TEST(BlocksCpu, AttentionTwoPositionsByHand) {
  // q = [1, 0]; K0 = [0, 0], K1 = [ln 3, 0] -> scores 0, ln 3 -> p = [1/4, 3/4]; V0 = [4, 0], V1 = [0, 8].
  // Cache rows have stride 3 (one padding float).
  const float q[2] = {1, 0};
  const float k[6] = {0, 0, -9, std::log(3.0f), 0, -9};
  const float v[6] = {4, 0, -9, 0, 8, -9};
  float scratch[2], out[2];
  attend_head(q, k, v, 2, 3, 2, 1.0f, scratch, out);
  EXPECT_NEAR(out[0], 1.0f, 1e-6);
  EXPECT_NEAR(out[1], 6.0f, 1e-6);
  attend_head(q, k, v, 1, 3, 2, 1.0f, scratch, out);  // causal: only position 0
  EXPECT_EQ(out[0], 4.0f);
  EXPECT_EQ(out[1], 0.0f);
}

TEST(BlocksCpu, DotMatchesDoubleOnOddLengths) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int n : {1, 7, 8, 9, 255, 1001}) {
    std::vector<float> a(n), b(n);
    double ref = 0, mag = 0;
    for (int i = 0; i < n; ++i) {
      a[i] = u(rng);
      b[i] = u(rng);
      ref += static_cast<double>(a[i]) * b[i];
      mag += std::fabs(static_cast<double>(a[i]) * b[i]);
    }
    EXPECT_NEAR(dot_f32(a.data(), b.data(), n), ref, 1e-6 * mag) << "n=" << n;
  }
}
