// generate(): stop ids, ignore_eos, max_tokens, cancellation, context limit (on a scripted fake backend) and
// greedy continuations of the CPU backend against transformers' (golden fixture).
#include <gtest/gtest.h>

#include <cmath>
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
    pending_ = (fed.back() + 1) % config().vocab;
    return {pending_, logprobs_ ? -0.25f : std::numeric_limits<float>::quiet_NaN(), {}};
  }
  void decode_device_launch() override {
    EXPECT_FALSE(in_flight_);
    in_flight_ = true;
    forward(std::span<const int32_t>(&pending_, 1), nullptr, false);
    launches++;
  }
  SampleResult decode_device_wait() override {
    EXPECT_TRUE(in_flight_);
    in_flight_ = false;
    return sample_device();
  }
  int begun = 0, launches = 0;

 private:
  int32_t pending_ = -1;
  bool in_flight_ = false, logprobs_ = false;
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

// The device-sampling path of generate() against the host path on the same script: the same ids, finish
// reasons and consumed ids (the stop id and the last id are never fed), except that a cancelling on_token
// runs while the last id's step is in flight (so that id is consumed too). host_sampling keeps the host path.
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
      EXPECT_EQ(dev.fed, host.fed);
      EXPECT_EQ(dev.begun, 1);
      EXPECT_EQ(dev.launches, static_cast<int>(a.tokens.size()) - 1);
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
