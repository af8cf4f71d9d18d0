// `n` (several samples of one prompt, docs/api.md §2) against the real `lily serve --demo`: choice i of a seeded
// request equals the one-choice request with seed + i (byte for byte: reasoning, content, logprobs, forced tool
// calls and their ids, structured output), usage counts the prompt once and sums the completions, streamed chunks
// carry their choice's index and each choice rebuilds its non-streaming text and logprobs with its own
// finish_reason, greedy choices agree, out-of-range n is 400, a queue that cannot take every choice rejects the
// whole request, and a client that leaves frees all of its choices.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "server_harness.h"

using namespace lily::test;

namespace {

class ServerN : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { srv_ = new ServerProcess({"--ctx", "1024", "--queue", "16"}); }
  static void TearDownTestSuite() {
    delete srv_;
    srv_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(srv_->ok()) << srv_->error(); }
  static ServerProcess* srv_;
};
ServerProcess* ServerN::srv_ = nullptr;

ojson chat(const std::string& user, int max_tokens, double temperature) {
  return {{"model", "m"},
          {"messages", ojson::array({{{"role", "user"}, {"content", user}}})},
          {"max_tokens", max_tokens},
          {"temperature", temperature}};
}

// The parts of a choice that must not depend on how many choices the request had.
ojson choice_body(const ojson& choice) {
  ojson c = choice;
  c.erase("index");
  return c;
}

// A seeded request with n choices vs. n one-choice requests with seed + i.
void expect_choices_equal_single_runs(const ServerProcess& srv, const std::string& path, ojson body, int n,
                                      uint64_t seed) {
  body["seed"] = seed;
  body["n"] = n;
  int st = 0;
  ojson multi = post_json(srv, path, body, &st);
  ASSERT_EQ(st, 200) << multi.dump();
  ASSERT_EQ(multi["choices"].size(), static_cast<size_t>(n)) << multi.dump();
  int completion = 0, reasoning = 0;
  std::set<std::string> distinct;
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE("choice " + std::to_string(i));
    const ojson& c = multi["choices"][i];
    EXPECT_EQ(c["index"], i);
    ojson one_body = body;
    one_body.erase("n");
    one_body["seed"] = seed + static_cast<uint64_t>(i);
    ojson one = post_json(srv, path, one_body, &st);
    ASSERT_EQ(st, 200) << one.dump();
    ASSERT_EQ(one["choices"].size(), 1u);
    EXPECT_EQ(choice_body(c).dump(), choice_body(one["choices"][0]).dump());
    EXPECT_EQ(multi["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
    completion += one["usage"]["completion_tokens"].get<int>();
    reasoning += one["usage"]["completion_tokens_details"]["reasoning_tokens"].get<int>();
    distinct.insert(choice_body(c).dump());
  }
  EXPECT_EQ(multi["usage"]["completion_tokens"], completion);
  EXPECT_EQ(multi["usage"]["completion_tokens_details"]["reasoning_tokens"], reasoning);
  EXPECT_EQ(multi["usage"]["total_tokens"],
            multi["usage"]["prompt_tokens"].get<int>() + multi["usage"]["completion_tokens"].get<int>());
  EXPECT_GT(distinct.size(), 1u) << "the choices did not sample with different seeds: " << multi.dump();
}

// Per choice index: the streamed text, the number of role chunks and finish chunks, the finish_reason.
struct StreamedChoice {
  std::string reasoning, content, text;
  int roles = 0, finishes = 0;
  bool after_finish = false;  // a chunk came after the finish chunk
  std::string finish;
  ojson lp_content = ojson::array(), lp_reasoning = ojson::array();  // chat logprobs entries, in order
};

std::map<int, StreamedChoice> streamed(const std::vector<ojson>& events, bool chat) {
  std::map<int, StreamedChoice> out;
  for (const auto& e : events) {
    for (const auto& c : e["choices"]) {
      StreamedChoice& s = out[c["index"].get<int>()];
      if (s.finishes > 0) s.after_finish = true;
      if (chat) {
        const ojson& d = c["delta"];
        if (d.contains("role")) ++s.roles;
        if (d.contains("reasoning_content")) s.reasoning += d["reasoning_content"].get<std::string>();
        if (d.contains("content") && d["content"].is_string()) s.content += d["content"].get<std::string>();
        if (c["logprobs"].is_object()) {
          for (const auto& x : c["logprobs"]["content"]) s.lp_content.push_back(x);
          for (const auto& x : c["logprobs"].value("reasoning_content", ojson::array())) s.lp_reasoning.push_back(x);
        }
      } else {
        s.text += c["text"].get<std::string>();
      }
      if (!c["finish_reason"].is_null()) {
        ++s.finishes;
        s.finish = c["finish_reason"].get<std::string>();
      }
    }
  }
  return out;
}

TEST_F(ServerN, SeededChatChoicesEqualOneChoiceRequestsWithSeedPlusI) {
  expect_choices_equal_single_runs(*srv_, "/v1/chat/completions", chat("Tell me a story", 14, 1.0), 3, 42);
}

TEST_F(ServerN, SeededChatChoicesWithLogprobsAndNoThinking) {
  ojson b = chat("Name three colours", 10, 0.9);
  b["logprobs"] = true;
  b["top_logprobs"] = 2;
  b["chat_template_kwargs"] = {{"enable_thinking", false}};
  expect_choices_equal_single_runs(*srv_, "/v1/chat/completions", b, 2, 7);
}

TEST_F(ServerN, SeededCompletionChoicesEqualOneChoiceRequests) {
  ojson b = {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 1.0}, {"logprobs", 2},
             {"echo", true}};
  expect_choices_equal_single_runs(*srv_, "/v1/completions", b, 4, 1000);
}

