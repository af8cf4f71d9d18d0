// The request and response the HTTP transport (http_transport.h) hands to the handlers (http_server.cpp): plain
// data, no socket types, so the handlers do not depend on Boost.Beast.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace lily::server {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;  // in arrival order; names as sent

// ASCII case-insensitive equality (header names, tokens).
bool iequals(const std::string& a, const std::string& b);
// The value of the first header named `name` (any case), or "" when there is none.
const std::string& header_value(const HttpHeaders& h, const std::string& name);
bool has_header(const HttpHeaders& h, const std::string& name);

struct HttpRequest {
  std::string method;        // "GET", "POST", ...
  std::string target;        // as sent: path and query
  std::string path;          // target without the query
  int version = 11;          // 10 or 11
  HttpHeaders headers;
  std::string body;          // whole body (empty until read)
  std::string path_param;    // the part of the path after a prefix route (the model id of /v1/models/{id})
  int route = -1;            // index into the server's route table; -1: none
  bool blocking = false;     // the handler may block: run it on a worker thread, not an io thread
  int fd = -1;               // the client's socket, for disconnect polling (conn_watch.h); valid during the handler
  std::string header(const std::string& name) const { return header_value(headers, name); }
};

// Writes a streamed body (text/event-stream): each write is one HTTP chunk (HTTP/1.1) or raw bytes until close
// (HTTP/1.0). False once the client is gone or a write timed out; later writes fail at once.
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  virtual bool write(const std::string& data) = 0;
};

struct HttpResponse {
  int status = 200;
  HttpHeaders headers;
  std::string body;
  std::string content_type;  // empty: no Content-Type
  bool close = false;        // close the connection after this response
  // Streamed body: when set, the headers go out (chunked on HTTP/1.1), then stream() writes the body; its
  // result tells whether the stream ended normally. stream_done(ran_ok) runs after it in every case (with
  // false when the headers could not be written and stream() did not run).
  std::function<bool(StreamSink&)> stream;
  std::function<void(bool)> stream_done;

  void set_header(const std::string& name, const std::string& value);  // replaces any of that name
  std::string header(const std::string& name) const { return header_value(headers, name); }
  void set_content(std::string b, std::string type) {
    body = std::move(b);
    content_type = std::move(type);
  }
};

}  // namespace lily::server
