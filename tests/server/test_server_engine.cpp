// Unit tests of the one-request-at-a-time engine (server/engine.h) on a scripted backend: the device-sampling path
// against the host path, NaN logits, a cancel inside a prompt piece, prompt checkpoints on the backend's grid; and the
// context-length error of job setup.
#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <future>

#include "runtime/prefix_cache.h"
#include "server/api_error.h"
#include "server/engine.h"
#include "server/job_setup.h"
#include "server/metrics.h"
#include "server/served_model.h"

using namespace lily;
using namespace lily::server;

namespace {
// Logits put all mass on (last id + 1) % 16; optionally "samples on the device" (greedy only) the same script.
class ScriptBackend : public Backend {
 public:
  explicit ScriptBackend(bool device) : device_(device) { cfg_.vocab = 16; }
  const Config& config() const override { return cfg_; }
  std::string name() const override { return "script"; }
  int max_context() const override { return 64; }
  int position() const override { return static_cast<int>(fed.size()); }
  void forward(std::span<const int32_t> tokens, float* logits, bool) override {
    fed.insert(fed.end(), tokens.begin(), tokens.end());
    if (!logits) return;
    std::fill(logits, logits + cfg_.vocab, 0.0f);
    logits[(tokens.back() + 1) % cfg_.vocab] = 10.0f;
  }
  StateSnapshot save_state() const override {
    saved.push_back(position());
    return {position(), {}};
  }
  void restore_state(const StateSnapshot& s) override { fed.resize(s.position); }
  int prompt_grid() const override { return grid; }
  void begin_sampling(const SamplingSetup& s, std::span<const int32_t> prompt) override {
    on_device_ = device_ && s.params.temperature <= 0 && ++begun > 0;
    if (!on_device_) Backend::begin_sampling(s, prompt);
  }
  void prefill(std::span<const int32_t> tokens, bool last) override {
    if (!on_device_) return Backend::prefill(tokens, last);
    forward(tokens, nullptr, false);
  }
  SampledToken sample() override {
    if (!on_device_) return Backend::sample();
    next_ = (fed.back() + 1) % cfg_.vocab;
    return {next_, 0.f, {}};
  }
  // a launch consumes the id the previous sample produced, up to two queued
  void decode_launch() override {
    if (!on_device_) return Backend::decode_launch();
    EXPECT_LT(queue_.size(), 2u);
    forward(std::span<const int32_t>(&next_, 1), nullptr, false);
    next_ = (next_ + 1) % cfg_.vocab;
    queue_.push_back(next_);
    max_queued = std::max(max_queued, static_cast<int>(queue_.size()));
  }
  SampledToken decode_wait() override {
    if (!on_device_) return Backend::decode_wait();
    EXPECT_FALSE(queue_.empty());
    const int32_t t = queue_.front();
    queue_.pop_front();
    if (t == nan_id) throw NanLogitsError("script: NaN logits");  // as the CUDA backend reports them
    return {t, 0.f, {}};
  }
  void reset() override {
    fed.clear();
    ++resets;
  }
  // in two halves, `mid` and stop() between them
  bool prefill_stoppable(std::span<const int32_t> tokens, bool last, const std::function<bool()>& stop) override {
    const size_t h = tokens.size() / 2;
    prefill(tokens.first(h), false);
    if (mid) mid();
    if (stop()) return false;
    prefill(tokens.subspan(h), last);
    return true;
  }
  std::vector<int32_t> fed;
  std::function<void()> mid;
  int begun = 0, max_queued = 0, resets = 0;
  int32_t nan_id = -1;  // the device sample that would produce this id has NaN logits instead
  int grid = 1;         // prompt_grid()
  mutable std::vector<int> saved;  // positions of save_state()

