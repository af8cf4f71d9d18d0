// Unit tests of the server pieces that need no model: request validation (every field's type and range, with
// `param` naming it), body checks (UTF-8, nesting), stop-string hold-back, the prefix-cache LRU, metrics text.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>

#include "server/api_error.h"
#include "server/engine.h"
#include "server/metrics.h"
#include "server/prefix_cache.h"
#include "server/request.h"
#include "server/served_model.h"
#include "server/stop_strings.h"

using namespace lily;
using namespace lily::server;

namespace {

const RequestLimits kLimits{1000};

ojson chat_body(const std::string& extra = "") {
  std::string s = R"({"model":"m","messages":[{"role":"user","content":"hi"}])" + extra + "}";
  return parse_body(s, kLimits);
}

// Expects an ApiError with this status and param (and code when given).
void expect_error(const std::function<void()>& f, int status, const std::string& param, const std::string& code = "") {
  try {
    f();
    FAIL() << "no error; expected param '" << param << "'";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, status) << e.what();
    EXPECT_EQ(e.param, param) << e.what();
    if (!code.empty()) EXPECT_EQ(e.code, code) << e.what();
    auto j = e.to_json();
    EXPECT_TRUE(j["error"].contains("message"));
    EXPECT_TRUE(j["error"].contains("type"));
  }
}

}  // namespace

TEST(ServerRequest, BodyRejectsBadJsonAndNonObjects) {
  for (std::string b : {"{{{", "[]", "42", "null", "\"x\"", "", "{\"a\":1", "{\"a\":01}"})
    expect_error([&] { parse_body(b, kLimits); }, 400, "", "invalid_json");
}

TEST(ServerRequest, BodyRejectsInvalidUtf8) {
  for (std::string b : {std::string("{\"a\":\"\xff\xfe\"}"), std::string("{\"a\":\"\xf0\x9f\x8e\"}"),
                        std::string("{\"a\":\"\xc0\xaf\"}"), std::string("{\"a\":\"\xed\xa0\x80\"}"),
                        std::string("{\"a\":\"\\ud800\"}")})
    expect_error([&] { parse_body(b, kLimits); }, 400, "", "invalid_utf8");
  EXPECT_NO_THROW(parse_body("{\"a\":\"\xf0\x9f\x8e\x89 \\ud83c\\udf89\"}", kLimits));
}

TEST(ServerRequest, BodyBoundsNesting) {
  std::string deep(100000, '[');
  expect_error([&] { parse_body(deep, kLimits); }, 400, "", "invalid_json");
  // brackets inside strings do not count
  std::string ok = "{\"a\":\"" + std::string(1000, '[') + "\"}";
  EXPECT_NO_THROW(parse_body(ok, kLimits));
}

