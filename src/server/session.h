// One request's output side, shared by the engine thread (which feeds tokens) and the HTTP thread (which
// formats them). Generated ids go through the chat output parser (reasoning / content / tool calls; chat only)
// or a streaming detokenizer (completions), then through the stop-string matcher; the resulting events are
// queued for the HTTP thread and also accumulated, so streaming and non-streaming responses are built from the
// same events (docs/api.md principle: one generation and parsing path).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "chat/output_parser.h"
#include "server/engine.h"
#include "server/stop_strings.h"
#include "tokenizer/tokenizer.h"

namespace lily::server {

struct OutEvent {
  enum class Kind { reasoning, content, tool_header, tool_args, text };
  Kind kind = Kind::text;
  std::string text;        // text delta or an arguments fragment
  int index = -1;          // tool call index
  std::string id, name;    // tool_header
};

// One logprobs entry (one generated token) with the returned text it produced, so that the entries' strings
// concatenate to the response text: text the output lost (content's leading whitespace, a stop string) is in no
// entry, text held back (whitespace, partial UTF-8, a possible stop string) is in the entry that released it.
struct LogprobEntry : SampledToken {
  std::string text;              // added to `content` (chat) or `text` (completions) while this token was handled
  std::string reasoning;         // chat: added to `reasoning`
  bool reasoning_token = false;  // chat: generated in the reasoning state (</think> included)
};

struct ToolCallOut {
  std::string id, name, arguments;
};

// Wakes the one HTTP thread that waits on several sessions (the n choices of a request) when any of them has
// news: it reads seq(), drains every session, then waits until seq() moves on (no news is lost in between).
class Wakeup {
 public:
  void notify();
  uint64_t seq();
  void wait(uint64_t seen, std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t seq_ = 0;  // notifications so far
};

struct SessionOptions {
  bool chat = true;                       // false: /v1/completions (no parser)
  std::vector<std::string> stop;
  bool parallel_tool_calls = true;
  bool logprobs = false;                  // keep per-token logprob entries
  chat::ParserOptions parser;             // chat: delimiter ids, initial reasoning state
  chat::ToolSet tools;
  std::shared_ptr<Wakeup> wake;           // also notified on news (null: only take()'s own wait)
};

class Session {
 public:
  Session(const Tokenizer& tok, SessionOptions opt);

  // Engine thread.
  bool on_token(const SampledToken& ev);
  void on_done(const GenJob& job);

  // HTTP thread: waits up to `timeout` for news; moves pending events/logprobs out. Returns true when the
  // job has finished (everything produced has been handed out by this call or earlier).
  bool take(std::vector<OutEvent>& events, std::vector<LogprobEntry>& lps, std::chrono::milliseconds timeout);
  // True once the job has ended (on_done ran): its GenJob result fields are final.
  bool finished();

  // Accumulated results (complete once take() returned true).
  std::string reasoning, content, text;
  std::vector<ToolCallOut> tool_calls;
  std::vector<LogprobEntry> all_logprobs;
  int reasoning_tokens = 0;
  bool stop_string_hit = false;
  std::string stop_string;           // the user stop string that ended the output
  int tool_call_parse_failures = 0;  // tool-call blocks the parser returned as content (malformed)

 private:
  void emit(OutEvent ev);
  void route(const chat::ParserEvent& e);
  void route_text(OutEvent::Kind kind, const std::string& text);
  void flush_stop();

  const Tokenizer& tok_;
  SessionOptions opt_;
  std::unique_ptr<chat::OutputParser> parser_;
  std::optional<StreamDecoder> decoder_;
  StopMatcher stop_;
  OutEvent::Kind held_kind_ = OutEvent::Kind::text;  // kind of the text the stop matcher holds
  bool ended_ = false;                               // stop string matched or a call limit reached
  std::vector<chat::ParserEvent> scratch_;
  std::optional<LogprobEntry> held_lp_;  // the latest entry: text flushed at the end still joins it
  void release_lp();

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<OutEvent> pending_;
  std::vector<LogprobEntry> pending_lp_;
  bool done_ = false;
};

}  // namespace lily::server
