// Beast connection loop, limits and worker pool (see http_transport.h).
#include "server/http_transport.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "server/api_error.h"
#include "util/check.h"
#include "util/log.h"

namespace lily::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

std::chrono::milliseconds ms(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

constexpr size_t kDrainBytes = size_t{1} << 20;  // read and dropped after a refusal, so the reply is not reset
constexpr double kDrainSeconds = 2;
constexpr int kMaxRejecting = 64;                 // over-limit connections being answered 503 at once
constexpr size_t kMinBodyBudget = size_t{256} << 20;  // request bodies held at once, all connections (at least)

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 19) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

std::string reason(int status) {
  auto r = http::obsolete_reason(static_cast<http::status>(status));
  return r.empty() ? "Unknown" : std::string(r);
}

// Blocking handlers run here, off the io threads. A bounded backlog: beyond it a request is refused (503).
class WorkerPool {
 public:
  void start(int n, int backlog) {
    backlog_ = backlog;
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { run(); });
  }
  bool post(std::function<void()> f) {
    std::lock_guard l(mu_);
    if (stop_ || static_cast<int>(q_.size()) >= backlog_) return false;
    q_.push_back(std::move(f));
    cv_.notify_one();
    return true;
  }
  void stop() {
    {
      std::lock_guard l(mu_);
      stop_ = true;
      q_.clear();
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock l(mu_);
        cv_.wait(l, [&] { return stop_ || !q_.empty(); });
        if (stop_) return;
        f = std::move(q_.front());
        q_.pop_front();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  std::vector<std::thread> threads_;
  int backlog_ = 0;
  bool stop_ = false;
};

}  // namespace

struct HttpTransport::Impl {
  HttpLimits lim;
  HttpCallbacks cb;
  std::atomic<int> active{0};     // counted connections
  std::atomic<int> rejecting{0};  // over-limit connections being answered
  std::atomic<bool> stopped{false};   // stop() began: accept no more
  std::atomic<bool> io_stopped{false};  // the io threads are stopping: writes from workers give up
  std::atomic<int> busy{0};           // requests read and not yet answered (stop() lets them finish, bounded)
  std::atomic<size_t> body_bytes{0};  // request body bytes held by all connections
  size_t body_budget = 0;             // cap on body_bytes (503 above): many slow large bodies cannot exhaust memory
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::unique_ptr<net::steady_timer> retry_timer;
  std::vector<std::thread> io;
  WorkerPool pool;

  void accept();
};