TEST_F(ServerN, StructuredOutputFiltersAreOnePerChoice) {
  ojson b = chat("Give me a JSON object", 24, 1.0);
  b["chat_template_kwargs"] = {{"enable_thinking", false}};
  b["response_format"] = {{"type", "json_object"}};
  expect_choices_equal_single_runs(*srv_, "/v1/chat/completions", b, 3, 99);
}

// A forced call: each choice has its own constrained-decoding state and call ids from seed + i.
TEST_F(ServerN, ForcedToolCallChoicesEqualOneChoiceRequests) {
  ojson b = chat("Weather in Rome?", 96, 1.0);
  b["chat_template_kwargs"] = {{"enable_thinking", false}};
  b["tools"] = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {
      "type": "object", "properties": {"city": {"enum": ["Rome", "Oslo"]}, "days": {"enum": [1, 2, 3]}},
      "required": ["city", "days"], "additionalProperties": false}}}])");
  b["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  b["parallel_tool_calls"] = false;
  expect_choices_equal_single_runs(*srv_, "/v1/chat/completions", b, 3, 314);
  b["seed"] = 314;
  b["n"] = 3;
  int st = 0;
  ojson r = post_json(*srv_, "/v1/chat/completions", b, &st);
  ASSERT_EQ(st, 200) << r.dump();
  std::set<std::string> ids;
  for (const auto& c : r["choices"]) {
    ASSERT_EQ(c["finish_reason"], "tool_calls") << r.dump();
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r.dump();
    ids.insert(c["message"]["tool_calls"][0]["id"].get<std::string>());
  }
  EXPECT_EQ(ids.size(), 3u) << "call ids repeat across choices: " << r.dump();
}

