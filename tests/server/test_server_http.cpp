// End-to-end tests of `lily serve` over HTTP on loopback: response shapes, exact SSE framing, usage, seeds,
// stream == non-stream, the error table (docs/api.md §7, §10.1), context boundaries, concurrency and the queue,
// client disconnects, SIGTERM drain, auth, and the prefix cache on a second chat turn.

#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>

#include <gtest/gtest.h>

#include "server_harness.h"

using namespace lily::test;

namespace {

constexpr int kCtx = 1024;
// The stop ids of the demo model (served_model.cpp: <|endoftext|>, <|im_end|>, <|fim_pad|>, <|repo_name|>,
// <|file_sep|> of the Qwen3 tokenizer), suppressed where a test needs an exact token count: with only the
// first two, a sampled 150-token stream ended in "stop" now and then (SigtermDrainsInFlightStreamAndExitsZero).
const ojson kNoEos = {{"151643", -100}, {"151645", -100}, {"151662", -100}, {"151663", -100}, {"151664", -100}};

class ServerHttp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    srv_ = new ServerProcess({"--ctx", std::to_string(kCtx), "--queue", "16", "--max-body", "65536"});
  }
  static void TearDownTestSuite() {
    delete srv_;
    srv_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(srv_->ok()) << srv_->error(); }
  static ServerProcess* srv_;
};
ServerProcess* ServerHttp::srv_ = nullptr;

ojson chat(const std::string& user, int max_tokens, uint64_t seed, double temperature = 0.8) {
  return {{"model", "m"},
          {"messages", ojson::array({{{"role", "user"}, {"content", user}}})},
          {"max_tokens", max_tokens},
          {"seed", seed},
          {"temperature", temperature}};
}

std::string message_text(const ojson& r) {
  const ojson& m = r["choices"][0]["message"];
  std::string s;
  if (m.contains("reasoning_content")) s += m["reasoning_content"].get<std::string>();
  s += "|";
  if (m["content"].is_string()) s += m["content"].get<std::string>();
  return s;
}

std::string stream_text(const std::vector<ojson>& events) {
  std::string reasoning, content;
  for (const auto& e : events) {
    if (e["choices"].empty()) continue;
    const ojson& d = e["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
  }
  return reasoning + "|" + content;
}

}  // namespace

TEST_F(ServerHttp, HealthModelsMetrics) {
  auto c = srv_->client();
  auto h = c.get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c.get("/v1/models");
  ASSERT_TRUE(m);
  auto j = ojson::parse(m->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["max_model_len"], kCtx);
  EXPECT_EQ(j["data"][0]["meta"]["n_vocab"], 151669);
  std::string id = j["data"][0]["id"];
  auto one = c.get(("/v1/models/" + id).c_str());
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  std::string encoded;  // as a client that percent-encodes the id sends it
  for (char ch : id) encoded += ch == '-' ? std::string("%2D") : std::string(1, ch);
  auto enc = c.get("/v1/models/" + encoded);
  ASSERT_TRUE(enc);
  EXPECT_EQ(enc->status, 200) << enc->body;
  auto none = c.get("/v1/models/nope");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 404);
  auto met = c.get("/metrics");
  ASSERT_TRUE(met);
  EXPECT_NE(met->body.find("# TYPE lily_time_to_first_token_seconds histogram"), std::string::npos);
  EXPECT_NE(met->body.find("lily_requests_queued"), std::string::npos);
}

