// GPU tests of the sampler (kernels/sampling.cu) against a CPU implementation of the semantics written in
// kernels/sampling.h: greedy with ties, padding mask, repetition / presence / frequency penalties from the
// device count buffer, temperature, top-k (fast path) and the exact full-vocabulary path (top_k 0 or > 64)
// with top-p and min-p, the counter-based RNG and the count update. Fast path: the token must equal the
// reference (draws whose uniform lands within 1e-4 of a cumulative boundary are skipped and counted). Full
// path (sums over up to 248k fp32 terms): the token must be a valid draw of the reference within a relative
// tolerance of 2e-5 on the cut masses and on the uniform's position.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <numeric>
#include <thread>

#include "kernel_test_util.h"
#include "kernels/sampling.h"
#include "runtime/sampler.h"

namespace lily::cuda::test {
namespace {

// Returns the token, or -1 when the draw is too close to a boundary to compare.
int sample_ref(const std::vector<float>& logits, const std::vector<int>& counts, const SamplingParams& p,
               uint64_t counter, uint64_t seed = 0) {
  const int V = static_cast<int>(logits.size());
  std::vector<float> z(V);
  for (int i = 0; i < V; ++i) {
    if (p.n_valid > 0 && i >= p.n_valid) { z[i] = -INFINITY; continue; }
    float v = logits[i];
    const int c = counts.empty() ? 0 : counts[i];
    if (c > 0 && p.repetition != 1.0f) v = v > 0.f ? v / p.repetition : v * p.repetition;
    const float pen = p.frequency * static_cast<float>(c) + (c > 0 ? p.presence : 0.f);
    v = v - pen;
    if (p.temperature > 0.f) v = v / p.temperature;
    z[i] = v;
  }
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return z[a] > z[b]; });
  if (p.temperature <= 0.f) return order[0];
  int n = V;
  if (p.top_k > 0 && p.top_k < n) n = p.top_k;
  const double z0 = z[order[0]];
  auto e = [&](int j) { return std::exp(static_cast<double>(z[order[j]]) - z0); };
  double zk = 0;
  for (int j = 0; j < n; ++j) zk += e(j);
  int keep = n;
  if (p.top_p < 1.f) {
    double cum = 0;
    for (int j = 0; j < n; ++j) {
      cum += e(j);
      if (std::fabs(cum - p.top_p * zk) < 1e-4 * zk) return -1;
      if (cum >= p.top_p * zk) { keep = j + 1; break; }
    }
  }
  if (p.min_p > 0.f) {
    int j = 1;
    while (j < keep && e(j) >= p.min_p) {
      if (std::fabs(e(j) - p.min_p) < 1e-5) return -1;
      ++j;
    }
    keep = j;
  }
  std::vector<int> kept(order.begin(), order.begin() + keep);
  double total = 0;
  for (int j = 0; j < keep; ++j) total += e(j);
  std::sort(kept.begin(), kept.end());
  const double u = static_cast<double>(sample_uniform(seed, counter)) * total;
  double cum = 0;
  for (int id : kept) {
    cum += std::exp(static_cast<double>(z[id]) - z0);
    if (std::fabs(cum - u) < 1e-4 * total) return -1;
    if (cum > u) return id;
  }
  return kept.back();
}

