// Message normalisation and template rendering for the server (see chat_render.h).
#include "server/chat_render.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "server/api_error.h"
#include "util/check.h"

namespace lily::server {
namespace {

using ojson = nlohmann::ordered_json;

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("cannot read ", p.string());
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

std::string text_of(const ojson& content) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  for (auto& part : content)
    if (part.is_object() && part.contains("text") && part["text"].is_string()) out += part["text"].get<std::string>();
  return out;
}

}  // namespace

ChatRenderer ChatRenderer::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  ChatRenderer r;
  fs::path dir(model_dir);
  if (fs::exists(dir / "chat_template.jinja")) {
    r.source_ = read_file(dir / "chat_template.jinja");
  } else if (fs::exists(dir / "tokenizer_config.json")) {
    auto cfg = nlohmann::json::parse(read_file(dir / "tokenizer_config.json"), nullptr, false);
    if (cfg.is_object() && cfg.contains("chat_template") && cfg["chat_template"].is_string())
      r.source_ = cfg["chat_template"].get<std::string>();
  }
  if (r.source_.empty()) fail(model_dir, ": no chat_template.jinja and no chat_template in tokenizer_config.json");
  try {
    r.tmpl_ = std::make_shared<jinja::Template>(r.source_);
  } catch (const std::exception& e) {
    fail(model_dir, ": the chat template does not parse: ", e.what());
  }
  return r;
}

ojson ChatRenderer::normalise(const ojson& messages) {
  ojson out = ojson::array();
  std::string system;
  bool have_system = false;
  size_t i = 0;
  for (; i < messages.size(); ++i) {
    std::string role = messages[i]["role"].get<std::string>();
    if (role != "system" && role != "developer") break;
    if (have_system) system += "\n\n";
    system += text_of(messages[i].value("content", ojson(nullptr)));
    have_system = true;
  }
  if (have_system) out.push_back({{"role", "system"}, {"content", system}});
  for (; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    std::string role = m["role"].get<std::string>();
    std::string p = "messages[" + std::to_string(i) + "]";
    if (role == "system" || role == "developer")
      throw ApiError(400, "invalid_request_error", "template_error", p + ".role",
                     "System message must be at the beginning.");
    ojson n = ojson::object();
    n["role"] = role;
    n["content"] = text_of(m.value("content", ojson(nullptr)));
    if (role == "assistant") {
      const ojson* rc = nullptr;
      for (const char* key : {"reasoning_content", "reasoning"})
        if (m.contains(key) && m[key].is_string()) { rc = &m[key]; break; }
      if (rc) n["reasoning_content"] = *rc;
      if (m.contains("tool_calls") && m["tool_calls"].is_array() && !m["tool_calls"].empty()) {
        ojson calls = ojson::array();
        for (auto& tc : m["tool_calls"]) {
          ojson c = tc;
          ojson& f = c["function"];
          if (f.contains("arguments") && f["arguments"].is_string())
            f["arguments"] = ojson::parse(f["arguments"].get<std::string>());
          else if (!f.contains("arguments") || f["arguments"].is_null())
            f["arguments"] = ojson::object();
          calls.push_back(std::move(c));
        }
        n["tool_calls"] = std::move(calls);
      }
    } else if (role == "tool") {
      if (m.contains("tool_call_id")) n["tool_call_id"] = m["tool_call_id"];
    }
    out.push_back(std::move(n));
  }
  return out;
}

std::string ChatRenderer::render(const ojson& messages, const ojson& tools, const ojson& kwargs,
                                 bool* continued) const {
  ojson ctx = ojson::object();
  for (auto& [k, v] : kwargs.items()) ctx[k] = v;
  ojson msgs = normalise(messages);
  bool prefill = !msgs.empty() && msgs.back()["role"] == "assistant";
  ctx["messages"] = msgs;
  if (tools.is_array() && !tools.empty()) ctx["tools"] = tools;
  ctx["add_generation_prompt"] = !prefill;
  if (continued) *continued = prefill;
  std::string out;
  try {
    out = tmpl_->render(ctx);
  } catch (const ApiError&) {
    throw;
  } catch (const std::exception& e) {
    throw ApiError(400, "invalid_request_error", "template_error", "messages", e.what());
  }
  if (prefill) {
    // Continue the trailing assistant turn: drop the template's closing "<|im_end|>\n".
    const std::string close = "<|im_end|>\n";
    if (out.size() >= close.size() && out.compare(out.size() - close.size(), close.size(), close) == 0)
      out.resize(out.size() - close.size());
    else if (out.size() >= close.size() - 1 && out.compare(out.size() - (close.size() - 1), close.size() - 1, "<|im_end|>") == 0)
      out.resize(out.size() - (close.size() - 1));
  }
  return out;
}

}  // namespace lily::server
