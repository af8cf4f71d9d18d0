// Continuous batching through `lily serve --demo` (CPU backend, several sequences per step): concurrent requests
// with different seeds, sampling settings and lengths, some of them abandoned mid-stream, give each the exact
// text it gets alone (docs/api.md: a request's output does not depend on which others share its steps); a KV
// budget smaller than the load preempts and recomputes without changing any output; pools return to zero.
#include <gtest/gtest.h>

#include <thread>

#include "server_harness.h"

using namespace lily::test;

namespace {

const ojson kNoEos = {{"151643", -100}, {"151645", -100}, {"151662", -100}, {"151663", -100}, {"151664", -100}};

ojson request(int i) {
  ojson b = {{"prompt", "Request number " + std::to_string(i) + (i % 3 == 0 ? " with a longer opening line" : "")},
             {"max_tokens", 6 + (i * 7) % 40},
             {"logit_bias", kNoEos}};
  if (i % 4 == 0) {
    b["temperature"] = 0;
  } else {
    b["temperature"] = 0.7 + 0.1 * (i % 3);
    b["seed"] = 1000 + i;
    if (i % 2) b["top_p"] = 0.9;
    if (i % 5 == 1) b["presence_penalty"] = 0.5;
  }
  return b;
}

std::string text_of(const ojson& r) {
  if (!r.is_object() || !r.contains("choices")) return "<error: " + r.dump() + ">";
  return r["choices"][0]["text"].get<std::string>();
}

void wait_idle(const ServerProcess& srv) {
  const auto t0 = Clock::now();
  while ((metric(srv, "lily_requests_running") != 0 || metric(srv, "lily_state_slots_used") != 0) &&
         seconds_since(t0) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(metric(srv, "lily_requests_running"), 0);
  EXPECT_EQ(metric(srv, "lily_requests_queued"), 0);
  EXPECT_EQ(metric(srv, "lily_state_slots_used"), 0);
}

}  // namespace

TEST(ServerBatching, ConcurrentRequestsGetTheirSoloOutputs) {
  ServerProcess srv({"--ctx", "1024", "--max-seqs", "4", "--queue", "64"});
  ASSERT_TRUE(srv.ok()) << srv.error();
  constexpr int kN = 16;
  std::vector<std::string> solo(kN);
  for (int i = 0; i < kN; ++i) {
    int st = 0;
    solo[i] = text_of(post_json(srv, "/v1/completions", request(i), &st));
    ASSERT_EQ(st, 200) << solo[i];
  }
  EXPECT_EQ(metric(srv, "lily_state_slots_total"), 4);

  // All at once, twice: requests 3, 8 and 13 are abandoned after their first chunk.
  for (int round = 0; round < 2; ++round) {
    std::vector<std::string> got(kN);
    std::vector<int> status(kN, 0);
    std::vector<std::thread> th;
    for (int i = 0; i < kN; ++i)
      th.emplace_back([&, i] {
        if (i % 5 == 3) {
          status[i] = abandon_stream(srv, request(i)) ? 200 : -1;
          return;
        }
        got[i] = text_of(post_json(srv, "/v1/completions", request(i), &status[i]));
      });
    for (auto& t : th) t.join();
    for (int i = 0; i < kN; ++i) {
      EXPECT_EQ(status[i], 200) << "request " << i;
      if (i % 5 != 3) EXPECT_EQ(got[i], solo[i]) << "request " << i << " in round " << round;
    }
  }
  wait_idle(srv);
  // Steps carried several sequences.
  const double steps = metric(srv, "lily_batch_size_count"), seqs = metric(srv, "lily_batch_size_sum");
  EXPECT_GT(seqs / steps, 1.2) << seqs << " sequences in " << steps << " steps";
}

TEST(ServerBatching, AKvBudgetPreemptsAndRecomputesWithoutChangingOutputs) {
  // Three 256-token pages for three requests that each need two: two are admitted (one page each plus a page of
  // headroom per running sequence), and the newer is preempted when both cross their first page.
  ServerProcess srv({"--ctx", "768", "--max-seqs", "3", "--kv-tokens", "768", "--no-prefix-cache"});
  ASSERT_TRUE(srv.ok()) << srv.error();
  auto body = [](int i) {
    ojson b = request(i);
    b["max_tokens"] = 300;
    return b;
  };
  std::vector<std::string> solo(3), got(3);
  for (int i = 0; i < 3; ++i) solo[i] = text_of(post_json(srv, "/v1/completions", body(i + 1)));
  std::vector<int> status(3);
  std::vector<std::thread> th;
  for (int i = 0; i < 3; ++i)
    th.emplace_back([&, i] { got[i] = text_of(post_json(srv, "/v1/completions", body(i + 1), &status[i])); });
  for (auto& t : th) t.join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(status[i], 200) << i;
    EXPECT_EQ(got[i], solo[i]) << "request " << i;
  }
  EXPECT_GT(metric(srv, "lily_preemptions_total"), 0);
  EXPECT_LE(metric(srv, "lily_kv_pages_used"), 3);
  wait_idle(srv);
}

TEST(ServerBatching, TheChoicesOfOneRequestComputeItsPromptOnce) {
  ServerProcess srv({"--ctx", "1024", "--max-seqs", "4"});
  ASSERT_TRUE(srv.ok()) << srv.error();
  std::string words;
  for (int i = 0; i < 200; ++i) words += "word ";
  const double before = metric(srv, "lily_prompt_tokens_cached_total");
  int st = 0;
  const ojson r = post_json(srv, "/v1/completions",
                            {{"prompt", words}, {"max_tokens", 8}, {"n", 4}, {"temperature", 1.0}, {"seed", 5}}, &st);
  ASSERT_EQ(st, 200) << r.dump();
  const int n = r["usage"]["prompt_tokens"].get<int>();
  // choice 0 computes the prompt; choices 1..3 wait for it and restore all of it but the last token
  EXPECT_EQ(metric(srv, "lily_prompt_tokens_cached_total") - before, 3.0 * (n - 1));
  wait_idle(srv);
}

// A stream holds its HTTP worker until it ends: with more sequences than the workers of a fixed pool (the old
// default, queue + 32), the rest would wait for a worker, not run. Forty streams at once all run together.
TEST(ServerBatching, EverySequenceSlotCanStreamAtOnce) {
  ServerProcess srv({"--ctx", "2048", "--max-seqs", "40", "--queue", "0"});
  std::vector<RawStream> streams;
  for (int i = 0; i < 40; ++i) {
    ojson body = {{"prompt", "Stream " + std::to_string(i)}, {"max_tokens", 1800}, {"temperature", 0.8},
                  {"logit_bias", {{"151643", -100}, {"151645", -100}}}};
    streams.push_back(open_stream(srv, body));
    ASSERT_GE(streams.back().fd, 0) << "stream " << i;
    ASSERT_TRUE(streams.back().has_text()) << "stream " << i << " got no text: " << streams.back().got.substr(0, 300);
  }
  // (a stream may end early by sampling an end id the bias missed; the old pool ran 32 at most)
  EXPECT_GT(metric(srv, "lily_requests_running"), 36) << "every stream should run at once";
  for (RawStream& r : streams) close(r.fd);  // clients that go away: the server cancels them
  const auto t0 = Clock::now();
  while (metric(srv, "lily_requests_running") != 0 && seconds_since(t0) < 30)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  wait_idle(srv);
}

