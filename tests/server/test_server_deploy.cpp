// What a load balancer needs from one replica (docs/deploy.md): readiness vs liveness probes, capacity gauges
// in /metrics, the conversation fields of a request accepted, and `--gpu` narrowing CUDA_VISIBLE_DEVICES. The
// whole fleet behind nginx is tested by tests/deploy/test_deploy.mjs.
#include <gtest/gtest.h>

#include "server/health.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server_harness.h"

using namespace lily::server;
using lily::test::ServerProcess;

namespace {

const lily::test::ojson kNoEos = {{"151643", -100}, {"151645", -100}, {"151662", -100}, {"151663", -100},
                                  {"151664", -100}};

TEST(Health, PathsMapToProbes) {
  for (const char* p : {"/health", "/v1/health", "/health/ready", "/readyz"}) EXPECT_EQ(health_probe(p), Probe::ready) << p;
  for (const char* p : {"/health/live", "/livez"}) EXPECT_EQ(health_probe(p), Probe::live) << p;
  for (const char* p : {"/", "/healthz", "/health/", "/health/livez", "/v1/models", ""})
    EXPECT_FALSE(health_probe(p).has_value()) << p;
}

TEST(Health, ReadinessIs200OnlyWhenLoadedAndNotDraining) {
  auto ok = health_reply(Probe::ready, true, false);
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.retry_after, 0);
  EXPECT_EQ(nlohmann::json::parse(ok.body)["status"], "ok");
  auto loading = health_reply(Probe::ready, false, false);
  EXPECT_EQ(loading.status, 503);
  EXPECT_GT(loading.retry_after, 0);
  EXPECT_EQ(nlohmann::json::parse(loading.body)["error"]["message"], "Loading model");
  for (bool ready : {false, true}) {
    auto draining = health_reply(Probe::ready, ready, true);
    EXPECT_EQ(draining.status, 503);
    EXPECT_GT(draining.retry_after, 0);
    EXPECT_EQ(nlohmann::json::parse(draining.body)["error"]["message"], "Shutting down");
  }
}

TEST(Health, LivenessIs200InEveryStateAndNamesIt) {
  const std::pair<bool, bool> states[] = {{false, false}, {true, false}, {true, true}, {false, true}};
  const char* names[] = {"loading", "ready", "draining", "draining"};
  for (int i = 0; i < 4; ++i) {
    auto r = health_reply(Probe::live, states[i].first, states[i].second);
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.retry_after, 0);
    EXPECT_EQ(nlohmann::json::parse(r.body)["state"], names[i]);
  }
}

double gauge(const std::string& text, const std::string& name) {
  auto pos = text.find("\n" + name + " ");
  if (pos == std::string::npos) return -1;
  return std::stod(text.substr(pos + name.size() + 2));
}

TEST(MetricsCapacity, FreeSlotsAndQueueRoomFollowTheEngine) {
  Metrics m;
  m.set_capacity(1, 5);
  std::string t = m.render();
  EXPECT_EQ(gauge(t, "lily_sequence_slots"), 1);
  EXPECT_EQ(gauge(t, "lily_sequence_slots_free"), 1);
  EXPECT_EQ(gauge(t, "lily_queue_capacity"), 5);
  EXPECT_EQ(gauge(t, "lily_queue_free"), 5);
  m.set_queue(3, 1);
  t = m.render();
  EXPECT_EQ(gauge(t, "lily_sequence_slots_free"), 0);
  EXPECT_EQ(gauge(t, "lily_queue_free"), 2);
  m.set_queue(7, 1);  // the idle engine admits one more than the queue holds: never a negative gauge
  EXPECT_EQ(gauge(m.render(), "lily_queue_free"), 0);
}

TEST(RequestFields, ConversationKeysAreAccepted) {
  RequestLimits lim;
  lim.n_vocab = 1000;
  ojson body = ojson::parse(R"({"messages":[{"role":"user","content":"hi"}],"prompt_cache_key":"conv-17",
                                "user":"alice","safety_identifier":"h-1","metadata":{"k":"v"}})");
  EXPECT_NO_THROW(parse_chat_request(body, lim));
  ojson comp = ojson::parse(R"({"prompt":"hi","prompt_cache_key":"conv-17","user":"alice"})");
  EXPECT_NO_THROW(parse_completion_request(comp, lim));
}

TEST(ServerDeploy, ProbesOverHttpWithoutTheApiKeyAndThroughDrain) {
  ServerProcess srv({"--ctx", "512", "--api-key", "sekret", "--queue", "3", "--max-seqs", "2"});
  ASSERT_TRUE(srv.ok()) << srv.error();
  auto c = srv.client(10);
  for (const char* p : {"/health", "/v1/health", "/health/ready", "/readyz", "/health/live", "/livez"}) {
    auto r = c.get(p);
    ASSERT_TRUE(r) << p;
    EXPECT_EQ(r->status, 200) << p << " " << r->body;
  }
  auto m = c.get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(gauge(m->body, "lily_queue_capacity"), 3);
  EXPECT_EQ(gauge(m->body, "lily_sequence_slots"), 2);
  EXPECT_EQ(gauge(m->body, "lily_sequence_slots_free"), 2);

  // A long request keeps the replica draining after SIGTERM: not ready, still live.
  std::thread gen([&] {
    lily::server::HttpHeaders h = {{"Authorization", "Bearer sekret"}};
    lily::test::ojson body = {{"prompt", "count"}, {"max_tokens", 400}, {"logit_bias", kNoEos}};
    srv.client(60).post("/v1/completions", body.dump(), "application/json", h);
  });
  bool busy = false;
  for (int i = 0; i < 200 && !busy; ++i) {
    auto r = c.get("/metrics");
    busy = r && gauge(r->body, "lily_sequence_slots_free") == 1;
    if (!busy) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(busy) << "the long request never ran";
  kill(srv.pid(), SIGTERM);
  bool saw_draining = false;
  for (int i = 0; i < 100 && !saw_draining; ++i) {
    auto ready = c.get("/health");
    auto live = c.get("/livez");
    if (ready && live && ready->status == 503) {
      saw_draining = true;
      EXPECT_EQ(live->status, 200);
      EXPECT_EQ(nlohmann::json::parse(live->body)["state"], "draining");
      EXPECT_FALSE(ready->header("Retry-After").empty());
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  EXPECT_TRUE(saw_draining);
  gen.join();
  EXPECT_EQ(srv.stop(0, 30), 0) << srv.log_text();
}

TEST(ServeGpuFlag, IndexesCudaVisibleDevicesAndRefusesTheCpu) {
  const std::string lily = std::string(LILY_BINARY_DIR) + "/lily";
  auto run = [&](const std::string& args) {
    // bounded: a --gpu that were ignored would leave the server running
    std::string cmd = "timeout 30 " + lily + " serve --demo --port 0 " + args + " 2>&1";
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    char buf[512];
    while (p && fgets(buf, sizeof buf, p)) out += buf;
    int st = p ? pclose(p) : -1;
    return std::make_pair(WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
  };
  auto [rc1, out1] = run("--gpu 0 --device cpu");
  EXPECT_NE(rc1, 0);
  EXPECT_NE(out1.find("--gpu 0 and --device cpu are exclusive"), std::string::npos) << out1;
  setenv("CUDA_VISIBLE_DEVICES", "3,5", 1);
  auto [rc2, out2] = run("--gpu 2");
  unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_NE(rc2, 0);
  EXPECT_NE(out2.find("--gpu 2: CUDA_VISIBLE_DEVICES='3,5' lists 2 device(s)"), std::string::npos) << out2;
}

}  // namespace
