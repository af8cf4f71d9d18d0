// Soak (ctest label "soak", run by hand: `ctest --test-dir build -L soak`; not in scripts/test.sh): mixed valid
// and hostile traffic against `lily serve --demo` for LILY_SOAK_SECONDS (default 60). After a warm-up with the
// same traffic, the server's resident memory (VmRSS) and open descriptors must stay flat, every valid request
// must succeed, and /health must answer at the end. A second test runs 32 clients of random generation
// requests and disconnects through the continuous-batching engine: nothing lost, nothing crossed (probe
// requests keep their solo output under load), pools and memory back to where they were.
#include <dirent.h>

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <random>
#include <thread>

#include "raw_http.h"
#include "server_harness.h"

using namespace lily::test;

namespace {

long vm_rss_kib(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

int open_fds(pid_t pid) {
  DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

std::string req(const std::string& method, const std::string& path, const std::string& body = "",
                const std::string& extra = "") {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra;
  if (method == "POST")
    r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  return r + "\r\n" + body;
}

struct Counts {
  std::atomic<int> valid_ok{0}, valid_bad{0}, hostile{0};
};

// One action of a random kind; valid ones must succeed.
void act(int port, std::mt19937& rng, Counts& n) {
  const int kind = static_cast<int>(rng() % 10);
  switch (kind) {
    case 0: {  // keep-alive pipeline of three GETs
      RawConn c(port);
      c.send_all(req("GET", "/health") + req("GET", "/v1/models") + req("GET", "/metrics"));
      bool ok = true;
      for (int i = 0; i < 3; ++i) ok = ok && c.read_response(10).status == 200;
      (ok ? n.valid_ok : n.valid_bad)++;
      break;
    }
    case 1: {  // tokenize
      std::string text(1 + rng() % 2000, 'a' + static_cast<char>(rng() % 26));
      RawResponse r = raw_request(port, req("POST", "/tokenize", R"({"content":")" + text + "\"}"), 10);
      (r.status == 200 ? n.valid_ok : n.valid_bad)++;
      break;
    }
    case 2: {  // a short completion
      RawResponse r = raw_request(
          port, req("POST", "/v1/completions", R"({"prompt":"soak","max_tokens":3,"seed":)" + std::to_string(rng() % 1000) + "}"),
          60);
      (r.status == 200 || r.status == 429 ? n.valid_ok : n.valid_bad)++;
      break;
    }
    case 3: {  // a stream the client abandons after the first bytes
      RawConn c(port);
      c.send_all(req("POST", "/v1/completions", R"({"prompt":"abandon","max_tokens":50,"stream":true})"));
      c.read_some(10);
      n.hostile++;
      break;
    }
    case 4: {  // loose framing
      static const std::vector<std::string> bad = {
          "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nabcdef",
          "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
          "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nBroken header\r\n\r\n",
          "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"};
      raw_request(port, bad[rng() % bad.size()], 5);
      n.hostile++;
      break;
    }
    case 5: {  // an oversize chunked body
      RawConn c(port);
      c.send_all("POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n");
      std::string chunk = "4000\r\n" + std::string(0x4000, 'z') + "\r\n";
      for (int i = 0; i < 8 && c.send_all(chunk); ++i) {
      }
      c.read_response(5);
      n.hostile++;
      break;
    }
    case 6: {  // a partial header, then gone
      RawConn c(port);
      c.send_all("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Partial: ");
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 200));
      n.hostile++;
      break;
    }
    case 7: {  // too many headers
      std::string h;
      for (int i = 0; i < 150; ++i) h += "X-" + std::to_string(i) + ": v\r\n";
      raw_request(port, req("GET", "/health", "", h), 5);
      n.hostile++;
      break;
    }
    case 8: {  // random bytes
      std::string junk(1 + rng() % 512, '\0');
      for (auto& ch : junk) ch = static_cast<char>(rng());
      raw_request(port, junk, 2);
      n.hostile++;
      break;
    }
    default: {  // connect and close
      RawConn c(port);
      n.hostile++;
      break;
    }
  }
}

}  // namespace

