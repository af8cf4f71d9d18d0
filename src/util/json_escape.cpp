// JSON string escaping (see json_escape.h).
#include "util/json_escape.h"

#include <cstdio>

#include "util/utf8.h"

namespace lily {

namespace {
// The escape for c (< 0x80), or false when c is written as itself.
bool append_ascii_escape(std::string& out, unsigned c) {
  switch (c) {
    case '"': out += "\\\""; return true;
    case '\\': out += "\\\\"; return true;
    case '\n': out += "\\n"; return true;
    case '\r': out += "\\r"; return true;
    case '\t': out += "\\t"; return true;
    case '\b': out += "\\b"; return true;
    case '\f': out += "\\f"; return true;
    default: break;
  }
  if (c >= 0x20) return false;
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\u%04x", c);
  out += buf;
  return true;
}
}  // namespace

void append_json_escaped(std::string& out, std::string_view utf8) {
  for (char ch : utf8) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x80 || !append_ascii_escape(out, c)) out += ch;
  }
}

void append_json_escaped_cp(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    if (!append_ascii_escape(out, cp)) out += char(cp);
  } else if (cp >= 0xD800 && cp <= 0xDFFF) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
    out += buf;
  } else {
    append_utf8(out, cp);
  }
}

}  // namespace lily
