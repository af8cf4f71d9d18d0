// Server-side prompt rendering: pre-render normalisation of OpenAI messages (chat.md §2.4) and the chat template
// (the model directory's chat_template.jinja, or tokenizer_config.json's chat_template) run by the Jinja
// interpreter with the request's chat_template_kwargs. Rule violations become ApiError 400 template_error.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/jinja.h"

namespace lily::server {

class ChatRenderer {
 public:
  // Reads DIR/chat_template.jinja, else DIR/tokenizer_config.json "chat_template". Throws lily::Error.
  static ChatRenderer load(const std::string& model_dir);

  // messages: validated request messages; tools: array or null; kwargs: object merged into the context.
  // add_generation_prompt is false when the last message is an assistant prefill (continued, not closed).
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     const nlohmann::ordered_json& kwargs, bool* continued = nullptr) const;

  // chat.md §2.4 normalisation: developer -> system, leading system messages joined, text parts joined,
  // tool-call argument strings parsed, reasoning -> reasoning_content, null content -> "".
  static nlohmann::ordered_json normalise(const nlohmann::ordered_json& messages);

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<jinja::Template> tmpl_;
};

}  // namespace lily::server