TEST(ServerRequest, ValidChatRequestParses) {
  auto r = parse_chat_request(chat_body(R"(,"temperature":0.5,"top_p":0.9,"top_k":7,"min_p":0.1,
      "presence_penalty":-1,"frequency_penalty":2,"repetition_penalty":1.1,"seed":42,"stop":["a","bb"],
      "stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":3,
      "logit_bias":{"5":-100,"7":3.5},"max_tokens":9,"max_completion_tokens":11,"metadata":{"x":1},
      "store":false,"service_tier":"auto","user":"u","reasoning_effort":"none","unknown_field":[1,2])"),
                                kLimits);
  EXPECT_FLOAT_EQ(*r.sampling.temperature, 0.5f);
  EXPECT_EQ(*r.sampling.top_k, 7);
  EXPECT_EQ(*r.sampling.seed, 42u);
  EXPECT_EQ(r.stop.size(), 2u);
  EXPECT_TRUE(r.stream && r.include_usage && r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_EQ(r.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(*r.max_tokens, 11);  // max_completion_tokens wins
  EXPECT_EQ(r.chat_template_kwargs["enable_thinking"], false);  // reasoning_effort none
}

TEST(ServerRequest, EveryFieldIsTypeAndRangeChecked) {
  struct Case {
    std::string extra, param;
  };
  std::vector<Case> cases = {
      {R"(,"temperature":"hot")", "temperature"},     {R"(,"temperature":2.5)", "temperature"},
      {R"(,"temperature":-0.1)", "temperature"},      {R"(,"top_p":0)", "top_p"},
      {R"(,"top_p":1.5)", "top_p"},                   {R"(,"top_k":-2)", "top_k"},
      {R"(,"top_k":1001)", "top_k"},                  {R"(,"top_k":1.5)", "top_k"},
      {R"(,"min_p":2)", "min_p"},                     {R"(,"presence_penalty":3)", "presence_penalty"},
      {R"(,"frequency_penalty":-3)", "frequency_penalty"}, {R"(,"repetition_penalty":0)", "repetition_penalty"},
      {R"(,"repetition_penalty":11)", "repetition_penalty"}, {R"(,"seed":"x")", "seed"},
      {R"(,"max_tokens":0)", "max_tokens"},           {R"(,"max_tokens":-5)", "max_tokens"},
      {R"(,"max_tokens":"9")", "max_tokens"},         {R"(,"max_completion_tokens":1e20)", "max_completion_tokens"},
      {R"(,"n":2)", "n"},                             {R"(,"n":0)", "n"},
      {R"(,"stop":5)", "stop"},                       {R"(,"stop":[""])", "stop"},
      {R"(,"stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"])", "stop"},
      {R"(,"stream":"yes")", "stream"},               {R"(,"stream_options":3)", "stream_options"},
      {R"(,"logprobs":1)", "logprobs"},               {R"(,"top_logprobs":21)", "top_logprobs"},
      {R"(,"top_logprobs":-1)", "top_logprobs"},      {R"(,"logit_bias":{"1000":1})", "logit_bias"},
      {R"(,"logit_bias":{"-1":1})", "logit_bias"},    {R"(,"logit_bias":{"x":1})", "logit_bias"},
      {R"(,"logit_bias":{"3":101})", "logit_bias"},   {R"(,"logit_bias":[1])", "logit_bias"},
      {R"(,"tools":{})", "tools"},                    {R"(,"tools":[{"type":"retrieval"}])", "tools[0].type"},
      {R"(,"tools":[{"type":"function","function":{"name":"f","parameters":"x"}}])", "tools[0].function.parameters"},
      {R"(,"tools":[{"type":"function","function":{"name":""}}])", "tools[0].function.name"},
      {R"(,"tool_choice":"sometimes")", "tool_choice"}, {R"(,"tool_choice":"required")", "tool_choice"},
      {R"(,"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"integer","multipleOf":2}}})",
       "response_format.json_schema.schema"},
      {R"(,"response_format":{"type":"yaml"})", "response_format"},
      {R"(,"chat_template_kwargs":[])", "chat_template_kwargs"},
      {R"(,"chat_template_kwargs":{"enable_thinking":"no"})", "chat_template_kwargs.enable_thinking"},
      {R"(,"reasoning_effort":1)", "reasoning_effort"}, {R"(,"model":5)", "model"},
      {R"(,"parallel_tool_calls":"x")", "parallel_tool_calls"}, {R"(,"include_reasoning":0)", "include_reasoning"},
      {R"(,"reasoning_budget":100)", "reasoning_budget"},  // not implemented: rejected, never ignored
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.extra);
    expect_error([&] { parse_chat_request(chat_body(c.extra), kLimits); }, 400, c.param);
  }
}

