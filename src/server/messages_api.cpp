// Messages API mapping and formatting (see messages_api.h; the block ↔ message table is docs/api-mapping.md).
#include "server/messages_api.h"

#include <cstdio>

#include "server/api_error.h"
#include "server/json_fields.h"

namespace lily::server {
namespace {

// A string or an array of text blocks (system, tool_result content) → one string; blocks join with `sep`.
std::string text_blocks(const ojson& v, const std::string& param, const char* sep) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) throw invalid_value(param, "'" + param + "' must be a string or an array of blocks");
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    std::string p = param + "[" + std::to_string(i) + "]";
    if (!v[i].is_object()) throw invalid_value(p, "'" + p + "' must be an object");
    std::string type = str_field(v[i], "type", p);
    if (type != "text") throw not_supported(p + ".type", "block type '" + type + "' is not supported here (text only)");
    out += (i ? sep : "") + str_field(v[i], "text", p);
  }
  return out;
}

// One API message → chat messages. A user message's tool_result blocks become `tool` messages (in block order,
// text between them becomes user messages); an assistant message's thinking / text / tool_use blocks become one
// assistant message (reasoning_content, content, tool_calls).
void map_message(const ojson& m, const std::string& p, ojson& out) {
  if (!m.is_object()) throw invalid_value(p, "'" + p + "' must be an object");
  std::string role = str_field(m, "role", p);
  if (role != "user" && role != "assistant")
    throw invalid_value(p + ".role", "'" + p + ".role' must be 'user', 'assistant' or 'system', got '" + role + "'");
  const ojson* c = member(m, "content");
  if (!c) throw invalid_value(p + ".content", "'" + p + ".content' is required");
  if (c->is_string()) {
    out.push_back({{"role", role}, {"content", *c}});
    return;
  }
  if (!c->is_array()) throw invalid_value(p + ".content", "'" + p + ".content' must be a string or an array of blocks");
  ojson msg = {{"role", role}, {"content", ""}};
  bool pending = false;  // msg holds something not yet pushed
  for (size_t i = 0; i < c->size(); ++i) {
    const ojson& b = (*c)[i];
    std::string q = p + ".content[" + std::to_string(i) + "]";
    if (!b.is_object()) throw invalid_value(q, "'" + q + "' must be an object");
    std::string type = str_field(b, "type", q);
    if (type == "text") {
      msg["content"] = msg["content"].get<std::string>() + str_field(b, "text", q);
      pending = true;
    } else if (type == "thinking" && role == "assistant") {
      msg["reasoning_content"] = msg.value("reasoning_content", "") + str_field(b, "thinking", q);
      pending = true;
    } else if (type == "redacted_thinking" && role == "assistant") {
      // encrypted by another provider: nothing lily can render
    } else if (type == "tool_use" && role == "assistant") {
      const ojson* in = member(b, "input");
      if (in && !in->is_object()) throw invalid_value(q + ".input", "'" + q + ".input' must be an object");
      if (!msg.contains("tool_calls")) msg["tool_calls"] = ojson::array();
      msg["tool_calls"].push_back({{"id", str_field(b, "id", q)}, {"type", "function"},
                                   {"function", {{"name", str_field(b, "name", q)},
                                                 {"arguments", in ? *in : ojson::object()}}}});
      pending = true;
    } else if (type == "tool_result" && role == "user") {
      if (pending) out.push_back(msg);
      msg = {{"role", role}, {"content", ""}};
      pending = false;
      const ojson* rc = member(b, "content");
      out.push_back({{"role", "tool"}, {"tool_call_id", str_field(b, "tool_use_id", q)},
                     {"content", rc ? text_blocks(*rc, q + ".content", "\n") : ""}});
    } else if (type == "image" || type == "document" || type == "search_result") {
      throw not_supported(q + ".type", "block type '" + type + "' is not supported (text-only model)");
    } else {
      throw invalid_value(q + ".type", "block type '" + type + "' is not valid in a " + role + " message");
    }
  }
  if (pending || c->empty()) out.push_back(msg);
}

ojson map_tools(const ojson& tools) {
  if (!tools.is_array()) throw invalid_value("tools", "'tools' must be an array");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    std::string p = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) throw invalid_value(p, "'" + p + "' must be an object");
    if (const ojson* type = member(t, "type"); type && *type != "custom")
      throw not_supported(p + ".type", "tool type '" + (type->is_string() ? type->get<std::string>() : type->dump()) +
                                           "' is not supported (only client tools with an input_schema)");
    const ojson* schema = member(t, "input_schema");
    if (!schema || !schema->is_object()) throw invalid_value(p + ".input_schema", "'" + p + ".input_schema' must be an object");
    ojson fn = {{"name", str_field(t, "name", p)}};
    if (const ojson* d = member(t, "description")) fn["description"] = *d;
    fn["parameters"] = *schema;
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  return out;
}

