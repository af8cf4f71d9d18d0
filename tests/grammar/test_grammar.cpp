// Grammar engine on a byte vocabulary (token i = byte i, plus two "special" ids): regex, GBNF and JSON Schema
// front ends accept exactly their languages, masks agree with token-by-token acceptance, and unsupported
// schema keywords are errors naming the keyword and path.
#include <gtest/gtest.h>

#include <random>

#include "grammar/cache.h"
#include "grammar/frontends.h"
#include "grammar/token_mask.h"

using namespace lily::grammar;
using ojson = nlohmann::ordered_json;

namespace {

constexpr int32_t kSpecialA = 256, kSpecialB = 257;

// Bytes as tokens, plus a few multi-byte tokens so masks are exercised across token boundaries.
std::shared_ptr<const Vocab> byte_vocab() {
  static auto v = [] {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.push_back(std::string(1, char(b)));
    t.push_back("<A>");
    t.push_back("<B>");
    for (const char* s : {"\": \"", "\",", "\"}", "true", "null", "12", "ab", "abc", "{\"", "\"a", "\\n", " \"", "é"})
      t.push_back(s);
    return Vocab::build(t, {kSpecialA, kSpecialB});
  }();
  return v;
}

bool full_match(const Grammar& g, std::string_view text) {
  Matcher m(CompiledGrammar::compile(g, byte_vocab()));
  return m.accept_bytes(text) && m.accepting();
}

bool schema_ok(const char* schema, std::string_view instance) {
  return full_match(json_schema_grammar(ojson::parse(schema)), instance);
}

}  // namespace

TEST(GrammarRegex, Basics) {
  auto g = regex_grammar("a(b|cd)*e?[x-z]{2,3}\\d+");
  EXPECT_TRUE(full_match(g, "axx1"));
  EXPECT_TRUE(full_match(g, "abcdbexyz42"));
  EXPECT_FALSE(full_match(g, "abcdbexyzz42"));
  EXPECT_FALSE(full_match(g, "ax1"));
  EXPECT_FALSE(full_match(g, "axx"));
  EXPECT_TRUE(full_match(regex_grammar("^[^a-c]+$"), "xyzé"));
  EXPECT_FALSE(full_match(regex_grammar("[^a-c]+"), "xbz"));
  EXPECT_TRUE(full_match(regex_grammar("\\w+@\\w+\\.com"), "me_1@ex.com"));
  EXPECT_TRUE(full_match(regex_grammar(".{3}"), "é中x"));
  EXPECT_FALSE(full_match(regex_grammar(".{3}"), "é中"));
  EXPECT_TRUE(full_match(regex_grammar("(?:ab){2}|c"), "abab"));
  EXPECT_TRUE(full_match(regex_grammar("(?:ab){2}|c"), "c"));
  EXPECT_FALSE(full_match(regex_grammar("(?:ab){2}|c"), "ab"));
  for (const char* bad : {"a(b", "(?=x)", "\\1", "a\\b", "[z-a]", "a{2000}", "*a", "a^b"})
    EXPECT_THROW(regex_grammar(bad), GrammarError) << bad;
}

TEST(GrammarGbnf, ParsesAndMatches) {
  auto g = gbnf_grammar(R"(
# a comment
root ::= greeting (" " name)* "!"
greeting ::= "hi" | "hello"
name ::= [A-Z] [a-z]*
  | "\u00e9t\xe9"
)");
  EXPECT_TRUE(full_match(g, "hi!"));
  EXPECT_TRUE(full_match(g, "hello Bob Al!"));
  EXPECT_TRUE(full_match(g, "hi été!"));
  EXPECT_FALSE(full_match(g, "hi bob!"));
  EXPECT_FALSE(full_match(g, "hey!"));
  auto rep = gbnf_grammar("root ::= (\"ab\"){2,3} [0-9]{1,} .?");
  EXPECT_TRUE(full_match(rep, "abab1"));
  EXPECT_TRUE(full_match(rep, "ababab12中"));
  EXPECT_FALSE(full_match(rep, "ab1"));
  EXPECT_FALSE(full_match(rep, "abababab1"));
  for (const char* bad : {"", "root ::= x", "root ::= \"a", "root ::= root \"a\"", "root ::= [", "x ::= \"a\"",
                          "root ::= (\"a\"", "root ::= \"a\"\nroot ::= \"b\"", "root ::= \"a\"{2000}"})
    EXPECT_THROW(gbnf_grammar(bad), GrammarError) << bad;
}

