// Hostile clients against `lily serve --demo` over raw sockets (docs/http.md): header count and size limits,
// chunked bodies against --max-body, strict framing (request smuggling shapes), slow headers and a slowloris
// while /health keeps answering, pipelining, HTTP/1.0 streams, 405/415, the Host check, the connection cap and
// disconnect detection behind unread bytes. Every wait is bounded.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>

#include "raw_http.h"
#include "server_harness.h"

using namespace lily::test;

namespace {

constexpr int kMaxBody = 65536;

class HttpHostile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    srv_ = new ServerProcess({"--ctx", "512", "--max-body", std::to_string(kMaxBody)});
  }
  static void TearDownTestSuite() {
    delete srv_;
    srv_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(srv_->ok()) << srv_->error(); }
  static int port() { return srv_->port(); }
  static ServerProcess* srv_;
};
ServerProcess* HttpHostile::srv_ = nullptr;

std::string get(const std::string& path, const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra + "\r\n";
}

std::string post(const std::string& path, const std::string& body, const std::string& extra = "",
                 const std::string& type = "application/json") {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + (type.empty() ? "" : "Content-Type: " + type + "\r\n") +
         "Content-Length: " + std::to_string(body.size()) + "\r\n" + extra + "\r\n" + body;
}

std::string chunked(const std::string& body, size_t piece) {
  std::string out;
  for (size_t i = 0; i < body.size(); i += piece) {
    const std::string p = body.substr(i, piece);
    char size[24];
    std::snprintf(size, sizeof size, "%zx\r\n", p.size());
    out += size + p + "\r\n";
  }
  return out + "0\r\n\r\n";
}

bool healthy(int port) { return raw_request(port, get("/health"), 5).status == 200; }

}  // namespace

TEST_F(HttpHostile, HeaderCountAndSizeLimitsAnswer431) {
  std::string ninety_nine;  // with Host: 100 fields, the limit
  for (int i = 0; i < 99; ++i) ninety_nine += "X-H" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(raw_request(port(), get("/health", ninety_nine)).status, 200);
  RawResponse r = raw_request(port(), get("/health", ninety_nine + "X-One-Too-Many: v\r\n"));
  EXPECT_EQ(r.status, 431) << r.head;
  EXPECT_NE(r.body.find("too_many_headers"), std::string::npos) << r.body;
  // 9 fields of 7.5 KiB: each line is legal, the total (> 64 KiB) is not
  std::string big;
  for (int i = 0; i < 9; ++i) big += "X-Big" + std::to_string(i) + ": " + std::string(7500, 'a') + "\r\n";
  EXPECT_EQ(raw_request(port(), get("/health", big)).status, 431);
  // one line over 8 KiB
  EXPECT_EQ(raw_request(port(), get("/health", "X-Long: " + std::string(9000, 'b') + "\r\n")).status, 431);
  // a megabyte of header is refused at the limit, not read whole
  RawConn c(port());
  ASSERT_TRUE(c.ok());
  c.send_all("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n");
  std::string line = "X-Flood: " + std::string(1000, 'c') + "\r\n";
  for (int i = 0; i < 1000 && c.send_all(line); ++i) {
  }
  EXPECT_EQ(c.read_response(5).status, 431);
  EXPECT_TRUE(healthy(port()));
}

