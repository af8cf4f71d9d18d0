// Sampler: penalties' arithmetic, padding mask, greedy ties, seeded determinism, the kept sets of
// top-k / top-p / min-p (excluded ids never drawn) and empirical frequencies within statistical bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "runtime/sampler.h"
#include "util/check.h"

using namespace lily;

namespace {

// Logits whose softmax is exactly `probs` (up to fp32 rounding).
std::vector<float> logits_for(const std::vector<double>& probs) {
  std::vector<float> z;
  for (double p : probs) z.push_back(p > 0 ? static_cast<float>(std::log(p)) : -INFINITY);
  return z;
}

// Draws n tokens with a fresh sampler per draw sequence and returns the frequency of each id.
std::vector<double> frequencies(const SamplingParams& p, const std::vector<float>& z, int n) {
  Sampler s(p, static_cast<int>(z.size()));
  std::vector<double> f(z.size(), 0.0);
  for (int i = 0; i < n; ++i) f[s.sample(z.data()).token] += 1.0 / n;
  return f;
}

// |observed - expected| within 5 standard deviations of a binomial proportion.
void expect_frequencies(const std::vector<double>& f, const std::vector<double>& expect, int n, const char* what) {
  for (size_t i = 0; i < f.size(); ++i) {
    if (expect[i] == 0) {
      EXPECT_EQ(f[i], 0.0) << what << ": excluded id " << i << " was drawn";
      continue;
    }
    const double sd = std::sqrt(expect[i] * (1 - expect[i]) / n);
    EXPECT_NEAR(f[i], expect[i], 5 * sd + 1e-12) << what << ": id " << i;
  }
}

}  // namespace

TEST(Sampler, PenaltiesBiasAndMaskArithmetic) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.logit_bias = {{1, 1.0f}, {5, 100.0f}};
  p.n_valid = 5;
  p.temperature = 0.5f;
  Sampler s(p, 7);
  const int32_t prompt[] = {0, 1};
  s.add_prompt(prompt);
  s.add_generated(2);
  s.add_generated(2);
  s.add_generated(3);
  const float logits[7] = {3.0f, -1.0f, 4.0f, -2.0f, 1.0f, 9.0f, 9.0f};
  float z[7];
  s.process(logits, z);
  // id 0: prompt only, positive -> 3/2 = 1.5; / temperature 0.5 -> 3
  EXPECT_FLOAT_EQ(z[0], 3.0f);
  // id 1: bias +1 -> 0 -> not > 0 -> 0 * 2 = 0 -> 0
  EXPECT_FLOAT_EQ(z[1], 0.0f);
  // id 2: generated twice: 4/2 = 2, - (0.25*2 + 0.5) = 1 -> 2
  EXPECT_FLOAT_EQ(z[2], 2.0f);
  // id 3: generated once, negative: -2*2 = -4, - (0.25 + 0.5) = -4.75 -> -9.5
  EXPECT_FLOAT_EQ(z[3], -9.5f);
  // id 4: untouched: 1 / 0.5 = 2
  EXPECT_FLOAT_EQ(z[4], 2.0f);
  // ids >= n_valid are masked even with a bias
  EXPECT_EQ(z[5], -INFINITY);
  EXPECT_EQ(z[6], -INFINITY);
}

TEST(Sampler, GreedyTakesLowestIdOnTiesAndNeverPadding) {
  SamplingParams p;
  p.temperature = 0;
  p.n_valid = 4;
  Sampler s(p, 6);
  const float logits[6] = {1, 5, 5, 2, 50, 50};
  EXPECT_EQ(s.sample(logits).token, 1);
}

TEST(Sampler, GreedyLogprobsAreLogSoftmax) {
  SamplingParams p;
  p.temperature = 0;
  p.top_logprobs = 2;
  Sampler s(p, 3);
  const float logits[3] = {0.0f, std::log(3.0f), 0.0f};
  SampledToken r = s.sample(logits);
  EXPECT_EQ(r.token, 1);
  EXPECT_NEAR(r.logprob, std::log(0.6), 1e-6);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].token, 1);
  EXPECT_EQ(r.top[1].token, 0);  // tie with id 2: lower id first
  EXPECT_NEAR(r.top[1].logprob, std::log(0.2), 1e-6);
}

TEST(Sampler, SameSeedSameTokensOtherSeedDiffers) {
  std::vector<float> z(50);
  for (int i = 0; i < 50; ++i) z[i] = std::sin(i * 1.7f);
  SamplingParams p;
  p.seed = 42;
  auto draw = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p, 50);
    std::vector<int32_t> out;
    for (int i = 0; i < 40; ++i) out.push_back(s.sample(z.data()).token);
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
  // The uniform stream is a fixed function of (seed, counter).
  EXPECT_EQ(sample_uniform(1, 0), sample_uniform(1, 0));
  EXPECT_NE(sample_uniform(1, 0), sample_uniform(1, 1));
  // splitmix64(0) = 0xE220A8397B1DCDAF (the reference generator's first output), so this seed makes
  // splitmix64(seed ^ splitmix64(0)) = splitmix64(0), whose top 24 bits are 0xE220A8.
  EXPECT_EQ(sample_uniform(0xE220A8397B1DCDAFull, 0), static_cast<float>(0xE220A8) / 16777216.0f);
  for (uint64_t c = 0; c < 1000; ++c) {
    const float u = sample_uniform(9, c);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
  }
}

