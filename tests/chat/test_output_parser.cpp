// Output parser cases: docs/chat.md §3.6 pitfalls one by one, the §2.3(e) tool round trip, reasoning split (§4),
// streaming emission rules (§3.5). Every text case runs through parse_all_ways: word tokens, byte tokens, every
// single extra cut, random chunks, streaming and non-streaming, all required to agree.
#include <gtest/gtest.h>

#include "parser_harness.h"

namespace lily::chat {
namespace {

using testing::parse_all_ways;
using testing::run_stream;
using testing::Tok;
using testing::tokens_words;

const ToolSet& tools() {
  static const ToolSet set = ToolSet::from_json(OrderedJson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Return the current weather for a city.",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object",
      "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "set_flags", "parameters": {"type": "object", "properties": {
      "flag": {"type": "boolean"}, "count": {"type": ["integer", "null"]},
      "items": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
      "config": {"type": "object"}}}}}
  ])"));
  return set;
}

ParseResult parse(std::string_view text, bool reasoning = false, const ToolSet& t = tools(),
                  ToolFormat format = ToolFormat::automatic, DelimiterIds ids = {}) {
  ParserOptions opt;
  opt.ids = std::move(ids);
  opt.start_in_reasoning = reasoning;
  opt.format = format;
  return parse_all_ways(text, opt, t);
}

void expect_call(const ParseResult& r, size_t i, const std::string& name, const std::string& args) {
  ASSERT_LT(i, r.tool_calls.size());
  EXPECT_EQ(r.tool_calls[i].name, name);
  EXPECT_EQ(r.tool_calls[i].arguments, args);
}

constexpr const char* kWeatherCall =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nRoma\n</parameter>\n</function>\n</tool_call>";

TEST(OutputParser, InitialStateFromPromptIds) {
  const DelimiterIds ids;
  // docs/chat.md §2.3 (a): generation prompt with thinking on ends `248068 198`.
  const std::vector<int32_t> a = {248045, 846, 198, 2114, 13168, 2148, 220, 16, 22, 348, 220, 17, 18, 30,
                                  248046, 198, 248045, 74455, 198, 248068, 198};
  // (b): enable_thinking=false ends `248068 271 248069 271`.
  const std::vector<int32_t> b = {248045, 846, 198, 49, 158648, 13138, 25, 187179, 248046, 198, 248045, 74455, 198,
                                  248068, 271, 248069, 271};
  EXPECT_TRUE(initial_reasoning_state(a, ids));
  EXPECT_FALSE(initial_reasoning_state(b, ids));
  EXPECT_FALSE(initial_reasoning_state(std::vector<int32_t>{248045, 846, 198}, ids));
  // Pitfall 8: an unclosed <think> in history followed by a closed generation prompt -> content.
  std::vector<int32_t> c = {248068, 9419, 248046};
  c.insert(c.end(), b.begin(), b.end());
  EXPECT_FALSE(initial_reasoning_state(c, ids));
  // Qwen3 ids.
  EXPECT_TRUE(initial_reasoning_state(std::vector<int32_t>{151644, 151667, 198}, DelimiterIds::qwen3()));
  EXPECT_FALSE(initial_reasoning_state(std::vector<int32_t>{151667, 151668}, DelimiterIds::qwen3()));
}