 private:
  Config cfg_;
  bool device_;
  bool on_device_ = false;
  int32_t next_ = -1;
  std::deque<int32_t> queue_;
};

struct EngineRun {
  std::vector<int32_t> tokens, fed;
  FinishReason finish = FinishReason::none;
  std::string error_code;
  int begun = 0, max_queued = 0, resets = 0;
};

// One job on a fresh engine: prompt {2, 3}, greedy, stop id 9, on_token ending the generation at `cut`; the
// device sample of id nan_id has NaN logits.
EngineRun run_engine(bool device, bool logprobs, int max_tokens, int32_t cut, int32_t nan_id = -1) {
  ScriptBackend be(device);
  be.nan_id = nan_id;
  Metrics metrics;
  EngineOptions eo;
  eo.prefix_cache = false;
  EngineRun out;
  {
    Engine engine(be, metrics, eo);
    auto job = std::make_shared<GenJob>();
    job->prompt = {2, 3};
    job->sampling.temperature = 0;
    job->logprobs = logprobs;
    job->max_tokens = max_tokens;
    job->stop_ids = {9};
    std::promise<void> done;
    job->on_token = [&](const SampledToken& ev) {
      out.tokens.push_back(ev.token);
      return ev.token != cut;
    };
    job->on_done = [&] { done.set_value(); };
    engine.submit(job);
    done.get_future().wait();
    out.finish = job->finish;
    out.error_code = job->error_code;
    engine.shutdown(Clock::now());
  }
  out.fed = be.fed;
  out.begun = be.begun;
  out.max_queued = be.max_queued;
  out.resets = be.resets;
  return out;
}
}  // namespace

// The engine's device-sampling path against its host path on the same script: the same ids, finish reasons and
// consumed ids (both queue the next id's step before the engine has seen the id, two steps deep, so a stop id is
// consumed, as is an id after which on_token ends the generation: its step ran while on_token handled it).
TEST(ServerEngine, DeviceSamplingPathMatchesHostPath) {
  for (int max_tokens : {3, 20}) {
    const EngineRun h = run_engine(false, false, max_tokens, -1), d = run_engine(true, false, max_tokens, -1);
    EXPECT_EQ(d.tokens, h.tokens);
    EXPECT_EQ(d.finish, h.finish);
    EXPECT_EQ(d.fed, h.fed);
    if (h.finish == FinishReason::stop) EXPECT_EQ(h.fed.back(), 9);  // the stop id's step ran ahead
    EXPECT_EQ(d.begun, 1);
    EXPECT_EQ(d.max_queued, 2);
  }
  EXPECT_EQ(run_engine(false, false, 20, -1).tokens, (std::vector<int32_t>{4, 5, 6, 7, 8}));  // 9 is the stop id
  EXPECT_EQ(run_engine(false, false, 20, -1).finish, FinishReason::stop);
  const EngineRun h = run_engine(false, false, 20, 6), d = run_engine(true, false, 20, 6);
  EXPECT_EQ(d.tokens, h.tokens);
  EXPECT_EQ(h.fed, (std::vector<int32_t>{2, 3, 4, 5, 6}));
  EXPECT_EQ(d.fed, h.fed);
  EXPECT_EQ(run_engine(true, true, 20, -1).begun, 1);  // logprobs: the device path reports them
}

// NaN logits on the device path (docs/api.md §10.1): a sample the request uses fails it with nan_logits and resets
// the backend; the look-ahead sample after the last id kept (the stop id's step, or the step of the id at which
// on_token ends the generation) is thrown away, so a NaN there ends the request as it would have ended, with the
// same ids, but the state after that step is not kept (reset).
TEST(ServerEngine, NanLogitsOnTheDevicePath) {
  const EngineRun clean = run_engine(true, false, 20, -1);
  EXPECT_EQ(clean.tokens, (std::vector<int32_t>{4, 5, 6, 7, 8}));
  EXPECT_EQ(clean.finish, FinishReason::stop);
  const int clean_resets = clean.resets;

  const EngineRun used = run_engine(true, false, 20, -1, 6);  // the sample giving id 6 is NaN
  EXPECT_EQ(used.finish, FinishReason::error);
  EXPECT_EQ(used.error_code, "nan_logits");
  EXPECT_EQ(used.tokens, (std::vector<int32_t>{4, 5}));
  EXPECT_GT(used.resets, clean_resets);
  EXPECT_TRUE(used.fed.empty());

  const EngineRun after_stop = run_engine(true, false, 20, -1, 10);  // the stop id 9's step samples NaN
  EXPECT_EQ(after_stop.tokens, clean.tokens);
  EXPECT_EQ(after_stop.finish, FinishReason::stop);
  EXPECT_TRUE(after_stop.error_code.empty());
  EXPECT_GT(after_stop.resets, clean_resets);
  EXPECT_TRUE(after_stop.fed.empty());  // the poisoned state was dropped

  const EngineRun cut_clean = run_engine(true, false, 20, 6);
  const EngineRun after_cut = run_engine(true, false, 20, 6, 7);  // on_token ends at 6; 6's step samples NaN
  EXPECT_EQ(after_cut.tokens, cut_clean.tokens);
  EXPECT_EQ(after_cut.finish, cut_clean.finish);
  EXPECT_TRUE(after_cut.error_code.empty());
  EXPECT_GT(after_cut.resets, cut_clean.resets);
  EXPECT_TRUE(after_cut.fed.empty());
  EXPECT_EQ(cut_clean.fed, (std::vector<int32_t>{2, 3, 4, 5, 6}));
}

