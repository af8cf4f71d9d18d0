// Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens; docs/api-mapping.md) mapped onto the chat
// path: a request becomes a chat-completions body (system → system message, content blocks → messages with
// reasoning_content / tool_calls / tool results, tools' input_schema → parameters, tool_choice any/tool →
// required/named, thinking → enable_thinking) that the chat request parser validates; the chat path's Session
// events become a `message` object or the message_start … message_stop SSE events. Errors are Anthropic-shaped.
#pragma once
#include <string>

#include "server/api_format.h"
#include "server/request.h"

namespace lily::server {

// Body → chat-completions body. count_only: /count_tokens (max_tokens not required). Throws ApiError.
ojson messages_to_chat(const ojson& body, bool count_only);
// messages_to_chat + parse_chat_request (errors renamed to Messages fields).
ChatRequest parse_messages_request(const ojson& body, const RequestLimits& limits, bool count_only = false);

// {"type":"error","error":{"type":...,"message":...}} with the Anthropic error type for the status.
ojson anthropic_error(const ApiError& e);

class MessagesFormat : public ApiFormat {
 public:
  ojson response(const GenResult& r) override;
  std::string start() override;
  std::string events(const std::vector<OutEvent>& ev) override;
  std::string finish(const GenResult& r) override;
  std::string error(const std::string& message, const std::string& code) override;
  std::string ping() override;

 private:
  enum class Block { none, thinking, text, tool_use };
  std::string open(Block kind, const OutEvent* header);
  std::string close();

  Block cur_ = Block::none;
  int index_ = -1;         // content block index of the open block
  int tool_index_ = -1;
  std::string thinking_;   // the open thinking block's text (its signature covers it)
};

}  // namespace lily::server