TEST(OutputParser, ToolRoundTripGoldenIds) {
  // docs/chat.md §2.3 (e): the assistant turn's ids; token texts as the spec splits them
  // (`<function=get_weather>` = 27 1628 27362 67017 29, `<parameter=city>` = 27 15704 28 8656 29).
  const std::map<int32_t, std::string> text = {{271, "\n\n"}, {198, "\n"}, {27, "<"}, {1628, "function"},
                                               {27362, "=get"}, {67017, "_weather"}, {29, ">"}, {15704, "parameter"},
                                               {28, "="}, {8656, "city"}, {208639, "Roma"}, {510, "</"}};
  const std::vector<int32_t> ids = {248068, 271, 248069, 271, 248058, 198, 27, 1628, 27362, 67017, 29, 198, 27,
                                    15704, 28, 8656, 29, 198, 208639, 198, 510, 15704, 29, 198, 510, 1628, 29, 198,
                                    248059, 248046, 198, 248045};
  std::vector<std::string> texts;
  for (int32_t id : ids) texts.push_back(text.count(id) ? text.at(id) : std::string());
  ParserOptions opt;
  opt.id_seed = 1;
  const ParseResult r = parse_output(ids, texts, opt, tools());
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "");
  EXPECT_TRUE(r.reasoning_ended);
  expect_call(r, 0, "get_weather", R"({"city": "Roma"})");
  EXPECT_EQ(r.reasoning_tokens, 2);  // "\n\n" and </think>; the leading <think> opened reasoning from content
  EXPECT_FALSE(r.call_cut);
}

TEST(OutputParser, ThinkingThenCall) {
  const auto r = parse(std::string("Devo chiamare il meteo.\n</think>\n\n") + kWeatherCall + "<|im_end|>", true);
  EXPECT_EQ(r.reasoning, "Devo chiamare il meteo.");
  EXPECT_EQ(r.content, "");
  expect_call(r, 0, "get_weather", R"({"city": "Roma"})");
  EXPECT_EQ(r.tool_calls.size(), 1u);
}

TEST(OutputParser, ReasoningTokensCountIncludesThinkClose) {
  ParserOptions opt;
  opt.start_in_reasoning = true;
  const auto toks = tokens_words("a b\n</think>\n\nHi");  // "a" " " "b" "\n" </think> "\n\n" "Hi"
  const auto run = run_stream(toks, opt, tools());
  EXPECT_EQ(run.result.reasoning_tokens, 5);
  EXPECT_EQ(run.result.reasoning, "a b");
  EXPECT_EQ(run.result.content, "Hi");
  // A refuted <tool_call> look-ahead stays reasoning, its tokens counted: "a" " " <tool_call> " " "b" </think>.
  const auto run2 = run_stream(tokens_words("a <tool_call> b</think>"), opt, tools());
  EXPECT_EQ(run2.result.reasoning_tokens, 6);
  EXPECT_EQ(run2.result.reasoning, "a <tool_call> b");
}

// Pitfall 1: a call inside an unclosed think block ends reasoning implicitly.
TEST(OutputParser, Pitfall01CallInsideUnclosedThink) {
  const auto r = parse(std::string("I need the weather.\n") + kWeatherCall, true);
  EXPECT_EQ(r.reasoning, "I need the weather.");
  EXPECT_EQ(r.content, "");
  EXPECT_TRUE(r.reasoning_ended);
  expect_call(r, 0, "get_weather", R"({"city": "Roma"})");
  // Reasoning tokens stop at the <tool_call> that turned out to be a call.
  ParserOptions opt;
  opt.start_in_reasoning = true;
  const auto run = run_stream(tokens_words(std::string("x\n") + kWeatherCall), opt, tools());
  EXPECT_EQ(run.result.reasoning_tokens, 2);
}

// Pitfall 2: <tool_call> in prose without <function does not end reasoning.
TEST(OutputParser, Pitfall02ToolCallMentionInReasoning) {
  auto r = parse("The format uses <tool_call> tags. Then</think>\n\nAnswer.", true);
  EXPECT_EQ(r.reasoning, "The format uses <tool_call> tags. Then");
  EXPECT_EQ(r.content, "Answer.");
  EXPECT_TRUE(r.tool_calls.empty());
  r = parse("Maybe <tool_call>\n<functional> style?</think>Ok", true);
  EXPECT_EQ(r.reasoning, "Maybe <tool_call>\n<functional> style?");
  EXPECT_EQ(r.content, "Ok");
  // A phantom header (invalid name) is not a call either.
  r = parse("Template: <tool_call>\n<function={{ tc.name }}>\n</think>\nNo.", true);
  EXPECT_EQ(r.reasoning, "Template: <tool_call>\n<function={{ tc.name }}>");
  EXPECT_EQ(r.content, "No.");
  // Output ends during the look-ahead: reasoning text, never content.
  r = parse("Hmm <tool_call>\n<func", true);
  EXPECT_EQ(r.reasoning, "Hmm <tool_call>\n<func");
  EXPECT_FALSE(r.reasoning_ended);
  // More than the bounded whitespace look-ahead.
  r = parse("Hmm <tool_call>" + std::string(80, ' ') + "<function=get_weather>", true);
  EXPECT_EQ(r.reasoning, "Hmm <tool_call>" + std::string(80, ' ') + "<function=get_weather>");
}