// Full-path check: is `token` the draw of the reference for some kept set between the shortest and longest
// prefixes allowed by the tolerance, with the uniform's position within the tolerance?
bool acceptable_full(const std::vector<float>& logits, const SamplingParams& p, uint64_t counter, uint64_t seed,
                     int token) {
  const double tol = 2e-5;
  const int V = static_cast<int>(logits.size());
  std::vector<float> z(V);
  for (int i = 0; i < V; ++i) {
    z[i] = (p.n_valid > 0 && i >= p.n_valid) ? -INFINITY : logits[i];
    if (p.temperature > 0.f) z[i] = z[i] / p.temperature;
  }
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return z[a] > z[b]; });
  const int n = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  const double z0 = z[order[0]];
  auto e = [&](int j) { return std::exp(static_cast<double>(z[order[j]]) - z0); };
  double zk = 0;
  for (int j = 0; j < n; ++j) zk += e(j);
  int lo = n, hi = n;
  if (p.top_p < 1.f) {
    double cum = 0;
    int a = -1, b = -1;
    for (int j = 0; j < n && b < 0; ++j) {
      cum += e(j);
      if (a < 0 && cum >= p.top_p * zk * (1 - tol)) a = j + 1;
      if (cum >= p.top_p * zk * (1 + tol)) b = j + 1;
    }
    lo = std::min(lo, a < 0 ? n : a);
    hi = std::min(hi, b < 0 ? n : b);
  }
  if (p.min_p > 0.f) {
    int a = 1, b = 1;
    while (a < n && e(a) >= p.min_p * (1 + tol)) ++a;
    while (b < n && e(b) >= p.min_p * (1 - tol)) ++b;
    lo = std::min(lo, a);
    hi = std::min(hi, b);
  }
  const double un = sample_uniform(seed, counter);
  std::vector<int> keeps;
  for (int t = 0; t <= 8; ++t) keeps.push_back(lo + (hi - lo) * t / 8);
  keeps.erase(std::unique(keeps.begin(), keeps.end()), keeps.end());
  for (int keep : keeps) {
    std::vector<int> kept(order.begin(), order.begin() + keep);
    double total = 0;
    for (int j = 0; j < keep; ++j) total += e(j);
    std::sort(kept.begin(), kept.end());
    const double u = un * total;
    double cum = 0;
    for (int id : kept) {
      const double before = cum;
      cum += std::exp(static_cast<double>(z[id]) - z0);
      if (id == token && before <= u + tol * total && cum >= u - tol * total) return true;
    }
  }
  return false;
}