std::string hex64(const std::string& s) {  // FNV-1a, for the opaque thinking signature
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string signature(const std::string& thinking) { return "lily-" + hex64(thinking); }

const char* stop_reason(const GenResult& r) {
  if (r.length) return "max_tokens";
  if (!r.tool_calls.empty()) return "tool_use";
  if (!r.stop_string.empty()) return "stop_sequence";
  return "end_turn";
}

ojson usage(const GenResult& r) {
  return {{"input_tokens", r.n_prompt - r.n_cached}, {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", r.n_cached}, {"output_tokens", r.n_generated}};
}

ojson tool_input(const std::string& args) {
  ojson in = ojson::parse(args.empty() ? "{}" : args, nullptr, false);
  return in.is_object() ? in : ojson::object();
}

}  // namespace

ojson messages_to_chat(const ojson& b, bool count_only) {
  ojson chat = ojson::object();
  if (const ojson* m = member(b, "model")) chat["model"] = *m;
  if (!count_only) {
    const ojson* mt = member(b, "max_tokens");
    if (!mt) throw invalid_value("max_tokens", "'max_tokens' is required");
    chat["max_tokens"] = *mt;
  }
  ojson msgs = ojson::array();
  std::string system;
  if (const ojson* s = member(b, "system")) system = text_blocks(*s, "system", "\n\n");
  const ojson* in = member(b, "messages");
  if (!in) throw invalid_value("messages", "'messages' is required");
  if (!in->is_array() || in->empty()) throw invalid_value("messages", "'messages' must be a non-empty array");
  for (size_t i = 0; i < in->size(); ++i) {
    const ojson& m = (*in)[i];
    std::string p = "messages[" + std::to_string(i) + "]";
    // A system message inside the conversation (Claude Code sends them): the chat template takes one system
    // message, first, so its text joins the system prompt.
    if (m.is_object() && m.contains("role") && m["role"] == "system") {
      const ojson* c = member(m, "content");
      if (!c) throw invalid_value(p + ".content", "'" + p + ".content' is required");
      std::string t = text_blocks(*c, p + ".content", "\n\n");
      system += (system.empty() || t.empty() ? "" : "\n\n") + t;
      continue;
    }
    map_message(m, p, msgs);
  }
  if (msgs.empty()) throw invalid_value("messages", "'messages' holds no user or assistant message");
  if (!system.empty()) msgs.insert(msgs.begin(), ojson({{"role", "system"}, {"content", system}}));
  chat["messages"] = msgs;
  bool tools_off = false;
  if (const ojson* tc = member(b, "tool_choice")) {
    if (!tc->is_object()) throw invalid_value("tool_choice", "'tool_choice' must be an object");
    std::string type = str_field(*tc, "type", "tool_choice");
    if (type == "auto") chat["tool_choice"] = "auto";
    else if (type == "any") chat["tool_choice"] = "required";
    else if (type == "none") tools_off = true;
    else if (type == "tool") chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", str_field(*tc, "name", "tool_choice")}}}};
    else throw invalid_value("tool_choice.type", "'tool_choice.type' must be auto, any, tool or none");
    if (const ojson* d = member(*tc, "disable_parallel_tool_use")) {
      if (!d->is_boolean()) throw invalid_value("tool_choice.disable_parallel_tool_use", "must be a boolean");
      chat["parallel_tool_calls"] = !d->get<bool>();
    }
  }
  if (const ojson* t = member(b, "tools"); t && !tools_off) {
    ojson tools = map_tools(*t);
    if (!tools.empty()) chat["tools"] = tools;
  }
  if (const ojson* s = member(b, "stop_sequences")) chat["stop"] = *s;
  if (const ojson* t = member(b, "temperature")) {
    if (!t->is_number() || t->get<double>() < 0 || t->get<double>() > 1)
      throw invalid_value("temperature", "'temperature' must be a number in [0, 1]");
    chat["temperature"] = *t;
  }
  // Thinking is off unless asked for (the Messages API's default), whatever the server's chat default.
  bool thinking = false;
  if (const ojson* th = member(b, "thinking")) {
    if (!th->is_object()) throw invalid_value("thinking", "'thinking' must be an object");
    std::string type = str_field(*th, "type", "thinking");
    if (type == "enabled") {
      const ojson* bt = member(*th, "budget_tokens");
      if (!bt || !bt->is_number_integer() || bt->get<int64_t>() < 1)
        throw invalid_value("thinking.budget_tokens", "'thinking.budget_tokens' must be a positive integer");
      thinking = true;
    } else if (type == "adaptive") {
      thinking = true;
    } else if (type != "disabled") {
      throw invalid_value("thinking.type", "'thinking.type' must be enabled, adaptive or disabled");
    }
  }
  if (member(b, "mcp_servers")) throw not_supported("mcp_servers", "MCP servers are not supported");
  if (member(b, "container")) throw not_supported("container", "containers are not supported");
  for (const char* k : {"top_p", "top_k", "stream", "min_p", "seed", "logit_bias", "presence_penalty",
                        "frequency_penalty", "repetition_penalty"})
    if (const ojson* v = member(b, k)) chat[k] = *v;
  ojson kwargs = {{"enable_thinking", thinking}};
  if (const ojson* k = member(b, "chat_template_kwargs")) {  // lily extension, as on the chat path
    if (!k->is_object()) throw invalid_value("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    for (auto& [key, v] : k->items()) kwargs[key] = v;
  }
  chat["chat_template_kwargs"] = kwargs;
  return chat;
}

ChatRequest parse_messages_request(const ojson& b, const RequestLimits& limits, bool count_only) {
  ojson chat = messages_to_chat(b, count_only);
  try {
    return parse_chat_request(chat, limits);
  } catch (const ApiError& e) {
    rethrow_renamed(e, {{"stop", "stop_sequences"}, {"parallel_tool_calls", "tool_choice.disable_parallel_tool_use"}},
                    "messages");
  }
}

ojson anthropic_error(const ApiError& e) {
  const char* type = "invalid_request_error";
  switch (e.status) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503: type = "overloaded_error"; break;
    default: if (e.status >= 500) type = "api_error";
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}};
}

// ---- formatting ----

ojson MessagesFormat::response(const GenResult& r) {
  ojson content = ojson::array();
  if (!r.reasoning.empty())
    content.push_back({{"type", "thinking"}, {"thinking", r.reasoning}, {"signature", signature(r.reasoning)}});
  if (!r.content.empty()) content.push_back({{"type", "text"}, {"text", r.content}});
  for (const auto& c : r.tool_calls)
    content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", tool_input(c.arguments)}});
  return {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", model}, {"content", content},
          {"stop_reason", stop_reason(r)},
          {"stop_sequence", r.stop_string.empty() ? ojson(nullptr) : ojson(r.stop_string)},
          {"usage", usage(r)}};
}

std::string MessagesFormat::start() {
  ojson msg = {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", model},
               {"content", ojson::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
               {"usage", {{"input_tokens", n_prompt}, {"cache_creation_input_tokens", 0},
                          {"cache_read_input_tokens", 0}, {"output_tokens", 0}}}};
  return sse_event("message_start", {{"type", "message_start"}, {"message", msg}}) + ping();
}

std::string MessagesFormat::ping() { return sse_event("ping", {{"type", "ping"}}); }

std::string MessagesFormat::open(Block kind, const OutEvent* header) {
  std::string out = close();
  cur_ = kind;
  ++index_;
  ojson block;
  if (kind == Block::thinking) {
    thinking_.clear();
    block = {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
  } else if (kind == Block::text) {
    block = {{"type", "text"}, {"text", ""}};
  } else {
    tool_index_ = header->index;
    block = {{"type", "tool_use"}, {"id", header->id}, {"name", header->name}, {"input", ojson::object()}};
  }
  return out + sse_event("content_block_start", {{"type", "content_block_start"}, {"index", index_},
                                                  {"content_block", block}});
}

std::string MessagesFormat::close() {
  if (cur_ == Block::none) return {};
  std::string out;
  if (cur_ == Block::thinking)
    out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                     {"delta", {{"type", "signature_delta"}, {"signature", signature(thinking_)}}}});
  out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
  cur_ = Block::none;
  return out;
}

std::string MessagesFormat::events(const std::vector<OutEvent>& ev) {
  std::string out;
  auto delta = [&](ojson d) {
    out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", d}});
  };
  for (const auto& e : ev) {
    switch (e.kind) {
      case OutEvent::Kind::reasoning:
        if (e.text.empty()) break;
        if (cur_ != Block::thinking) out += open(Block::thinking, nullptr);
        thinking_ += e.text;
        delta({{"type", "thinking_delta"}, {"thinking", e.text}});
        break;
      case OutEvent::Kind::content:
      case OutEvent::Kind::text:
        if (e.text.empty()) break;
        if (cur_ != Block::text) out += open(Block::text, nullptr);
        delta({{"type", "text_delta"}, {"text", e.text}});
        break;
      case OutEvent::Kind::tool_header:
        out += open(Block::tool_use, &e);
        break;
      case OutEvent::Kind::tool_args:
        if (e.text.empty() || cur_ != Block::tool_use || e.index != tool_index_) break;
        delta({{"type", "input_json_delta"}, {"partial_json", e.text}});
        break;
    }
  }
  return out;
}

std::string MessagesFormat::finish(const GenResult& r) {
  std::string out = close();
  ojson d = {{"stop_reason", stop_reason(r)},
             {"stop_sequence", r.stop_string.empty() ? ojson(nullptr) : ojson(r.stop_string)}};
  out += sse_event("message_delta", {{"type", "message_delta"}, {"delta", d}, {"usage", usage(r)}});
  out += sse_event("message_stop", {{"type", "message_stop"}});
  return out;
}

std::string MessagesFormat::error(const std::string& message, const std::string&) {
  return sse_event("error", {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", message}}}});
}

}  // namespace lily::server
