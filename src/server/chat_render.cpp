// Request messages -> prompt text with ApiError mapping (see chat_render.h).
#include "server/chat_render.h"

#include "server/api_error.h"

namespace lily::server {

ChatRenderer ChatRenderer::load(const std::string& model_dir) {
  ChatRenderer r;
  r.tmpl_ = std::make_shared<chat::ChatTemplate>(chat::ChatTemplate::load_from_dir(model_dir));
  return r;
}

std::string ChatRenderer::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 const nlohmann::ordered_json& kwargs) const {
  std::string out;
  bool prefill = false;
  try {
    nlohmann::ordered_json msgs = chat::normalize_messages(messages);
    prefill = !msgs.empty() && msgs.back().value("role", "") == "assistant";
    out = tmpl_->render(msgs, tools.is_array() && !tools.empty() ? tools : nlohmann::ordered_json(nullptr), !prefill,
                        kwargs);
  } catch (const chat::MessageError& e) {
    throw ApiError(400, "invalid_request_error", "invalid_value", "messages", e.what());
  } catch (const std::exception& e) {
    throw ApiError(400, "invalid_request_error", "template_error", "messages", e.what());
  }
  if (prefill) {
    // Continue the trailing assistant turn: drop the template's closing "<|im_end|>" (and its newline).
    for (const std::string close : {"<|im_end|>\n", "<|im_end|>"}) {
      if (out.size() >= close.size() && out.compare(out.size() - close.size(), close.size(), close) == 0) {
        out.resize(out.size() - close.size());
        break;
      }
    }
  }
  return out;
}

}  // namespace lily::server
