// util/utf8.h against an independent decoder: exhaustive over code points and short byte strings, seeded
// random strings, the WHATWG replacement example, and the streaming split property.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "util/utf8.h"

using namespace lily;

namespace {
// Reference: decode by bit patterns, then reject overlongs, surrogates and values above U+10FFFF.
bool ref_valid(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) {
      const unsigned cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

std::string random_bytes(std::mt19937& rng, size_t n) {
  // Biased towards lead and continuation bytes so that valid multi-byte sequences occur often.
  static const unsigned char pool[] = {'a', ' ', 0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1,
                                       0xc2, 0xdf, 0xe0, 0xe1, 0xed, 0xee, 0xef, 0xf0, 0xf1, 0xf4, 0xf5, 0xff};
  std::string s;
  for (size_t i = 0; i < n; ++i)
    s.push_back(char(rng() % 3 == 0 ? rng() & 0xff : pool[rng() % sizeof pool]));
  return s;
}
}  // namespace

TEST(Utf8, EveryCodePointRoundTrips) {
  for (uint32_t cp = 0; cp <= 0x10ffff; ++cp) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    std::string s;
    append_utf8(s, cp);
    ASSERT_TRUE(utf8_valid(s)) << cp;
    size_t i = 0;
    ASSERT_EQ(utf8_next(s, i), cp);
    ASSERT_EQ(i, s.size());
    ASSERT_EQ(utf8_incomplete_tail(s), 0u);
    for (size_t cut = 1; cut < s.size(); ++cut) ASSERT_EQ(utf8_incomplete_tail(s.substr(0, cut)), cut) << cp;
  }
}

TEST(Utf8, SurrogatesAndOutOfRangeAreInvalid) {
  for (uint32_t cp : {0xd800u, 0xdbffu, 0xdc00u, 0xdfffu, 0x110000u, 0x13ffffu}) {
    std::string s;
    append_utf8(s, cp);
    EXPECT_FALSE(utf8_valid(s)) << cp;
    EXPECT_EQ(utf8_lossy(s).find("\xEF\xBF\xBD"), 0u);
  }
}

TEST(Utf8, AllShortByteStringsMatchTheReference) {
  for (uint32_t v = 0; v < (1u << 16); ++v) {
    for (size_t n : {1, 2}) {
      if (n == 1 && v > 0xff) break;
      std::string s;
      for (size_t k = 0; k < n; ++k) s.push_back(char(v >> (8 * k)));
      ASSERT_EQ(utf8_valid(s), ref_valid(s)) << v;
    }
  }
}

TEST(Utf8, RandomStringsMatchTheReferenceAndRepair) {
  std::mt19937 rng(20261204);
  for (int iter = 0; iter < 20000; ++iter) {
    const std::string s = random_bytes(rng, 1 + rng() % 13);
    const bool valid = ref_valid(s);
    ASSERT_EQ(utf8_valid(s), valid);
    const size_t bad = utf8_find_invalid(s);
    ASSERT_EQ(bad == std::string::npos, valid);
    if (!valid) ASSERT_TRUE(ref_valid(s.substr(0, bad)));  // everything before the first bad byte is fine
    const std::string fixed = utf8_lossy(s);
    ASSERT_TRUE(ref_valid(fixed));
    if (valid) ASSERT_EQ(fixed, s);
    // Streaming: emitting up to the incomplete tail, then the rest, repairs like the whole text.
    const size_t cut = rng() % (s.size() + 1);
    const std::string head = s.substr(0, cut);
    const size_t keep = head.size() - utf8_incomplete_tail(head);
    ASSERT_EQ(utf8_lossy(head.substr(0, keep)) + utf8_lossy(s.substr(keep)), fixed) << iter;
  }
}

TEST(Utf8, MaximalSubpartsBecomeOneReplacementEach) {
  // The WHATWG Encoding Standard's example: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
  const std::string in = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy(in), "a" + r + r + r + "b" + r + "c" + r + r + "d");
  EXPECT_EQ(utf8_lossy("x\xE2\x82"), "x" + r);  // an incomplete tail is one replacement
  EXPECT_EQ(utf8_find_invalid("ok\xE2\x82"), 2u);
  EXPECT_EQ(utf8_incomplete_tail("ok\xE2\x82"), 2u);
  EXPECT_EQ(utf8_incomplete_tail("ok\xE2\x28"), 0u);  // not a prefix of any valid sequence
  EXPECT_EQ(utf8_incomplete_tail("\x80\x80\x80"), 0u);
  size_t len;
  EXPECT_EQ(utf8_classify(reinterpret_cast<const unsigned char*>("\xED\xA0\x80"), 3, len), Utf8Seq::invalid);
  EXPECT_EQ(len, 1u);  // ED A0 starts a surrogate: only the lead byte is the invalid subpart
}