// Pitfall 3: duplicated </parameter>.
TEST(OutputParser, Pitfall03DuplicatedParameterClose) {
  auto r = parse(
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nRoma\n</parameter>\n</parameter>\n"
      "<parameter=unit>\ncelsius\n</parameter></parameter>\n</function>\n</tool_call>");
  expect_call(r, 0, "get_weather", R"({"city": "Roma", "unit": "celsius"})");
  EXPECT_EQ(r.content, "");
  r = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nRoma\n</parameter>\n</parameter>\n</function>\n"
            "</tool_call>");
  expect_call(r, 0, "get_weather", R"({"city": "Roma"})");
}

// Pitfall 4: literal XML inside string values (structural end rules, §3.3.2).
TEST(OutputParser, Pitfall04LiteralXmlInValues) {
  const std::string value =
      "print('</parameter>')\nx = \"</function>\"\n<parameter=path>\n</parameter>\nend\n"
      "<function=get_weather>\n<parameter=city>\nRoma\n</parameter>\n</function>\ndone";
  const auto r = parse("<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n</parameter>\n"
                       "<parameter=content>\n" + value + "\n</parameter>\n</function>\n</tool_call>");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  const auto args = OrderedJson::parse(r.tool_calls[0].arguments);
  EXPECT_EQ(args.at("path"), "/tmp/a.py");
  EXPECT_EQ(args.at("content"), value);
  // Schema-less tool: a line-start <parameter= of any key is structural, literal </parameter> mid-line is not.
  const auto r2 = parse("<tool_call>\n<function=other>\n<parameter=a>\nx </parameter> y\n</parameter>\n"
                        "<parameter=b>\n2\n</parameter>\n</function>\n</tool_call>");
  expect_call(r2, 0, "other", R"({"a": "x </parameter> y", "b": "2"})");
}

// Pitfall 5: prose before the call goes to content (trailing whitespace dropped).
TEST(OutputParser, Pitfall05ProseBeforeCall) {
  const auto r = parse(std::string("Let me check.\n\n") + kWeatherCall + "<|im_end|>");
  EXPECT_EQ(r.content, "Let me check.");
  expect_call(r, 0, "get_weather", R"({"city": "Roma"})");
}

// Pitfall 6: prompt with the closed empty block -> content; the parser never assumes reasoning.
TEST(OutputParser, Pitfall06ThinkingStateFromPrompt) {
  const std::vector<int32_t> prompt = {248045, 74455, 198, 248068, 271, 248069, 271};
  const bool reasoning = initial_reasoning_state(prompt, DelimiterIds{});
  const auto r = parse("Ciao! Tutto bene.", reasoning);
  EXPECT_EQ(r.content, "Ciao! Tutto bene.");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.reasoning_tokens, 0);
}