TEST(HttpSoak, MixedTrafficKeepsMemoryAndDescriptorsFlat) {
  const char* env = std::getenv("LILY_SOAK_SECONDS");
  const double seconds = env ? std::atof(env) : 60;
  ServerProcess srv({"--ctx", "256", "--max-body", "65536", "--header-timeout", "2", "--read-timeout", "2"});
  ASSERT_TRUE(srv.ok()) << srv.error();
  Counts n;
  auto run_for = [&](double s, unsigned seed) {
    std::vector<std::thread> th;
    std::atomic<bool> stop{false};
    for (int t = 0; t < 6; ++t)
      th.emplace_back([&, t] {
        std::mt19937 rng(seed * 100 + static_cast<unsigned>(t));
        while (!stop.load()) act(srv.port(), rng, n);
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(s * 1000)));
    stop.store(true);
    for (auto& x : th) x.join();
    std::this_thread::sleep_for(std::chrono::seconds(3));  // header deadlines of abandoned connections pass
  };
  run_for(std::max(5.0, seconds * 0.2), 1);  // warm-up: allocator pools, caches, thread stacks
  const long rss0 = vm_rss_kib(srv.pid());
  const int fds0 = open_fds(srv.pid());
  run_for(seconds, 2);
  const long rss1 = vm_rss_kib(srv.pid());
  const int fds1 = open_fds(srv.pid());
  std::printf("[ soak ] %.0f s: %d valid ok, %d valid failed, %d hostile; VmRSS %ld -> %ld KiB, fds %d -> %d\n",
              seconds, n.valid_ok.load(), n.valid_bad.load(), n.hostile.load(), rss0, rss1, fds0, fds1);
  EXPECT_EQ(n.valid_bad.load(), 0);
  EXPECT_GT(n.valid_ok.load(), 0);
  EXPECT_LE(fds1, fds0 + 2);
  EXPECT_LT(rss1 - rss0, 32 * 1024) << "resident memory grew by " << (rss1 - rss0) / 1024 << " MiB";
  EXPECT_EQ(raw_request(srv.port(), req("GET", "/health")).status, 200);
}

TEST(HttpSoak, ThirtyTwoClientsOfRandomRequestsAndDisconnects) {
  const char* env = std::getenv("LILY_SOAK_SECONDS");
  const double seconds = env ? std::atof(env) : 60;
  ServerProcess srv({"--ctx", "512", "--max-seqs", "8", "--queue", "64"});
  ASSERT_TRUE(srv.ok()) << srv.error();
  const ojson no_eos = {{"151643", -100}, {"151645", -100}, {"151662", -100}, {"151663", -100}, {"151664", -100}};
  const ojson probe = {{"prompt", "the probe"}, {"max_tokens", 24}, {"seed", 4242}, {"temperature", 0.8},
                       {"logit_bias", no_eos}};
  const ojson solo = post_json(srv, "/v1/completions", probe);
  ASSERT_TRUE(solo.contains("choices")) << solo.dump();
  std::atomic<int> ok{0}, lost{0}, crossed{0}, abandoned{0};
  auto run_for = [&](double s, unsigned seed) {
    std::vector<std::thread> th;
    std::atomic<bool> stop{false};
    for (int t = 0; t < 32; ++t)
      th.emplace_back([&, t] {
        std::mt19937 rng(seed * 1000 + static_cast<unsigned>(t));
        while (!stop.load()) {
          const int kind = static_cast<int>(rng() % 10);
          if (kind == 0) {  // the probe: its solo text under any load
            const ojson r = post_json(srv, "/v1/completions", probe);
            (r.contains("choices") && r["choices"][0]["text"] == solo["choices"][0]["text"] ? ok : crossed)++;
            continue;
          }
          const int max_tokens = 1 + static_cast<int>(rng() % 60);
          ojson b = {{"prompt", "client " + std::to_string(t) + " asks " + std::to_string(rng() % 1000)},
                     {"max_tokens", max_tokens}, {"seed", static_cast<int>(rng() % 100000)}, {"logit_bias", no_eos}};
          if (kind <= 2) {  // goes away mid-stream
            abandon_stream(srv, b);
            abandoned++;
            continue;
          }
          int st = 0;
          const ojson r = post_json(srv, "/v1/completions", b, &st);
          const bool full = st == 200 && r.contains("usage") && r["usage"]["completion_tokens"] == max_tokens;
          (full ? ok : lost)++;
        }
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(s * 1000)));
    stop.store(true);
    for (auto& x : th) x.join();
    const auto t0 = Clock::now();  // abandoned streams end within a step
    while (metric(srv, "lily_requests_running") != 0 && seconds_since(t0) < 10)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  run_for(std::max(5.0, seconds * 0.2), 1);  // warm-up
  const long rss0 = vm_rss_kib(srv.pid());
  run_for(seconds, 2);
  const long rss1 = vm_rss_kib(srv.pid());
  const std::string m = metrics_text(srv);
  std::printf("[ soak ] 32 clients, %.0f s: %d complete, %d lost, %d crossed, %d abandoned; VmRSS %ld -> %ld KiB; "
              "%.0f steps, %.2f sequences per step, %.0f preemptions\n",
              seconds, ok.load(), lost.load(), crossed.load(), abandoned.load(), rss0, rss1,
              metric_in(m, "lily_batch_size_count"),
              metric_in(m, "lily_batch_size_sum") / std::max(1.0, metric_in(m, "lily_batch_size_count")),
              metric_in(m, "lily_preemptions_total"));
  EXPECT_EQ(lost.load(), 0);
  EXPECT_EQ(crossed.load(), 0);
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(metric_in(m, "lily_requests_running"), 0);
  EXPECT_EQ(metric_in(m, "lily_requests_queued"), 0);
  EXPECT_EQ(metric_in(m, "lily_state_slots_used"), 0);
  EXPECT_LT(rss1 - rss0, 32 * 1024) << "resident memory grew by " << (rss1 - rss0) / 1024 << " MiB";
}
