// libFuzzer target for the output parsers (scripts/fuzz.sh builds it with ASan + UBSan).
// Input: byte 0 = flags (bit 0 start in reasoning, bits 1-2 tool format: auto, xml, json, auto + </thinking>
// fallback; bit 3 request has tools, bits 4-7 the schema type for the value-conversion check); then generated
// text where 0x00 escapes a delimiter:
// 00 00 <think>, 00 01 </think>, 00 02 <tool_call>, 00 03 </tool_call>, 00 04 <|im_end|>, 00 05 token boundary,
// anything else after 00 = a literal 0x00 byte.
// Checks (abort on failure): streamed deltas rebuild the final result, arguments are JSON objects, every text is
// valid UTF-8, and the result is the same for three tokenisations of the same text (as given, one token per
// text run, one byte per token). Also: convert_value + python_json_dumps always produce valid JSON.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "chat/output_parser.h"
#include "util/log.h"

namespace {

using namespace lily::chat;
using lily::utf8_lossy;

struct Tok {
  int32_t id;
  std::string text;
};

constexpr int32_t kText = 7;

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_parsers: invariant violated: %s\n", what);
    std::abort();
  }
}

const ToolSet& fuzz_tools() {
  static const ToolSet set = ToolSet::from_json(OrderedJson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "ratio": {"type": "number"},
      "flag": {"type": "boolean"}, "items": {"anyOf": [{"type": "array"}, {"type": "null"}]},
      "config": {"type": "object"}, "maybe": {"type": ["string", "null"]}}}}},
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}},
    {"name": "bare_schema_less"}
  ])"));
  return set;
}

ParseResult run(const std::vector<Tok>& toks, const ParserOptions& opt, const ToolSet& tools) {
  OutputParser parser(opt, tools);
  std::vector<ParserEvent> ev;
  std::string reasoning, content;
  std::vector<std::string> args;
  auto absorb = [&] {
    for (auto& e : ev) {
      require(utf8_lossy(e.text) == e.text, "event text is valid UTF-8");
      switch (e.kind) {
        case ParserEvent::Kind::reasoning: reasoning += e.text; break;
        case ParserEvent::Kind::content: content += e.text; break;
        case ParserEvent::Kind::tool_header:
          require(e.index == static_cast<int>(args.size()), "header indices count from 0");
          args.emplace_back();
          break;
        case ParserEvent::Kind::tool_args:
          require(e.index + 1 == static_cast<int>(args.size()), "arguments belong to the last header");
          args.back() += e.text;
          break;
      }
    }
    ev.clear();
  };
  for (const auto& t : toks) {
    parser.feed(t.id, t.text, ev);
    absorb();
  }
  parser.finish(ev);
  absorb();
  const ParseResult& r = parser.result();
  require(r.reasoning == reasoning && r.content == content, "deltas rebuild reasoning and content");
  require(r.tool_calls.size() == args.size(), "one header per call");
  for (size_t i = 0; i < args.size(); ++i) {
    require(r.tool_calls[i].arguments == args[i], "streamed arguments == final arguments");
    const auto j = OrderedJson::parse(args[i], nullptr, false);
    require(!j.is_discarded() && j.is_object(), "arguments are a JSON object");
    require(!tool_call_json(r.tool_calls[i]).dump().empty(), "OpenAI tool call object serialises");
  }
  return r;
}

bool same(const ParseResult& a, const ParseResult& b) {
  if (a.reasoning != b.reasoning || a.content != b.content || a.call_cut != b.call_cut ||
      a.reasoning_ended != b.reasoning_ended || a.tool_calls.size() != b.tool_calls.size())
    return false;
  for (size_t i = 0; i < a.tool_calls.size(); ++i)
    if (a.tool_calls[i].name != b.tool_calls[i].name || a.tool_calls[i].arguments != b.tool_calls[i].arguments)
      return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lily::log::set_level(lily::log::Level::error);
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const DelimiterIds ids;
  const int32_t delim[] = {ids.think_open, ids.think_close, ids.tool_open, ids.tool_close, ids.stop[0]};

  std::vector<Tok> toks, merged, bytes;
  std::string text, all_text;
  auto flush = [&] {
    if (!text.empty()) toks.push_back({kText, text});
    text.clear();
  };
  auto flush_merged = [&] {
    if (!all_text.empty()) {
      merged.push_back({kText, all_text});
      for (char c : all_text) bytes.push_back({kText, std::string(1, c)});
    }
    all_text.clear();
  };
  for (size_t i = 1; i < size; ++i) {
    if (data[i] == 0 && i + 1 < size && data[i + 1] <= 5) {
      const uint8_t k = data[++i];
      flush();
      if (k == 5) continue;
      flush_merged();
      const Tok d{delim[k], ""};
      toks.push_back(d);
      merged.push_back(d);
      bytes.push_back(d);
      continue;
    }
    text += static_cast<char>(data[i]);
    all_text += static_cast<char>(data[i]);
  }
  flush();
  flush_merged();

  ParserOptions opt;
  opt.start_in_reasoning = flags & 1;
  const int fmt = (flags >> 1) & 3;
  opt.format = fmt == 1 ? ToolFormat::xml : fmt == 2 ? ToolFormat::json : ToolFormat::automatic;
  opt.thinking_close_fallback = fmt == 3;
  opt.id_seed = 1;
  static const ToolSet no_tools;
  const ToolSet& tools = (flags & 8) ? fuzz_tools() : no_tools;

  const ParseResult a = run(toks, opt, tools);
  require(same(a, run(merged, opt, tools)), "same result with one token per text run");
  require(same(a, run(bytes, opt, tools)), "same result with one byte per token");
  require(utf8_lossy(a.reasoning) == a.reasoning && utf8_lossy(a.content) == a.content,
          "final texts are valid UTF-8");

  // Value conversion of the raw text under a schema type chosen by the flags.
  static const uint8_t kTypes[] = {0, ParamType::string, ParamType::integer, ParamType::number, ParamType::boolean,
                                   ParamType::object, ParamType::array, ParamType::null,
                                   ParamType::integer | ParamType::null, ParamType::array | ParamType::null,
                                   ParamType::string | ParamType::integer, ParamType::object | ParamType::string,
                                   ParamType::number | ParamType::boolean, ParamType::string | ParamType::null,
                                   ParamType::array | ParamType::object | ParamType::null, 127};
  const std::string raw(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string dumped = python_json_dumps(convert_value(raw, ParamType{kTypes[flags >> 4]}));
  require(utf8_lossy(dumped) == dumped, "converted value is valid UTF-8");
  require(!OrderedJson::parse(dumped, nullptr, false).is_discarded(), "converted value is valid JSON");
  return 0;
}
