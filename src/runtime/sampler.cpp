// Host sampler: see sampler.h for the exact semantics.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "util/check.h"

namespace lily {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

float sample_uniform(uint64_t seed, uint64_t counter) {
  const uint64_t x = splitmix64(seed ^ splitmix64(counter));  // same stream as kernels/sampling.cu
  return static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
}

Sampler::Sampler(const SamplingParams& params, int vocab) : p_(params), vocab_(vocab) {
  LILY_CHECK(vocab > 0, "sampler: vocab must be positive");
  n_valid_ = (p_.n_valid > 0 && p_.n_valid < vocab) ? p_.n_valid : vocab;
  LILY_CHECK(p_.repetition_penalty > 0, "sampler: repetition_penalty must be > 0, got ", p_.repetition_penalty);
  LILY_CHECK(p_.top_logprobs >= 0, "sampler: top_logprobs must be >= 0");
  generated_count_.assign(vocab, 0);
  in_context_.assign(vocab, 0);
  z_.resize(vocab);
}

void Sampler::add_prompt(std::span<const int32_t> prompt) {
  for (int32_t t : prompt)
    if (t >= 0 && t < vocab_ && !in_context_[t]) {
      in_context_[t] = 1;
      context_ids_.push_back(t);
    }
}

void Sampler::add_generated(int32_t token) {
  if (token < 0 || token >= vocab_) return;
  generated_count_[token]++;
  if (!in_context_[token]) {
    in_context_[token] = 1;
    context_ids_.push_back(token);
  }
}

void Sampler::record_drawn(int32_t token) {
  if (p_.temperature > 0) ++draws_;
  add_generated(token);
}

void Sampler::process(const float* logits, float* z, const uint32_t* allowed) const {
  std::copy(logits, logits + vocab_, z);
  if (allowed)
    for (int i = 0; i < vocab_; ++i)
      if (!((allowed[i >> 5] >> (i & 31)) & 1u)) z[i] = -INFINITY;
  for (const auto& [id, bias] : p_.logit_bias)
    if (id >= 0 && id < vocab_) z[id] += bias;
  const float rep = p_.repetition_penalty;
  const bool counted = rep != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
  if (counted)  // only ids in the context are penalised (generated ids are in it too)
    for (int32_t i : context_ids_) {
      if (rep != 1.0f) z[i] = z[i] > 0 ? z[i] / rep : z[i] * rep;
      if (generated_count_[i] > 0)
        z[i] -= p_.frequency_penalty * static_cast<float>(generated_count_[i]) + p_.presence_penalty;
    }
  for (int i = n_valid_; i < vocab_; ++i) z[i] = -INFINITY;
  if (p_.temperature > 0 && p_.temperature != 1.0f)
    for (int i = 0; i < n_valid_; ++i) z[i] /= p_.temperature;
}

SampledToken Sampler::sample(const float* logits, const uint32_t* allowed) {
  float* z = z_.data();
  process(logits, z, allowed);
  // Greedy pick and the maximum: ties go to the lowest id. A NaN fails the step (never a token).
  int32_t best = -1;
  for (int i = 0; i < n_valid_; ++i) {
    if (std::isnan(z[i])) throw NanLogitsError("sampler: the logit of token " + std::to_string(i) + " is NaN");
    if (best < 0 || z[i] > z[best]) best = i;
  }
  const float z_max = z[best];
  LILY_CHECK(z_max > -INFINITY, "sampler: every token is masked");
  double lse = 0;
  for (int i = 0; i < n_valid_; ++i) lse += std::exp(static_cast<double>(z[i]) - z_max);
  const double log_total = z_max + std::log(lse);

  int32_t token = best;
  if (p_.temperature > 0) {
    auto before = [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); };
    std::vector<int32_t> kept;
    bool sorted = false;
    if (p_.top_k > 0 && p_.top_k <= 4096) {
      // the top_k first ids of the order in one pass: a heap of the best so far, its root the worst of them;
      // an id enters only if it comes before the root (the same set as sorting everything, since the order is
      // total)
      const size_t k = static_cast<size_t>(p_.top_k);
      kept.reserve(k);
      for (int i = 0; i < n_valid_; ++i) {
        if (!(z[i] > -INFINITY)) continue;
        if (kept.size() < k) {
          kept.push_back(i);
          std::push_heap(kept.begin(), kept.end(), before);
        } else if (before(i, kept.front())) {
          std::pop_heap(kept.begin(), kept.end(), before);
          kept.back() = i;
          std::push_heap(kept.begin(), kept.end(), before);
        }
      }
      std::sort(kept.begin(), kept.end(), before);
      sorted = true;
    } else {
      kept.reserve(n_valid_);
      for (int i = 0; i < n_valid_; ++i)
        if (z[i] > -INFINITY) kept.push_back(i);
      if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < kept.size()) {
        std::partial_sort(kept.begin(), kept.begin() + p_.top_k, kept.end(), before);
        kept.resize(p_.top_k);
        sorted = true;
      }
    }
    if (p_.top_p < 1.0f) {
      if (!sorted) std::sort(kept.begin(), kept.end(), before);
      sorted = true;
      double mass = 0;
      for (int32_t i : kept) mass += std::exp(static_cast<double>(z[i]) - z_max);
      double run = 0;
      size_t n = 0;
      while (n < kept.size()) {
        run += std::exp(static_cast<double>(z[kept[n]]) - z_max);
        ++n;
        if (run / mass >= static_cast<double>(p_.top_p)) break;
      }
      kept.resize(n);
    }
    if (p_.min_p > 0.0f) {
      const double threshold = z_max + std::log(static_cast<double>(p_.min_p));
      kept.erase(std::remove_if(kept.begin(), kept.end(), [&](int32_t i) { return z[i] < threshold; }), kept.end());
    }
    std::sort(kept.begin(), kept.end());
    double total = 0;
    for (int32_t i : kept) total += std::exp(static_cast<double>(z[i]) - z_max);
    const double target = static_cast<double>(sample_uniform(p_.seed, draws_++)) * total;
    double run = 0;
    token = kept.back();
    for (int32_t i : kept) {
      run += std::exp(static_cast<double>(z[i]) - z_max);
      if (run > target) {
        token = i;
        break;
      }
    }
  }

  SampledToken r;
  r.token = token;
  r.logprob = static_cast<float>(z[token] - log_total);
  if (p_.top_logprobs > 0) {
    const int n = std::min(p_.top_logprobs, n_valid_);
    std::vector<int32_t> ids(n_valid_);
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                      [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
    for (int j = 0; j < n; ++j) r.top.push_back({ids[j], static_cast<float>(z[ids[j]] - log_total)});
  }
  add_generated(token);
  return r;
}

}  // namespace lily