namespace {

// One client connection: reads a request, answers it, then the next (pipelined requests wait in buf_ and are
// answered in order). All socket operations run on the connection's strand.
class Conn : public std::enable_shared_from_this<Conn> {
 public:
  Conn(HttpTransport::Impl& t, tcp::socket s, bool reject)
      : t_(t), stream_(std::move(s)), buf_(t.lim.max_header_bytes + 65536), reject_(reject) {
    (reject_ ? t_.rejecting : t_.active).fetch_add(1);
  }
  ~Conn() {
    mark_busy(false);
    uncharge();
    (reject_ ? t_.rejecting : t_.active).fetch_sub(1);
  }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      if (self->reject_) {
        self->version_ = 11;
        self->fail(503, "too_many_connections", "the server has too many open connections; retry later", 1);
      } else {
        self->next_request(true);
      }
    });
  }

  // Worker side: one write of `data`, waited for (bounded by the write deadline). False once the client is gone.
  bool write_blocking(std::string data) {
    if (broken_.load()) return false;
    auto done = std::make_shared<std::promise<bool>>();
    auto fut = done->get_future();
    auto buf = std::make_shared<std::string>(std::move(data));
    net::post(stream_.get_executor(), [self = shared_from_this(), buf, done] {
      self->stream_.expires_after(ms(self->t_.lim.write_timeout_s));
      net::async_write(self->stream_, net::buffer(*buf),
                       [buf, done](beast::error_code ec, size_t) { done->set_value(!ec); });
    });
    while (fut.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      if (t_.io_stopped.load()) {
        broken_.store(true);
        return false;
      }
    }
    bool ok = fut.get();
    if (!ok) broken_.store(true);
    return ok;
  }

 private:
  class Sink : public StreamSink {
   public:
    Sink(Conn& c, bool chunked) : c_(c), chunked_(chunked) {}
    bool write(const std::string& data) override {
      if (data.empty()) return !c_.broken_.load();
      if (!chunked_) return c_.write_blocking(data);
      char size[24];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      return c_.write_blocking(size + data + "\r\n");
    }

   private:
    Conn& c_;
    bool chunked_;
  };

  // The body bytes this connection holds count against the transport's budget until its next request.
  bool charge(size_t total) {
    if (total <= charged_) return true;
    const size_t more = total - charged_;
    if (t_.body_bytes.fetch_add(more) + more > t_.body_budget) {
      t_.body_bytes.fetch_sub(more);
      return false;
    }
    charged_ = total;
    return true;
  }
  void uncharge() {
    t_.body_bytes.fetch_sub(charged_);
    charged_ = 0;
  }
  void mark_busy(bool b) {
    if (busy_.exchange(b) != b) b ? t_.busy.fetch_add(1) : t_.busy.fetch_sub(1);
  }

  void next_request(bool first) {
    uncharge();
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(t_.lim.max_header_bytes));
    parser_->body_limit(t_.lim.max_body);
    req_ = HttpRequest{};
    if (first || buf_.size() > 0) return read_header();
    // Keep-alive: wait (idle timeout) for the next request's first bytes, then give its header the deadline.
    stream_.expires_after(ms(t_.lim.idle_timeout_s));
    stream_.async_read_some(buf_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) return self->close_now();
      self->buf_.commit(n);
      self->read_header();
    });
  }

  void read_header() {
    stream_.expires_after(ms(t_.lim.header_timeout_s));
    http::async_read_header(stream_, buf_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset)
      return close_now();
    // A deadline that expired closed the socket (tcp_stream): nothing more can be said to this client.
    if (ec == beast::error::timeout) return close_now();
    if (ec == http::error::header_limit)
      return fail(431, "header_too_large", "the request header exceeds " +
                                               std::to_string(t_.lim.max_header_bytes) + " bytes");
    if (ec == http::error::body_limit) return too_large();
    if (ec) return fail(400, "bad_request", "malformed HTTP request: " + ec.message());

    auto& h = parser_->get();
    version_ = h.version();
    keep_alive_ = parser_->keep_alive();
    req_.method = std::string(h.method_string());
    req_.target = std::string(h.target());
    req_.version = version_;
    int n_cl = 0, n_te = 0, n_host = 0;
    std::string te, cl;
    for (const auto& f : h) {
      std::string name(f.name_string()), value(f.value());
      if (name.size() + value.size() + 4 > t_.lim.max_line)
        return fail(431, "header_too_large", "the header line '" + name.substr(0, 64) + "' exceeds " +
                                                 std::to_string(t_.lim.max_line) + " bytes");
      if (f.name() == http::field::content_length) ++n_cl, cl = trim(value);
      if (f.name() == http::field::transfer_encoding) ++n_te, te = trim(value);
      if (f.name() == http::field::host) ++n_host;
      req_.headers.emplace_back(std::move(name), std::move(value));
    }
    if (static_cast<int>(req_.headers.size()) > t_.lim.max_headers)
      return fail(431, "too_many_headers", "the request has more than " + std::to_string(t_.lim.max_headers) +
                                               " header fields");
    if (version_ != 10 && version_ != 11) {
      version_ = 11;
      return fail(505, "http_version_not_supported", "only HTTP/1.0 and HTTP/1.1 are served");
    }
    if (req_.target.size() > t_.lim.max_line) return fail(414, "uri_too_long", "the request target is too long");
    if (req_.target.empty() || req_.target[0] != '/')
      return fail(400, "bad_request", "the request target must be a path (origin form)");
    // Strict framing (RFC 9112 §6): one Content-Length of digits only, or Transfer-Encoding exactly "chunked"
    // on HTTP/1.1, never both; anything else could be read differently by a proxy in front (request smuggling).
    if (n_cl > 1) return fail(400, "bad_request", "more than one Content-Length header");
    if (n_cl == 1 && !all_digits(cl)) return fail(400, "bad_request", "Content-Length must be a decimal number");
    if (n_te > 0 && n_cl > 0) return fail(400, "bad_request", "both Content-Length and Transfer-Encoding");
    if (n_te > 1 || (n_te == 1 && !iequals(te, "chunked")))
      return fail(400, "bad_request", "only 'Transfer-Encoding: chunked' is supported");
    if (n_te > 0 && version_ == 10) return fail(400, "bad_request", "Transfer-Encoding on an HTTP/1.0 request");
    if (n_host > 1 || (version_ == 11 && n_host == 0))
      return fail(400, "bad_request", "an HTTP/1.1 request needs exactly one Host header");
    req_.path = req_.target.substr(0, req_.target.find('?'));
    req_.fd = stream_.socket().native_handle();

    HttpResponse res;
    bool answered = false;
    try {
      answered = t_.cb.on_header(req_, res);
    } catch (const std::exception& e) {
      res = transport_error(500, "internal_error", e.what());
      answered = true;
    }
    if (answered) {
      t_.cb.decorate(req_, res);
      return send(std::move(res), !parser_->is_done());
    }
    if (parser_->is_done()) return dispatch();
    // A declared length is reserved at once (the body string is sized for it); chunked bodies as they grow.
    if (auto len = parser_->content_length(); len && !charge(static_cast<size_t>(*len)))
      return fail(503, "server_busy", "too many request bodies are being received; retry later", 1);
    if (version_ == 11 && iequals(trim(req_.header("Expect")), "100-continue")) {
      auto msg = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      stream_.expires_after(ms(t_.lim.write_timeout_s));
      return net::async_write(stream_, net::buffer(*msg), [self = shared_from_this(), msg](beast::error_code ec, size_t) {
        if (ec) return self->close_now();
        self->read_body();
      });
    }
    read_body();
  }

  void read_body() {
    stream_.expires_after(ms(t_.lim.read_timeout_s));
    http::async_read_some(stream_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec == http::error::body_limit) return self->too_large();
      if (ec == beast::error::timeout) return self->close_now();
      if (ec == http::error::end_of_stream || ec == net::error::eof || ec == http::error::partial_message ||
          ec == net::error::connection_reset)
        return self->close_now();
      if (ec) return self->fail(400, "bad_request", "malformed request body framing: " + ec.message());
      if (!self->charge(self->parser_->get().body().size()))
        return self->fail(503, "server_busy", "too many request bodies are being received; retry later", 1);
      if (!self->parser_->is_done()) return self->read_body();
      self->req_.body = std::move(self->parser_->get().body());
      self->dispatch();
    });
  }

  void dispatch() {
    mark_busy(true);
    if (!req_.blocking) {
      HttpResponse res;
      run(req_, res);
      if (res.stream) {  // streams block: they always run on a worker
        res = transport_error(500, "internal_error", "a streamed response on the io thread");
      }
      return send(std::move(res), false);
    }
    auto self = shared_from_this();
    auto req = std::make_shared<HttpRequest>(std::move(req_));
    bool queued = t_.pool.post([self, req] {
      HttpResponse res;
      self->run(*req, res);
      if (!res.stream) {
        net::post(self->stream_.get_executor(),
                  [self, r = std::make_shared<HttpResponse>(std::move(res))] { self->send(std::move(*r), false); });
        return;
      }
      self->stream(*req, res);
    });
    if (!queued) {
      req_ = std::move(*req);
      fail(503, "server_busy", "every HTTP worker is busy; retry later", 1);
    }
  }

  void run(HttpRequest& req, HttpResponse& res) {
    try {
      t_.cb.on_request(req, res);
    } catch (const std::exception& e) {
      res = transport_error(500, "internal_error", e.what());
    }
    t_.cb.decorate(req, res);
  }

  // Takes the Connection header out of a handler's response: the transport decides keep-alive.
  bool want_close(HttpResponse& res) {
    bool close = res.close;
    for (auto it = res.headers.begin(); it != res.headers.end();) {
      if (iequals(it->first, "Connection")) {
        if (iequals(trim(it->second), "close")) close = true;
        it = res.headers.erase(it);
      } else {
        ++it;
      }
    }
    return close || !keep_alive_ || (t_.cb.closing && t_.cb.closing());
  }

  // Worker side: a streamed response (headers, body chunks, last chunk), then the connection's next request.
  void stream(const HttpRequest& req, HttpResponse& res) {
    const bool close = want_close(res) || version_ != 11;
    std::string head = "HTTP/1." + std::string(version_ == 11 ? "1" : "0") + " " + std::to_string(res.status) + " " +
                       reason(res.status) + "\r\n";
    for (const auto& [k, v] : res.headers) head += k + ": " + v + "\r\n";
    if (!res.content_type.empty()) head += "Content-Type: " + res.content_type + "\r\n";
    if (version_ == 11) head += "Transfer-Encoding: chunked\r\n";  // HTTP/1.0: the body ends at the close
    if (close) head += "Connection: close\r\n";
    head += "\r\n";
    bool ran = false, ok = false;
    if (write_blocking(std::move(head))) {
      Sink sink(*this, version_ == 11);
      ok = res.stream(sink);
      ran = true;
      if (ok && version_ == 11) ok = write_blocking("0\r\n\r\n");
    }
    if (res.stream_done) res.stream_done(ran);
    auto self = shared_from_this();
    const bool keep = ok && !close && !broken_.load();
    net::post(stream_.get_executor(), [self, keep] {
      self->mark_busy(false);
      if (keep) self->next_request(false);
      else self->graceful_close();
    });
  }

  // Strand side: writes a whole response; body_pending: the request body was not read (the connection closes).
  void send(HttpResponse res, bool body_pending) {
    const bool keep = !want_close(res) && !body_pending;
    auto msg = std::make_shared<http::response<http::string_body>>();
    msg->version(version_);
    msg->result(static_cast<unsigned>(res.status));
    for (const auto& [k, v] : res.headers) msg->insert(k, v);
    if (!res.content_type.empty()) msg->set(http::field::content_type, res.content_type);
    if (res.status != 204 && res.status != 304) msg->body() = std::move(res.body);
    msg->keep_alive(keep);
    msg->prepare_payload();
    stream_.expires_after(ms(t_.lim.write_timeout_s));
    http::async_write(stream_, *msg, [self = shared_from_this(), msg, keep](beast::error_code ec, size_t) {
      self->mark_busy(false);
      if (ec) return self->close_now();
      if (keep) self->next_request(false);
      else self->graceful_close();
    });
  }

  void too_large() {
    fail(413, "body_too_large", "the request body exceeds " + std::to_string(t_.lim.max_body) + " bytes (--max-body)");
  }

  // A refusal by the transport: the error, then the connection closes (its framing can no longer be trusted).
  void fail(int status, const std::string& code, const std::string& message, int retry_after = 0) {
    HttpResponse res = transport_error(status, code, message);
    if (retry_after > 0) res.set_header("Retry-After", std::to_string(retry_after));
    if (t_.cb.decorate) t_.cb.decorate(req_, res);
    res.close = true;
    send(std::move(res), true);
  }

  // Half-closes, then reads and drops what the client still sends (bounded), so the reply is not lost to a reset.
  void graceful_close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close_now();
    drained_ = 0;
    drain();
  }
  void drain() {
    stream_.expires_after(ms(kDrainSeconds));
    stream_.async_read_some(net::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->drained_ += n;
      if (ec || self->drained_ > kDrainBytes) return self->close_now();
      self->drain();
    });
  }

  void close_now() {
    broken_.store(true);
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  HttpTransport::Impl& t_;
  beast::tcp_stream stream_;
  beast::flat_buffer buf_;                                   // bytes read, not yet parsed (pipelined requests)
  std::optional<http::request_parser<http::string_body>> parser_;
  HttpRequest req_;                                          // the request being read
  int version_ = 11;                                         // of the current request
  bool keep_alive_ = false;                                  // the current request allows another after it
  bool reject_ = false;                                      // over the connection limit: 503 and close
  std::atomic<bool> broken_{false};                          // a write failed or the socket closed
  std::array<char, 4096> scratch_{};
  size_t drained_ = 0;
  size_t charged_ = 0;                                       // body bytes counted in t_.body_bytes
  std::atomic<bool> busy_{false};                            // counted in t_.busy
};

}  // namespace