struct Sampler {
  int V;
  DevBuf<float> logits;
  DevBuf<int> counts, token;
  DevBuf<uint64_t> rng;
  DevBuf<char> scratch;
  explicit Sampler(int v) : V(v), logits(v), counts(v), token(1), rng(2), scratch(sampling_scratch_bytes(v)) {
    CUDA_CHECK(cudaMemset(rng.p, 0, 2 * sizeof(uint64_t)));
  }
  int run(const std::vector<float>& l, const std::vector<int>& c, const SamplingParams& p, uint64_t counter,
          uint64_t seed = 0) {
    logits.upload(l);
    if (!c.empty()) counts.upload(c);
    const uint64_t r[2] = {counter, seed};  // the seed from device memory, as the decode graph has it
    CUDA_CHECK(cudaMemcpy(rng.p, r, sizeof r, cudaMemcpyHostToDevice));
    token.poison();
    sample(logits.p, V, p, c.empty() ? nullptr : counts.p, rng.p, token.p, scratch.p, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    uint64_t after = 0;
    CUDA_CHECK(cudaMemcpy(&after, rng.p, sizeof(after), cudaMemcpyDeviceToHost));
    EXPECT_EQ(after, counter + 1) << "rng counter must advance by one";
    return token.download()[0];
  }
};

std::vector<float> random_logits(std::mt19937_64& rng, int V, float spread) {
  std::vector<float> l = random_vec(rng, V, -spread, spread);
  return l;
}

TEST(Sampling, GreedyTiesMaskAndPenalties) {
  for (int V : {1000, 4099, kVocab}) {
    std::mt19937_64 rng(V);
    Sampler s(V);
    std::vector<float> l = random_logits(rng, V, 8.f);
    SamplingParams p;
    p.temperature = 0.f;
    p.update_counts = false;
    // tie for the maximum at two ids: the lower wins
    l[V / 3] = 20.f;
    l[V / 7] = 20.f;
    EXPECT_EQ(s.run(l, {}, p, 0), V / 7);
    // a larger logit in the padding region is masked
    p.n_valid = V - 5;
    l[V - 2] = 50.f;
    EXPECT_EQ(s.run(l, {}, p, 1), V / 7);
    // penalties: counts on the leaders push them down
    std::vector<int> c(V, 0);
    for (int i = 0; i < V; i += 17) c[i] = 1 + static_cast<int>(rng() % 3);
    c[V / 7] = 2;
    c[V / 3] = 1;
    for (auto [rep, pres, freq] : {std::tuple{1.3f, 0.f, 0.f}, std::tuple{1.f, 0.7f, 0.f}, std::tuple{1.f, 0.f, 0.4f},
                                   std::tuple{1.1f, 0.5f, 0.3f}}) {
      p.repetition = rep;
      p.presence = pres;
      p.frequency = freq;
      EXPECT_EQ(s.run(l, c, p, 2), sample_ref(l, c, p, 2)) << "V " << V << " rep " << rep << " pres " << pres << " freq " << freq;
    }
  }
}

// peaked: a tail in [-12, -4] and 40 head logits in [5, 10], so the nucleus of top_p <= 0.98 lies in the head;
// otherwise a flat tail in [-6, 6] and a head of 30 at ~9.
void check_draws(int V, SamplingParams p, int n_draws, uint64_t seed, bool penalties, bool peaked = false) {
  std::mt19937_64 rng(seed);
  Sampler s(V);
  int skipped = 0, compared = 0;
  std::vector<int> seen;
  for (int t = 0; t < n_draws; ++t) {
    std::vector<float> l = random_logits(rng, V, peaked ? 4.f : 6.f);
    if (peaked) {
      for (float& x : l) x -= 8.f;
      for (int i = 0; i < 40; ++i) l[rng() % V] = 5.f + static_cast<float>(rng() % 5000) * 1e-3f;
    } else {
      for (int i = 0; i < 30; ++i) l[rng() % V] = 9.f + static_cast<float>(rng() % 1000) * 1e-3f;  // a head
    }
    std::vector<int> c;
    if (penalties) {
      c.assign(V, 0);
      for (int i = 0; i < V / 50; ++i) c[rng() % V] += 1;
    }
    const uint64_t draw_seed = seed * 1000 + t;
    const uint64_t counter = rng() % 100000;
    const int got = s.run(l, c, p, counter, draw_seed);
    const bool fast = p.temperature <= 0.f || (p.top_k >= 1 && p.top_k <= kSampleFastTopK);
    if (!fast) {
      ++compared;
      EXPECT_TRUE(acceptable_full(l, p, counter, draw_seed, got)) << "draw " << t << " V " << V << " top_k " << p.top_k
                                                        << " top_p " << p.top_p << " min_p " << p.min_p << " token " << got;
      seen.push_back(got);
      continue;
    }
    const int ref = sample_ref(l, c, p, counter, draw_seed);
    if (ref < 0) { ++skipped; continue; }
    ++compared;
    EXPECT_EQ(got, ref) << "draw " << t << " V " << V << " top_k " << p.top_k << " top_p " << p.top_p << " min_p "
                        << p.min_p << " T " << p.temperature;
    seen.push_back(got);
  }
  EXPECT_GE(compared, n_draws * 3 / 4) << "too many boundary skips (" << skipped << ")";
  std::sort(seen.begin(), seen.end());
  if (p.top_k != 1) EXPECT_GT(std::unique(seen.begin(), seen.end()) - seen.begin(), 1) << "sampler never varied";
}

TEST(Sampling, FastPathTopKTopPMinP) {
  SamplingParams p;
  p.update_counts = false;
  for (int k : {1, 5, 20, 64}) {
    p.top_k = k;
    p.temperature = 0.8f;
    check_draws(5000, p, 20, 30 + k, false);
  }
  p.top_k = 20; p.top_p = 0.95f; p.temperature = 1.0f;
  check_draws(kVocab, p, 20, 41, false);
  p.top_k = 40; p.top_p = 0.7f; p.min_p = 0.05f; p.temperature = 1.3f; p.n_valid = kVocabReal;
  check_draws(kVocab, p, 20, 42, false);
  p.top_k = 20; p.top_p = 1.f; p.min_p = 0.f; p.repetition = 1.2f; p.presence = 0.3f; p.frequency = 0.2f;
  check_draws(7777, p, 20, 43, true);
}

// sample_rows (a batched step's draws) against sample() row by row: the same token, log-probability, top
// log-probabilities, counts and rng counter, bit for bit, over 40 rows (two launches of kSampleRowsPerLaunch) of
// mixed parameters: greedy, top-k with top-p / min-p, penalties with count updates, top_logprobs.
TEST(Sampling, RowsMatchOneRowAtATime) {
  const int V = kVocab, n = 40;
  std::mt19937_64 rng(77);
  std::vector<SampleRow> rows(n), one(n);
  DevBuf<float> logits(static_cast<size_t>(n) * V), lps(2 * n), tops(2 * n * 5);
  DevBuf<int> counts(static_cast<size_t>(2) * n * V), tokens(2 * n), top_ids(2 * n * 5);
  DevBuf<uint64_t> rngs(2 * 2 * n);
  DevBuf<char> scratch(static_cast<size_t>(n) * sample_rows_scratch_bytes(V)), one_scratch(sampling_scratch_bytes(V));
  std::vector<float> l(static_cast<size_t>(n) * V);
  for (float& x : l) x = static_cast<float>(static_cast<int>(rng() % 12000) - 6000) * 1e-3f;
  logits.upload(l);
  std::vector<int> c(static_cast<size_t>(2) * n * V, 0);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < V / 40; ++i) {
      const size_t at = static_cast<size_t>(r) * V + rng() % V;
      c[at] = c[at + static_cast<size_t>(n) * V] = 1 + static_cast<int>(rng() % 3);
    }
  counts.upload(c);
  std::vector<uint64_t> rg(4 * n);
  for (int r = 0; r < n; ++r) rg[2 * r] = rg[2 * (n + r)] = rng() % 1000, rg[2 * r + 1] = rg[2 * (n + r) + 1] = rng();
  rngs.upload(rg);
  for (int r = 0; r < n; ++r) {
    SamplingParams p;
    p.n_valid = kVocabReal;
    switch (r % 5) {
      case 0: p.temperature = 0.f; break;
      case 1: p.top_k = 20; p.top_p = 0.95f; p.temperature = 0.6f; break;
      case 2: p.top_k = 64; p.min_p = 0.05f; p.temperature = 1.3f; break;
      case 3: p.top_k = 20; p.repetition = 1.1f; p.presence = 0.4f; p.frequency = 0.2f; break;
      default: p.top_k = 5; p.temperature = 0.9f; p.update_counts = false; break;
    }
    const int top_n = r % 3 == 0 ? 5 : 0;
    for (int copy = 0; copy < 2; ++copy) {
      const int k = copy * n + r;
      (copy ? one : rows)[r] = {logits.p + static_cast<size_t>(r) * V, p, counts.p + static_cast<size_t>(k) * V,
                                rngs.p + 2 * k, tokens.p + k, lps.p + k, top_n, top_ids.p + 5 * k, tops.p + 5 * k};
    }
  }
  tokens.poison();
  sample_rows(rows.data(), n, V, scratch.p, nullptr);
  for (const SampleRow& r : one)
    sample(r.logits, V, r.p, r.counts, r.rng, r.out_token, one_scratch.p, nullptr, r.out_logprob, nullptr, r.top_n,
           r.top_ids, r.top_lps);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<int> tok = tokens.download(), ids = top_ids.download(), cnt = counts.download();
  const std::vector<float> lp = lps.download(), tl = tops.download();
  const std::vector<uint64_t> rg2 = rngs.download();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(tok[r], tok[n + r]) << "row " << r;
    EXPECT_GE(tok[r], 0) << "row " << r;
    EXPECT_EQ(std::memcmp(&lp[r], &lp[n + r], sizeof(float)), 0) << "row " << r << ": " << lp[r] << " vs " << lp[n + r];
    EXPECT_EQ(rg2[2 * r], rg2[2 * (n + r)]) << "row " << r;
    EXPECT_EQ(rg2[2 * r], rg[2 * r] + 1) << "row " << r;
    for (int j = 0; j < (r % 3 == 0 ? 5 : 0); ++j) {
      EXPECT_EQ(ids[5 * r + j], ids[5 * (n + r) + j]) << "row " << r << " top " << j;
      EXPECT_EQ(std::memcmp(&tl[5 * r + j], &tl[5 * (n + r) + j], sizeof(float)), 0) << "row " << r << " top " << j;
    }
    EXPECT_EQ(std::memcmp(&cnt[static_cast<size_t>(r) * V], &cnt[static_cast<size_t>(n + r) * V], sizeof(int) * V), 0)
        << "row " << r << ": counts differ";
  }
  SamplingParams full;
  full.top_k = 0;
  EXPECT_FALSE(sample_rows_supported(full));
}

