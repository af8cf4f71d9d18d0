// util/json_escape.h against nlohmann::json's serialiser (same escapes for valid UTF-8 without ensure_ascii).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "util/json_escape.h"
#include "util/utf8.h"

using namespace lily;

namespace {
std::string esc_quoted(std::string_view s) {
  std::string out = "\"";
  append_json_escaped(out, s);
  return out + "\"";
}
}  // namespace

TEST(JsonEscape, EveryAsciiCharacterMatchesNlohmann) {
  for (int c = 0; c < 0x80; ++c) {
    const std::string s(1, char(c));
    ASSERT_EQ(esc_quoted(s), nlohmann::json(s).dump()) << c;
    std::string one;
    append_json_escaped_cp(one, uint32_t(c));
    ASSERT_EQ("\"" + one + "\"", esc_quoted(s)) << c;
  }
  EXPECT_EQ(esc_quoted("a\"b\\c\n\x01"), R"("a\"b\\c\n\u0001")");
}

TEST(JsonEscape, RandomUtf8MatchesNlohmannAndTheCodePointForm) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 5000; ++iter) {
    std::string s, by_cp;
    const int n = 1 + int(rng() % 9);
    for (int k = 0; k < n; ++k) {
      uint32_t cp = rng() % 4 == 0 ? rng() % 0x40 : rng() % 0x110000;
      if (cp >= 0xd800 && cp <= 0xdfff) cp = '"';
      append_utf8(s, cp);
      append_json_escaped_cp(by_cp, cp);
    }
    ASSERT_EQ(esc_quoted(s), nlohmann::json(s).dump());
    ASSERT_EQ("\"" + by_cp + "\"", esc_quoted(s));
  }
}

TEST(JsonEscape, SurrogateCodePointsAreEscaped) {
  std::string out;
  append_json_escaped_cp(out, 0xdc80);
  append_json_escaped_cp(out, 0xdcff);
  EXPECT_EQ(out, "\\udc80\\udcff");
}