TEST(GrammarGbnf, SpecialTokens) {
  auto cg = CompiledGrammar::compile(gbnf_grammar("root ::= <[256]> \"x\"* <[257]>"), byte_vocab());
  Matcher m(cg);
  std::vector<uint32_t> mask(cg->vocab().mask_words());
  m.fill_mask(mask);
  EXPECT_TRUE(mask[kSpecialA / 32] >> (kSpecialA % 32) & 1);
  EXPECT_FALSE(m.allows('x'));
  EXPECT_FALSE(m.allows(kSpecialB));
  ASSERT_TRUE(m.accept_token(kSpecialA));
  ASSERT_TRUE(m.accept_token('x'));
  EXPECT_FALSE(m.accepting());
  ASSERT_TRUE(m.accept_token(kSpecialB));
  EXPECT_TRUE(m.accepting());
  EXPECT_FALSE(m.can_continue());
}

TEST(GrammarSchema, Types) {
  EXPECT_TRUE(schema_ok(R"({"type":"string"})", R"("a\"b\\ \u00e9 é")"));
  EXPECT_FALSE(schema_ok(R"({"type":"string"})", "\"a\nb\""));
  EXPECT_FALSE(schema_ok(R"({"type":"string"})", "\"\\x\""));
  EXPECT_TRUE(schema_ok(R"({"type":"integer"})", "-120"));
  EXPECT_FALSE(schema_ok(R"({"type":"integer"})", "012"));
  EXPECT_FALSE(schema_ok(R"({"type":"integer"})", "1.5"));
  EXPECT_TRUE(schema_ok(R"({"type":"number"})", "-0.5e+10"));
  EXPECT_FALSE(schema_ok(R"({"type":"number"})", ".5"));
  EXPECT_TRUE(schema_ok(R"({"type":"boolean"})", "false"));
  EXPECT_TRUE(schema_ok(R"({"type":"null"})", "null"));
  EXPECT_TRUE(schema_ok(R"({"type":["integer","null"]})", "null"));
  EXPECT_TRUE(schema_ok(R"({"type":["integer","null"]})", "7"));
  EXPECT_FALSE(schema_ok(R"({"type":["integer","null"]})", "\"7\""));
  EXPECT_TRUE(schema_ok(R"({"type":"integer","nullable":true})", "null"));
  EXPECT_TRUE(schema_ok(R"({})", R"({"a":[1,{"b":null}],"c":"d"})"));
  EXPECT_TRUE(schema_ok(R"(true)", "[]"));
}

TEST(GrammarSchema, Objects) {
  const char* s = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
                      "c":{"type":"boolean"}},"required":["b"]})";
  EXPECT_TRUE(schema_ok(s, R"({"b":"x"})"));
  EXPECT_TRUE(schema_ok(s, R"({ "a": 1, "b": "x", "c": true })"));
  EXPECT_TRUE(schema_ok(s, "{\n  \"a\": 1,\n  \"b\": \"x\"\n}"));
  EXPECT_TRUE(schema_ok(s, R"({"b":"x","c":false})"));
  EXPECT_FALSE(schema_ok(s, R"({"a":1})"));                // required b missing
  EXPECT_FALSE(schema_ok(s, R"({"b":"x","a":1})"));        // declaration order
  EXPECT_FALSE(schema_ok(s, R"({"b":"x","d":1})"));        // additionalProperties absent = false
  EXPECT_FALSE(schema_ok(s, R"({"a":1,,"b":"x"})"));
  const char* extra = R"({"type":"object","properties":{"a":{"type":"integer"}},
                          "additionalProperties":{"type":"number"}})";
  EXPECT_TRUE(schema_ok(extra, R"({"a":1,"z":2.5,"y":3})"));
  EXPECT_TRUE(schema_ok(extra, R"({"z":2.5})"));
  EXPECT_FALSE(schema_ok(extra, R"({"a":1,"z":"s"})"));
  EXPECT_TRUE(schema_ok(R"({"type":"object"})", R"({})"));
  EXPECT_FALSE(schema_ok(R"({"type":"object","additionalProperties":false})", R"({"a":1})"));
}

