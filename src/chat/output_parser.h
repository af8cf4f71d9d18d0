// Output parser (docs/chat.md §3–4): splits generated tokens into reasoning, content and OpenAI tool calls.
// One state machine serves streaming and non-streaming: `feed` one token at a time and forward the events,
// or call `parse_output` (which feeds every token and returns the final result). The final result is built
// from the same state as the events, so concatenated deltas == final fields for any tokenisation.
//
// Input per token: its id and its raw bytes (`token_text(id)`, which may be a partial UTF-8 sequence). The parser
// reassembles UTF-8 itself: every emitted text is complete, valid UTF-8 (invalid bytes become U+FFFD). Only the
// ids in DelimiterIds are treated specially (their bytes are ignored); every other token is text, so results do
// not depend on how the text between delimiters is split into tokens (tested by feeding every byte split).
//
// Deviations and choices within the spec:
// - The implicit end of reasoning (§4.3) is decided on text, not on a count of 8 tokens (which would make the
//   result depend on the tokenisation): <tool_call> + up to 64 whitespace bytes + a complete, valid
//   `<function=NAME>` (or `{"name"` in the JSON format) ends reasoning; anything else (or the end) refutes it.
// - Reasoning and content drop leading and trailing whitespace runs (docs/chat.md strips "\n"; replay trims anyway).
// - Output that ends inside a `<function=` header yields no call but sets call_cut.
// - A structural decision waits for at most 1024 bytes of whitespace / repeated </parameter> (degenerate output
//   stays linear); past that the text is not structural.
// - Qwen3 JSON calls are emitted whole (header + arguments) at their </tool_call>.
//
// Tool-call formats: Qwen3.5/3.6 XML (`<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>`) and
// Qwen3 JSON (`{"name": ..., "arguments": {...}}`) inside <tool_call>…</tool_call>; `ToolFormat::automatic`
// picks per block by its first non-whitespace character ('<' or '{'), which is unambiguous.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chat/tool_values.h"

namespace lily::chat {

// Token ids of the delimiters the parser matches on ids (the caller fills them from its vocabulary).
struct DelimiterIds {
  int32_t think_open = 248068;               // <think>
  int32_t think_close = 248069;              // </think>
  int32_t tool_open = 248058;                // <tool_call>
  int32_t tool_close = 248059;               // </tool_call>
  std::vector<int32_t> stop = {248046, 248044};  // <|im_end|>, <|endoftext|>: end of output

  static DelimiterIds qwen36() { return {}; }
  static DelimiterIds qwen3() { return {151667, 151668, 151657, 151658, {151645, 151643}}; }
};

enum class ToolFormat { automatic, xml, json };

struct ParserOptions {
  DelimiterIds ids;
  ToolFormat format = ToolFormat::automatic;
  bool start_in_reasoning = false;           // from initial_reasoning_state(prompt ids)
  bool thinking_close_fallback = false;      // §4.6: literal text "</thinking>" also ends reasoning
  // Call ids: "call_" + 24 alphanumerics from a generator seeded with id_seed (random when unset), or
  // make_call_id when set.
  std::optional<uint64_t> id_seed;
  std::function<std::string()> make_call_id;
};

// §4.1: true iff, scanning the prompt ids backwards, <think> is found before </think>.
bool initial_reasoning_state(std::span<const int32_t> prompt, const DelimiterIds& ids);

struct ParserEvent {
  enum class Kind { reasoning, content, tool_header, tool_args };
  Kind kind;
  std::string text;   // reasoning/content delta, or an arguments fragment
  int index = -1;     // tool call index (tool_header, tool_args)
  std::string id;     // tool_header: "call_…"
  std::string name;   // tool_header: function name
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON object text, Python json.dumps style
};

struct ParseResult {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
  int reasoning_tokens = 0;   // tokens generated in the reasoning state, </think> included
  bool call_cut = false;      // output ended inside a tool call (its arguments were closed with what was parsed)
  bool reasoning_ended = false;  // reasoning was closed (</think> or an implicit end by a tool call)
  int tool_call_parse_failures = 0;  // <tool_call> blocks returned as content (no valid header, invalid JSON)
};

class OutputParser {
 public:
  OutputParser(ParserOptions options, ToolSet tools);
  ~OutputParser();
  OutputParser(const OutputParser&) = delete;
  OutputParser& operator=(const OutputParser&) = delete;

  // One generated token. Events are appended to `events`. Tokens after a stop id are ignored.
  void feed(int32_t id, std::string_view bytes, std::vector<ParserEvent>& events);
  // End of output (stop token, stop string or length). Flushes everything held back. Idempotent.
  void finish(std::vector<ParserEvent>& events);
  // The result so far (complete after finish).
  const ParseResult& result() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// OpenAI objects: a message's `tool_calls[i]`, and a stream chunk's `delta.tool_calls[0]` for a tool_header or
// tool_args event (header: index, id, type, function {name, arguments ""}; args: index, function {arguments}).
OrderedJson tool_call_json(const ToolCall& call);
OrderedJson tool_call_delta_json(const ParserEvent& event);

// Non-streaming: feeds tokens (ids[i] with texts[i]) and finishes.
ParseResult parse_output(std::span<const int32_t> ids, std::span<const std::string> texts, ParserOptions options,
                         const ToolSet& tools);

}  // namespace lily::chat