TEST(Sampling, FullPathExact) {
  SamplingParams p;
  p.update_counts = false;
  p.top_k = 0; p.top_p = 0.9f; p.temperature = 1.0f;
  check_draws(5000, p, 15, 51, false);
  p.top_k = 100; p.top_p = 0.8f;
  check_draws(9001, p, 15, 52, false);
  p.top_k = 0; p.top_p = 1.f; p.min_p = 0.1f; p.temperature = 0.7f;
  check_draws(9001, p, 15, 53, false);
  p.top_k = 0; p.top_p = 0.95f; p.min_p = 0.f; p.n_valid = kVocabReal; p.temperature = 1.f;
  check_draws(kVocab, p, 8, 54, false);
  p.top_k = 0; p.top_p = 1.f; p.min_p = 0.f; p.n_valid = 0;  // plain softmax sampling over everything
  check_draws(3000, p, 15, 55, false);
  // peaked: the cut in the head (top_p 0.9 / 0.98, also with min_p and a padded vocabulary), and a top_p whose
  // cut lies deep in the tail (0.9995)
  p.top_k = 0; p.top_p = 0.9f; p.temperature = 1.f;
  check_draws(kVocab, p, 12, 56, false, true);
  p.top_p = 0.98f; p.min_p = 0.001f; p.n_valid = kVocabReal; p.temperature = 0.8f;
  check_draws(kVocab, p, 12, 57, false, true);
  p.top_p = 0.9f; p.min_p = 0.f; p.n_valid = 0; p.temperature = 1.f;
  check_draws(5000, p, 12, 58, false, true);
  p.top_p = 0.9995f;
  check_draws(kVocab, p, 8, 59, false, true);
}