TEST(ServerRequest, MessagesAreValidated) {
  struct Case {
    std::string messages, param;
  };
  std::vector<Case> cases = {
      {R"("x")", "messages"},
      {R"([])", "messages"},
      {R"([123])", "messages[0]"},
      {R"([{}])", "messages[0].role"},
      {R"([{"role":123,"content":"a"}])", "messages[0].role"},
      {R"([{"role":"wizard","content":"a"}])", "messages[0].role"},
      {R"([{"role":"function","content":"a"}])", "messages[0].role"},
      {R"([{"role":"user","content":123}])", "messages[0].content"},
      {R"([{"role":"user"}])", "messages[0].content"},
      {R"([{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}])", "messages[0].content[0].type"},
      {R"([{"role":"user","content":[{"type":"text"}]}])", "messages[0].content[0].text"},
      {R"([{"role":"user","content":"a"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{bad"}}]}])",
       "messages[1].tool_calls[0].function.arguments"},
      {R"([{"role":"user","content":"a"},{"role":"assistant","content":"x","reasoning_content":5}])",
       "messages[1].reasoning_content"},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.messages);
    auto body = parse_body(R"({"model":"m","messages":)" + c.messages + "}", kLimits);
    expect_error([&] { parse_chat_request(body, kLimits); }, 400, c.param);
  }
  auto ok = parse_body(R"({"messages":[{"role":"developer","content":[{"type":"text","text":"a"}]},
      {"role":"user","content":"b"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",
      "function":{"name":"f","arguments":"{\"x\": 1}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}]})",
                       kLimits);
  EXPECT_NO_THROW(parse_chat_request(ok, kLimits));
}

TEST(ServerRequest, CompletionPrompts) {
  auto r = parse_completion_request(parse_body(R"({"prompt":[1,2,3],"logprobs":2,"echo":true})", kLimits), kLimits);
  EXPECT_TRUE(r.prompt_is_tokens);
  EXPECT_EQ(r.prompt_tokens.size(), 3u);
  EXPECT_EQ(r.logprobs, 2);
  r = parse_completion_request(parse_body(R"({"prompt":["hello"]})", kLimits), kLimits);
  EXPECT_EQ(r.prompt_text, "hello");
  for (std::string b : {R"({"prompt":[-1]})", R"({"prompt":[1000]})", R"({"prompt":[]})", R"({"prompt":""})",
                        R"({"prompt":["a","b"]})", R"({"prompt":5})", R"({})"})
    expect_error([&] { parse_completion_request(parse_body(b, kLimits), kLimits); }, 400, "prompt");
  expect_error([&] { parse_completion_request(parse_body(R"({"prompt":"a","logprobs":6})", kLimits), kLimits); },
               400, "logprobs");
  expect_error([&] { parse_completion_request(parse_body(R"({"prompt":"a","suffix":"z"})", kLimits), kLimits); },
               400, "suffix");
  expect_error([&] { parse_completion_request(parse_body(R"({"prompt":"a","best_of":3})", kLimits), kLimits); },
               400, "best_of");
}

// Random JSON-ish bodies never escape as anything but ApiError.
TEST(ServerRequest, FuzzedBodiesOnlyRaiseApiErrors) {
  std::mt19937 rng(1234);
  const std::string alphabet = "{}[]\":,0123456789.-eE truefalsnl\\u" "\xff\xc3\xa9" "abc";
  const std::string base = R"({"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":1,"stop":["x"]})";
  for (int it = 0; it < 3000; ++it) {
    std::string b = base;
    int edits = 1 + int(rng() % 6);
    for (int e = 0; e < edits; ++e) {
      size_t pos = rng() % (b.size() + 1);
      int op = int(rng() % 3);
      char c = alphabet[rng() % alphabet.size()];
      if (op == 0) b.insert(b.begin() + long(pos), c);
      else if (op == 1 && pos < b.size()) b.erase(pos, 1);
      else if (pos < b.size()) b[pos] = c;
    }
    try {
      auto j = parse_body(b, kLimits);
      parse_chat_request(j, kLimits);
    } catch (const ApiError& e) {
      EXPECT_GE(e.status, 400);
      EXPECT_LT(e.status, 500);
    }
  }
}

TEST(ServerStop, HoldsBackPartialMatches) {
  StopMatcher m({"STOP", "xy"});
  std::string out;
  out += m.push("abc ST");
  EXPECT_EQ(out, "abc ");  // "ST" could start STOP
  out += m.push("O");
  EXPECT_EQ(out, "abc ");
  out += m.push("P and more");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(out, "abc ");
  EXPECT_EQ(m.push("later"), "");

  StopMatcher n({"STOP"});
  std::string o = n.push("S");
  o += n.push("TO? no: STO");
  o += n.push("X");
  o += n.flush();
  EXPECT_FALSE(n.matched());
  EXPECT_EQ(o, "STO? no: STOX");
}

TEST(ServerStop, EverySplitGivesTheSameResult) {
  const std::string text = "hello wor<|ld|> and </stop> tail";
  for (size_t a = 0; a <= text.size(); ++a)
    for (size_t b = a; b <= text.size(); ++b) {
      StopMatcher m({"</stop>", "<|ld|> and !"});
      std::string out = m.push(text.substr(0, a));
      out += m.push(text.substr(a, b - a));
      out += m.push(text.substr(b));
      out += m.flush();
      ASSERT_TRUE(m.matched()) << a << " " << b;
      ASSERT_EQ(out, "hello wor<|ld|> and ") << a << " " << b;
    }
}

TEST(ServerPrefixCache, LongestPrefixWithinLimitAndLru) {
  auto snap = [](int pos, size_t bytes) {
    StateSnapshot s;
    s.position = pos;
    s.bytes.assign(bytes, uint8_t(pos));
    return s;
  };
  std::vector<int32_t> p = {5, 9, 2, 7, 7, 1, 3, 8, 4, 6};
  PrefixCache c(100000);
  c.insert(std::span(p.data(), 3), snap(3, 1000));
  c.insert(std::span(p.data(), 6), snap(6, 1000));
  std::vector<int32_t> other = {5, 9, 2, 0, 0, 0, 0, 0};
  c.insert(std::span(other.data(), 8), snap(8, 1000));
  EXPECT_EQ(c.count(), 3u);
  const StateSnapshot* s = c.lookup(p, 9);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->position, 6);
  s = c.lookup(p, 5);  // limited: the 6-token snapshot is past the usable prefix
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->position, 3);
  std::vector<int32_t> q = {5, 9, 3};
  EXPECT_EQ(c.lookup(q, 3), nullptr);
  // Same prefix replaces; byte cap evicts the least recently used.
  c.insert(std::span(p.data(), 6), snap(6, 1000));
  EXPECT_EQ(c.count(), 3u);
  PrefixCache small(2 * (1000 + sizeof(int32_t) * 8) + 400);
  small.insert(std::span(p.data(), 3), snap(3, 1000));
  small.insert(std::span(p.data(), 6), snap(6, 1000));
  ASSERT_NE(small.lookup(p, 3), nullptr);  // touch the 3-token entry
  small.insert(std::span(other.data(), 8), snap(8, 1000));
  EXPECT_LE(small.bytes(), small.max_bytes());
  EXPECT_EQ(small.count(), 2u);
  ASSERT_NE(small.lookup(p, 9), nullptr);
  EXPECT_EQ(small.lookup(p, 9)->position, 3);  // the 6-token entry was evicted
  PrefixCache tiny(10);
  tiny.insert(std::span(p.data(), 3), snap(3, 1000));  // larger than the pool: dropped
  EXPECT_EQ(tiny.count(), 0u);
}

