// Beast blocking client (see http_client.h).
#include "server/http_client.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "util/check.h"

namespace lily::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

std::chrono::milliseconds ms(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

}  // namespace

HttpClient HttpClient::from_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) fail("the URL '", url, "' must start with http://");
  std::string rest = url.substr(scheme.size());
  rest = rest.substr(0, rest.find('/'));
  std::string host = rest;
  int port = 80;
  size_t colon = rest.rfind(':');
  if (colon != std::string::npos && rest.find(']', colon) == std::string::npos) {
    host = rest.substr(0, colon);
    try {
      port = std::stoi(rest.substr(colon + 1));
    } catch (const std::exception&) {
      fail("the URL '", url, "' has a bad port");
    }
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return HttpClient(host, port);
}

std::optional<HttpReply> HttpClient::get(const std::string& path, const HttpHeaders& headers) {
  return send("GET", path, headers, "");
}

std::optional<HttpReply> HttpClient::post(const std::string& path, const std::string& body,
                                          const std::string& content_type, const HttpHeaders& headers) {
  HttpHeaders h = headers;
  h.emplace_back("Content-Type", content_type);
  return send("POST", path, h, body);
}

std::optional<HttpReply> HttpClient::send(const std::string& method, const std::string& path,
                                          const HttpHeaders& headers, const std::string& body,
                                          const std::function<bool(const std::string&)>& on_data,
                                          std::string* error) {
  try {
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    stream.expires_after(ms(connect_s_));
    stream.connect(resolver.resolve(host_, std::to_string(port_)));

    http::request<http::string_body> req(http::string_to_verb(method), path, 11);
    const bool v6 = host_.find(':') != std::string::npos;
    req.set(http::field::host, (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_));
    req.set(http::field::user_agent, "lily");
    for (const auto& [k, v] : headers) req.insert(k, v);
    req.keep_alive(false);
    if (method != "GET" || !body.empty()) {
      req.body() = body;
      req.prepare_payload();
    }
    stream.expires_after(ms(timeout_s_));
    http::write(stream, req);

    beast::flat_buffer buf;
    http::response_parser<http::buffer_body> p;
    p.body_limit(boost::none);
    stream.expires_after(ms(timeout_s_));
    http::read_header(stream, buf, p);
    HttpReply reply;
    reply.status = static_cast<int>(p.get().result_int());
    for (const auto& f : p.get()) reply.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    const bool streamed = on_data && reply.status == 200;
    char chunk[16384];
    while (!p.is_done()) {
      p.get().body().data = chunk;
      p.get().body().size = sizeof chunk;
      beast::error_code ec;
      stream.expires_after(ms(timeout_s_));
      http::read(stream, buf, p, ec);
      if (ec && ec != http::error::need_buffer) throw beast::system_error(ec);
      const size_t n = sizeof chunk - p.get().body().size;
      if (n == 0) continue;
      std::string piece(chunk, n);
      if (!streamed) reply.body += piece;
      else if (!on_data(piece)) break;
    }
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    return reply;
  } catch (const std::exception& e) {
    if (error) *error = e.what();
    return std::nullopt;
  }
}

}  // namespace lily::server