void HttpTransport::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket s) {
    if (stopped.load() || !acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors (or a transient error): pause briefly instead of spinning.
      log::warn("accept failed: ", ec.message());
      retry_timer->expires_after(std::chrono::milliseconds(50));
      retry_timer->async_wait([this](beast::error_code) {
        if (!stopped.load()) accept();
      });
      return;
    }
    beast::error_code opt_ec;
    s.set_option(tcp::no_delay(true), opt_ec);
    if (active.load() < lim.max_connections) {
      std::make_shared<Conn>(*this, std::move(s), false)->start();
    } else if (rejecting.load() < kMaxRejecting) {
      std::make_shared<Conn>(*this, std::move(s), true)->start();
    } else {
      s.close(opt_ec);
    }
    accept();
  });
}

HttpTransport::HttpTransport(HttpLimits limits, HttpCallbacks cb) : impl_(std::make_unique<Impl>()) {
  impl_->lim = limits;
  impl_->body_budget = std::max(kMinBodyBudget, 4 * limits.max_body);
  impl_->cb = std::move(cb);
  impl_->retry_timer = std::make_unique<net::steady_timer>(impl_->ioc);
}

HttpTransport::~HttpTransport() { stop(); }

int HttpTransport::bind(const std::string& host, int port) {
  auto& a = impl_->acceptor;
  beast::error_code ec;
  tcp::endpoint ep;
  auto addr = net::ip::make_address(host, ec);
  if (!ec) {
    ep = tcp::endpoint(addr, static_cast<unsigned short>(port));
  } else {
    tcp::resolver r(impl_->ioc);
    auto results = r.resolve(host, std::to_string(port), ec);
    if (ec || results.empty()) fail("cannot resolve the --host '", host, "': ", ec.message());
    ep = results.begin()->endpoint();
  }
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) fail("cannot listen on ", host, ":", port, " (", ec.message(), ")");
  return a.local_endpoint().port();
}