TEST_F(ServerN, GreedyChoicesAreIdentical) {
  ojson b = chat("Hello there", 12, 0.0);
  b["n"] = 2;
  int st = 0;
  ojson r = post_json(*srv_, "/v1/chat/completions", b, &st);
  ASSERT_EQ(st, 200) << r.dump();
  ASSERT_EQ(r["choices"].size(), 2u);
  EXPECT_EQ(r["choices"][0]["index"], 0);
  EXPECT_EQ(r["choices"][1]["index"], 1);
  EXPECT_EQ(choice_body(r["choices"][0]).dump(), choice_body(r["choices"][1]).dump());
}

TEST_F(ServerN, StreamingChatChoicesCarryTheirIndexAndRebuildTheNonStreamingOnes) {
  ojson b = chat("Write a poem", 16, 1.0);
  b["seed"] = 5;
  b["n"] = 3;
  b["logprobs"] = true;
  b["top_logprobs"] = 1;
  int st = 0;
  ojson full = post_json(*srv_, "/v1/chat/completions", b, &st);
  ASSERT_EQ(st, 200) << full.dump();
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  std::string sse = post_stream(*srv_, "/v1/chat/completions", b, &st);
  ASSERT_EQ(st, 200) << sse;
  std::vector<ojson> events;
  bool done = false;
  std::string why;
  ASSERT_TRUE(parse_sse(sse, events, done, why)) << why;
  ASSERT_TRUE(done);
  ASSERT_FALSE(events.empty());
  // the last event is the one usage chunk, with no choices; every earlier one has "usage": null
  const ojson& last = events.back();
  EXPECT_TRUE(last["choices"].is_array() && last["choices"].empty()) << last.dump();
  for (const char* k : {"prompt_tokens", "completion_tokens", "total_tokens"})  // cached_tokens differ: a rerun
    EXPECT_EQ(last["usage"][k], full["usage"][k]) << k;
  EXPECT_EQ(last["usage"]["completion_tokens_details"], full["usage"]["completion_tokens_details"]);
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_TRUE(events[i]["usage"].is_null()) << events[i].dump();
    EXPECT_EQ(events[i]["choices"].size(), 1u) << events[i].dump();
    EXPECT_EQ(events[i]["id"], last["id"]);
  }
  auto got = streamed(events, true);
  ASSERT_EQ(got.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE("choice " + std::to_string(i));
    const StreamedChoice& s = got[i];
    const ojson& m = full["choices"][i]["message"];
    EXPECT_EQ(s.roles, 1);
    EXPECT_EQ(s.finishes, 1);
    EXPECT_FALSE(s.after_finish);
    EXPECT_EQ(s.finish, full["choices"][i]["finish_reason"]);
    EXPECT_EQ(s.reasoning, m.value("reasoning_content", ""));
    EXPECT_EQ(s.content, m["content"].is_string() ? m["content"].get<std::string>() : "");
    const ojson& lp = full["choices"][i]["logprobs"];
    EXPECT_EQ(s.lp_content.dump(), lp["content"].dump());
    EXPECT_EQ(s.lp_reasoning.dump(), lp.value("reasoning_content", ojson::array()).dump());
    EXPECT_FALSE(s.lp_content.empty() && s.lp_reasoning.empty());
  }
}

TEST_F(ServerN, StreamingCompletionChoicesRebuildTheNonStreamingOnes) {
  ojson b = {{"prompt", "The weather today"}, {"max_tokens", 10}, {"temperature", 1.0}, {"seed", 11}, {"n", 2}};
  int st = 0;
  ojson full = post_json(*srv_, "/v1/completions", b, &st);
  ASSERT_EQ(st, 200) << full.dump();
  b["stream"] = true;
  std::string sse = post_stream(*srv_, "/v1/completions", b, &st);
  ASSERT_EQ(st, 200) << sse;
  std::vector<ojson> events;
  bool done = false;
  std::string why;
  ASSERT_TRUE(parse_sse(sse, events, done, why)) << why;
  ASSERT_TRUE(done);
  auto got = streamed(events, false);
  ASSERT_EQ(got.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(got[i].text, full["choices"][i]["text"]) << i;
    EXPECT_EQ(got[i].finishes, 1) << i;
    EXPECT_EQ(got[i].finish, full["choices"][i]["finish_reason"]) << i;
  }
}

