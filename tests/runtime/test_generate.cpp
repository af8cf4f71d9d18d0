// generate(): stop ids, ignore_eos, max_tokens, cancellation, context limit (on a scripted fake backend) and
// greedy continuations of the CPU backend against transformers' (golden fixture).
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "model/forward_cpu.h"
#include "runtime/generate.h"

using namespace lily;

namespace {

// Logits put all mass on (last token + 1) % vocab, so the continuation of t is t+1, t+2, ...
class CountingBackend : public Backend {
 public:
  explicit CountingBackend(int max_ctx) : max_ctx_(max_ctx) {
    cfg_.vocab = 16;
    cfg_.eos_token_ids = {9, 12};
  }
  const Config& config() const override { return cfg_; }
  std::string name() const override { return "fake"; }
  int max_context() const override { return max_ctx_; }
  int position() const override { return pos_; }
  void reset() override { pos_ = 0; }
  void forward(std::span<const int32_t> tokens, float* logits, bool all_logits) override {
    pos_ += static_cast<int>(tokens.size());
    fed.insert(fed.end(), tokens.begin(), tokens.end());
    if (!logits) return;
    std::fill(logits, logits + cfg_.vocab, 0.0f);
    logits[(tokens.back() + 1) % cfg_.vocab] = 10.0f;
  }
  StateSnapshot save_state() const override { return {}; }
  void restore_state(const StateSnapshot&) override {}
  std::vector<int32_t> fed;

 private:
  Config cfg_;
  int max_ctx_;
  int pos_ = 0;
};

// The same script with the sampler "on the device" (Backend::begin_device_sampling): greedy only. Counts its
// launches and checks the launch / wait pairing.
class DeviceCountingBackend : public CountingBackend {
 public:
  using CountingBackend::CountingBackend;
  bool begin_device_sampling(const SamplingParams& p, std::span<const int32_t>, bool logprobs) override {
    if (p.temperature > 0) return false;
    begun++;
    logprobs_ = logprobs;
    return true;
  }
  SampleResult sample_device() override {
    EXPECT_TRUE(queue_.empty());
    next_ = (fed.back() + 1) % config().vocab;
    return result(next_);
  }
  // a launch consumes the id the previous sample produced (known on the "device" before the host waits)
  void decode_device_launch() override {
    EXPECT_LT(queue_.size(), 2u);
    forward(std::span<const int32_t>(&next_, 1), nullptr, false);
    next_ = (next_ + 1) % config().vocab;
    queue_.push_back(next_);
    launches++;
    max_queued = std::max(max_queued, static_cast<int>(queue_.size()));
  }
  SampleResult decode_device_wait() override {
    EXPECT_FALSE(queue_.empty());
    const int32_t t = queue_.front();
    queue_.pop_front();
    return result(t);
  }
  int begun = 0, launches = 0, max_queued = 0;

 private:
  SampleResult result(int32_t t) const { return {t, logprobs_ ? -0.25f : std::numeric_limits<float>::quiet_NaN(), {}}; }
  int32_t next_ = -1;
  std::deque<int32_t> queue_;
  bool logprobs_ = false;
};

GenerateOptions greedy(int max_tokens) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampling.temperature = 0;
  return o;
}

}  // namespace

TEST(Generate, StopsOnEosIncludingIt) {
  CountingBackend be(100);
  const int32_t prompt[] = {3, 5};
  GenerateResult r = generate(be, prompt, greedy(10));
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{6, 7, 8, 9}));
  EXPECT_EQ(r.finish, FinishReason::stop);
  EXPECT_EQ(r.prompt_tokens, 2);
  // The stop id itself is never fed back.
  EXPECT_EQ(be.fed, (std::vector<int32_t>{3, 5, 6, 7, 8}));
}

TEST(Generate, IgnoreEosRunsToMaxTokens) {
  CountingBackend be(100);
  const int32_t prompt[] = {7};
  GenerateOptions o = greedy(7);
  o.ignore_eos = true;
  GenerateResult r = generate(be, prompt, o);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{8, 9, 10, 11, 12, 13, 14}));
  EXPECT_EQ(r.finish, FinishReason::length);
  EXPECT_EQ(finish_reason_name(r.finish), std::string("length"));
  o.extra_stop_ids = {11};
  CountingBackend be2(100);
  EXPECT_EQ(generate(be2, prompt, o).tokens, (std::vector<int32_t>{8, 9, 10, 11}));
}