// Ties at the cut across blocks of the full path: 50 logits at 5, a group of 300 equal logits at 3 (every 16th id
// from 700: the group starts inside block 0 and has 64 ids in each later block), the rest at -2. top_k 250 keeps
// the 50 and the group's 200 lowest ids (blocks 0-3); top_p 0.7759 needs ceil(179.5) = 180 of them (its cut mass
// falls inside the group). Every draw must be a kept id, some must come from the group, and the same input draws
// the same token. A top_p so small that its mass target rounds to 0 keeps the first id in the order (z desc, id
// asc), as the host Sampler does.
TEST(Sampling, FullPathTiesAtTheCutAcrossBlocks) {
  const int V = 6000;
  std::vector<float> l(V, -2.f);
  std::vector<int> group;
  for (int i = 700; i < V && static_cast<int>(group.size()) < 300; i += 16) {
    l[i] = 3.f;
    group.push_back(i);
  }
  std::vector<int> head;
  for (int i = 0; i < V && static_cast<int>(head.size()) < 50; i += 91)
    if (l[i] == -2.f) {
      l[i] = 5.f;
      head.push_back(i);
    }
  ASSERT_EQ(head.size(), 50u);
  ASSERT_EQ(group.size(), 300u);
  Sampler s(V);
  for (auto [top_k, top_p, n_group] : {std::tuple{250, 1.f, 200}, std::tuple{0, 0.7759f, 180}}) {
    ASSERT_GT(group[n_group - 1], 3 * 1024) << "the kept ties must reach block 3";
    SamplingParams p;
    p.temperature = 1.f;
    p.top_k = top_k;
    p.top_p = top_p;
    p.update_counts = false;
    std::vector<char> kept(V, 0);
    for (int i : head) kept[i] = 1;
    for (int j = 0; j < n_group; ++j) kept[group[j]] = 1;
    int from_group = 0;
    for (int t = 0; t < 300; ++t) {
      const int got = s.run(l, {}, p, static_cast<uint64_t>(t), 77);
      ASSERT_TRUE(got >= 0 && got < V && kept[got]) << "top_k " << top_k << " top_p " << top_p << " draw " << t
                                                    << " token " << got << " (not kept)";
      EXPECT_TRUE(acceptable_full(l, p, static_cast<uint64_t>(t), 77, got)) << "draw " << t << " token " << got;
      from_group += l[got] == 3.f;
    }
    EXPECT_GT(from_group, 30) << "top_k " << top_k << " top_p " << top_p;
    for (uint64_t t : {3u, 11u, 250u})
      EXPECT_EQ(s.run(l, {}, p, t, 77), s.run(l, {}, p, t, 77)) << "same input, same token";
  }
  SamplingParams tiny;
  tiny.temperature = 1.f;
  tiny.top_p = 1e-20f;
  tiny.update_counts = false;
  for (uint64_t t = 0; t < 20; ++t) EXPECT_EQ(s.run(l, {}, tiny, t, 5), head[0]) << "top_p 1e-20, draw " << t;
}