TEST_F(ServerN, OutOfRangeNIs400NamingN) {
  for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
    for (ojson n : {ojson(17), ojson(0), ojson(-3), ojson(1000000), ojson("2"), ojson(1.5)}) {
      SCOPED_TRACE(std::string(path) + " n=" + n.dump());
      ojson b = std::string(path) == "/v1/completions" ? ojson{{"prompt", "x"}, {"max_tokens", 2}} : chat("x", 2, 0.5);
      b["n"] = n;
      int st = 0;
      ojson r = post_json(*srv_, path, b, &st);
      EXPECT_EQ(st, 400) << r.dump();
      EXPECT_EQ(r["error"]["param"], "n") << r.dump();
      EXPECT_EQ(r["error"]["type"], "invalid_request_error") << r.dump();
    }
  }
  ojson b = chat("x", 2, 0.5);
  b["n"] = 16;  // the upper bound itself is served
  int st = 0;
  ojson r = post_json(*srv_, "/v1/chat/completions", b, &st);
  EXPECT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"].size(), 16u);
}

TEST_F(ServerN, ClientDisconnectCancelsEveryChoice) {
  const double before = metric(*srv_, "lily_client_disconnects_total");
  const ojson no_eos = {{"151643", -100}, {"151645", -100}, {"151662", -100}, {"151663", -100}, {"151664", -100}};
  const RawStream stream = open_stream(*srv_, {{"prompt", "a long story"}, {"max_tokens", 900}, {"n", 4}, {"logit_bias", no_eos}});
  ASSERT_GE(stream.fd, 0);
  const int fd = stream.fd;
  ASSERT_NE(stream.got.find("200 OK"), std::string::npos) << stream.got;
  ASSERT_TRUE(stream.has_text()) << stream.got;
  const std::string m = metrics_text(*srv_);  // the four choices: running, or waiting for choice 0's prompt
  EXPECT_EQ(metric_in(m, "lily_requests_running") + metric_in(m, "lily_requests_queued"), 4);
  close(fd);
  auto tc = Clock::now();
  while ((metric(*srv_, "lily_requests_running") != 0 || metric(*srv_, "lily_requests_queued") != 0) &&
         seconds_since(tc) < 5)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_LT(seconds_since(tc), 1.0) << "choices kept running or waiting for the departed client";
  EXPECT_EQ(metric(*srv_, "lily_client_disconnects_total"), before + 1);
}

TEST(ServerNQueue, QueueThatCannotTakeEveryChoiceRejectsTheWholeRequest) {
  ServerProcess srv({"--ctx", "512", "--queue", "1", "--max-seqs", "1"});
  ASSERT_TRUE(srv.ok()) << srv.error();
  ojson b = chat("Hi", 4, 0.7);
  b["n"] = 3;  // one may run, one may wait: the third does not fit
  auto r = srv.client().post("/v1/chat/completions", b.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429) << r->body;
  EXPECT_FALSE(r->header("Retry-After").empty());
  EXPECT_EQ(ojson::parse(r->body)["error"]["code"], "queue_full") << r->body;
  // the choices already queued were withdrawn: nothing left running or waiting, and n = 2 fits
  auto t0 = Clock::now();
  while ((metric(srv, "lily_requests_running") != 0 || metric(srv, "lily_requests_queued") != 0) &&
         seconds_since(t0) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(metric(srv, "lily_requests_running"), 0);
  EXPECT_EQ(metric(srv, "lily_requests_queued"), 0);
  b["n"] = 2;
  int st = 0;
  ojson ok = post_json(srv, "/v1/chat/completions", b, &st);
  EXPECT_EQ(st, 200) << ok.dump();
  EXPECT_EQ(ok["choices"].size(), 2u);
}

}  // namespace