// Pitfall 7: missing <tool_call> wrapper, accepted only for known names at line start in content.
TEST(OutputParser, Pitfall07MissingWrapper) {
  auto r = parse("Checking.\n<function=get_weather>\n<parameter=city>\nRoma\n</parameter>\n</function>");
  EXPECT_EQ(r.content, "Checking.");
  expect_call(r, 0, "get_weather", R"({"city": "Roma"})");
  EXPECT_FALSE(r.call_cut);
  r = parse("#include <functional>\n<function=unknown_tool>\nx\n</function>\nsee <function=get_weather> inline");
  EXPECT_EQ(r.content,
            "#include <functional>\n<function=unknown_tool>\nx\n</function>\nsee <function=get_weather> inline");
  EXPECT_TRUE(r.tool_calls.empty());
  // Two bare calls in a row, then a stray </tool_call> that belongs to them.
  r = parse("<function=get_time>\n</function>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
            "</function>\n</tool_call>");
  expect_call(r, 0, "get_time", "{}");
  expect_call(r, 1, "get_weather", R"({"city": "Oslo"})");
  EXPECT_EQ(r.content, "");
  // Text after a bare call ends it (there is no </tool_call> to wait for).
  r = parse("Checking.\n<function=get_weather>\n<parameter=city>\nRoma\n</parameter>\n</function>\nAnything else?");
  expect_call(r, 0, "get_weather", R"({"city": "Roma"})");
  EXPECT_EQ(r.content, "Checking.\nAnything else?");
  // Without tools there is no bare-call detection.
  r = parse("<function=get_weather>\n</function>", false, ToolSet{});
  EXPECT_EQ(r.content, "<function=get_weather>\n</function>");
}

// Pitfall 8: hallucinated </thinking> stays reasoning text (the fallback is off).
TEST(OutputParser, Pitfall08HallucinatedThinkingClose) {
  const auto r = parse("step one</thinking>\nstill thinking\n</think>\nDone", true);
  EXPECT_EQ(r.reasoning, "step one</thinking>\nstill thinking");
  EXPECT_EQ(r.content, "Done");
}

TEST(OutputParser, ThinkingCloseFallbackOption) {
  ParserOptions opt;
  opt.start_in_reasoning = true;
  opt.thinking_close_fallback = true;
  auto r = parse_all_ways("step one</thinking>\n\nThe answer.", opt, tools());
  EXPECT_EQ(r.reasoning, "step one");
  EXPECT_EQ(r.content, "The answer.");
  EXPECT_TRUE(r.reasoning_ended);
  r = parse_all_ways("almost </thinkin", opt, tools());  // a tail that never completes stays reasoning
  EXPECT_EQ(r.reasoning, "almost </thinkin");
  r = parse_all_ways("a </thinkin<tool_call> b</think>c", opt, tools());
  EXPECT_EQ(r.reasoning, "a </thinkin<tool_call> b");
  EXPECT_EQ(r.content, "c");
  // A <tool_call> in reasoning that is no call: the text after it still ends reasoning at </thinking>, however
  // it is tokenised (found by fuzz_parsers: one text token kept the tag in reasoning, bytes ended it).
  r = parse_all_ways("a <tool_call> no call here</thinking>\nThe answer.", opt, tools());
  EXPECT_EQ(r.reasoning, "a <tool_call> no call here");
  EXPECT_EQ(r.content, "The answer.");
  EXPECT_TRUE(r.reasoning_ended);
}

// Pitfall 10: truncated arguments (length stop) are closed with what was parsed.
TEST(OutputParser, Pitfall10TruncatedCall) {
  auto r = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nRo");
  expect_call(r, 0, "get_weather", R"({"city": "Ro"})");
  EXPECT_TRUE(r.call_cut);
  r = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nRoma\n</parameter>\n<parameter=days>\n3");
  expect_call(r, 0, "get_weather", R"({"city": "Roma", "days": 3})");
  EXPECT_TRUE(r.call_cut);
  r = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nRoma\n</parameter>\n<param");
  expect_call(r, 0, "get_weather", R"({"city": "Roma"})");
  EXPECT_TRUE(r.call_cut);
  r = parse("<tool_call>\n<function=get_weather>\n");
  expect_call(r, 0, "get_weather", "{}");
  EXPECT_TRUE(r.call_cut);
  r = parse("Sure.\n<tool_call>\n<function=get_wea");  // header incomplete: no call, content kept
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_TRUE(r.call_cut);
  EXPECT_EQ(r.content, "Sure.");
  // Thinking ate the budget: everything is reasoning.
  r = parse("Let me think about 17 * 23 =", true);
  EXPECT_EQ(r.reasoning, "Let me think about 17 * 23 =");
  EXPECT_EQ(r.content, "");
  EXPECT_FALSE(r.reasoning_ended);
  // </function> then the stop token (missing </tool_call>) is a complete call.
  r = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nRoma\n</parameter>\n</function>\n<|im_end|>");
  expect_call(r, 0, "get_weather", R"({"city": "Roma"})");
  EXPECT_FALSE(r.call_cut);
}