TEST_F(ServerHttp, ChatNonStreamingShapeAndUsage) {
  int st = 0;
  ojson r = post_json(*srv_, "/v1/chat/completions", chat("Hello there", 12, 5), &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_TRUE(r["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  const ojson& ch = r["choices"][0];
  EXPECT_EQ(ch["message"]["role"], "assistant");
  EXPECT_TRUE(ch["finish_reason"] == "length" || ch["finish_reason"] == "stop");
  const ojson& u = r["usage"];
  EXPECT_GT(u["prompt_tokens"].get<int>(), 5);
  EXPECT_LE(u["completion_tokens"].get<int>(), 12);
  EXPECT_EQ(u["total_tokens"], u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
  EXPECT_TRUE(u["prompt_tokens_details"].contains("cached_tokens"));
  EXPECT_TRUE(u["completion_tokens_details"].contains("reasoning_tokens"));
  // thinking is on by default: the prompt ends in <think>, so the output is reasoning (both field names)
  if (ch["message"].contains("reasoning_content"))
    EXPECT_EQ(ch["message"]["reasoning_content"], ch["message"]["reasoning"]);
}

TEST_F(ServerHttp, StreamingFramingUsageAndEqualityWithNonStreaming) {
  ojson body = chat("Tell me a story", 16, 77);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  int st = 0;
  std::string raw = post_stream(*srv_, "/v1/chat/completions", body, &st);
  ASSERT_EQ(st, 200) << raw;
  std::vector<ojson> ev;
  bool done = false;
  std::string why;
  ASSERT_TRUE(parse_sse(raw, ev, done, why)) << why << "\n" << raw;
  ASSERT_TRUE(done);
  ASSERT_TRUE(raw.size() >= 14 && raw.compare(raw.size() - 14, 14, "data: [DONE]\n\n") == 0);
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(ev[0]["choices"][0]["delta"]["content"].is_null());
  for (size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i]["id"], ev[0]["id"]);
    EXPECT_EQ(ev[i]["object"], "chat.completion.chunk");
    if (i + 1 < ev.size()) {
      EXPECT_TRUE(ev[i]["usage"].is_null()) << i;
      if (i > 0) EXPECT_FALSE(ev[i]["choices"][0]["delta"].contains("role"));
    }
  }
  const ojson& fin = ev[ev.size() - 2];
  EXPECT_TRUE(fin["choices"][0]["delta"].empty());
  EXPECT_FALSE(fin["choices"][0]["finish_reason"].is_null());
  const ojson& last = ev.back();
  EXPECT_TRUE(last["choices"].is_array() && last["choices"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"].get<int>() > 0, true);

  body.erase("stream");
  body.erase("stream_options");
  ojson r = post_json(*srv_, "/v1/chat/completions", body, &st);
  ASSERT_EQ(st, 200);
  EXPECT_EQ(stream_text(ev), message_text(r));
  EXPECT_EQ(r["usage"]["completion_tokens"], last["usage"]["completion_tokens"]);
}

TEST_F(ServerHttp, SameSeedSameTextAtPositiveTemperature) {
  int st = 0;
  ojson a = post_json(*srv_, "/v1/chat/completions", chat("Seeds", 16, 4242, 1.0), &st);
  ASSERT_EQ(st, 200);
  post_json(*srv_, "/v1/chat/completions", chat("Something else in between", 4, 1), &st);
  ojson b = post_json(*srv_, "/v1/chat/completions", chat("Seeds", 16, 4242, 1.0), &st);
  ASSERT_EQ(st, 200);
  ojson c = post_json(*srv_, "/v1/chat/completions", chat("Seeds", 16, 4243, 1.0), &st);
  ASSERT_EQ(st, 200);
  EXPECT_EQ(message_text(a), message_text(b));
  EXPECT_NE(message_text(a), message_text(c));  // 16 draws over 151k ids: equal only by a broken seed
}

TEST_F(ServerHttp, ErrorTable) {
  struct Case {
    std::string body;
    int status;
    std::string type, param, code;
  };
  const std::string ok_msgs = R"("messages":[{"role":"user","content":"hi"}])";
  std::vector<Case> cases = {
      {"{{{", 400, "invalid_request_error", "", "invalid_json"},
      {"[]", 400, "invalid_request_error", "", "invalid_json"},
      {"42", 400, "invalid_request_error", "", "invalid_json"},
      {"null", 400, "invalid_request_error", "", "invalid_json"},
      {std::string("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}"), 400,
       "invalid_request_error", "", "invalid_utf8"},
      {R"({"model":"m","messages":[{"role":"user","content":"\ud800"}]})", 400, "invalid_request_error", "", "invalid_utf8"},
      {R"({"model":"m","messages":"x"})", 400, "invalid_request_error", "messages", ""},
      {R"({"model":"m","messages":[123]})", 400, "invalid_request_error", "messages[0]", ""},
      {R"({"model":"m","messages":[{}]})", 400, "invalid_request_error", "messages[0].role", ""},
      {R"({"model":"m","messages":[{"role":123,"content":"a"}]})", 400, "invalid_request_error", "messages[0].role", ""},
      {R"({"model":"m","messages":[{"role":"user","content":123}]})", 400, "invalid_request_error", "messages[0].content", ""},
      {R"({"model":"m","messages":[{"role":"wizard","content":"a"}]})", 400, "invalid_request_error", "messages[0].role", ""},
      {R"({"model":"m",)" + ok_msgs + R"(,"temperature":"hot"})", 400, "invalid_request_error", "temperature", ""},
      {R"({"model":"m",)" + ok_msgs + R"(,"n":17})", 400, "invalid_request_error", "n", ""},
      {R"({"model":"m",)" + ok_msgs + R"(,"top_logprobs":50})", 400, "invalid_request_error", "top_logprobs", ""},
      {R"({"model":"m",)" + ok_msgs + R"(,"max_tokens":-1})", 400, "invalid_request_error", "max_tokens", ""},
      {R"({"model":"m",)" + ok_msgs + R"(,"logit_bias":{"999999":1}})", 400, "invalid_request_error", "logit_bias", ""},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", 400,
       "not_supported_error", "messages[0].content[0].type", ""},
      {R"({"model":"m","messages":[{"role":"assistant","content":"only an assistant"}]})", 400, "invalid_request_error",
       "messages", "template_error"},
      {R"({"model":"m","messages":[{"role":"user","content":"a"},{"role":"system","content":"late"}]})", 400,
       "invalid_request_error", "messages", "template_error"},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.body.substr(0, 120));
    auto r = srv_->client().post("/v1/chat/completions", c.body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, c.status) << r->body;
    auto j = ojson::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    ASSERT_TRUE(j.contains("error")) << r->body;
    EXPECT_EQ(j["error"]["type"], c.type) << r->body;
    if (!c.param.empty()) EXPECT_EQ(j["error"]["param"], c.param) << r->body;
    if (!c.code.empty()) EXPECT_EQ(j["error"]["code"], c.code) << r->body;
  }
  // unknown fields are ignored
  int st = 0;
  ojson body = chat("hi", 2, 1);
  body["metadata"] = {{"a", 1}};
  body["store"] = true;
  body["some_future_field"] = ojson::array({1, 2});
  post_json(*srv_, "/v1/chat/completions", body, &st);
  EXPECT_EQ(st, 200);
  auto nf = srv_->client().get("/v1/nothing-here");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_NE(nf->body.find("not_found_error"), std::string::npos);
  EXPECT_EQ(srv_->client().get("/health")->status, 200);
}

TEST_F(ServerHttp, OversizeBodyIs413AndServerStaysHealthy) {
  std::string big = R"({"model":"m","messages":[{"role":"user","content":")" + std::string(70000, 'a') + "\"}]}";
  auto r = srv_->client().post("/v1/chat/completions", big, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_NE(r->body.find("body_too_large"), std::string::npos) << r->body;
  EXPECT_EQ(srv_->client().get("/health")->status, 200);
}

TEST_F(ServerHttp, ContextBoundariesAndMaxTokensClamp) {
  std::vector<int> toks(kCtx, 0);
  for (int i = 0; i < kCtx; ++i) toks[i] = 1000 + (i * 37) % 5000;
  int st = 0;
  // prompt == n_ctx: rejected before any SSE byte, also in stream mode
  ojson body = {{"prompt", toks}, {"max_tokens", 1}, {"stream", true}};
  ojson r = post_json(*srv_, "/v1/completions", body, &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(r["error"]["type"], "exceed_context_size_error") << r.dump();
  EXPECT_EQ(r["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(r["error"]["n_ctx"], kCtx);
  EXPECT_EQ(r["error"]["n_prompt_tokens"], kCtx);
  // prompt == n_ctx - 1 with one output token is allowed
  toks.pop_back();
  r = post_json(*srv_, "/v1/completions", {{"prompt", toks}, {"max_tokens", 1}, {"logit_bias", kNoEos}}, &st);
  EXPECT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["usage"]["completion_tokens"], 1);
  // max_tokens beyond the remaining context: clamped, ends with length after exactly n_ctx - P tokens
  const int P = kCtx - 40;
  toks.resize(P);
  r = post_json(*srv_, "/v1/completions",
                {{"prompt", toks}, {"max_tokens", kCtx - P + 1}, {"logit_bias", kNoEos}, {"temperature", 0}}, &st);
  EXPECT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], kCtx - P);
  // a chat prompt over the context
  std::string huge;
  for (int i = 0; i < 1500; ++i) huge += " word" + std::to_string(i % 10);
  r = post_json(*srv_, "/v1/chat/completions", chat(huge, 4, 1), &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(r["error"]["code"], "context_length_exceeded");
  // token ids out of range
  r = post_json(*srv_, "/v1/completions", {{"prompt", {1, -1}}}, &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(r["error"]["param"], "prompt");
}

TEST_F(ServerHttp, CompletionsTokenizeDetokenize) {
  int st = 0;
  ojson t = post_json(*srv_, "/tokenize", {{"content", "Hello world"}, {"with_pieces", true}}, &st);
  ASSERT_EQ(st, 200);
  ASSERT_EQ(t["tokens"].size(), 2u);
  EXPECT_EQ(t["tokens"][1]["piece"], " world");
  ojson ids = post_json(*srv_, "/tokenize", {{"content", "Hello world"}}, &st);
  ojson d = post_json(*srv_, "/detokenize", {{"tokens", ids["tokens"]}}, &st);
  EXPECT_EQ(d["content"], "Hello world");
  post_json(*srv_, "/detokenize", {{"tokens", {-3}}}, &st);
  EXPECT_EQ(st, 400);
  ojson c = post_json(*srv_, "/v1/completions",
                      {{"prompt", "Once upon a time"}, {"max_tokens", 6}, {"echo", true}, {"logprobs", 2}, {"seed", 3}},
                      &st);
  ASSERT_EQ(st, 200) << c.dump();
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"].get<std::string>().rfind("Once upon a time", 0), 0u);
  EXPECT_EQ(c["choices"][0]["logprobs"]["tokens"].size(), c["usage"]["completion_tokens"].get<size_t>());
  EXPECT_LE(c["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);
}

TEST_F(ServerHttp, StopStringsAreExcludedFromOutput) {
  // Generate once without stop strings, then stop on a piece of that output: the text ends right before it.
  int st = 0;
  ojson body = {{"prompt", "abc"}, {"max_tokens", 24}, {"seed", 11}, {"logit_bias", kNoEos}};
  ojson a = post_json(*srv_, "/v1/completions", body, &st);
  ASSERT_EQ(st, 200);
  std::string text = a["choices"][0]["text"];
  ASSERT_GT(text.size(), 12u);
  // a stop string of two whole code points from the middle of the output
  auto lead = [&](size_t i) { return i >= text.size() || (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80; };
  size_t from = text.size() / 2;
  while (!lead(from)) ++from;
  size_t to = from + 1;
  for (int cps = 0; to < text.size(); ++to)
    if (lead(to) && ++cps == 2) break;
  std::string stop = text.substr(from, to - from);
  ASSERT_FALSE(stop.empty());
  size_t first = text.find(stop);
  body["stop"] = {stop};
  for (bool stream : {false, true}) {
    body["stream"] = stream;
    std::string got;
    ojson finish;
    if (!stream) {
      ojson b = post_json(*srv_, "/v1/completions", body, &st);
      ASSERT_EQ(st, 200);
      got = b["choices"][0]["text"];
      finish = b["choices"][0]["finish_reason"];
    } else {
      std::string raw = post_stream(*srv_, "/v1/completions", body, &st);
      std::vector<ojson> ev;
      bool done = false;
      std::string why;
      ASSERT_TRUE(parse_sse(raw, ev, done, why)) << why;
      for (auto& e : ev) {
        got += e["choices"][0]["text"].get<std::string>();
        if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
      }
    }
    EXPECT_EQ(got, text.substr(0, first)) << "stream=" << stream << " stop='" << stop << "'";
    EXPECT_EQ(finish, "stop");
  }
}

TEST_F(ServerHttp, ConcurrentClientsCompleteOrGet429WithoutCrossTalk) {
  const int N = 32;
  // The previous test's last job may still be winding down on the engine thread after its reply went out;
  // "queue + 1 always fit" holds from an idle engine.
  auto tw = Clock::now();
  while ((metric(*srv_, "lily_requests_running") != 0 || metric(*srv_, "lily_requests_queued") != 0) &&
         seconds_since(tw) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  struct Result {
    int status = 0;
    std::string text, retry_after;
    double seconds = 0;
  };
  std::vector<Result> res(N);
  std::vector<std::thread> th;
  auto t0 = Clock::now();
  for (int i = 0; i < N; ++i) {
    th.emplace_back([&, i] {
      ojson body = {{"prompt", "client " + std::to_string(i) + " says"}, {"max_tokens", 24}, {"seed", 1000 + i},
                    {"logit_bias", kNoEos}, {"stream", true}};
      std::string raw;
      auto s = Clock::now();
      auto r = srv_->client(120).send("POST", "/v1/completions", {{"Content-Type", "application/json"}}, body.dump(),
                                      [&](const std::string& piece) {
                                        raw += piece;
                                        return true;
                                      });
      res[i].seconds = seconds_since(s);
      res[i].status = r ? r->status : -1;
      if (r) res[i].retry_after = r->header("Retry-After");
      if (r && r->status == 200) {
        std::vector<ojson> ev;
        bool done = false;
        std::string why;
        if (parse_sse(raw, ev, done, why) && done)
          for (auto& e : ev) res[i].text += e["choices"][0]["text"].get<std::string>();
        else
          res[i].status = -2;
      }
    });
  }
  for (auto& t : th) t.join();
  double total = seconds_since(t0);
  int ok = 0, busy = 0;
  for (int i = 0; i < N; ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(res[i].status == 200 || res[i].status == 429) << res[i].status;
    if (res[i].status == 429) {
      ++busy;
      EXPECT_GE(std::stoi(res[i].retry_after.empty() ? "0" : res[i].retry_after), 1);
    } else {
      ++ok;
    }
  }
  EXPECT_GE(ok, 17);  // queue 16 + the running one always fit
  EXPECT_LT(total, 120.0);
  std::printf("[ concurrency ] %d clients: %d completed, %d got 429, wall %.2f s\n", N, ok, busy, total);
  // No cross-talk: each completed request's text equals the same request replayed alone.
  for (int i = 0; i < N; ++i) {
    if (res[i].status != 200) continue;
    int st = 0;
    ojson r = post_json(*srv_, "/v1/completions",
                        {{"prompt", "client " + std::to_string(i) + " says"}, {"max_tokens", 24}, {"seed", 1000 + i},
                         {"logit_bias", kNoEos}},
                        &st);
    ASSERT_EQ(st, 200);
    EXPECT_EQ(res[i].text, r["choices"][0]["text"].get<std::string>()) << "client " << i;
  }
}

TEST_F(ServerHttp, DisconnectMidStreamFreesTheEngine) {
  const double before = metric(*srv_, "lily_client_disconnects_total");
  const RawStream stream = open_stream(*srv_, {{"prompt", "a long story"}, {"max_tokens", 900}, {"logit_bias", kNoEos}});
  ASSERT_GE(stream.fd, 0);
  const int fd = stream.fd;
  ASSERT_NE(stream.got.find("200 OK"), std::string::npos) << stream.got;
  ASSERT_TRUE(stream.has_text()) << stream.got;
  EXPECT_EQ(metric(*srv_, "lily_requests_running"), 1);
  close(fd);
  auto tc = Clock::now();
  while (metric(*srv_, "lily_requests_running") != 0 && seconds_since(tc) < 5)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  double freed = seconds_since(tc);
  EXPECT_LT(freed, 1.0) << "the engine kept working for the departed client";
  EXPECT_EQ(metric(*srv_, "lily_client_disconnects_total"), before + 1);
  auto tn = Clock::now();
  int st = 0;
  post_json(*srv_, "/v1/completions", {{"prompt", "next"}, {"max_tokens", 2}}, &st);
  EXPECT_EQ(st, 200);
  double next = seconds_since(tn);
  EXPECT_LT(next, 2.0);
  std::printf("[ disconnect ] engine idle %.3f s after close; next request took %.3f s\n", freed, next);
}

TEST_F(ServerHttp, SecondTurnReusesTheFirstFromThePrefixCache) {
  std::string long_turn = "Please summarise the following notes. ";
  for (int i = 0; i < 60; ++i) long_turn += "Note " + std::to_string(i) + ": the quick brown fox jumps. ";
  int st = 0;
  ojson msgs = ojson::array({{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", long_turn}}});
  ojson r1 = post_json(*srv_, "/v1/chat/completions",
                       {{"messages", msgs}, {"max_tokens", 8}, {"seed", 9}, {"logit_bias", kNoEos}}, &st);
  ASSERT_EQ(st, 200) << r1.dump();
  const int p1 = r1["usage"]["prompt_tokens"];
  ojson reply = {{"role", "assistant"}, {"content", r1["choices"][0]["message"]["content"]}};
  if (r1["choices"][0]["message"].contains("reasoning_content"))
    reply["reasoning_content"] = r1["choices"][0]["message"]["reasoning_content"];
  msgs.push_back(reply);
  msgs.push_back({{"role", "user"}, {"content", "And in one word?"}});
  ojson r2 = post_json(*srv_, "/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 4}, {"seed", 9}}, &st);
  ASSERT_EQ(st, 200) << r2.dump();
  const int p2 = r2["usage"]["prompt_tokens"];
  const int cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"];
  const int processed = r2["timings"]["prompt_n"];
  EXPECT_GT(p1, 500);
  // Everything up to the end of the first user turn is reused at least; only the rest is prefilled.
  EXPECT_GE(cached, p1 - 8) << "p1 " << p1 << " p2 " << p2;
  EXPECT_EQ(processed, p2 - cached);
  EXPECT_LT(processed, 60);
  std::printf("[ prefix cache ] turn 1: %d prompt tokens in %.1f ms; turn 2: %d prompt tokens, %d cached, %d "
              "prefilled in %.1f ms\n",
              p1, r1["timings"]["prompt_ms"].get<double>(), p2, cached, processed,
              r2["timings"]["prompt_ms"].get<double>());
}

TEST_F(ServerHttp, CachedAndColdPrefillGiveIdenticalGreedyTokens) {
  std::string text = "Cache equality check. ";
  for (int i = 0; i < 30; ++i) text += "Line " + std::to_string(i) + ". ";
  ojson body = chat(text, 20, 1, 0.0);
  body["logit_bias"] = kNoEos;
  int st = 0;
  // Evict the live sequence first, so the first run is cold.
  post_json(*srv_, "/v1/completions", {{"prompt", "unrelated"}, {"max_tokens", 1}}, &st);
  ojson cold = post_json(*srv_, "/v1/chat/completions", body, &st);
  ASSERT_EQ(st, 200);
  ojson warm = post_json(*srv_, "/v1/chat/completions", body, &st);
  ASSERT_EQ(st, 200);
  EXPECT_EQ(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_GT(warm["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
  EXPECT_EQ(message_text(cold), message_text(warm));
}

TEST(ServerLifecycle, SigtermDrainsInFlightStreamAndExitsZero) {
  ServerProcess srv({"--ctx", "512", "--drain", "20"});
  ASSERT_TRUE(srv.ok()) << srv.error();
  std::string raw;
  int st = 0;
  std::thread client([&] {
    raw = post_stream(srv, "/v1/completions",
                      {{"prompt", "drain me"}, {"max_tokens", 150}, {"stream", true}, {"logit_bias", kNoEos}}, &st);
  });
  auto t0 = Clock::now();
  while (metric(srv, "lily_requests_running") != 1 && seconds_since(t0) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto ts = Clock::now();
  kill(srv.pid(), SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // new work is refused while draining (or the listener is already gone)
  int st2 = 0;
  post_json(srv, "/v1/completions", {{"prompt", "late"}, {"max_tokens", 1}}, &st2);
  EXPECT_TRUE(st2 == 503 || st2 == -1) << st2;
  client.join();
  int code = srv.stop(0, 30);
  double exit_s = seconds_since(ts);
  EXPECT_EQ(st, 200);
  std::vector<ojson> ev;
  bool done = false;
  std::string why;
  ASSERT_TRUE(parse_sse(raw, ev, done, why)) << why;
  EXPECT_TRUE(done);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back()["choices"][0]["finish_reason"], "length");  // finished, not cut
  EXPECT_EQ(code, 0) << srv.log_text();
  EXPECT_LT(exit_s, 25);
}

TEST(ServerLifecycle, ApiKeyIsRequiredOnGenerationEndpoints) {
  ServerProcess srv({"--ctx", "256", "--api-key", "sekret"});
  ASSERT_TRUE(srv.ok()) << srv.error();
  ojson body = chat("hi", 1, 1);
  int st = 0;
  ojson r = post_json(srv, "/v1/chat/completions", body, &st);
  EXPECT_EQ(st, 401);
  EXPECT_EQ(r["error"]["type"], "authentication_error");
  post_json(srv, "/v1/chat/completions", body, &st, {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(st, 401);
  post_json(srv, "/v1/chat/completions", body, &st, {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(st, 200);
  post_json(srv, "/v1/chat/completions", body, &st, {{"X-Api-Key", "sekret"}});
  EXPECT_EQ(st, 200);
  post_json(srv, "/tokenize", {{"content", "x"}}, &st);
  EXPECT_EQ(st, 401);
  EXPECT_EQ(srv.client().get("/health")->status, 200);
  EXPECT_EQ(srv.client().get("/v1/models")->status, 200);
}

TEST(ServerLifecycle, QueueFullAnswers429WithRetryAfter) {
  ServerProcess srv({"--ctx", "512", "--queue", "1", "--max-seqs", "1"});  // one runs, one waits
  ASSERT_TRUE(srv.ok()) << srv.error();
  std::vector<std::thread> th;
  std::vector<int> status(6);
  std::vector<std::string> retry(6);
  for (int i = 0; i < 6; ++i)  // long enough that the first still runs when the last arrives
    th.emplace_back([&, i] {
      auto r = srv.client(60).post("/v1/completions",
                                   ojson({{"prompt", "q"}, {"max_tokens", 300}, {"logit_bias", kNoEos}}).dump(),
                                   "application/json");
      status[i] = r ? r->status : -1;
      if (r) retry[i] = r->header("Retry-After");
    });
  for (auto& t : th) t.join();
  int n429 = 0;
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(status[i] == 200 || status[i] == 429) << status[i];
    if (status[i] == 429) {
      ++n429;
      EXPECT_FALSE(retry[i].empty());
    }
  }
  EXPECT_GE(n429, 1);
  EXPECT_GE(metric(srv, "lily_requests_rejected_total{reason=\"queue_full\"}"), 1);
}

// Sets every element of the final norm's weight (the one `*norm.weight` outside the layers) of a safetensors file
// to NaN, in place. Returns the tensor's name.
std::string poison_final_norm(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string text(n, '\0');
  f.read(text.data(), static_cast<std::streamsize>(n));
  const ojson header = ojson::parse(text);
  std::string name;
  for (const auto& [key, t] : header.items()) {
    const bool final_norm = key.size() > 11 && key.compare(key.size() - 11, 11, "norm.weight") == 0 &&
                            key.find("layers") == std::string::npos && key.find("mtp") == std::string::npos &&
                            key.find("visual") == std::string::npos;
    if (!final_norm) continue;
    EXPECT_TRUE(name.empty()) << "two final norms: " << name << ", " << key;
    name = key;
    const std::string dtype = t["dtype"];
    const uint64_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
    std::string bytes(end - begin, '\0');
    const uint16_t nan16 = 0x7fc0;
    const uint32_t nan32 = 0x7fc00000u;
    EXPECT_TRUE(dtype == "BF16" || dtype == "F32") << dtype;
    for (uint64_t i = 0; i < bytes.size(); i += dtype == "BF16" ? 2 : 4)
      std::memcpy(&bytes[i], dtype == "BF16" ? static_cast<const void*>(&nan16) : &nan32, dtype == "BF16" ? 2 : 4);
    f.seekp(static_cast<std::streamoff>(8 + n + begin));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  return name;
}

// docs/api.md §10.1: a checkpoint whose final norm is NaN has NaN logits: 500 `nan_logits` (non-streaming), an
// error event with that code before [DONE] (streaming), never a token; the server keeps serving.
TEST(ServerLifecycle, NanLogitsAnswer500NanLogits) {
  namespace fs = std::filesystem;
  const fs::path demo = fs::path(LILY_BINARY_DIR) / "test-cache" / "lily" / "demo";
  if (!fs::exists(demo / ".complete")) {  // the demo checkpoint is made by the first demo server
    ServerProcess warm({"--ctx", "256"});
    ASSERT_TRUE(warm.ok()) << warm.error();
  }
  const fs::path dir = fs::path(LILY_BINARY_DIR) / ("test-nan-model-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::copy(demo, dir, fs::copy_options::recursive);
  ASSERT_FALSE(poison_final_norm((dir / "model.safetensors").string()).empty());
  ServerProcess srv({"--model", dir.string(), "--ctx", "256"}, 180, false);
  ASSERT_TRUE(srv.ok()) << srv.error();
  const ojson body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}};
  for (auto [temperature, n] : {std::pair{0.0, 1}, std::pair{0.7, 1}, std::pair{0.7, 3}}) {
    ojson b = body;
    b["temperature"] = temperature;
    b["n"] = n;  // n = 3: the first failing choice ends the request, the others are withdrawn
    if (temperature > 0) b["top_k"] = 0;  // (the GPU sampler's full-vocabulary path)
    int status = 0;
    const ojson r = post_json(srv, "/v1/chat/completions", b, &status);
    EXPECT_EQ(status, 500) << r.dump();
    EXPECT_EQ(r["error"]["code"], "nan_logits") << r.dump();
    EXPECT_EQ(r["error"]["type"], "server_error") << r.dump();
    b["stream"] = true;
    const std::string sse = post_stream(srv, "/v1/chat/completions", b, &status);
    EXPECT_NE(sse.find("\"code\":\"nan_logits\""), std::string::npos) << sse;
    EXPECT_EQ(sse.find("\"content\":\""), std::string::npos) << "a token was emitted: " << sse;
    EXPECT_NE(sse.find("data: [DONE]"), std::string::npos) << sse;
    EXPECT_EQ(sse.find("\"finish_reason\":\""), std::string::npos) << "a failed choice was finished: " << sse;
  }
  auto t0 = Clock::now();
  while (metric(srv, "lily_requests_queued") != 0 && seconds_since(t0) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(metric(srv, "lily_requests_queued"), 0);
  auto h = srv.client().get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(srv.stop(SIGTERM, 20), 0);
  fs::remove_all(dir);
}

TEST_F(ServerHttp, OfficialOpenAiNodeClient) {
  const std::string oracle = std::string(LILY_SOURCE_DIR) + "/tests/oracle/node_modules/openai/package.json";
  ASSERT_EQ(access(oracle.c_str(), R_OK), 0) << "run (cd tests/oracle && npm ci) first: " << oracle << " is missing";
  std::string cmd = "timeout 120 node " + std::string(LILY_SOURCE_DIR) + "/tests/server/openai_client.mjs http://127.0.0.1:" +
                    std::to_string(srv_->port()) + "/v1 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  int rc = pclose(p);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
}
