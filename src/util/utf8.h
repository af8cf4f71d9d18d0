// UTF-8 in one place: encoding a code point, classifying the sequence at a position (strict: no overlongs, no
// surrogates, nothing above U+10FFFF), validation, the incomplete tail of a stream, and lossy repair (each
// maximal invalid subpart becomes U+FFFD, as Rust's from_utf8_lossy and the WHATWG decoder do). Used by the
// safetensors reader, the tokenizer, the Jinja interpreter, the output parsers and the HTTP request checks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lily {

// Appends cp's UTF-8 bytes. Callers decide their own policy for surrogates (escape, replace, pass through).
inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

enum class Utf8Seq { valid, incomplete, invalid };

// Classifies the bytes p[0..n) (n >= 1) from their start. valid: `len` = the sequence's length. invalid: `len` =
// the maximal invalid subpart (1..3 bytes, to be replaced by one U+FFFD). incomplete: p[0..n) is a valid
// prefix cut short by the end of the data, `len` = n.
inline Utf8Seq utf8_classify(const unsigned char* p, size_t n, size_t& len) {
  const unsigned b = p[0];
  if (b < 0x80) return len = 1, Utf8Seq::valid;
  size_t need;
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) need = 2;
  else if (b >= 0xE0 && b <= 0xEF) need = 3, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
  else if (b >= 0xF0 && b <= 0xF4) need = 4, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
  else return len = 1, Utf8Seq::invalid;
  for (size_t k = 1; k < need; ++k) {
    if (k >= n) return len = k, Utf8Seq::incomplete;
    const unsigned c = p[k];
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return len = k, Utf8Seq::invalid;
  }
  return len = need, Utf8Seq::valid;
}

// Decodes the code point at s[i] and advances i past it. s must hold a valid sequence at i.
inline uint32_t utf8_next(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  const uint32_t c = p[0];
  if (c < 0x80) { i += 1; return c; }
  if (c < 0xE0) { i += 2; return ((c & 0x1F) << 6) | (p[1] & 0x3F); }
  if (c < 0xF0) { i += 3; return ((c & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F); }
  i += 4;
  return ((c & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

// Byte offset of the first invalid or incomplete sequence, or npos when all of s is valid UTF-8.
size_t utf8_find_invalid(std::string_view s);
inline bool utf8_valid(std::string_view s) { return utf8_find_invalid(s) == std::string_view::npos; }

// Length (0..3) of the valid but incomplete sequence that ends s: bytes that may still become a code point
// when more arrive. Everything before s.size() - utf8_incomplete_tail(s) can be emitted now.
size_t utf8_incomplete_tail(std::string_view s);

// s with each maximal invalid subpart (and an incomplete tail) replaced by U+FFFD; valid text is unchanged.
void append_utf8_lossy(std::string& out, std::string_view s);
std::string utf8_lossy(std::string_view s);

}  // namespace lily
