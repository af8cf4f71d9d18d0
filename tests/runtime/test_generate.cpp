// generate(): stop ids, ignore_eos, max_tokens, cancellation, context limit (on a scripted fake backend) and
// greedy continuations of the CPU backend against transformers' (golden fixture).
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <fstream>
#include <functional>
#include <limits>

#include <nlohmann/json.hpp>

#include "runtime/cpu_backend.h"
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
    const size_t rows = all_logits ? tokens.size() : 1;
    std::fill(logits, logits + rows * cfg_.vocab, 0.0f);
    for (size_t r = 0; r < rows; ++r) logits[r * cfg_.vocab + (tokens[tokens.size() - rows + r] + 1) % cfg_.vocab] = 10.0f;
  }
  StateSnapshot save_state() const override { return {}; }
  void restore_state(const StateSnapshot&) override {}
  std::vector<int32_t> fed;

 private:
  Config cfg_;
  int max_ctx_;
  int pos_ = 0;
};

// The same script with the sampler "on the device" (overriding the generation protocol): greedy only. Counts its
// launches and checks the launch / wait pairing.
class DeviceCountingBackend : public CountingBackend {
 public:
  using CountingBackend::CountingBackend;
  void begin_sampling(const SamplingSetup& s, std::span<const int32_t> prompt) override {
    device_ = s.params.temperature <= 0 && !s.host;
    if (!device_) return Backend::begin_sampling(s, prompt);
    begun++;
    logprobs_ = s.logprobs;
  }
  void prefill(std::span<const int32_t> tokens, bool last) override {
    if (!device_) return Backend::prefill(tokens, last);
    forward(tokens, nullptr, false);
  }
  bool samples_on_device() const override { return device_; }
  SampledToken sample() override {
    if (!device_) return Backend::sample();
    EXPECT_TRUE(queue_.empty());
    next_ = (fed.back() + 1) % config().vocab;
    return result(next_);
  }
  // a launch consumes the id the previous sample produced (known on the "device" before the host waits)
  void decode_launch() override {
    if (!device_) return Backend::decode_launch();
    EXPECT_LT(queue_.size(), 2u);
    forward(std::span<const int32_t>(&next_, 1), nullptr, false);
    next_ = (next_ + 1) % config().vocab;
    queue_.push_back(next_);
    launches++;
    max_queued = std::max(max_queued, static_cast<int>(queue_.size()));
  }
  SampledToken decode_wait() override {
    if (!device_) return Backend::decode_wait();
    EXPECT_FALSE(queue_.empty());
    const int32_t t = queue_.front();
    queue_.pop_front();
    return result(t);
  }
  int begun = 0, launches = 0, max_queued = 0;

 private:
  SampledToken result(int32_t t) const { return {t, logprobs_ ? -0.25f : std::numeric_limits<float>::quiet_NaN(), {}}; }
  bool device_ = false;
  int32_t next_ = -1;
  std::deque<int32_t> queue_;
  bool logprobs_ = false;
};

GenerateOptions greedy(int max_tokens, const Backend& be, bool eos = true) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampling.params.temperature = 0;
  if (eos) o.stop_ids = be.config().eos_token_ids;
  return o;
}

}  // namespace

TEST(Generate, StopsOnEosIncludingIt) {
  CountingBackend be(100);
  const int32_t prompt[] = {3, 5};
  GenerateResult r = generate(be, prompt, greedy(10, be));
  EXPECT_EQ(r.ids(), (std::vector<int32_t>{6, 7, 8, 9}));
  EXPECT_EQ(r.finish, FinishReason::stop);
  EXPECT_TRUE(r.stopped_by_id);
  EXPECT_EQ(r.prompt_tokens, 2);
  // The stop id's step was queued before the loop saw the id (the pipeline is two deep on every backend).
  EXPECT_EQ(be.fed, (std::vector<int32_t>{3, 5, 6, 7, 8, 9}));
}

TEST(Generate, WithoutStopIdsRunsToMaxTokens) {
  CountingBackend be(100);
  const int32_t prompt[] = {7};
  GenerateOptions o = greedy(7, be, false);
  GenerateResult r = generate(be, prompt, o);
  EXPECT_EQ(r.ids(), (std::vector<int32_t>{8, 9, 10, 11, 12, 13, 14}));
  EXPECT_EQ(r.finish, FinishReason::length);
  EXPECT_EQ(finish_reason_name(r.finish), std::string("length"));
  EXPECT_EQ(be.position(), 1 + 6);  // the last id is never consumed
  o.stop_ids = {11};
  CountingBackend be2(100);
  EXPECT_EQ(generate(be2, prompt, o).ids(), (std::vector<int32_t>{8, 9, 10, 11}));
}

