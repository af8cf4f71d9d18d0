// Exactness of lily's tokenizer against the HF `tokenizers` library (npm oracle, tests/tokenizer/oracle_corpus.js):
// ~2,400 seeded strings per variant (Qwen3's tokenizer.json, and the same file with the Qwen3.5 regex), with
// and without special-token parsing; NFC on every code point below U+30000; the regex classes on every code point.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <gtest/gtest.h>

#include "oracle_support.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace lily {
namespace {

std::string ids_text(const std::vector<int32_t>& ids, size_t from, size_t n) {
  std::string s;
  for (size_t i = from; i < ids.size() && i < from + n; ++i) s += std::to_string(ids[i]) + " ";
  return s;
}

void compare_variant(const std::string& variant, const char* cases_file, bool parse_special, size_t min_cases = 2000) {
  const std::string dir = test::oracle_dir();
  ASSERT_FALSE(dir.empty());
  Tokenizer tok = Tokenizer::load(dir + "/" + variant + "/tokenizer.json");
  nlohmann::json cases = test::read_json(dir + "/" + variant + "/" + cases_file);
  ASSERT_GE(cases.size(), min_cases);
  size_t mismatches = 0, tokens = 0;
  for (const auto& c : cases) {
    std::string text = c["t"].get<std::string>();
    std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> got = tok.encode(text, parse_special);
    tokens += want.size();
    if (got == want) continue;
    if (++mismatches > 5) continue;
    size_t k = 0;
    while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
    size_t from = k > 3 ? k - 3 : 0;
    ADD_FAILURE() << variant << " mismatch on " << test::escaped(text) << "\n  first difference at token " << k
                  << "\n  oracle: ..." << ids_text(want, from, 10) << "\n  lily:   ..." << ids_text(got, from, 10)
                  << "\n  oracle token " << (k < want.size() ? test::escaped(tok.token_text(want[k])) : "(end)")
                  << ", lily token " << (k < got.size() ? test::escaped(tok.token_text(got[k])) : "(end)");
  }
  EXPECT_EQ(mismatches, 0u) << "of " << cases.size() << " strings (" << tokens << " tokens)";
}

TEST(TokenizerOracle, Qwen3ExactIds) {
  LILY_REQUIRE_ORACLE();
  compare_variant("qwen3", "cases.json", true);
}

TEST(TokenizerOracle, Qwen35RegexExactIds) {
  LILY_REQUIRE_ORACLE();
  compare_variant("qwen35", "cases.json", true);
}

// parse_special = false must equal the oracle on a file without the special: true added tokens.
TEST(TokenizerOracle, Qwen3PlainSpecialLiterals) {
  LILY_REQUIRE_ORACLE();
  compare_variant("qwen3", "plain.json", false);
}

TEST(TokenizerOracle, Qwen35PlainSpecialLiterals) {
  LILY_REQUIRE_ORACLE();
  compare_variant("qwen35", "plain.json", false);
}

// lstrip / rstrip added-token flags (HF swallows White_Space before / after the literal).
TEST(TokenizerOracle, AddedTokenStripFlags) {
  LILY_REQUIRE_ORACLE();
  compare_variant("strip", "cases.json", true, 200);
}

TEST(TokenizerOracle, NfcMatchesReference) {
  LILY_REQUIRE_ORACLE();
  const std::string dir = test::oracle_dir();
  ASSERT_FALSE(dir.empty());
  nlohmann::json cases = test::read_json(dir + "/nfc.json");
  ASSERT_GT(cases.size(), 400u);
  size_t bad = 0;
  for (const auto& c : cases) {
    std::string in = c[0].get<std::string>(), want = c[1].get<std::string>();
    std::string got = unicode::nfc(in);
    if (got == want) continue;
    if (++bad > 5) continue;
    size_t k = 0;
    while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
    size_t from = k > 12 ? k - 12 : 0;
    ADD_FAILURE() << "NFC differs at byte " << k << ": oracle " << test::escaped(want.substr(from, 40)) << " lily "
                  << test::escaped(got.substr(from, 40));
  }
  EXPECT_EQ(bad, 0u) << "of " << cases.size() << " NFC cases";
}

// Each regex class, as lily rewrites it for PCRE2, contains exactly the code points the oracle's engine counts.
TEST(TokenizerOracle, RegexClassesMatchReference) {
  LILY_REQUIRE_ORACLE();
  const std::string dir = test::oracle_dir();
  ASSERT_FALSE(dir.empty());
  nlohmann::json classes = test::read_json(dir + "/classes.json");
  for (const char* name : {"L", "M", "N", "s"}) {
    std::string pat = adapt_regex(std::string(name) == "s" ? "\\s" : std::string("\\p{") + name + "}", "test");
    int err;
    PCRE2_SIZE off;
    pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(), PCRE2_UTF | PCRE2_UCP,
                                   &err, &off, nullptr);
    ASSERT_TRUE(re) << pat;
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    std::vector<uint8_t> want(0x110000, 0);
    for (const auto& r : classes[name])
      for (uint32_t c = r[0].get<uint32_t>(); c <= r[1].get<uint32_t>(); ++c) want[c] = 1;
    size_t bad = 0;
    std::string s;
    for (uint32_t c = 0; c < 0x110000; ++c) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      s.clear();
      unicode::append_utf8(s, c);
      bool got = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, PCRE2_ANCHORED, md, nullptr) > 0;
      if (got != bool(want[c]) && ++bad <= 5)
        ADD_FAILURE() << "class " << name << ": U+" << std::hex << c << " lily " << got << " oracle " << int(want[c]);
    }
    EXPECT_EQ(bad, 0u) << "class " << name;
    pcre2_match_data_free(md);
    pcre2_code_free(re);
  }
}

}  // namespace
}  // namespace lily