TEST(ServerMetrics, PrometheusText) {
  Metrics m;
  m.request_done(200);
  m.request_done(200);
  m.request_done(429);
  m.add_prompt_tokens(100, 60);
  m.observe_ttft(0.02);
  m.observe_ttft(7);
  m.set_queue(3, 1);
  std::string t = m.render();
  EXPECT_NE(t.find("lily_requests_total{status=\"200\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lily_requests_total{status=\"429\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("lily_prompt_tokens_cached_total 60\n"), std::string::npos);
  EXPECT_NE(t.find("lily_requests_queued 3\n"), std::string::npos);
  EXPECT_NE(t.find("lily_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("lily_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("lily_time_to_first_token_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE lily_inter_token_latency_seconds histogram"), std::string::npos);
}

TEST(ServerModelLookup, FindsTheNewestCachedSnapshotOfAKnownRepo) {
  namespace fs = std::filesystem;
  fs::path hf = fs::path(LILY_BINARY_DIR) / ("test-hf-home-" + std::to_string(getpid()));
  fs::remove_all(hf);
  fs::path snaps = hf / "hub" / "models--mlx-community--Qwen3.6-35B-A3B-4bit" / "snapshots";
  fs::create_directories(snaps / "aaa");
  fs::create_directories(snaps / "bbb");
  std::ofstream(snaps / "bbb" / "config.json") << "{}";  // only bbb is a complete snapshot
  fs::create_directories(hf / "hub" / "models--someone--Other" / "snapshots" / "ccc");
  const char* old_home = std::getenv("HF_HOME");
  std::string saved = old_home ? old_home : "";
  unsetenv("HF_HUB_CACHE");
  setenv("HF_HOME", hf.c_str(), 1);
  auto found = find_cached_model();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(fs::path(*found).filename(), "bbb");
  fs::remove_all(snaps / "bbb");
  EXPECT_FALSE(find_cached_model().has_value());
  EXPECT_NE(how_to_get_model().find("--demo"), std::string::npos);
  if (old_home) setenv("HF_HOME", saved.c_str(), 1);
  else unsetenv("HF_HOME");
  fs::remove_all(hf);
}

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
  StateSnapshot save_state() const override { return {position(), {}}; }
  void restore_state(const StateSnapshot& s) override { fed.resize(s.position); }
  bool begin_device_sampling(const SamplingParams& p, std::span<const int32_t>, bool) override {
    return device_ && p.temperature <= 0 && ++begun > 0;
  }
  SampleResult sample_device() override {
    next_ = (fed.back() + 1) % cfg_.vocab;
    return {next_, 0.f, {}};
  }
  // a launch consumes the id the previous sample produced, up to two queued
  void decode_device_launch() override {
    EXPECT_LT(queue_.size(), 2u);
    forward(std::span<const int32_t>(&next_, 1), nullptr, false);
    next_ = (next_ + 1) % cfg_.vocab;
    queue_.push_back(next_);
    max_queued = std::max(max_queued, static_cast<int>(queue_.size()));
  }
  SampleResult decode_device_wait() override {
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
  std::vector<int32_t> fed;
  int begun = 0, max_queued = 0, resets = 0;
  int32_t nan_id = -1;  // the device sample that would produce this id has NaN logits instead

 private:
  Config cfg_;
  bool device_;
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
    job->on_token = [&](const TokenEvent& ev) {
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

// The engine's device-sampling path against its host path on the same script: the same ids and finish
// reasons; the last id is not consumed, except that the device path queues the next id's step before the engine
// has seen the id (two steps queued), so a stop id is consumed, as is an id after which on_token ends the
// generation (its step ran while on_token handled it).
TEST(ServerEngine, DeviceSamplingPathMatchesHostPath) {
  for (int max_tokens : {3, 20}) {
    const EngineRun h = run_engine(false, false, max_tokens, -1), d = run_engine(true, false, max_tokens, -1);
    EXPECT_EQ(d.tokens, h.tokens);
    EXPECT_EQ(d.finish, h.finish);
    std::vector<int32_t> fed = h.fed;
    if (h.finish == FinishReason::stop) fed.push_back(9);  // the stop id's step ran ahead
    EXPECT_EQ(d.fed, fed);
    EXPECT_EQ(d.begun, 1);
    EXPECT_EQ(d.max_queued, 2);
  }
  EXPECT_EQ(run_engine(false, false, 20, -1).tokens, (std::vector<int32_t>{4, 5, 6, 7, 8}));  // 9 is the stop id
  EXPECT_EQ(run_engine(false, false, 20, -1).finish, FinishReason::stop);
  const EngineRun h = run_engine(false, false, 20, 6), d = run_engine(true, false, 20, 6);
  EXPECT_EQ(d.tokens, h.tokens);
  EXPECT_EQ(h.fed, (std::vector<int32_t>{2, 3, 4, 5}));
  EXPECT_EQ(d.fed, (std::vector<int32_t>{2, 3, 4, 5, 6}));
  EXPECT_EQ(run_engine(true, true, 20, -1).begun, 1);  // logprobs: the device path reports them
}

// NaN logits on the device path (api.md §4 row 11): a sample the request uses fails it with nan_logits and resets
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