// Pitfall 11: parse on ids; the literal text "<tool_call>" as ordinary tokens is content, and delimiter ids work
// even when the caller passes no text for them.
TEST(OutputParser, Pitfall11DelimitersByIdOnly) {
  ParserOptions opt;
  opt.id_seed = 3;
  std::vector<Tok> toks = {{testing::kTextId, "<tool_call>"}, {testing::kTextId, " is a tag"}};
  auto run = run_stream(toks, opt, tools());
  EXPECT_EQ(run.result.content, "<tool_call> is a tag");
  toks = tokens_words(std::string("x\n") + kWeatherCall);
  for (auto& t : toks)
    if (t.id != testing::kTextId) t.text.clear();
  run = run_stream(toks, opt, tools());
  EXPECT_EQ(run.result.content, "x");
  expect_call(run.result, 0, "get_weather", R"({"city": "Roma"})");
}

// Pitfall 12: Qwen3.5-style Python literals.
TEST(OutputParser, Pitfall12PythonLiterals) {
  const auto r = parse("<tool_call>\n<function=set_flags>\n<parameter=flag>\nTrue\n</parameter>\n<parameter=count>\n"
                       "None\n</parameter>\n<parameter=config>\n{'a': None, 'b': [True, 'x']}\n</parameter>\n"
                       "</function>\n</tool_call>");
  expect_call(r, 0, "set_flags", R"({"flag": true, "count": null, "config": {"a": null, "b": [true, "x"]}})");
}

// Pitfall 13: anyOf parameter double-encoded as a JSON string.
TEST(OutputParser, Pitfall13AnyOfDoubleEncoded) {
  const auto r = parse("<tool_call>\n<function=set_flags>\n<parameter=items>\n\"[\\\"a\\\", \\\"b\\\"]\"\n"
                       "</parameter>\n<parameter=count>\n7\n</parameter>\n</function>\n</tool_call>");
  expect_call(r, 0, "set_flags", R"({"items": ["a", "b"], "count": 7})");
}

TEST(OutputParser, ParallelCallsAndTextBetween) {
  auto r = parse(std::string(kWeatherCall) + "\n" +
                 "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
                 "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n\n" + kWeatherCall + "<|im_end|>");
  ASSERT_EQ(r.tool_calls.size(), 3u);
  expect_call(r, 1, "get_weather", R"({"city": "Oslo", "days": 2})");
  EXPECT_EQ(r.content, "");
  std::set<std::string> ids;
  for (auto& c : r.tool_calls) ids.insert(c.id);
  EXPECT_EQ(ids.size(), 3u) << "call ids must differ";
  r = parse(std::string("Sure.\n\n") + kWeatherCall + "\nDone, one call." + kWeatherCall + "\n");
  EXPECT_EQ(r.content, "Sure.\nDone, one call.");
  EXPECT_EQ(r.tool_calls.size(), 2u);
}

TEST(OutputParser, ZeroParametersAndMissingParameterClose) {
  auto r = parse("<tool_call>\n<function=get_time>\n</function>\n</tool_call>");
  expect_call(r, 0, "get_time", "{}");
  r = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nRoma\n<parameter=unit>\ncelsius\n</function>\n"
            "</tool_call>");
  expect_call(r, 0, "get_weather", R"({"city": "Roma", "unit": "celsius"})");
  r = parse("<tool_call><function=get_weather><parameter=city>Roma</parameter></function></tool_call>");
  expect_call(r, 0, "get_weather", R"({"city": "Roma"})");
}