void HttpTransport::start() {
  impl_->pool.start(std::max(1, impl_->lim.workers), std::max(1, impl_->lim.worker_backlog));
  impl_->accept();
  for (int i = 0; i < std::max(1, impl_->lim.io_threads); ++i)
    impl_->io.emplace_back([this] {
      for (;;) {
        try {
          impl_->ioc.run();
          return;
        } catch (const std::exception& e) {  // a handler threw: log it, keep serving
          log::error("http io thread: ", e.what());
        }
      }
    });
}

void HttpTransport::stop() {
  if (impl_->stopped.exchange(true)) return;
  net::post(impl_->ioc, [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
  });
  // Answers already computed (a drained request's reply) still go out; bounded.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (!impl_->io.empty() && impl_->busy.load() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  impl_->io_stopped.store(true);
  if (impl_->io.empty()) {
    beast::error_code ec;
    impl_->acceptor.close(ec);
  }
  impl_->ioc.stop();
  for (auto& t : impl_->io)
    if (t.joinable()) t.join();
  impl_->pool.stop();
}

int HttpTransport::connections() const { return impl_->active.load(); }

HttpResponse transport_error(int status, const std::string& code, const std::string& message) {
  const char* type = status == 503 ? "unavailable_error" : status >= 500 ? "server_error" : "invalid_request_error";
  ApiError e(status, type, code, "", message);
  HttpResponse res;
  res.status = status;
  res.set_content(e.to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
  return res;
}

}  // namespace lily::server
