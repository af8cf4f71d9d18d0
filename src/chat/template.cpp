// ChatTemplate: loading the template shipped with a model and rendering it like transformers; message
// normalisation of docs/chat.md §2.4.
#include "chat/template.h"

#include <fstream>
#include <sstream>

#include "tokenizer/unicode.h"

namespace lily::chat {
namespace {

using json = nlohmann::ordered_json;

std::string read_file(const std::filesystem::path& p) {
  // A chat template or tokenizer_config.json is kilobytes; refuse absurd sizes before reading them.
  constexpr uintmax_t kMaxFile = 64u << 20;
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(p, ec);
  if (!ec && size > kMaxFile) lily::fail(p.string(), ": ", size, " bytes is too large (at most ", kMaxFile, ")");
  std::ifstream f(p, std::ios::binary);
  if (!f) lily::fail("cannot read ", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// transformers passes special_tokens_map: string tokens, or AddedToken objects with "content".
json special_tokens_of(const json& config) {
  json out = json::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!config.contains(key)) continue;
    const json& v = config[key];
    if (v.is_string()) out[key] = v;
    else if (v.is_object() && v.contains("content") && v["content"].is_string()) out[key] = v["content"];
  }
  return out;
}

std::string content_text(const json& content, size_t index) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    throw MessageError("messages[" + std::to_string(index) + "].content must be a string, an array of parts or null");
  std::string out;
  for (const auto& part : content) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw MessageError("messages[" + std::to_string(index) + "].content parts must be objects with a string type");
    std::string type = part["type"].get<std::string>();
    if (type != "text")
      throw MessageError("messages[" + std::to_string(index) + "]: content part type '" + type +
                         "' is not supported (lily accepts text only)");
    if (!part.contains("text") || !part["text"].is_string())
      throw MessageError("messages[" + std::to_string(index) + "]: a text part needs a string 'text'");
    out += part["text"].get<std::string>();
  }
  return out;
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, nlohmann::ordered_json special_tokens)
    : source_(std::move(source)), special_tokens_(std::move(special_tokens)),
      tmpl_(std::make_shared<jinja::Template>(source_)) {}

ChatTemplate ChatTemplate::load_from_dir(const std::filesystem::path& dir) {
  const auto jinja_path = dir / "chat_template.jinja";
  const auto config_path = dir / "tokenizer_config.json";
  json config = json::object();
  if (std::filesystem::exists(config_path)) {
    try {
      config = json::parse(read_file(config_path));
    } catch (const json::exception& e) {
      lily::fail(config_path.string(), ": invalid JSON: ", e.what());
    }
  }
  std::string source;
  if (std::filesystem::exists(jinja_path)) {
    source = read_file(jinja_path);
    // Checked here, not at the first chat: every prompt rendered from it would fail to tokenize.
    if (size_t bad = unicode::find_invalid_utf8(source); bad != std::string::npos)
      lily::fail(jinja_path.string(), ": not valid UTF-8 (byte ", bad, " of ", source.size(), ")");
  } else if (config.contains("chat_template")) {
    const json& t = config["chat_template"];
    if (t.is_string()) {
      source = t.get<std::string>();
    } else if (t.is_array()) {  // named templates: [{"name": "default", "template": "..."}]
      for (const auto& e : t)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
          source = e["template"].get<std::string>();
      if (source.empty()) lily::fail(config_path.string(), ": chat_template has no 'default' entry");
    } else {
      lily::fail(config_path.string(), ": chat_template must be a string");
    }
  } else {
    lily::fail("no chat template in ", dir.string(), " (expected chat_template.jinja or tokenizer_config.json ",
               "with a chat_template key)");
  }
  try {
    return ChatTemplate(std::move(source), special_tokens_of(config));
  } catch (const TemplateError& e) {
    throw TemplateError("chat template of " + dir.string() + ": " + e.what());
  }
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt, const nlohmann::ordered_json& template_kwargs) const {
  // The same variables, in the same precedence, as transformers' render_jinja_template.
  json ctx = special_tokens_;
  ctx["messages"] = messages;
  ctx["tools"] = tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  if (template_kwargs.is_object())
    for (const auto& [k, v] : template_kwargs.items()) ctx[k] = v;
  std::string out = tmpl_->render(ctx);
  // The prompt goes to the tokenizer, which takes only UTF-8: a template error, not a failure later on.
  if (size_t bad = unicode::find_invalid_utf8(out); bad != std::string::npos)
    throw TemplateError("the chat template produced text that is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  return out;
}

nlohmann::ordered_json normalize_messages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) throw MessageError("messages must be an array");
  json out = json::array();
  bool leading = true;  // still inside the run of leading system messages
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object()) throw MessageError("messages[" + std::to_string(i) + "] must be an object");
    if (!m.contains("role") || !m["role"].is_string())
      throw MessageError("messages[" + std::to_string(i) + "].role must be a string");
    json n = m;
    if (n["role"] == "developer") n["role"] = "system";
    n["content"] = content_text(m.contains("content") ? m["content"] : json(), i);
    if (n.contains("reasoning")) {
      if (!n.contains("reasoning_content") || n["reasoning_content"].is_null()) n["reasoning_content"] = n["reasoning"];
      n.erase("reasoning");
    }
    if (n.contains("tool_calls") && n["tool_calls"].is_array()) {
      for (size_t c = 0; c < n["tool_calls"].size(); ++c) {
        json& call = n["tool_calls"][c];
        json* fn = call.is_object() && call.contains("function") ? &call["function"] : &call;
        if (!fn->is_object() || !fn->contains("arguments")) continue;
        json& args = (*fn)["arguments"];
        if (args.is_string()) {
          const std::string where =
              "messages[" + std::to_string(i) + "].tool_calls[" + std::to_string(c) + "].function.arguments";
          try {
            args = json::parse(args.get<std::string>());
          } catch (const json::exception&) {
            throw MessageError(where + " is not valid JSON");
          }
          if (!args.is_object()) throw MessageError(where + " must be a JSON object");
        }
      }
    }
    // Consecutive leading system messages become one (docs/chat.md §2.4); a later one is left for the template.
    const bool is_system = n["role"] == "system";
    if (is_system && leading && !out.empty()) {
      out[0]["content"] = out[0]["content"].get<std::string>() + "\n\n" + n["content"].get<std::string>();
      continue;
    }
    leading = leading && is_system;
    out.push_back(std::move(n));
  }
  return out;
}

}  // namespace lily::chat