TEST(OutputParser, ToolCallTokenInsideValueOrAfterForgottenClose) {
  // <tool_call> right after </function> (missing </tool_call>) starts the next call.
  auto r = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nRoma\n</parameter>\n</function>\n"
                 "<tool_call>\n<function=get_time>\n</function>\n</tool_call>");
  expect_call(r, 0, "get_weather", R"({"city": "Roma"})");
  expect_call(r, 1, "get_time", "{}");
  r = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nRoma\n</parameter>\n<tool_call>\n"
            "<function=get_time>\n</function>\n</tool_call>");
  expect_call(r, 0, "get_weather", R"({"city": "Roma"})");
  expect_call(r, 1, "get_time", "{}");
  // Elsewhere inside a value it is literal text.
  r = parse("<tool_call>\n<function=write_file>\n<parameter=content>\nuse <tool_call> and <think> here\n"
            "</parameter>\n</function>\n</tool_call>");
  expect_call(r, 0, "write_file", R"({"content": "use <tool_call> and <think> here"})");
}

// Degenerate output: structural decisions wait for at most 1024 bytes of whitespace (keeps parsing linear).
TEST(OutputParser, BoundedPendingWhitespace) {
  const std::string ws(1500, ' ');
  auto r = parse("<tool_call>" + ws + "<function=get_time>\n</function>\n</tool_call>");
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "<tool_call>" + ws + "<function=get_time>\n</function>\n</tool_call>");
  r = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nRoma\n</parameter>" + ws +
            "\n</function>\n</tool_call>");
  expect_call(r, 0, "get_weather", "{\"city\": \"Roma\\n</parameter>" + ws + "\"}");
  r = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nRoma\n</parameter>\n</function>" + ws +
            "</tool_call>");
  expect_call(r, 0, "get_weather", "{\"city\": \"Roma\\n</parameter>\\n</function>" + ws + "\"}");
}

TEST(OutputParser, DuplicateKeysFirstWins) {
  const auto r = parse("<tool_call>\n<function=other>\n<parameter=a>\n1st\n</parameter>\n<parameter=a>\n2nd\n"
                       "</parameter>\n</function>\n</tool_call>");
  expect_call(r, 0, "other", R"({"a": "1st"})");
}

TEST(OutputParser, InvalidHeaderBecomesContent) {
  auto r = parse("Hi <tool_call>\n<function={{ tc.name }}>\n</function>\n</tool_call> end");
  EXPECT_EQ(r.content, "Hi <tool_call>\n<function={{ tc.name }}>\n</function>\n</tool_call> end");
  EXPECT_TRUE(r.tool_calls.empty());
  r = parse("<tool_call>no function here</tool_call>");
  EXPECT_EQ(r.content, "<tool_call>no function here</tool_call>");
  r = parse("<tool_call>\n<function=>\n</function></tool_call>");
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "<tool_call>\n<function=>\n</function></tool_call>");
}

TEST(OutputParser, NewlineStrippingExactlyOne) {
  auto r = parse("<tool_call>\n<function=other>\n<parameter=a>\n\n  two lines\n\n</parameter>\n"
                 "<parameter=b>x</parameter>\n</function>\n</tool_call>");
  expect_call(r, 0, "other", R"({"a": "\n  two lines\n", "b": "x"})");
}

TEST(OutputParser, EscapingAndNonAscii) {
  const auto r = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nCittà \"nuova\"\t\\ 東京 🎉\x01\n"
                       "</parameter>\n</function>\n</tool_call>");
  expect_call(r, 0, "get_weather", "{\"city\": \"Città \\\"nuova\\\"\\t\\\\ 東京 🎉\\u0001\"}");
}

TEST(OutputParser, InvalidUtf8BecomesReplacementEverywhere) {
  auto r = parse("ok \xE4\xBD then \xF0\x9F\x8E</think>x\xC3", true);
  EXPECT_EQ(r.reasoning, "ok \xEF\xBF\xBD then \xEF\xBF\xBD");
  EXPECT_EQ(r.content, "x\xEF\xBF\xBD");
  r = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nA\xE4\xBD\n</parameter>\n</function>\n"
            "</tool_call>");
  expect_call(r, 0, "get_weather", "{\"city\": \"A\xEF\xBF\xBD\"}");
}

