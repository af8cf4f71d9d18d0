// Header helpers of http_message.h.
#include "server/http_message.h"

namespace lily::server {

bool iequals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    unsigned char x = static_cast<unsigned char>(a[i]), y = static_cast<unsigned char>(b[i]);
    if (x >= 'A' && x <= 'Z') x = static_cast<unsigned char>(x + 32);
    if (y >= 'A' && y <= 'Z') y = static_cast<unsigned char>(y + 32);
    if (x != y) return false;
  }
  return true;
}

const std::string& header_value(const HttpHeaders& h, const std::string& name) {
  static const std::string empty;
  for (const auto& [k, v] : h)
    if (iequals(k, name)) return v;
  return empty;
}

bool has_header(const HttpHeaders& h, const std::string& name) {
  for (const auto& kv : h)
    if (iequals(kv.first, name)) return true;
  return false;
}

void HttpResponse::set_header(const std::string& name, const std::string& value) {
  for (auto it = headers.begin(); it != headers.end();) {
    if (iequals(it->first, name)) it = headers.erase(it);
    else ++it;
  }
  headers.emplace_back(name, value);
}

}  // namespace lily::server