// A request cancelled while its prompt piece is processed (docs/api.md: a dropped client stops its request): the
// backend stops inside the piece, the request ends cancelled with no ids, and the half-consumed state is reset.
TEST(ServerEngine, CancelInsideAPromptPiece) {
  ScriptBackend be(false);
  Metrics metrics;
  EngineOptions eo;
  eo.prefix_cache = false;
  Engine engine(be, metrics, eo);
  auto job = std::make_shared<GenJob>();
  job->prompt = {2, 3, 4, 5, 6, 7};
  job->sampling.temperature = 0;
  job->max_tokens = 5;
  std::vector<int32_t> ids;
  job->on_token = [&](const SampledToken& ev) { return ids.push_back(ev.token), true; };
  std::promise<void> done;
  job->on_done = [&] { done.set_value(); };
  be.mid = [&] { job->cancel.store(true); };
  const int resets = be.resets;
  engine.submit(job);
  done.get_future().wait();
  engine.shutdown(Clock::now());  // (joins the engine thread: the reset after on_done has happened)
  EXPECT_EQ(job->finish, FinishReason::cancelled);
  EXPECT_TRUE(ids.empty());
  EXPECT_GT(be.resets, resets);
  EXPECT_TRUE(be.fed.empty());  // the half piece was dropped, not kept as the resident prefix
}

// The prompt checkpoints of a backend with a prompt grid (docs/batching.md: the CUDA chunked GDN's 64) move down
// to it: a turn checkpoint at 30 and the interval's at 20 become snapshots at 24 and 16 (grid 8).
TEST(ServerEngine, PromptCheckpointsKeepToTheBackendsGrid) {
  for (int grid : {1, 8}) {
    ScriptBackend be(false);
    be.grid = grid;
    Metrics metrics;
    EngineOptions eo;
    eo.checkpoint_interval = 20;
    Engine engine(be, metrics, eo);
    auto job = std::make_shared<GenJob>();
    for (int i = 0; i < 40; ++i) job->prompt.push_back(i % 16);
    job->checkpoints = {30};
    job->sampling.temperature = 0;
    job->max_tokens = 2;
    job->on_token = [](const SampledToken&) { return true; };
    std::promise<void> done;
    job->on_done = [&] { done.set_value(); };
    engine.submit(job);
    done.get_future().wait();
    engine.shutdown(Clock::now());
    const std::vector<int> want = grid == 1 ? std::vector<int>{20, 30} : std::vector<int>{16, 24};
    ASSERT_GE(be.saved.size(), 2u);
    EXPECT_EQ(std::vector<int>(be.saved.begin(), be.saved.begin() + 2), want) << "grid " << grid;
  }
}

// The context-length error names the field the prompt came from: "prompt" for /v1/completions.
TEST(ServerJobSetup, ContextErrorNamesTheRequestField) {
  ServedModel m;
  m.backend = std::make_unique<ScriptBackend>(false);  // 64 tokens of context
  EXPECT_NO_THROW(check_context(m, 63, "prompt"));
  for (const char* field : {"prompt", "messages"}) {
    try {
      check_context(m, 64, field);
      ADD_FAILURE() << "no error";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.type, "exceed_context_size_error");
      EXPECT_EQ(e.param, field);
      EXPECT_EQ(e.extra["n_prompt_tokens"], 64);
      EXPECT_EQ(e.extra["n_ctx"], 64);
      EXPECT_NE(std::string(e.what()).find(std::string("'") + field + "'"), std::string::npos) << e.what();
    }
  }
}
