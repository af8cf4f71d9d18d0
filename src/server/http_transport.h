// The HTTP/1.1 transport of `lily serve`, on Boost.Beast (Boost 1.81, header-only, Debian's libboost1.81-dev).
//
// Why Beast: the server faces unauthenticated clients, so every limit must be ours to set and to test. Beast's
// parser takes a header-size limit and a body limit that counts chunked bodies too, rejects conflicting framing
// (two Content-Lengths, Content-Length with Transfer-Encoding), and its tcp_stream gives every asynchronous read
// and write a deadline; the connection loop here adds what Beast leaves to the application (header count and
// line length, a strict Transfer-Encoding, pipelining in order, a connection cap). cpp-httplib 0.11 (the former
// transport) is a compiled Debian library whose limits and timeouts could not be changed from the project.
//
// Design: a few io threads run every socket asynchronously, one strand per connection, so slow or idle
// clients cost a socket and a timer, never a thread. Requests whose handler may block (tokenising, waiting for
// a generation) run on a pool of worker threads; their responses (and SSE streams, chunk by chunk) are handed
// back to the connection's strand. Cheap requests (/health, /metrics, early errors) are answered on the io
// thread, so they keep answering while every worker waits on the engine.
//
// Limits (docs/http.md): header ≤ max_header_bytes in total, ≤ max_headers fields, each line ≤ max_line → 431;
// body ≤ max_body, sized or chunked → 413 (a declared length is refused before any body byte is read); the
// whole header within header_timeout_s; each body read within read_timeout_s; max_connections open sockets,
// beyond which a connection gets 503 and is closed; request bodies held at once by all connections ≤ max(256 MiB,
// 4 × max_body) (503 above). Framing errors → 400 and the connection closes.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "server/http_message.h"

namespace lily::server {

struct HttpLimits {
  size_t max_body = size_t{8} << 20;          // bytes per request body (413 above), sized or chunked
  size_t max_header_bytes = size_t{64} << 10; // request line + all fields (431 above)
  int max_headers = 100;                      // header fields per request (431 above)
  size_t max_line = size_t{8} << 10;          // one field line or the request target (431 / 414 above)
  double header_timeout_s = 10;               // whole header, from its first byte
  double read_timeout_s = 30;                 // each body read; also the first byte of a new connection's request
  double idle_timeout_s = 30;                 // keep-alive wait for the next request
  double write_timeout_s = 30;                // each response write
  int max_connections = 512;                  // open client sockets (503 above)
  int io_threads = 2;                         // threads running the sockets
  int workers = 48;                           // threads running blocking handlers
  int worker_backlog = 64;                    // blocking requests waiting for a worker (503 above)
};

struct HttpCallbacks {
  // After the header (io thread): routes the request (sets req.route, req.blocking, req.path_param) and may
  // answer it at once (returns true; the body is then not read). Auth, Host, method and media-type checks.
  std::function<bool(HttpRequest&, HttpResponse&)> on_header;
  // The whole request: on a worker thread when req.blocking, else on the io thread.
  std::function<void(HttpRequest&, HttpResponse&)> on_request;
  // Headers added to every response, transport errors included (X-Request-Id, CORS).
  std::function<void(const HttpRequest&, HttpResponse&)> decorate;
  // True while the server drains: responses close their connection.
  std::function<bool()> closing;
};

class HttpTransport {
 public:
  HttpTransport(HttpLimits limits, HttpCallbacks cb);
  ~HttpTransport();

  // Binds and listens (host: an IP address or a name); returns the bound port. Throws lily::Error.
  int bind(const std::string& host, int port);
  // Starts the io threads and the workers.
  void start();
  // Stops accepting, closes every connection, joins all threads. Idempotent.
  void stop();

  int connections() const;  // open client connections

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The OpenAI-shaped JSON error response the transport sends for its own refusals (400, 413, 431, 503, ...).
HttpResponse transport_error(int status, const std::string& code, const std::string& message);

}  // namespace lily::server