TEST(Sampler, PlainTemperatureFrequencies) {
  const std::vector<double> probs = {0.1, 0.4, 0.2, 0.3};
  SamplingParams p;
  p.seed = 1;
  const int n = 20000;
  expect_frequencies(frequencies(p, logits_for(probs), n), probs, n, "temperature 1");
  // Temperature 0.5 squares the probabilities (renormalised).
  p.temperature = 0.5f;
  std::vector<double> sq = {0.01, 0.16, 0.04, 0.09};
  for (double& x : sq) x /= 0.30;
  expect_frequencies(frequencies(p, logits_for(probs), n), sq, n, "temperature 0.5");
}

TEST(Sampler, TopKTopPMinPKeptSets) {
  const std::vector<double> probs = {0.05, 0.5, 0.15, 0.3};  // order: 1, 3, 2, 0
  const int n = 20000;
  SamplingParams p;
  p.seed = 7;
  p.top_k = 2;  // {1, 3}
  expect_frequencies(frequencies(p, logits_for(probs), n), {0, 0.5 / 0.8, 0, 0.3 / 0.8}, n, "top_k 2");
  p = {};
  p.seed = 8;
  p.top_p = 0.75f;  // 0.5 < 0.75 <= 0.8 -> {1, 3}
  expect_frequencies(frequencies(p, logits_for(probs), n), {0, 0.5 / 0.8, 0, 0.3 / 0.8}, n, "top_p 0.75");
  p.top_p = 0.9f;  // 0.8 < 0.9 <= 0.95 -> {1, 3, 2}
  expect_frequencies(frequencies(p, logits_for(probs), n), {0, 0.5 / 0.95, 0.15 / 0.95, 0.3 / 0.95}, n, "top_p 0.9");
  p = {};
  p.seed = 9;
  p.min_p = 0.2f;  // threshold 0.1 -> {1, 3, 2}
  expect_frequencies(frequencies(p, logits_for(probs), n), {0, 0.5 / 0.95, 0.15 / 0.95, 0.3 / 0.95}, n, "min_p 0.2");
  p = {};
  p.seed = 10;
  p.top_k = 3;     // {1, 3, 2}, renormalised mass 0.95
  p.top_p = 0.6f;  // 0.5/0.95 = 0.526 < 0.6 <= 0.8/0.95 -> {1, 3}
  expect_frequencies(frequencies(p, logits_for(probs), n), {0, 0.5 / 0.8, 0, 0.3 / 0.8}, n, "top_k 3 + top_p 0.6");
  p = {};
  p.seed = 11;
  p.top_k = 1;  // greedy by truncation
  expect_frequencies(frequencies(p, logits_for(probs), 200), {0, 1, 0, 0}, 200, "top_k 1");
}

TEST(Sampler, PaddingNeverDrawnAndAllMaskedRejected) {
  SamplingParams p;
  p.seed = 3;
  p.n_valid = 3;
  std::vector<float> z = {0, 0, 0, 10, 10};
  expect_frequencies(frequencies(p, z, 3000), {1.0 / 3, 1.0 / 3, 1.0 / 3, 0, 0}, 3000, "padding mask");
  p.logit_bias = {{0, -INFINITY}, {1, -INFINITY}, {2, -INFINITY}};
  Sampler s(p, 5);
  EXPECT_THROW(s.sample(z.data()), Error);
}

// docs/api.md §10.1: NaN logits fail the step (the server answers 500 nan_logits), greedy or sampled, wherever
// the NaN is; a NaN in the padding region (ids >= n_valid, masked) does not.
TEST(Sampler, NanLogitsAreAnError) {
  for (float temperature : {0.f, 0.8f}) {
    for (int at : {0, 3, 6}) {
      SamplingParams p;
      p.temperature = temperature;
      p.top_k = 3;
      p.seed = 9;
      std::vector<float> z = {0.5f, 1.f, -2.f, 3.f, 0.f, 1.5f, -1.f};
      z[at] = std::numeric_limits<float>::quiet_NaN();
      Sampler s(p, 7);
      EXPECT_THROW(s.sample(z.data()), NanLogitsError) << "temperature " << temperature << " at " << at;
    }
  }
  SamplingParams p;
  p.temperature = 0.f;
  p.n_valid = 6;
  std::vector<float> z = {0.5f, 1.f, -2.f, 3.f, 0.f, 1.5f, std::numeric_limits<float>::quiet_NaN()};
  Sampler s(p, 7);
  EXPECT_EQ(s.sample(z.data()).token, 3);
}

TEST(Sampler, FrequencyPenaltyBalancesCounts) {
  // Two equal tokens and a huge frequency penalty: the less frequent one always wins, so the counts never
  // differ by more than one, and after each even number of draws they are equal.
  SamplingParams p;
  p.seed = 5;
  p.frequency_penalty = 100.0f;
  Sampler s(p, 2);
  const float z[2] = {0, 0};
  int count[2] = {0, 0};
  for (int i = 1; i <= 20; ++i) {
    count[s.sample(z).token]++;
    ASSERT_LE(std::abs(count[0] - count[1]), 1) << "draw " << i;
    if (i % 2 == 0) EXPECT_EQ(count[0], count[1]) << "draw " << i;
  }
}