TEST(Generate, CallbackSeesEveryTokenAndCanEnd) {
  CountingBackend be(100);
  const int32_t prompt[] = {0};
  GenerateOptions o = greedy(10, be);
  std::vector<int32_t> seen;
  o.on_token = [&](const SampledToken& s, int index, bool stop_id) {
    EXPECT_EQ(index, static_cast<int>(seen.size()));
    EXPECT_FALSE(stop_id);
    seen.push_back(s.token);
    return s.token == 3 ? FinishReason::cancelled : FinishReason::none;
  };
  GenerateResult r = generate(be, prompt, o);
  EXPECT_EQ(r.ids(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(seen, r.ids());
  EXPECT_EQ(r.finish, FinishReason::cancelled);
  EXPECT_FALSE(r.stopped_by_id);
  EXPECT_TRUE(std::isnan(r.tokens[0].logprob));  // not asked for
  o.sampling.logprobs = true;
  seen.clear();
  be.reset();
  EXPECT_NEAR(generate(be, prompt, o).tokens[0].logprob, 0.0f, 1e-3);
}

TEST(Generate, InterruptStopsPrefillAndDecode) {
  CountingBackend be(1000);
  std::vector<int32_t> prompt(50, 1);
  GenerateOptions o = greedy(10, be, false);
  o.prefill_chunk = 16;
  std::vector<int> checkpoints;
  o.checkpoints = {20, 40, 60};
  o.on_checkpoint = [&](int pos) { checkpoints.push_back(pos); };
  int calls = 0;
  o.interrupt = [&] { return ++calls == 3 ? FinishReason::cancelled : FinishReason::none; };
  GenerateResult r = generate(be, prompt, o);
  EXPECT_FALSE(r.prefilled);
  EXPECT_EQ(r.finish, FinishReason::cancelled);
  EXPECT_EQ(be.position(), 20);  // pieces [0, 16), [16, 20) (a checkpoint), then interrupted
  EXPECT_EQ(checkpoints, (std::vector<int>{20}));
  // resumed from where it stopped: pieces [20, 36), [36, 40), [40, 50); then interrupted before the third id
  calls = 0;
  checkpoints.clear();
  o.interrupt = [&] { return ++calls == 6 ? FinishReason::length : FinishReason::none; };
  r = generate(be, prompt, 20, o);
  EXPECT_TRUE(r.prefilled);
  EXPECT_EQ(checkpoints, (std::vector<int>{40}));
  EXPECT_EQ(r.ids(), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(r.finish, FinishReason::length);
}

// A backend that stops inside a piece (Backend::prefill_stoppable): parts of 4 tokens, stop() between them.
class PartsBackend : public CountingBackend {
 public:
  using CountingBackend::CountingBackend;
  bool prefill_stoppable(std::span<const int32_t> tokens, bool last, const std::function<bool()>& stop) override {
    for (size_t i = 0; i < tokens.size(); i += 4) {
      if (i > 0 && stop()) return false;
      prefill(tokens.subspan(i, std::min<size_t>(4, tokens.size() - i)), last && i + 4 >= tokens.size());
    }
    return true;
  }
};

TEST(Generate, InterruptInsideAPiece) {
  PartsBackend be(1000);
  std::vector<int32_t> prompt(30, 1);
  GenerateOptions o = greedy(5, be, false);
  o.prefill_chunk = 16;
  int calls = 0;
  // call 1 before the piece [0, 16), calls 2 and 3 before its parts [4, 8) and [8, 12): stopped there
  o.interrupt = [&] { return ++calls == 3 ? FinishReason::cancelled : FinishReason::none; };
  GenerateResult r = generate(be, prompt, o);
  EXPECT_FALSE(r.prefilled);
  EXPECT_FALSE(r.state_valid);
  EXPECT_EQ(r.finish, FinishReason::cancelled);
  EXPECT_EQ(be.position(), 8);
  EXPECT_TRUE(r.tokens.empty());
  // between pieces the state stays valid (the position is what was consumed)
  be.reset();
  calls = 0;
  o.interrupt = [&] { return ++calls == 5 ? FinishReason::cancelled : FinishReason::none; };  // 1, 2, 3, 4: [0, 16)
  r = generate(be, prompt, o);
  EXPECT_FALSE(r.prefilled);
  EXPECT_TRUE(r.state_valid);
  EXPECT_EQ(be.position(), 16);
}

// The CPU backend's parts (prefill_stoppable) give the bits of one whole forward: the state and the next logits.
TEST(Generate, CpuPartsGiveTheWholePiecesBits) {
  Model model = load_model(std::string(LILY_SOURCE_DIR) + "/tests/data/golden/hf");
  ThreadPool pool(2);
  CpuBackend whole(model, 0, &pool), parts(model, 0, &pool);
  std::vector<int32_t> prompt(600);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % model.config.vocab);
  whole.forward(prompt, nullptr, false);
  int checks = 0;
  EXPECT_TRUE(parts.prefill_stoppable(prompt, false, [&] { return ++checks, false; }));
  EXPECT_EQ(checks, 2);  // before [256, 512) and [512, 600)
  EXPECT_EQ(parts.position(), whole.position());
  EXPECT_EQ(parts.save_state().bytes, whole.save_state().bytes);
  const int32_t next = 5;
  std::vector<float> a(model.config.vocab), b(model.config.vocab);
  whole.forward(std::span<const int32_t>(&next, 1), a.data(), false);
  parts.forward(std::span<const int32_t>(&next, 1), b.data(), false);
  EXPECT_EQ(a, b);
  // stopped before its second part: the first part consumed, false returned
  parts.reset();
  EXPECT_FALSE(parts.prefill_stoppable(prompt, true, [] { return true; }));
  EXPECT_EQ(parts.position(), 256);
}

TEST(Generate, ScoresAPromptWithoutSampling) {
  CountingBackend be(100);
  const int32_t prompt[] = {4, 6, 8};
  std::vector<float> logits(3 * 16);
  GenerateOptions o;
  o.max_tokens = 0;
  o.prompt_logits = logits.data();
  o.prefill_chunk = 2;
  const GenerateResult r = generate(be, prompt, o);
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_EQ(be.position(), 3);
  EXPECT_EQ(logits[1 * 16 + 7], 10.0f);  // position 1 (id 6) predicts 7
  EXPECT_EQ(logits[2 * 16 + 9], 10.0f);
}

TEST(Generate, FilterMasksTheSampler) {
  // The filter allows only even ids: the counting script's favourite (odd) is masked, so greedy picks the best
  // allowed id, the lowest even one among the tied zeros.
  struct Even : TokenFilter {
    bool allowed(std::span<uint32_t> mask) override {
      for (auto& w : mask) w = 0x55555555u;
      return true;
    }
    void accept(int32_t t) override { accepted.push_back(t); }
    std::vector<int32_t> accepted;
  } even;
  CountingBackend be(100);
  const int32_t prompt[] = {2};
  GenerateOptions o = greedy(3, be, false);
  o.sampling.filter = &even;
  const GenerateResult r = generate(be, prompt, o);
  EXPECT_EQ(r.ids(), (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(even.accepted, r.ids());
}

TEST(Generate, StopsAtContextLimit) {
  CountingBackend be(4);
  const int32_t prompt[] = {0, 0};
  GenerateResult r = generate(be, prompt, greedy(10, be));
  // Positions 2 and 3 hold generated ids 1 and 2; id 3 is sampled from position 3's logits.
  EXPECT_EQ(r.ids(), (std::vector<int32_t>{1, 2, 3}));
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
    GenerateOptions o = greedy(static_cast<int>(expect.size()), be, false);
    be.reset();
    EXPECT_EQ(generate(be, prompt, o).ids(), expect) << "prompt of " << prompt.size();
  }
}

// The device path of the protocol against the host path on the same script: the same ids, finish reasons and
// consumed ids (the step of a stop id, or of the id a generation ends at, runs ahead on both). Two steps are
// queued at a time. SamplingSetup::host keeps the host path.
TEST(Generate, DeviceSamplingPathMatchesHostPath) {
  for (int max_ctx : {100, 4}) {
    for (bool eos : {true, false}) {
      CountingBackend host(max_ctx);
      DeviceCountingBackend dev(max_ctx);
      const int32_t prompt[] = {2, 3};
      GenerateOptions o = greedy(9, host, eos);
      const GenerateResult a = generate(host, prompt, o), b = generate(dev, prompt, o);
      EXPECT_EQ(b.ids(), a.ids()) << max_ctx << " " << eos;
      EXPECT_EQ(b.finish, a.finish);
      EXPECT_EQ(dev.fed, host.fed);
      EXPECT_EQ(dev.begun, 1);
      EXPECT_EQ(dev.launches, static_cast<int>(dev.fed.size()) - 2);
      if (a.tokens.size() > 2) EXPECT_EQ(dev.max_queued, 2);
      EXPECT_TRUE(std::isnan(b.tokens[0].logprob));
    }
  }
  DeviceCountingBackend dev(100);
  const int32_t prompt[] = {0};
  GenerateOptions o = greedy(10, dev);
  o.on_token = [](const SampledToken& s, int, bool) { return s.token == 3 ? FinishReason::stop : FinishReason::none; };
  const GenerateResult r = generate(dev, prompt, o);
  EXPECT_EQ(r.ids(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.finish, FinishReason::stop);
  EXPECT_EQ(dev.fed, (std::vector<int32_t>{0, 1, 2, 3}));  // 3's step ran while on_token handled it
  DeviceCountingBackend dev2(100);
  o.on_token = nullptr;
  o.sampling.logprobs = true;  // passed on: the device path reports them
  const GenerateResult r2 = generate(dev2, prompt, o);
  EXPECT_EQ(r2.tokens.size(), 9u);  // 1 .. 9 (an eos id)
  EXPECT_EQ(r2.tokens[3].logprob, -0.25f);
  EXPECT_EQ(dev2.begun, 1);
  DeviceCountingBackend dev3(100);
  o.sampling.host = true;
  EXPECT_EQ(generate(dev3, prompt, o).tokens.size(), 9u);
  EXPECT_EQ(dev3.begun, 0);
}
