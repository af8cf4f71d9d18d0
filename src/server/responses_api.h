// OpenAI Responses API (POST /v1/responses, docs/api-mapping.md): the stateless subset mapped onto the chat path.
// A request becomes a chat-completions body (input items → messages, instructions → system, text.format →
// response_format, reasoning.effort → reasoning_effort, max_output_tokens → max_tokens) that the chat request
// parser validates, so both endpoints share limits, template, parsers, prefix cache and metrics. The chat path's
// Session events become `response` objects and the typed `response.*` SSE events (each with sequence_number).
#pragma once
#include <memory>
#include <string>

#include "server/api_format.h"
#include "server/request.h"

namespace lily::server {

struct ResponsesRequest {
  ojson chat;              // the equivalent chat-completions body
  ChatRequest chat_req;    // that body parsed by the chat path (errors renamed to Responses fields)
  ojson echo;              // request settings echoed in the response object (instructions, tools, ...)
};

// Body → chat-completions body. Throws ApiError naming the Responses field (input[2].call_id, text.format, ...).
ojson responses_to_chat(const ojson& body);
// responses_to_chat + parse_chat_request.
ResponsesRequest parse_responses_request(const ojson& body, const RequestLimits& limits);

class ResponsesFormat : public ApiFormat {
 public:
  explicit ResponsesFormat(ojson echo) : echo_(std::move(echo)) {}
  nlohmann::ordered_json response(const GenResult& r) override;
  std::string start() override;
  std::string events(const std::vector<OutEvent>& ev) override;
  std::string finish(const GenResult& r) override;
  std::string error(const std::string& message, const std::string& code) override;
  std::string ping() override { return ": ping\n\n"; }

 private:
  enum class Item { none, reasoning, message, function_call };
  ojson object(const std::string& status, const ojson& output, const GenResult* r) const;
  std::string emit(const std::string& type, ojson data);
  std::string open(Item kind, const OutEvent* header);
  std::string close();
  std::string new_id(const char* prefix);

  ojson echo_;
  int seq_ = 0;            // sequence_number of the next event
  int n_ids_ = 0;
  Item cur_ = Item::none;  // the output item being streamed
  ojson item_;             // its object (text / arguments accumulate)
  std::string text_;
  int tool_index_ = -1;
  ojson output_ = ojson::array();  // finished items, in order
};

}  // namespace lily::server
