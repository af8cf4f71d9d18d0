// Raw-socket HTTP helpers for the hostile-client tests: exact bytes out, responses parsed by hand, every wait
// bounded.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

namespace lily::test {

struct RawResponse {
  int status = 0;        // 0: no complete response
  std::string head;      // status line and headers
  std::string body;      // de-chunked
  std::string header(const std::string& name) const {
    std::string h = "\r\n";
    for (char c : head) h += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string key = "\r\n";
    for (char c : name) key += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    key += ":";
    size_t p = h.find(key);
    if (p == std::string::npos) return "";
    p += key.size();
    size_t e = h.find("\r\n", p);
    std::string v = head.substr(p - 2, e - p);
    while (!v.empty() && v.front() == ' ') v.erase(0, 1);
    return v;
  }
};

class RawConn {
 public:
  explicit RawConn(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~RawConn() {
    if (fd_ >= 0) close(fd_);
  }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // Sends all of s (false when the peer is gone).
  bool send_all(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads what is available within timeout_s into the pending buffer; false on close / error / timeout with
  // nothing read.
  bool read_some(double timeout_s) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout_s * 1000)) <= 0) return false;
    char buf[16384];
    ssize_t n = recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) {
      closed_ = true;
      return false;
    }
    pending_.append(buf, static_cast<size_t>(n));
    return true;
  }
  // The next complete response (Content-Length, chunked, or until close), within timeout_s.
  RawResponse read_response(double timeout_s = 5) {
    auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      RawResponse r;
      size_t used = 0;
      if (parse(r, used)) {
        pending_.erase(0, used);
        return r;
      }
      double left = timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (left <= 0 || closed_) return {};
      if (!read_some(left) && closed_) {
        RawResponse c;  // a response that ends at the close (HTTP/1.0 streams)
        if (parse(c, used, true)) {
          pending_.erase(0, used);
          return c;
        }
        return {};
      }
    }
  }
  // True when the server closes the connection within timeout_s (bytes before the close are kept).
  bool closed_within(double timeout_s) {
    auto t0 = std::chrono::steady_clock::now();
    while (!closed_) {
      double left = timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (left <= 0) return false;
      read_some(left);
    }
    return true;
  }
  const std::string& pending() const { return pending_; }

 private:
  bool parse(RawResponse& r, size_t& used, bool at_close = false) const {
    size_t he = pending_.find("\r\n\r\n");
    if (he == std::string::npos) return false;
    r.head = pending_.substr(0, he);
    if (r.head.rfind("HTTP/1.", 0) != 0 || r.head.size() < 12) return false;
    r.status = std::atoi(r.head.c_str() + 9);
    size_t pos = he + 4;
    std::string te = r.header("Transfer-Encoding"), cl = r.header("Content-Length");
    if (r.status == 100) {  // an interim response: report it as it is
      used = pos;
      return true;
    }
    if (te == "chunked") {
      std::string body;
      for (;;) {
        size_t le = pending_.find("\r\n", pos);
        if (le == std::string::npos) return false;
        size_t n = std::strtoul(pending_.c_str() + pos, nullptr, 16);
        pos = le + 2;
        if (n == 0) {
          if (pending_.size() < pos + 2) return false;
          used = pos + 2;
          r.body = body;
          return true;
        }
        if (pending_.size() < pos + n + 2) return false;
        body += pending_.substr(pos, n);
        pos += n + 2;
      }
    }
    if (!cl.empty()) {
      size_t n = std::strtoul(cl.c_str(), nullptr, 10);
      if (pending_.size() < pos + n) return false;
      r.body = pending_.substr(pos, n);
      used = pos + n;
      return true;
    }
    if (r.status == 204 || r.status == 304) {
      used = pos;
      return true;
    }
    if (!at_close) return false;
    r.body = pending_.substr(pos);
    used = pending_.size();
    return true;
  }

  int fd_ = -1;
  bool closed_ = false;
  std::string pending_;
};

// One request over a fresh connection; the first response.
inline RawResponse raw_request(int port, const std::string& bytes, double timeout_s = 5) {
  RawConn c(port);
  if (!c.ok() || !c.send_all(bytes)) return {};
  return c.read_response(timeout_s);
}

}  // namespace lily::test