TEST(GrammarSchema, Arrays) {
  EXPECT_TRUE(schema_ok(R"({"type":"array","items":{"type":"integer"}})", "[]"));
  EXPECT_TRUE(schema_ok(R"({"type":"array","items":{"type":"integer"}})", "[1, 2,3]"));
  EXPECT_FALSE(schema_ok(R"({"type":"array","items":{"type":"integer"}})", "[1,\"a\"]"));
  const char* b = R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})";
  EXPECT_FALSE(schema_ok(b, "[1]"));
  EXPECT_TRUE(schema_ok(b, "[1,2]"));
  EXPECT_TRUE(schema_ok(b, "[1,2,3]"));
  EXPECT_FALSE(schema_ok(b, "[1,2,3,4]"));
  const char* p = R"({"type":"array","prefixItems":[{"type":"string"},{"type":"boolean"}],"items":{"type":"null"}})";
  EXPECT_TRUE(schema_ok(p, R"(["a",true])"));
  EXPECT_TRUE(schema_ok(p, R"(["a",true,null,null])"));
  EXPECT_FALSE(schema_ok(p, R"([true,"a"])"));
  EXPECT_FALSE(schema_ok(p, R"(["a",true,1])"));
}

TEST(GrammarSchema, EnumConstCombinators) {
  EXPECT_TRUE(schema_ok(R"({"enum":["red","green",3,null]})", "\"green\""));
  EXPECT_TRUE(schema_ok(R"({"enum":["red","green",3,null]})", "3"));
  EXPECT_FALSE(schema_ok(R"({"enum":["red","green",3,null]})", "\"blue\""));
  EXPECT_TRUE(schema_ok(R"({"const":{"k":[1,"é"]}})", R"({"k":[1,"é"]})"));
  EXPECT_FALSE(schema_ok(R"({"const":"a"})", "\"b\""));
  // `type` beside enum/const (zod, Pydantic): the values of that type
  EXPECT_TRUE(schema_ok(R"({"type":"string","enum":["a","b"]})", "\"b\""));
  EXPECT_TRUE(schema_ok(R"({"type":["integer","null"],"enum":["a",2,2.5,null]})", "2"));
  EXPECT_FALSE(schema_ok(R"({"type":["integer","null"],"enum":["a",2,2.5,null]})", "\"a\""));
  EXPECT_FALSE(schema_ok(R"({"type":["integer","null"],"enum":["a",2,2.5,null]})", "2.5"));
  EXPECT_TRUE(schema_ok(R"({"type":"string","const":"x"})", "\"x\""));
  EXPECT_THROW(json_schema_grammar(ojson::parse(R"({"type":"string","enum":[1,null]})")), GrammarError);
  const char* any = R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":2}]})";
  EXPECT_TRUE(schema_ok(any, "5"));
  EXPECT_TRUE(schema_ok(any, "\"ab\""));
  EXPECT_FALSE(schema_ok(any, "\"abc\""));
  EXPECT_TRUE(schema_ok(R"({"oneOf":[{"type":"boolean"},{"type":"null"}]})", "null"));
  EXPECT_TRUE(schema_ok(R"({"allOf":[{"type":"boolean"}]})", "true"));
}

TEST(GrammarSchema, RefsRecursive) {
  const char* tree = R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{
      "v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}}})";
  EXPECT_TRUE(schema_ok(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(schema_ok(tree, R"({"v":1,"kids":[{"kids":[]}]})"));
  const char* self = R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},
                         "required":["next"]})";
  EXPECT_TRUE(schema_ok(self, R"({"next":{"next":null}})"));
  const char* defs = R"({"type":"object","properties":{"p":{"$ref":"#/definitions/a~1b"}},"required":["p"],
                         "definitions":{"a/b":{"type":"boolean"}}})";
  EXPECT_TRUE(schema_ok(defs, R"({"p":true})"));
}

