// UTF-8 validation and repair (see utf8.h).
#include "util/utf8.h"

namespace lily {

size_t utf8_find_invalid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) { ++i; continue; }
    size_t len;
    if (utf8_classify(p + i, n - i, len) != Utf8Seq::valid) return i;
    i += len;
  }
  return std::string_view::npos;
}

size_t utf8_incomplete_tail(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    if ((p[n - back] & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t len;
    return utf8_classify(p + n - back, back, len) == Utf8Seq::incomplete ? back : 0;
  }
  return 0;
}

void append_utf8_lossy(std::string& out, std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) { out.push_back(char(p[i++])); continue; }
    size_t len;
    if (utf8_classify(p + i, n - i, len) == Utf8Seq::valid) out.append(s.data() + i, len);
    else out.append("\xEF\xBF\xBD");
    i += len;
  }
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  append_utf8_lossy(out, s);
  return out;
}

}  // namespace lily
