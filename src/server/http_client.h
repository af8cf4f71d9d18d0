// A small blocking HTTP/1.1 client on Boost.Beast, for `lily chat` and the server tests: one connection per
// request, every step bounded by a timeout, streamed bodies delivered as they arrive.
#pragma once
#include <functional>
#include <optional>
#include <string>

#include "server/http_message.h"

namespace lily::server {

struct HttpReply {
  int status = 0;
  HttpHeaders headers;
  std::string body;  // the whole body (for a streamed 200: empty, the bytes went to on_data)
  std::string header(const std::string& name) const { return header_value(headers, name); }
};

class HttpClient {
 public:
  HttpClient(std::string host, int port) : host_(std::move(host)), port_(port) {}
  // "http://host:port" (port 80 when absent); throws lily::Error on another scheme.
  static HttpClient from_url(const std::string& url);

  void set_timeout(double s) { timeout_s_ = s; }          // each read and write
  void set_connect_timeout(double s) { connect_s_ = s; }

  std::optional<HttpReply> get(const std::string& path, const HttpHeaders& headers = {});
  std::optional<HttpReply> post(const std::string& path, const std::string& body,
                                const std::string& content_type = "application/json",
                                const HttpHeaders& headers = {});
  // Any request. With on_data, a 200 reply's body goes there piece by piece (return false to stop). nullopt on
  // a connection or protocol failure (*error says which).
  std::optional<HttpReply> send(const std::string& method, const std::string& path, const HttpHeaders& headers,
                                const std::string& body, const std::function<bool(const std::string&)>& on_data = {},
                                std::string* error = nullptr);

 private:
  std::string host_;
  int port_;
  double timeout_s_ = 60;
  double connect_s_ = 5;
};

}  // namespace lily::server