TEST(GrammarSchema, Strings) {
  const char* len = R"({"type":"string","minLength":2,"maxLength":4})";
  EXPECT_FALSE(schema_ok(len, "\"a\""));
  EXPECT_TRUE(schema_ok(len, "\"ab\""));
  EXPECT_TRUE(schema_ok(len, "\"é中\\n\""));
  EXPECT_TRUE(schema_ok(len, "\"abcd\""));
  EXPECT_FALSE(schema_ok(len, "\"abcde\""));
  EXPECT_TRUE(schema_ok(R"({"type":"string","minLength":3})", "\"abcdefgh\""));
  EXPECT_FALSE(schema_ok(R"({"type":"string","minLength":3})", "\"ab\""));
  const char* pat = R"({"type":"string","pattern":"^[A-Z]{3}-\\d{2}$"})";
  EXPECT_TRUE(schema_ok(pat, "\"ABC-12\""));
  EXPECT_FALSE(schema_ok(pat, "\"ABC-123\""));
  EXPECT_TRUE(schema_ok(R"({"type":"string","pattern":"x\"y"})", R"("aax\"ybb")"));  // unanchored: search
  EXPECT_TRUE(schema_ok(R"({"type":"string","format":"date"})", "\"2024-02-28\""));
  EXPECT_FALSE(schema_ok(R"({"type":"string","format":"date"})", "\"2024-02-30\""));
  EXPECT_TRUE(schema_ok(R"({"type":"string","format":"date-time"})", "\"2024-12-31T23:59:59.5Z\""));
  EXPECT_FALSE(schema_ok(R"({"type":"string","format":"time"})", "\"24:00:00Z\""));
  EXPECT_TRUE(schema_ok(R"({"type":"string","format":"time"})", "\"08:30:00+02:00\""));
  EXPECT_TRUE(schema_ok(R"({"type":"string","format":"email"})", "\"a.b+c@ex-1.co.uk\""));
  EXPECT_FALSE(schema_ok(R"({"type":"string","format":"email"})", "\"a..b@ex.com\""));
  EXPECT_TRUE(schema_ok(R"({"type":"string","format":"uuid"})", "\"123e4567-e89b-12d3-a456-426614174000\""));
  EXPECT_FALSE(schema_ok(R"({"type":"string","format":"uuid"})", "\"123e4567-e89b-12d3-a456\""));
  EXPECT_TRUE(schema_ok(R"({"type":"string","format":"uri"})", "\"https://ex.com:8080/a/b?q=1\""));
  EXPECT_FALSE(schema_ok(R"({"type":"string","format":"uri"})", "\"not a uri\""));
}

TEST(GrammarSchema, NumberBounds) {
  const char* i = R"({"type":"integer","minimum":-15,"maximum":237})";
  for (int v = -40; v <= 300; ++v)
    EXPECT_EQ(schema_ok(i, std::to_string(v)), v >= -15 && v <= 237) << v;
  const char* ex = R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":100})";
  EXPECT_FALSE(schema_ok(ex, "0"));
  EXPECT_TRUE(schema_ok(ex, "1"));
  EXPECT_TRUE(schema_ok(ex, "99"));
  EXPECT_FALSE(schema_ok(ex, "100"));
  EXPECT_TRUE(schema_ok(R"({"type":"integer","minimum":10})", "123456789"));
  EXPECT_FALSE(schema_ok(R"({"type":"integer","minimum":10})", "9"));
  EXPECT_TRUE(schema_ok(R"({"type":"integer","maximum":-10})", "-123456"));
  EXPECT_FALSE(schema_ok(R"({"type":"integer","maximum":-10})", "-9"));
  const char* n = R"({"type":"number","minimum":0,"maximum":1})";
  EXPECT_TRUE(schema_ok(n, "0.25"));
  EXPECT_TRUE(schema_ok(n, "1"));
  EXPECT_TRUE(schema_ok(n, "0"));
  EXPECT_FALSE(schema_ok(n, "1.5"));
  EXPECT_FALSE(schema_ok(n, "-0.5"));
  const char* neg = R"({"type":"number","minimum":-5,"exclusiveMaximum":0})";
  EXPECT_TRUE(schema_ok(neg, "-4.75"));
  EXPECT_TRUE(schema_ok(neg, "-5"));
  EXPECT_FALSE(schema_ok(neg, "-5.5"));
  EXPECT_FALSE(schema_ok(neg, "0"));
  EXPECT_TRUE(schema_ok(R"({"type":"number","exclusiveMinimum":0})", "0.01"));
  EXPECT_FALSE(schema_ok(R"({"type":"number","exclusiveMinimum":0})", "0.0"));
}

