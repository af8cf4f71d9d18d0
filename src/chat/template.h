// The model's chat template (docs/chat.md §2): loaded from a model directory and rendered with the Jinja
// interpreter exactly as transformers' apply_chat_template does; plus lily's pre-render normalisation of
// OpenAI request messages (docs/chat.md §2.4).
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/jinja.h"
#include "util/check.h"

namespace lily::chat {

using jinja::TemplateError;

// A request's messages that the template cannot take (bad content part, unparseable tool arguments, ...);
// the server answers 400 invalid_request_error with what().
struct MessageError : lily::Error {
  using lily::Error::Error;
};

class ChatTemplate {
 public:
  // `source`: the template text. `special_tokens`: variables transformers passes along (bos_token, eos_token,
  // ...), an object of strings; may be empty.
  explicit ChatTemplate(std::string source, nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object());
  // chat_template.jinja in `dir`, else the "chat_template" key of tokenizer_config.json (special tokens are
  // read from tokenizer_config.json when present). Throws lily::Error naming the file when neither exists.
  static ChatTemplate load_from_dir(const std::filesystem::path& dir);

  // messages: array of message objects; tools: array or null; template_kwargs: object (enable_thinking,
  // preserve_thinking, ...) or null. Throws TemplateError (what() = the template's raise_exception message).
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt, const nlohmann::ordered_json& template_kwargs) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  nlohmann::ordered_json special_tokens_;
  std::shared_ptr<jinja::Template> tmpl_;
};

// docs/chat.md §2.4, before rendering: developer → system; leading system messages joined with "\n\n";
// content null → ""; text parts concatenated (other part types → MessageError naming the type);
// tool_calls[].function.arguments JSON strings parsed to ordered objects (invalid → MessageError);
// `reasoning` feeds `reasoning_content` (reasoning_content wins when both are present).
nlohmann::ordered_json normalize_messages(const nlohmann::ordered_json& messages);

}  // namespace lily::chat