TEST(OutputParser, LeadingThinkDroppedAndStopEndsOutput) {
  auto r = parse("<think>\nreasoning here\n</think>\n\nanswer<|im_end|>ignored<tool_call>", true);
  EXPECT_EQ(r.reasoning, "reasoning here");
  EXPECT_EQ(r.content, "answer");
  // From content (prompt without a think block) a leading <think> opens reasoning.
  r = parse("<think>\nhmm\n</think>\n\nok", false);
  EXPECT_EQ(r.reasoning, "hmm");
  EXPECT_EQ(r.content, "ok");
  // A <think> later in content is literal.
  r = parse("a <think> b", false);
  EXPECT_EQ(r.content, "a <think> b");
}

TEST(OutputParser, TypedValuesFromSchema) {
  auto r = parse("<tool_call>\n<function=get_weather>\n<parameter=days>\n 3 \n</parameter>\n"
                 "<parameter=city>\n42\n</parameter>\n</function>\n</tool_call>");
  expect_call(r, 0, "get_weather", R"({"days": 3, "city": "42"})");  // integer; a string stays "42"
  // Unknown tool (no schema): '{'/'[' values that parse are JSON, everything else a string.
  r = parse("<tool_call>\n<function=other>\n<parameter=n>\n3\n</parameter>\n<parameter=o>\n{\"k\": [1, 2.5]}\n"
            "</parameter>\n<parameter=bad>\n[1,\n</parameter>\n</function>\n</tool_call>");
  expect_call(r, 0, "other", R"({"n": "3", "o": {"k": [1, 2.5]}, "bad": "[1,"})");
  // Known schema: after </parameter> only a declared, unseen key starts a parameter (§3.3.2); an undeclared
  // one is literal text of the value.
  r = parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nRoma\n</parameter>\n<parameter=extra>\n1\n"
            "</parameter>\n</function>\n</tool_call>");
  expect_call(r, 0, "get_weather", R"({"city": "Roma\n</parameter>\n<parameter=extra>\n1"})");
}

TEST(OutputParser, Qwen3JsonFormat) {
  const DelimiterIds q3 = DelimiterIds::qwen3();
  // Qwen3 <think> 151667, </think> 151668, <tool_call> 151657, </tool_call> 151658, <|im_end|> 151645.
  auto r = parse("ok\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Roma\", "
                 "\"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"
                 "<|im_end|>",
                 true, tools(), ToolFormat::automatic, q3);
  EXPECT_EQ(r.reasoning, "ok");
  expect_call(r, 0, "get_weather", R"({"city": "Roma", "days": 2})");
  expect_call(r, 1, "get_time", "{}");
  // Forced json format; arguments given as a JSON string.
  r = parse("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>", false, tools(),
            ToolFormat::json, q3);
  expect_call(r, 0, "f", R"({"x": 1})");
  // Broken JSON degrades to content; XML ids of Qwen3 also work.
  r = parse("<tool_call>{\"name\": oops}</tool_call>", false, tools(), ToolFormat::automatic, q3);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "<tool_call>{\"name\": oops}</tool_call>");
  r = parse(kWeatherCall, false, tools(), ToolFormat::automatic, q3);
  expect_call(r, 0, "get_weather", R"({"city": "Roma"})");
  // Implicit end of reasoning by a JSON call.
  r = parse("plan\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", true, tools(),
            ToolFormat::automatic, q3);
  EXPECT_EQ(r.reasoning, "plan");
  expect_call(r, 0, "get_time", "{}");
}