TEST(GrammarSchema, UnsupportedKeywordsNameKeywordAndPath) {
  auto expect = [](const char* schema, const char* kw, const char* path) {
    try {
      json_schema_grammar(ojson::parse(schema));
      ADD_FAILURE() << "accepted " << schema;
    } catch (const GrammarError& e) {
      EXPECT_EQ(e.keyword, kw) << e.what();
      EXPECT_EQ(e.path, path) << e.what();
    }
  };
  expect(R"({"type":"object","properties":{"a":{"type":"string","contentSchema":{}}}})", "contentSchema",
         "#/properties/a");
  expect(R"({"type":"array","items":{"type":"integer","multipleOf":3}})", "multipleOf", "#/items");
  expect(R"({"type":"array","uniqueItems":true})", "uniqueItems", "#");
  expect(R"({"type":"object","patternProperties":{"x":{}}})", "patternProperties", "#");
  expect(R"({"type":"string","format":"hostname"})", "format", "#");
  expect(R"x({"type":"string","pattern":"(?=a)"})x", "pattern", "#");
  expect(R"({"$ref":"http://x/y"})", "$ref", "#");
  expect(R"({"$ref":"#/$defs/missing"})", "$ref", "#");
  expect(R"({"type":"number","minimum":0.5})", "minimum", "#");
  expect(R"({"type":"strange"})", "type", "#");
  expect(R"({"type":"object","required":["x"]})", "required", "#");
  expect(R"({"allOf":[{"type":"string"},{"maxLength":3}]})", "allOf", "#");
  expect(R"({"type":"string","maxLength":100000})", "maxLength", "#");
  // Annotations are fine.
  EXPECT_NO_THROW(json_schema_grammar(ojson::parse(
      R"({"$schema":"x","title":"t","description":"d","type":"integer","default":1,"examples":[1]})")));
}

// The mask equals the set of tokens accepted one by one, along random walks.
TEST(GrammarMask, MatchesTokenByTokenAcceptance) {
  std::vector<Grammar> gs;
  gs.push_back(json_schema_grammar(ojson::parse(R"({"type":"object","properties":{"a":{"type":"string"},
      "b":{"type":"array","items":{"type":"integer","minimum":-3,"maximum":40}}},"required":["a","b"]})")));
  gs.push_back(json_object_grammar());
  gs.push_back(gbnf_grammar("root ::= (\"ab\" | [a-c]+ \"\\\"\" | \"12\" )* \"}\""));
  std::mt19937 rng(7);
  for (const auto& g : gs) {
    auto cg = CompiledGrammar::compile(g, byte_vocab());
    for (int walk = 0; walk < 20; ++walk) {
      Matcher m(cg);
      std::vector<uint32_t> mask(cg->vocab().mask_words());
      for (int step = 0; step < 60; ++step) {
        m.fill_mask(mask);
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < cg->vocab().size(); ++id) {
          bool in = (mask[size_t(id) / 32] >> (id % 32)) & 1;
          ASSERT_EQ(in, m.allows(id)) << "token " << id << " step " << step;
          if (in) allowed.push_back(id);
        }
        if (allowed.empty()) {
          EXPECT_TRUE(m.accepting());
          break;
        }
        ASSERT_TRUE(m.accept_token(allowed[rng() % allowed.size()]));
      }
    }
  }
}

// A matcher whose automaton is rebuilt after every token behaves exactly like one that never is.
TEST(GrammarMask, CompactionKeepsTheState) {
  auto cg = CompiledGrammar::compile(json_schema_grammar(ojson::parse(R"({"type":"array","items":{"type":"object",
      "properties":{"k":{"type":"array","items":{"type":"integer"}}},"required":["k"]}})")), byte_vocab());
  Matcher a(cg), b(cg);
  b.set_max_bytes(0);
  std::string text = R"([{"k":[1,22,-3]}, {"k":[]},{"k":[4]}])";
  std::vector<uint32_t> ma(cg->vocab().mask_words()), mb(ma.size());
  for (char c : text) {
    a.fill_mask(ma);
    b.fill_mask(mb);
    ASSERT_EQ(ma, mb) << c;
    ASSERT_TRUE(a.accept_token(uint8_t(c)));
    ASSERT_TRUE(b.accept_token(uint8_t(c)));
    EXPECT_EQ(a.accepting(), b.accepting());
  }
  EXPECT_TRUE(b.accepting());
}

TEST(GrammarCache, CompilesOnce) {
  GrammarCache cache(byte_vocab(), 2);
  int builds = 0;
  auto build = [&] { ++builds; return json_object_grammar(); };
  auto a = cache.get("json_object", build);
  auto b = cache.get("json_object", build);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(builds, 1);
  EXPECT_GT(a->bytes(), 0u);
  EXPECT_THROW(cache.get("bad", [] { return gbnf_grammar("root ::= x"); }), GrammarError);
}
