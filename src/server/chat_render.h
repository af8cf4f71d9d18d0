// Server-side prompt rendering over the chat library (chat/template.h): normalises the request's messages
// (docs/chat.md §2.4), renders the model's template with the request's chat_template_kwargs, and turns every
// template or message error into ApiError 400. A trailing assistant message is continued (prefill): the
// prompt ends inside that turn, without its closing <|im_end|> and without a generation prompt.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/template.h"

namespace lily::server {

class ChatRenderer {
 public:
  // Throws lily::Error when the directory has no usable template.
  static ChatRenderer load(const std::string& model_dir);

  // messages: validated request messages; tools: array or null; kwargs: template variables.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     const nlohmann::ordered_json& kwargs) const;

 private:
  std::shared_ptr<chat::ChatTemplate> tmpl_;
};

}  // namespace lily::server
