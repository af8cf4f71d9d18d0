// Shared pieces of the non-OpenAI-chat generation endpoints (/v1/responses, /v1/messages; docs/api-mapping.md):
// the finished generation as plain data (GenResult) and the formatter interface an endpoint implements to turn
// the chat path's Session events into its own JSON body or SSE events. The HTTP layer only moves strings.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/session.h"

namespace lily::server {

// What one finished chat-path generation produced, transport- and API-independent.
struct GenResult {
  std::string reasoning, content;        // parsed reasoning text and visible text
  std::vector<ToolCallOut> tool_calls;   // id, name, arguments (a JSON object's text)
  int n_prompt = 0;                      // prompt tokens
  int n_cached = 0;                      // of those, served from the prefix cache
  int n_generated = 0;                   // generated tokens (a stop token included)
  int reasoning_tokens = 0;              // of those, generated in the reasoning state
  bool length = false;                   // ended by the token limit (max_tokens / context)
  std::string stop_string;               // the user stop string that ended the output, or empty
};

GenResult gen_result(const Session& s, const GenJob& job);

// One response's formatting for an API: a non-streaming body, or the SSE byte stream in pieces.
class ApiFormat {
 public:
  virtual ~ApiFormat() = default;
  virtual nlohmann::ordered_json response(const GenResult& r) = 0;  // non-streaming body
  virtual std::string start() = 0;                                  // the events before any output
  virtual std::string events(const std::vector<OutEvent>& ev) = 0;  // output so far
  virtual std::string finish(const GenResult& r) = 0;               // closing events (the stream ends after)
  virtual std::string error(const std::string& message, const std::string& code) = 0;  // failure mid-stream
  virtual std::string ping() = 0;                                   // keep-alive while nothing is produced

  std::string id, model;   // the response id ("resp_…", "msg_…") and the served model's alias
  int64_t created = 0;     // unix seconds
  int n_prompt = 0;        // prompt tokens (known before generation; message_start needs it)
};

// `event: NAME\ndata: JSON\n\n` (both APIs name their SSE events).
std::string sse_event(const std::string& name, const nlohmann::ordered_json& data);

// The lily test header `X-Lily-Logit-Bias: {"id": bias, ...}` (for clients that cannot add body fields, such as
// agents driven by environment variables): becomes the body's `logit_bias` unless the body has one.
void apply_logit_bias_header(nlohmann::ordered_json& body, const std::string& header);

// Renames an ApiError's `param` from the chat field the mapped request used to the field of the caller's API
// (`renames`: chat name → API name; a chat name that starts with "messages" becomes `messages_as`).
[[noreturn]] void rethrow_renamed(const ApiError& e, const std::vector<std::pair<std::string, std::string>>& renames,
                                  const std::string& messages_as);

}  // namespace lily::server