// §3.5: the header is emitted once the name is complete; string values stream before </parameter>; holding
// back a possible trailing "\n" and a partial "</parameter>".
TEST(OutputParser, StreamingEmitsIncrementally) {
  ParserOptions opt;
  opt.id_seed = 9;
  OutputParser p(opt, tools());
  std::vector<ParserEvent> ev;
  std::string args;
  auto feed = [&](std::string_view text, int32_t id = testing::kTextId) {
    ev.clear();
    p.feed(id, text, ev);
    for (auto& e : ev)
      if (e.kind == ParserEvent::Kind::tool_args) args += e.text;
  };
  feed("", 248058);
  feed("\n<function=get_wea");
  EXPECT_TRUE(ev.empty());
  feed("ther>");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, ParserEvent::Kind::tool_header);
  EXPECT_EQ(ev[0].name, "get_weather");
  EXPECT_EQ(ev[0].index, 0);
  feed("\n<parameter=city>\nNew");
  EXPECT_EQ(args, "{\"city\": \"New");
  feed(" York\n");
  EXPECT_EQ(args, "{\"city\": \"New York");  // the "\n" may be the trailing one
  feed("</para");
  EXPECT_EQ(args, "{\"city\": \"New York");
  feed("meter>\n<parameter=days>\n1");
  EXPECT_EQ(args, "{\"city\": \"New York\", \"days\": ");  // integers are emitted whole at their end
  feed("0\n</parameter>\n</function>\n");
  EXPECT_EQ(args, "{\"city\": \"New York\", \"days\": ");  // structural only once </tool_call> follows
  feed("", 248059);
  EXPECT_EQ(args, "{\"city\": \"New York\", \"days\": 10}");
  ev.clear();
  p.finish(ev);
  EXPECT_EQ(p.result().tool_calls.at(0).arguments, args);
  EXPECT_FALSE(p.result().call_cut);
}

TEST(OutputParser, CallIdsFromSeedOrGenerator) {
  ParserOptions opt;
  opt.id_seed = 5;
  const auto toks = tokens_words(kWeatherCall);
  const auto a = run_stream(toks, opt, tools());
  const auto b = run_stream(toks, opt, tools());
  ASSERT_EQ(a.result.tool_calls.size(), 1u);
  EXPECT_EQ(a.result.tool_calls[0].id, b.result.tool_calls[0].id);
  for (char c : a.result.tool_calls[0].id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)));
  opt.id_seed = 6;
  EXPECT_NE(run_stream(toks, opt, tools()).result.tool_calls[0].id, a.result.tool_calls[0].id);
  opt.make_call_id = [] { return std::string("call_fixedfixedfixedfixedfixe"); };
  EXPECT_EQ(run_stream(toks, opt, tools()).result.tool_calls[0].id, "call_fixedfixedfixedfixedfixe");
}

TEST(OutputParser, OpenAiJson) {
  const ToolCall call{"call_abcdefghijklmnopqrstuvwx", "get_weather", R"({"city": "Roma"})"};
  EXPECT_EQ(tool_call_json(call).dump(),
            R"({"id":"call_abcdefghijklmnopqrstuvwx","type":"function","function":{"name":"get_weather",)"
            R"("arguments":"{\"city\": \"Roma\"}"}})");
  const ParserEvent header{ParserEvent::Kind::tool_header, "", 1, "call_x", "f"};
  EXPECT_EQ(tool_call_delta_json(header).dump(),
            R"({"index":1,"id":"call_x","type":"function","function":{"name":"f","arguments":""}})");
  const ParserEvent args{ParserEvent::Kind::tool_args, "{\"a\": ", 1, "", ""};
  EXPECT_EQ(tool_call_delta_json(args).dump(), R"({"index":1,"function":{"arguments":"{\"a\": "}})");
}

TEST(OutputParser, WhitespaceHandling) {
  auto r = parse("  \n  thinking  \n\n</think>\n\n  answer  \n\n", true);
  EXPECT_EQ(r.reasoning, "thinking");
  EXPECT_EQ(r.content, "answer");
  r = parse("line one\n\nline two", false);
  EXPECT_EQ(r.content, "line one\n\nline two");
}

}  // namespace
}  // namespace lily::chat