TEST(Sampling, UpdatesCountsAndCountTokens) {
  const int V = 3001;
  std::mt19937_64 rng(60);
  Sampler s(V);
  std::vector<int> c(V, 0);
  std::vector<int> prompt = {5, 17, 17, 3000, 2, 5, 5};
  DevBuf<int> dp(prompt);
  s.counts.upload(c);
  count_tokens(s.counts.p, V, dp.p, static_cast<int>(prompt.size()), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int> got = s.counts.download();
  for (int t : prompt) c[t] += 1;
  EXPECT_EQ(got, c);
  SamplingParams p;
  p.temperature = 0.f;
  p.update_counts = true;
  std::vector<float> l = random_logits(rng, V, 3.f);
  l[1234] = 10.f;
  const int tok = s.run(l, c, p, 0);
  EXPECT_EQ(tok, 1234);
  got = s.counts.download();
  c[1234] += 1;
  EXPECT_EQ(got, c);
}

// NaN logits (of valid ids) write kSampleNanToken on every path (greedy, the fast candidate path, the full
// path, top-p without top-k), whether one logit, every 7th or all are NaN (then no finite key is left to select
// or draw from), leave the counts alone, and the next call on clean logits samples normally.
TEST(Sampling, NanLogitsGiveTheNanToken) {
  const int V = 5003;
  std::mt19937_64 rng(61);
  Sampler s(V);
  std::vector<int> c(V, 0);
  SamplingParams greedy, fast, full, nucleus;
  greedy.temperature = 0.f;
  fast.top_k = 20;
  full.top_k = 100;
  nucleus.top_p = 0.9f;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (SamplingParams* p : {&greedy, &fast, &full, &nucleus}) p->update_counts = true;
  for (const SamplingParams& p : {greedy, fast, full, nucleus}) {
    for (int at : {0, 2048, V - 1, -7, -1}) {  // -7: every 7th logit NaN, -1: all of them
      std::vector<float> l = random_logits(rng, V, 4.f);
      for (int i = 0; i < V; ++i)
        if (i == at || (at == -7 && i % 7 == 3) || at == -1) l[i] = nan;
      s.counts.upload(c);
      EXPECT_EQ(s.run(l, c, p, 0), kSampleNanToken) << "top_k " << p.top_k << " top_p " << p.top_p << " at " << at;
      EXPECT_EQ(s.counts.download(), c) << "counts changed";
      l = random_logits(rng, V, 4.f);
      const int best = at >= 0 ? at : 1234;
      l[best] = 30.f;
      EXPECT_EQ(s.run(l, c, p, 1), best) << "after a NaN";  // 30 against [-4, 4]: every path keeps only it
      s.counts.upload(c);
    }
  }
  // masked padding: a NaN past n_valid is not a logit
  greedy.n_valid = V - 3;
  greedy.update_counts = false;
  std::vector<float> l = random_logits(rng, V, 4.f);
  l[V - 1] = std::numeric_limits<float>::quiet_NaN();
  l[77] = 30.f;
  EXPECT_EQ(s.run(l, {}, greedy, 0), 77);
}

// Token masks (apply_token_mask) in mapped pinned host memory, two slots, as the decode graph uses them.
struct MaskSlots {
  int V;
  uint32_t* host = nullptr;
  uint32_t* dev = nullptr;
  explicit MaskSlots(int v) : V(v) {
    const size_t words = 2 * static_cast<size_t>(token_mask_slot_words(v));
    CUDA_CHECK(cudaHostAlloc(&host, words * sizeof(uint32_t), cudaHostAllocMapped));
    CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), host, 0));
    std::fill(host, host + words, 0u);
  }
  ~MaskSlots() { cudaFreeHost(host); }
  void publish(uint64_t ticket, const std::vector<uint32_t>* bits) {  // null: every id allowed
    if (bits) std::copy(bits->begin(), bits->end(), token_mask_bits(host, V, ticket));
    publish_token_mask(host, V, ticket, bits != nullptr);
  }
};