TEST(Generate, CallbackSeesEveryTokenAndCanCancel) {
  CountingBackend be(100);
  const int32_t prompt[] = {0};
  GenerateOptions o = greedy(10);
  std::vector<int32_t> seen;
  o.on_token = [&](const SampleResult& s, int index) {
    EXPECT_EQ(index, static_cast<int>(seen.size()));
    seen.push_back(s.token);
    return s.token != 3;
  };
  GenerateResult r = generate(be, prompt, o);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(seen, r.tokens);
  EXPECT_EQ(r.finish, FinishReason::cancelled);
  EXPECT_NEAR(r.samples[0].logprob, 0.0f, 1e-3);
}

TEST(Generate, StopsAtContextLimit) {
  CountingBackend be(4);
  const int32_t prompt[] = {0, 0};
  GenerateResult r = generate(be, prompt, greedy(10));
  // Positions 2 and 3 hold generated ids 1 and 2; id 3 is sampled from position 3's logits.
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.finish, FinishReason::length);
  EXPECT_LE(be.position(), be.max_context());
}

TEST(Generate, CpuGreedyMatchesTransformers) {
  const std::string dir = std::string(LILY_SOURCE_DIR) + "/tests/data/golden/hf";
  Model model = load_model(dir);
  ThreadPool pool(2);
  CpuBackend be(model, 0, &pool);
  std::ifstream f(dir + "/golden/golden.json");
  nlohmann::json g = nlohmann::json::parse(f);
  for (const auto& c : g["cases"]) {
    std::vector<int32_t> prompt = c["prompt"].get<std::vector<int32_t>>();
    std::vector<int32_t> expect = c["greedy"].get<std::vector<int32_t>>();
    GenerateOptions o = greedy(static_cast<int>(expect.size()));
    o.ignore_eos = true;
    be.reset();
    EXPECT_EQ(generate(be, prompt, o).tokens, expect) << "prompt of " << prompt.size();
  }
}

// The device-sampling path of generate() against the host path on the same script: the same ids and finish
// reasons; the same consumed ids (the last id is never fed) except that the device path queues the step of the
// next id before the host has seen it, so a stop id, or the id a cancelling on_token returns at, is consumed
// too. Two steps are queued at a time. host_sampling keeps the host path.
TEST(Generate, DeviceSamplingPathMatchesHostPath) {
  for (int max_ctx : {100, 4}) {
    for (bool ignore_eos : {false, true}) {
      CountingBackend host(max_ctx);
      DeviceCountingBackend dev(max_ctx);
      const int32_t prompt[] = {2, 3};
      GenerateOptions o = greedy(9);
      o.ignore_eos = ignore_eos;
      const GenerateResult a = generate(host, prompt, o), b = generate(dev, prompt, o);
      EXPECT_EQ(b.tokens, a.tokens) << max_ctx << " " << ignore_eos;
      EXPECT_EQ(b.finish, a.finish);
      std::vector<int32_t> fed = host.fed;
      if (a.finish == FinishReason::stop) fed.push_back(a.tokens.back());  // the stop id's step ran ahead
      EXPECT_EQ(dev.fed, fed);
      EXPECT_EQ(dev.begun, 1);
      const int extra = static_cast<int>(dev.fed.size() - host.fed.size());  // the stop id's step
      EXPECT_EQ(dev.launches, extra + static_cast<int>(a.tokens.size()) - 1);
      if (a.tokens.size() > 2) EXPECT_EQ(dev.max_queued, 2);
      EXPECT_TRUE(std::isnan(b.samples[0].logprob));
    }
  }
  DeviceCountingBackend dev(100);
  const int32_t prompt[] = {0};
  GenerateOptions o = greedy(10);
  o.on_token = [](const SampleResult& s, int) { return s.token != 3; };
  const GenerateResult r = generate(dev, prompt, o);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.finish, FinishReason::cancelled);
  EXPECT_EQ(dev.fed, (std::vector<int32_t>{0, 1, 2, 3}));  // 3's step ran while on_token handled it
  DeviceCountingBackend dev2(100);
  o.on_token = nullptr;
  o.logprobs = true;  // passed on: the device path reports them
  const GenerateResult r2 = generate(dev2, prompt, o);
  EXPECT_EQ(r2.tokens.size(), 9u);  // 1 .. 9 (an eos id)
  EXPECT_EQ(r2.samples[3].logprob, -0.25f);
  EXPECT_EQ(dev2.begun, 1);
  DeviceCountingBackend dev3(100);
  o.host_sampling = true;
  EXPECT_EQ(generate(dev3, prompt, o).tokens.size(), 9u);
  EXPECT_EQ(dev3.begun, 0);
}