TEST_F(HttpHostile, ChunkedBodiesCountAgainstMaxBody) {
  const std::string ok_body = R"({"content":"hello chunked world"})";
  RawResponse ok = raw_request(port(), "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                       "Transfer-Encoding: chunked\r\n\r\n" + chunked(ok_body, 7));
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_NE(ok.body.find("\"tokens\""), std::string::npos) << ok.body;
  // a chunked body over the cap: 413, whatever the chunk sizes
  const std::string big = R"({"content":")" + std::string(kMaxBody + 100, 'a') + "\"}";
  RawResponse r = raw_request(port(), "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                      "Transfer-Encoding: chunked\r\n\r\n" + chunked(big, 4096));
  EXPECT_EQ(r.status, 413) << r.head;
  EXPECT_NE(r.body.find("body_too_large"), std::string::npos) << r.body;
  // one chunk declared far larger than the cap: refused on the declaration, no body byte needed
  RawConn c(port());
  ASSERT_TRUE(c.ok());
  c.send_all("POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
             "12000000\r\n");
  EXPECT_EQ(c.read_response(3).status, 413);
  // a declared 300 MB: 413 at once, before any body byte
  RawConn d(port());
  ASSERT_TRUE(d.ok());
  d.send_all("POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 300000000\r\n\r\n");
  auto t0 = Clock::now();
  EXPECT_EQ(d.read_response(3).status, 413);
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_TRUE(d.closed_within(5));
  // Expect: 100-continue with a body over the cap: 413 instead of 100
  RawResponse e = raw_request(port(), "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                      "Content-Length: 100000\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_EQ(e.status, 413);
  EXPECT_TRUE(healthy(port()));
}

TEST_F(HttpHostile, ExpectContinueIsAnswered) {
  RawConn c(port());
  ASSERT_TRUE(c.ok());
  const std::string body = R"({"content":"x"})";
  c.send_all("POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_EQ(c.read_response(3).status, 100);
  c.send_all(body);
  EXPECT_EQ(c.read_response(5).status, 200);
}

// Item 5 of the issue: each framing a proxy could read differently is refused with 400 and the connection closes.
TEST_F(HttpHostile, LooseFramingIsRefusedWith400) {
  const std::string b = R"({"content":"x"})";  // 15 bytes
  const std::string hdr = "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"two different Content-Length", hdr + "Content-Length: 15\r\nContent-Length: 4\r\n\r\n" + b},
      {"two equal Content-Length", hdr + "Content-Length: 15\r\nContent-Length: 15\r\n\r\n" + b},
      {"Content-Length list", hdr + "Content-Length: 15, 15\r\n\r\n" + b},
      {"Content-Length +15", hdr + "Content-Length: +15\r\n\r\n" + b},
      {"Content-Length -1", hdr + "Content-Length: -1\r\n\r\n" + b},
      {"Content-Length hex", hdr + "Content-Length: 0xf\r\n\r\n" + b},
      {"space before the colon", hdr + "Transfer-Encoding : chunked\r\n\r\n" + chunked(b, 5)},
      {"line without a colon", hdr + "Content-Length: 15\r\nNoColonHere\r\n\r\n" + b},
      {"NUL in a value", hdr + "Content-Length: 15\r\nX-A: a" + std::string(1, '\0') + "b\r\n\r\n" + b},
      {"NUL in a name", hdr + "Content-Length: 15\r\nX" + std::string(1, '\0') + "A: b\r\n\r\n" + b},
      {"CL and TE", hdr + "Content-Length: 15\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(b, 5)},
      {"TE and CL", hdr + "Transfer-Encoding: chunked\r\nContent-Length: 15\r\n\r\n" + chunked(b, 5)},
      {"TE chunked, identity", hdr + "Transfer-Encoding: chunked, identity\r\n\r\n" + chunked(b, 5)},
      {"TE identity", hdr + "Transfer-Encoding: identity\r\n\r\n" + b},
      {"TE gzip, chunked", hdr + "Transfer-Encoding: gzip, chunked\r\n\r\n" + chunked(b, 5)},
      {"two TE headers", hdr + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(b, 5)},
      {"TE on HTTP/1.0", "POST /tokenize HTTP/1.0\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
                             chunked(b, 5)},
      {"bad chunk size", hdr + "Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"},
      {"chunk without CRLF", hdr + "Transfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n0\r\n\r\n"},
      {"bare LF line ends", "GET /health HTTP/1.1\nHost: x\n\n"},
      {"no Host on HTTP/1.1", "GET /health HTTP/1.1\r\n\r\n"},
      {"two Hosts", "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil\r\n\r\n"},
      {"absolute-form target", "GET http://127.0.0.1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
      {"bad version", "GET /health HTTP/1.x\r\nHost: 127.0.0.1\r\n\r\n"},
  };
  for (const auto& [name, bytes] : cases) {
    SCOPED_TRACE(name);
    RawConn c(port());
    ASSERT_TRUE(c.ok());
    c.send_all(bytes);
    auto t0 = Clock::now();
    RawResponse r = c.read_response(5);
    EXPECT_EQ(r.status, 400) << r.head << "\n" << r.body;
    EXPECT_LT(seconds_since(t0), 2.0);  // never waits for more bytes (`TE: chunked, identity` hung before)
    EXPECT_TRUE(c.closed_within(5));    // after a framing error nothing more is read from this connection
  }
  // other versions: never served
  EXPECT_EQ(raw_request(port(), "GET /health HTTP/1.2\r\nHost: 127.0.0.1\r\n\r\n").status, 400);
  EXPECT_EQ(raw_request(port(), "GET /health HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n").status, 400);
  EXPECT_TRUE(healthy(port()));
}

TEST_F(HttpHostile, PipelinedRequestsAreAnsweredInOrder) {
  RawConn c(port());
  ASSERT_TRUE(c.ok());
  std::string burst;
  for (int i = 0; i < 4; ++i) burst += get("/health", "X-Request-Id: pipe" + std::to_string(i) + "\r\n");
  // a POST with a body in the middle of the burst, then more GETs
  burst += post("/tokenize", R"({"content":"pipelined"})", "X-Request-Id: pipe4\r\n");
  burst += get("/v1/models", "X-Request-Id: pipe5\r\n");
  auto t0 = Clock::now();
  ASSERT_TRUE(c.send_all(burst));
  for (int i = 0; i < 6; ++i) {
    RawResponse r = c.read_response(5);
    ASSERT_EQ(r.status, 200) << "response " << i << ": " << r.head;
    EXPECT_EQ(r.header("X-Request-Id"), "pipe" + std::to_string(i));
  }
  EXPECT_LT(seconds_since(t0), 2.0);  // no stall between them
  // and the connection stays usable
  c.send_all(get("/health"));
  EXPECT_EQ(c.read_response(5).status, 200);
}

TEST_F(HttpHostile, Http10GetsNoChunkedReplies) {
  RawConn c(port());
  ASSERT_TRUE(c.ok());
  const std::string body = R"({"prompt":"old client","max_tokens":4,"stream":true})";
  c.send_all("POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body);
  ASSERT_TRUE(c.closed_within(30));  // the body ends at the close
  const std::string& raw = c.pending();
  ASSERT_EQ(raw.rfind("HTTP/1.0 200", 0), 0u) << raw.substr(0, 200);
  std::string head = raw.substr(0, raw.find("\r\n\r\n"));
  std::string lower_head = head;
  std::transform(lower_head.begin(), lower_head.end(), lower_head.begin(), ::tolower);
  EXPECT_EQ(lower_head.find("transfer-encoding"), std::string::npos) << head;
  EXPECT_NE(lower_head.find("connection: close"), std::string::npos) << head;
  std::string sse = raw.substr(head.size() + 4);
  std::vector<ojson> ev;
  bool done = false;
  std::string why;
  EXPECT_TRUE(parse_sse(sse, ev, done, why)) << why << "\n" << sse;
  EXPECT_TRUE(done);
  // a non-stream HTTP/1.0 request gets a sized reply and a close
  RawResponse r = raw_request(port(), "GET /health HTTP/1.0\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.head.rfind("HTTP/1.0 200", 0), 0u);
}

TEST_F(HttpHostile, WrongMethodIs405WithAllowAndNonJsonIs415) {
  RawResponse a = raw_request(port(), post("/health", "{}"));
  EXPECT_EQ(a.status, 405);
  EXPECT_EQ(a.header("Allow"), "GET");
  RawResponse b = raw_request(port(), get("/v1/chat/completions"));
  EXPECT_EQ(b.status, 405);
  EXPECT_EQ(b.header("Allow"), "POST");
  EXPECT_NE(b.body.find("method_not_allowed"), std::string::npos);
  EXPECT_EQ(raw_request(port(), "DELETE /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").status, 405);
  EXPECT_EQ(raw_request(port(), get("/no/such/path")).status, 404);
  const std::string body = R"({"content":"x"})";
  for (const std::string type : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                 "", "application/jsonx"}) {
    SCOPED_TRACE(type);
    RawResponse r = raw_request(port(), post("/tokenize", body, "", type));
    EXPECT_EQ(r.status, 415) << r.body;
    EXPECT_NE(r.body.find("unsupported_media_type"), std::string::npos);
  }
  EXPECT_EQ(raw_request(port(), post("/tokenize", body, "", "Application/JSON; charset=utf-8")).status, 200);
}

TEST_F(HttpHostile, HostCheckOnLoopbackWithoutKey) {
  auto with_host = [&](const std::string& host) {
    return raw_request(port(), "GET /health HTTP/1.1\r\nHost: " + host + "\r\n\r\n").status;
  };
  EXPECT_EQ(with_host("127.0.0.1"), 200);
  EXPECT_EQ(with_host("127.0.0.1:9"), 200);
  EXPECT_EQ(with_host("localhost:8080"), 200);
  EXPECT_EQ(with_host("LOCALHOST"), 200);
  EXPECT_EQ(with_host("[::1]:8080"), 200);
  EXPECT_EQ(with_host("evil.example"), 403);
  EXPECT_EQ(with_host("evil.example:8080"), 403);
  EXPECT_EQ(with_host("localhost.evil.example"), 403);
  EXPECT_EQ(with_host("127.0.0.1.nip.io"), 403);
  // a rebinding page posting to the keyless server gets nothing
  RawResponse r = raw_request(port(), "POST /v1/completions HTTP/1.1\r\nHost: attacker.example\r\n"
                                      "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}");
  EXPECT_EQ(r.status, 403);
  EXPECT_NE(r.body.find("host_not_allowed"), std::string::npos);
}

TEST_F(HttpHostile, SlowlorisDoesNotStarveHealth) {
  const int kSlow = 64;
  std::vector<std::unique_ptr<RawConn>> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(std::make_unique<RawConn>(port()));
    ASSERT_TRUE(slow.back()->ok());
    slow.back()->send_all("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n");
  }
  std::atomic<bool> stop{false};
  std::thread dribble([&] {
    int n = 0;
    while (!stop.load()) {
      for (auto& c : slow) c->send_all("X-Slow" + std::to_string(n) + ": a\r\n");
      ++n;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  });
  std::vector<double> lat;
  auto t0 = Clock::now();
  while (seconds_since(t0) < 4) {
    auto s = Clock::now();
    RawResponse r = raw_request(port(), get("/health"), 2);
    lat.push_back(seconds_since(s));
    EXPECT_EQ(r.status, 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop.store(true);
  dribble.join();
  std::sort(lat.begin(), lat.end());
  const double p90 = lat[lat.size() * 9 / 10], worst = lat.back();
  std::printf("[ slowloris ] %d slow clients: /health p50 %.1f ms, p90 %.1f ms, max %.1f ms over %zu probes\n", kSlow,
              lat[lat.size() / 2] * 1e3, p90 * 1e3, worst * 1e3, lat.size());
  EXPECT_LT(p90, 0.1);
  EXPECT_LT(worst, 1.0);
}

TEST_F(HttpHostile, DisconnectIsSeenBehindUnreadBytes) {
  const double before = metric(*srv_, "lily_client_disconnects_total");
  RawConn c(port());
  ASSERT_TRUE(c.ok());
  const std::string body = R"({"prompt":"a long story","max_tokens":400,"logit_bias":{"151643":-100,"151645":-100}})";
  // the request, then one byte more (the start of a pipelined request), then the close
  c.send_all(post("/v1/completions", body) + "G");
  auto t0 = Clock::now();
  while (metric(*srv_, "lily_requests_running") != 1 && seconds_since(t0) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(metric(*srv_, "lily_requests_running"), 1);
  ::close(c.fd());
  auto tc = Clock::now();
  while (metric(*srv_, "lily_requests_running") != 0 && seconds_since(tc) < 5)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_LT(seconds_since(tc), 1.0) << "the generation went on for a departed client";
  EXPECT_EQ(metric(*srv_, "lily_client_disconnects_total"), before + 1);
}

// The header deadline, body read deadline, connection cap: on a server with short timeouts and 8 connections.
TEST(HttpHostileLimits, DeadlinesAndConnectionCap) {
  ServerProcess srv({"--ctx", "256", "--header-timeout", "1.5", "--read-timeout", "1.5", "--max-connections", "8",
                     "--http-threads", "1"});
  ASSERT_TRUE(srv.ok()) << srv.error();
  // the only worker waits on a long generation: /health and /metrics still answer at once (io threads)
  {
    RawConn gen(srv.port());
    ASSERT_TRUE(gen.ok());
    gen.send_all(post("/v1/completions", R"({"prompt":"busy","max_tokens":200,"logit_bias":{"151643":-100,"151645":-100}})"));
    auto t0 = Clock::now();
    while (metric(srv, "lily_requests_running") != 1 && seconds_since(t0) < 10)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(metric(srv, "lily_requests_running"), 1);
    for (int i = 0; i < 5; ++i) {
      auto s = Clock::now();
      EXPECT_EQ(raw_request(srv.port(), get("/health"), 2).status, 200);
      EXPECT_LT(seconds_since(s), 0.1);
    }
  }
  // a header that never ends: closed after the header deadline, not after each byte's timeout
  {
    RawConn c(srv.port());
    ASSERT_TRUE(c.ok());
    c.send_all("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    std::atomic<bool> stop{false};
    std::thread t([&] {
      while (!stop.load() && c.send_all("X: y\r\n")) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    });
    auto t0 = Clock::now();
    EXPECT_TRUE(c.closed_within(6));
    double took = seconds_since(t0);
    stop.store(true);
    t.join();
    EXPECT_EQ(c.pending(), "");  // closed, no response
    EXPECT_GT(took, 1.0);
    EXPECT_LT(took, 4.0);
  }
  // a body that stalls: closed after the read deadline
  {
    RawConn c(srv.port());
    ASSERT_TRUE(c.ok());
    c.send_all("POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"co");
    auto t0 = Clock::now();
    EXPECT_TRUE(c.closed_within(6));
    EXPECT_GT(seconds_since(t0), 1.0);
    EXPECT_LT(seconds_since(t0), 4.0);
  }
  // an idle connection is closed too (no request ever starts)
  {
    RawConn c(srv.port());
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(c.closed_within(6));
  }
  // the connection cap: 8 open, the 9th gets 503 and a close, and after they go /health answers again
  {
    std::vector<std::unique_ptr<RawConn>> held;
    for (int i = 0; i < 8; ++i) {
      // (a connection of the sections above may still be closing: half-closed replies drain for up to 2 s)
      auto t0 = Clock::now();
      int st = 0;
      while (st != 200 && seconds_since(t0) < 5) {
        held.push_back(std::make_unique<RawConn>(srv.port()));
        ASSERT_TRUE(held.back()->ok());
        held.back()->send_all(get("/health"));  // a kept-alive connection, answered
        st = held.back()->read_response(5).status;
        if (st != 200) {
          held.pop_back();
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      }
      ASSERT_EQ(st, 200) << "connection " << i;
    }
    RawResponse r = raw_request(srv.port(), get("/health"));
    EXPECT_EQ(r.status, 503);
    EXPECT_NE(r.body.find("too_many_connections"), std::string::npos) << r.body;
    EXPECT_FALSE(r.header("Retry-After").empty());
    held.clear();
    auto t0 = Clock::now();
    int st = 0;
    while (st != 200 && seconds_since(t0) < 5) {
      st = raw_request(srv.port(), get("/health")).status;
      if (st != 200) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(st, 200);
  }
}

TEST(HttpHostileLimits, AllowedHostsKeyComparisonAndCors) {
  ServerProcess srv({"--ctx", "256", "--api-key", "k3y-secret", "--allowed-hosts", "api.example,127.0.0.1", "--cors",
                     "https://app.example"});
  ASSERT_TRUE(srv.ok()) << srv.error();
  auto status = [&](const std::string& host, const std::string& auth) {
    const std::string body = R"({"content":"x"})";
    return raw_request(srv.port(), "POST /tokenize HTTP/1.1\r\nHost: " + host + "\r\n" + auth +
                                       "Content-Type: application/json\r\nContent-Length: " +
                                       std::to_string(body.size()) + "\r\n\r\n" + body)
        .status;
  };
  const std::string good = "Authorization: Bearer k3y-secret\r\n";
  EXPECT_EQ(status("api.example", good), 200);
  EXPECT_EQ(status("api.example:443", good), 200);
  EXPECT_EQ(status("127.0.0.1:1", good), 200);
  EXPECT_EQ(status("localhost", good), 403);  // not listed
  EXPECT_EQ(status("api.example", ""), 401);
  EXPECT_EQ(status("api.example", "Authorization: Bearer k3y-secre\r\n"), 401);   // a prefix
  EXPECT_EQ(status("api.example", "Authorization: Bearer k3y-secret2\r\n"), 401); // longer
  EXPECT_EQ(status("api.example", "Authorization: Bearer K3Y-SECRET\r\n"), 401);
  EXPECT_EQ(status("api.example", "X-Api-Key: k3y-secret\r\n"), 200);
  // CORS: the preflight needs no key; every answer carries the allowed origin
  RawResponse pre = raw_request(srv.port(), "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: api.example\r\n"
                                            "Origin: https://app.example\r\nAccess-Control-Request-Method: POST\r\n\r\n");
  EXPECT_EQ(pre.status, 204);
  EXPECT_EQ(pre.header("Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_NE(pre.header("Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
  RawResponse h = raw_request(srv.port(), "GET /health HTTP/1.1\r\nHost: api.example\r\n\r\n");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.header("Access-Control-Allow-Origin"), "https://app.example");
}

// SIGTERM while a non-stream request runs: its reply (computed during the drain) still goes out, then exit 0.
TEST(HttpHostileLimits, SigtermDrainDeliversANonStreamReply) {
  ServerProcess srv({"--ctx", "256", "--drain", "20"});
  ASSERT_TRUE(srv.ok()) << srv.error();
  RawConn c(srv.port());
  ASSERT_TRUE(c.ok());
  c.send_all(post("/v1/completions", R"({"prompt":"drain","max_tokens":120,"logit_bias":{"151643":-100,"151645":-100}})"));
  auto t0 = Clock::now();
  while (metric(srv, "lily_requests_running") != 1 && seconds_since(t0) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(metric(srv, "lily_requests_running"), 1);
  kill(srv.pid(), SIGTERM);
  RawResponse r = c.read_response(30);
  EXPECT_EQ(r.status, 200) << r.head << r.body;
  auto j = ojson::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.body;
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r.header("Connection"), "close");
  EXPECT_EQ(srv.stop(0, 30), 0);
}