// A mask allowing about one id in `every` (at least one).
std::vector<uint32_t> random_mask(std::mt19937_64& rng, int V, int every) {
  std::vector<uint32_t> m((V + 31) / 32, 0u);
  for (int i = 0; i < V; ++i)
    if (rng() % every == 0) m[i / 32] |= 1u << (i % 32);
  const int any = static_cast<int>(rng() % V);
  m[any / 32] |= 1u << (any % 32);
  return m;
}
bool allowed_by(const std::vector<uint32_t>& m, int i) { return (m[i / 32] >> (i % 32)) & 1u; }

// The kernel waits for its ticket's mask, published by another host thread only after the main thread has seen
// the stream still busy (a stale mask of ticket n - 2 in the same slot is not taken), then masks the forbidden ids
// of an odd vocabulary to -inf and leaves the others bit for bit; an "all allowed" ticket leaves every logit; with a
// short timeout and nothing published it gives up, leaves the logits and records the timeout.
TEST(Sampling, TokenMaskWaitsForTheHost) {
  for (int V : {5003, 70001, kVocab}) {
    SCOPED_TRACE(V);
    std::mt19937_64 rng(V);
    const std::vector<float> l = random_logits(rng, V, 6.f);
    DevBuf<float> d(V);
    DevBuf<uint64_t> counter(2);
    MaskSlots slots(V);
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (uint64_t ticket : {0ull, 1ull, 2ull, 3ull, 8ull}) {
      SCOPED_TRACE(ticket);
      const uint64_t c[2] = {ticket, 0};
      CUDA_CHECK(cudaMemcpy(counter.p, c, sizeof c, cudaMemcpyHostToDevice));
      const std::vector<uint32_t> none((V + 31) / 32, 0u);
      if (ticket >= 2) slots.publish(ticket - 2, &none);  // stale: this slot's previous ticket, nothing allowed
      const std::vector<uint32_t> mask = random_mask(rng, V, 2 + static_cast<int>(ticket % 3) * 5);
      const bool all = ticket == 3;
      d.upload(l);
      std::atomic<bool> go{false};
      apply_token_mask(d.p, V, slots.dev, counter.p, 10'000'000'000LL, s);
      std::thread publisher([&] {
        while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        slots.publish(ticket, all ? nullptr : &mask);
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << "the kernel did not wait for the host";
      (void)cudaGetLastError();  // (not ready is a status, not an error: leave nothing for the next launch check)
      go.store(true);
      CUDA_CHECK(cudaStreamSynchronize(s));
      publisher.join();
      const std::vector<float> got = d.download();
      int wrong = 0, masked = 0;
      for (int i = 0; i < V; ++i) {
        const bool keep = all || allowed_by(mask, i);
        masked += !keep;
        if (keep ? std::memcmp(&got[i], &l[i], sizeof(float)) != 0 : got[i] != -INFINITY) ++wrong;
      }
      EXPECT_EQ(wrong, 0) << masked << " masked";
      EXPECT_TRUE(all || masked > 0);
      EXPECT_FALSE(token_mask_timed_out(slots.host, V, ticket));
    }
    // nothing published for ticket 5 (its slot holds ticket 3's): gives up after 50 ms, logits untouched
    const uint64_t c[2] = {5, 0};
    CUDA_CHECK(cudaMemcpy(counter.p, c, sizeof c, cudaMemcpyHostToDevice));
    d.upload(l);
    apply_token_mask(d.p, V, slots.dev, counter.p, 50'000'000LL, s);
    CUDA_CHECK(cudaStreamSynchronize(s));
    EXPECT_EQ(d.download(), l);
    EXPECT_TRUE(token_mask_timed_out(slots.host, V, 5));
    EXPECT_FALSE(token_mask_timed_out(slots.host, V, 3));
    CUDA_CHECK(cudaStreamDestroy(s));
  }
}

// The sampler over masked logits against the host Sampler with the same mask (lily::Sampler applies it first):
// greedy, the fast path with fewer allowed ids than top_k (the -inf candidates must never be drawn), top-p / min-p
// on both paths and plain sampling over everything; the same token, an allowed one, and the same log-probability.
TEST(Sampling, MaskedLogitsSampleAsTheHost) {
  const int V = 9001;
  std::mt19937_64 rng(62);
  Sampler s(V);
  DevBuf<float> lp(1);
  MaskSlots slots(V);
  struct Case { float temperature; int top_k; float top_p; float min_p; int every; };
  for (const Case& k : {Case{0.f, 0, 1.f, 0.f, 7}, Case{1.f, 20, 1.f, 0.f, 3000}, Case{0.8f, 40, 0.9f, 0.f, 5},
                        Case{1.f, 0, 0.9f, 0.f, 7}, Case{1.2f, 100, 1.f, 0.05f, 2}, Case{1.f, 0, 1.f, 0.f, 11},
                        Case{0.9f, 64, 1.f, 0.f, 1500}}) {
    SamplingParams p;
    p.temperature = k.temperature;
    p.top_k = k.top_k;
    p.top_p = k.top_p;
    p.min_p = k.min_p;
    p.update_counts = false;
    lily::SamplingParams hp;
    hp.temperature = k.temperature;
    hp.top_k = k.top_k;
    hp.top_p = k.top_p;
    hp.min_p = k.min_p;
    hp.seed = 21;
    lily::Sampler host(hp, V);
    for (uint64_t t = 0; t < 12; ++t) {
      const std::vector<float> l = random_logits(rng, V, 5.f);
      const std::vector<uint32_t> mask = random_mask(rng, V, k.every);
      slots.publish(t, &mask);  // before the launch: no wait
      s.logits.upload(l);
      const uint64_t r[2] = {t, hp.seed};
      CUDA_CHECK(cudaMemcpy(s.rng.p, r, sizeof r, cudaMemcpyHostToDevice));
      apply_token_mask(s.logits.p, V, slots.dev, s.rng.p, 1'000'000'000LL, nullptr);
      sample(s.logits.p, V, p, nullptr, s.rng.p, s.token.p, s.scratch.p, nullptr, lp.p);
      CUDA_CHECK(cudaDeviceSynchronize());
      const int got = s.token.download()[0];
      const lily::SampledToken want = host.sample(l.data(), mask.data());
      ASSERT_TRUE(got >= 0 && got < V && allowed_by(mask, got)) << "token " << got << " is masked";
      EXPECT_EQ(got, want.token) << "top_k " << k.top_k << " top_p " << k.top_p << " draw " << t;
      EXPECT_NEAR(lp.download()[0], want.logprob, 1e-4) << "top_k " << k.top_k << " draw " << t;
    }
  }
}

TEST(Sampling, UniformIsCounterBased) {
  EXPECT_EQ(sample_uniform(7, 3), sample_uniform(7, 3));
  EXPECT_NE(sample_uniform(7, 3), sample_uniform(7, 4));
  EXPECT_NE(sample_uniform(7, 3), sample_uniform(8, 3));
  double mean = 0;
  for (int i = 0; i < 10000; ++i) {
    const float u = sample_uniform(1, i);
    ASSERT_GE(u, 0.f);
    ASSERT_LT(u, 1.f);
    mean += u;
  }
  EXPECT_NEAR(mean / 10000, 0.5, 0.02);
}

}  // namespace
}  // namespace lily::cuda::test
