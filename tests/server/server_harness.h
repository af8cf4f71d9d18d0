// Test harness: runs the real `lily serve --demo` binary (tiny random-weight checkpoint, real Qwen3 byte-level
// BPE tokenizer and Qwen3.6 chat template) on a free loopback port, and small HTTP helpers around it.
// Every wait is bounded; the process is killed if it does not exit.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/http_client.h"

namespace lily::test {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

class ServerProcess {
 public:
  // Starts `lily serve --demo --port 0 ARGS` (without --demo when demo is false: ARGS name the model); waits
  // (<= 180 s) until /health is 200.
  explicit ServerProcess(std::vector<std::string> args, double ready_timeout_s = 180, bool demo = true) {
    log_ = std::string(LILY_BINARY_DIR) + "/test-server-" + std::to_string(getpid()) + "-" +
           std::to_string(counter()++) + ".log";
    std::vector<std::string> argv = {std::string(LILY_BINARY_DIR) + "/lily", "serve", "--port", "0",
                                     "--host", "127.0.0.1"};
    if (demo) argv.insert(argv.begin() + 2, "--demo");
    argv.insert(argv.end(), args.begin(), args.end());
    std::string last = "nothing yet";
    if (start(argv, ready_timeout_s, last)) return;
    error_ = "server did not become ready (/health: " + last + "); log:\n" + log_text();
  }
  ~ServerProcess() { stop(SIGTERM, 20); }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string log_text() const {
    std::ifstream f(log_);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  lily::server::HttpClient client(double timeout_s = 60) const {
    lily::server::HttpClient c("127.0.0.1", port_);
    c.set_timeout(timeout_s);
    c.set_connect_timeout(5);
    return c;
  }
  // Sends `sig` and waits up to timeout_s for the exit; returns the exit status (-1: killed / not exited).
  int stop(int sig, double timeout_s) {
    if (pid_ <= 0) return exit_status_;
    kill(pid_, sig);
    auto t0 = Clock::now();
    while (seconds_since(t0) < timeout_s) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        exit_status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        return exit_status_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    exit_status_ = -1;
    return -1;
  }

 private:
  // Forks `argv` with stderr to log_ and waits up to limit_s for /health 200 (true); `last` says what /health
  // last answered.
  bool start(std::vector<std::string> argv, double limit_s, std::string& last) {
    // Emptied here, not only by the child: a log left by an earlier run under the same name (pids repeat)
    // would otherwise show an old port until the child has opened it.
    std::ofstream(log_, std::ios::trunc).close();
    pid_ = fork();
    if (pid_ == 0) {
      setenv("XDG_CACHE_HOME", (std::string(LILY_BINARY_DIR) + "/test-cache").c_str(), 1);
      setenv("LILY_LOG", "warn", 1);
      FILE* f = freopen(log_.c_str(), "w", stderr);
      (void)f;
      std::vector<char*> av;
      for (auto& a : argv) av.push_back(a.data());
      av.push_back(nullptr);
      execv(av[0], av.data());
      _exit(127);
    }
    auto t0 = Clock::now();
    std::regex re("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    while (seconds_since(t0) < limit_s) {
      if (port_ == 0) {
        std::smatch m;
        std::string text = log_text();
        if (std::regex_search(text, m, re)) port_ = std::stoi(m[1]);
      }
      if (port_ != 0) {
        auto r = client(2).get("/health");
        if (r && r->status == 200) return true;
        last = r ? "HTTP " + std::to_string(r->status) : "no answer";
      }
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  static int& counter() {
    static int c = 0;
    return c;
  }
  pid_t pid_ = -1;
  int port_ = 0;
  int exit_status_ = -1;
  std::string log_, error_;
};

// A gauge or counter without labels from a /metrics text, or -1.
inline double metric_in(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  return -1;
}

inline std::string metrics_text(const ServerProcess& s) {
  auto r = s.client().get("/metrics");
  return r ? r->body : std::string();
}

// A gauge or counter without labels from the server's /metrics, or -1.
inline double metric(const ServerProcess& s, const std::string& name) { return metric_in(metrics_text(s), name); }

inline ojson post_json(const ServerProcess& s, const std::string& path, const ojson& body, int* status = nullptr,
                       lily::server::HttpHeaders headers = {}) {
  auto r = s.client().post(path, body.dump(), "application/json", headers);
  if (!r) {
    if (status) *status = -1;
    return nullptr;
  }
  if (status) *status = r->status;
  auto j = ojson::parse(r->body, nullptr, false);
  return j;
}

// The raw SSE body of a streaming request (the bytes after the HTTP headers, chunked encoding removed).
inline std::string post_stream(const ServerProcess& s, const std::string& path, const ojson& body, int* status) {
  std::string out;
  auto res = s.client().send("POST", path, {{"Content-Type", "application/json"}}, body.dump(),
                             [&](const std::string& piece) {
                               out += piece;
                               return true;
                             });
  *status = res ? res->status : -1;
  if (res && res->status != 200) out = res->body;
  return out;
}

// Splits an SSE body into the JSON payloads of its `data:` events; checks the exact framing on the way.
// Returns false (with why) on any framing violation; `done` is set when the stream ended with [DONE].
inline bool parse_sse(const std::string& body, std::vector<ojson>& events, bool& done, std::string& why) {
  size_t pos = 0;
  done = false;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) { why = "event without the blank-line terminator at " + std::to_string(pos); return false; }
    std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind(":", 0) == 0) continue;  // comment (ping)
    if (ev.rfind("data: ", 0) != 0) { why = "event does not start with 'data: ': " + ev.substr(0, 40); return false; }
    if (ev.find('\n') != std::string::npos) { why = "multi-line event"; return false; }
    std::string payload = ev.substr(6);
    if (done) { why = "data after [DONE]"; return false; }
    if (payload == "[DONE]") { done = true; continue; }
    auto j = ojson::parse(payload, nullptr, false);
    if (j.is_discarded()) { why = "payload is not JSON: " + payload.substr(0, 80); return false; }
    events.push_back(std::move(j));
  }
  return true;
}

// A streaming /v1/completions request (body["stream"] set) on a raw socket, read until its first text chunk (or
// 60 s): the socket is left open for the caller to close (a client that goes away mid-stream). fd -1: no
// connection.
struct RawStream {
  int fd = -1;
  std::string got;                      // the bytes read so far (headers and the first events)
  bool has_text() const { return got.find("\"text\"") != std::string::npos; }
};
inline RawStream open_stream(const ServerProcess& srv, const ojson& body) {
  RawStream r;
  r.fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(srv.port()));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  ojson b = body;
  b["stream"] = true;
  const std::string s = b.dump();
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Content-Length: " + std::to_string(s.size()) + "\r\n\r\n" + s;
  if (connect(r.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      send(r.fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) {
    close(r.fd);
    r.fd = -1;
    return r;
  }
  char buf[4096];
  const auto t0 = Clock::now();
  while (!r.has_text() && seconds_since(t0) < 60) {
    const ssize_t n = recv(r.fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    r.got.append(buf, static_cast<size_t>(n));
  }
  return r;
}

// A client that goes away after the first text chunk of a stream; whether one arrived.
inline bool abandon_stream(const ServerProcess& srv, const ojson& body) {
  RawStream r = open_stream(srv, body);
  if (r.fd >= 0) close(r.fd);
  return r.has_text();
}

}  // namespace lily::test
