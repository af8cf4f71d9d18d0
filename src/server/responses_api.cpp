// Responses API mapping and formatting (see responses_api.h; the item ↔ message table is docs/api-mapping.md).
#include "server/responses_api.h"

#include "server/api_error.h"
#include "server/json_fields.h"

namespace lily::server {
namespace {

// A message item's content: a string or input_text / output_text / refusal parts → one string.
std::string content_text(const ojson& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw invalid_value(param, "'" + param + "' must be a string or an array of content parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& part = content[i];
    std::string p = param + "[" + std::to_string(i) + "]";
    if (!part.is_object()) throw invalid_value(p, "'" + p + "' must be an object");
    std::string type = str_field(part, "type", p);
    if (type == "input_text" || type == "output_text" || type == "text") text += str_field(part, "text", p);
    else if (type == "refusal") text += str_field(part, "refusal", p);
    else if (type == "input_image" || type == "input_file" || type == "input_audio")
      throw not_supported(p + ".type", "content part type '" + type + "' is not supported (text-only model)");
    else throw invalid_value(p + ".type", "unknown content part type '" + type + "'");
  }
  return text;
}

// Input items → chat messages. Consecutive assistant-side items (reasoning, message, function_call) merge into
// one assistant message in output order (reasoning, then text, then calls), as the chat template renders a turn.
ojson input_messages(const ojson& input) {
  ojson msgs = ojson::array();
  if (input.is_string()) {
    msgs.push_back({{"role", "user"}, {"content", input}});
    return msgs;
  }
  if (!input.is_array()) throw invalid_value("input", "'input' must be a string or an array of items");
  auto assistant = [&](bool for_calls, bool for_reasoning) -> ojson& {
    if (!msgs.empty() && msgs.back()["role"] == "assistant") {
      ojson& a = msgs.back();
      bool has_calls = a.contains("tool_calls"), has_text = !a["content"].get<std::string>().empty();
      if (for_calls || (!has_calls && !(for_reasoning && has_text))) return a;
    }
    msgs.push_back({{"role", "assistant"}, {"content", ""}});
    return msgs.back();
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const ojson& it = input[i];
    std::string p = "input[" + std::to_string(i) + "]";
    if (!it.is_object()) throw invalid_value(p, "'" + p + "' must be an object");
    std::string type = member(it, "type") ? str_field(it, "type", p) : "message";
    if (type == "message") {
      std::string role = str_field(it, "role", p);
      const ojson* c = member(it, "content");
      if (!c) throw invalid_value(p + ".content", "'" + p + ".content' is required");
      std::string text = content_text(*c, p + ".content");
      if (role == "assistant") {
        ojson& a = assistant(false, false);
        a["content"] = a["content"].get<std::string>() + text;
      } else if (role == "user" || role == "system" || role == "developer") {
        msgs.push_back({{"role", role}, {"content", text}});
      } else {
        throw invalid_value(p + ".role", "unsupported role '" + role + "' (user, assistant, system, developer)");
      }
    } else if (type == "function_call") {
      std::string call_id = str_field(it, "call_id", p), name = str_field(it, "name", p);
      std::string args = str_field(it, "arguments", p);
      ojson& a = assistant(true, false);
      if (!a.contains("tool_calls")) a["tool_calls"] = ojson::array();
      a["tool_calls"].push_back({{"id", call_id}, {"type", "function"},
                                 {"function", {{"name", name}, {"arguments", args.empty() ? "{}" : args}}}});
    } else if (type == "function_call_output") {
      std::string call_id = str_field(it, "call_id", p);
      const ojson* out = member(it, "output");
      if (!out) throw invalid_value(p + ".output", "'" + p + ".output' is required");
      msgs.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", content_text(*out, p + ".output")}});
    } else if (type == "reasoning") {
      std::string text;
      if (const ojson* c = member(it, "content"); c && c->is_array() && !c->empty()) {
        for (size_t k = 0; k < c->size(); ++k)
          text += str_field((*c)[k], "text", p + ".content[" + std::to_string(k) + "]");
      } else if (const ojson* s = member(it, "summary")) {
        if (!s->is_array()) throw invalid_value(p + ".summary", "'" + p + ".summary' must be an array");
        for (size_t k = 0; k < s->size(); ++k)
          text += (k ? "\n\n" : "") + str_field((*s)[k], "text", p + ".summary[" + std::to_string(k) + "]");
      }
      ojson& a = assistant(false, true);
      a["reasoning_content"] = a.value("reasoning_content", "") + text;
    } else if (type == "item_reference") {
      throw not_supported(p + ".type", "'item_reference' needs stored responses; lily is stateless (send the items)");
    } else {
      throw not_supported(p + ".type", "input item type '" + type + "' is not supported");
    }
  }
  if (msgs.empty()) throw invalid_value("input", "'input' must not be empty");
  return msgs;
}

ojson map_tools(const ojson& tools) {
  if (!tools.is_array()) throw invalid_value("tools", "'tools' must be an array");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    std::string p = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) throw invalid_value(p, "'" + p + "' must be an object");
    std::string type = str_field(t, "type", p);
    if (type != "function")
      throw not_supported(p + ".type", "tool type '" + type + "' is not supported (only 'function' tools)");
    ojson fn = {{"name", str_field(t, "name", p)}};
    if (const ojson* d = member(t, "description")) fn["description"] = *d;
    fn["parameters"] = member(t, "parameters") ? t["parameters"] : ojson({{"type", "object"}, {"properties", ojson::object()}});
    if (const ojson* s = member(t, "strict")) fn["strict"] = *s;
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  return out;
}

ojson map_tool_choice(const ojson& tc) {
  if (tc.is_string()) return tc;
  if (!tc.is_object()) throw invalid_value("tool_choice", "'tool_choice' must be a string or an object");
  std::string type = str_field(tc, "type", "tool_choice");
  if (type == "function") return {{"type", "function"}, {"function", {{"name", str_field(tc, "name", "tool_choice")}}}};
  if (type == "auto" || type == "none" || type == "required") return type;
  throw not_supported("tool_choice.type", "tool_choice type '" + type + "' is not supported");
}

ojson map_text_format(const ojson& text) {
  if (!text.is_object()) throw invalid_value("text", "'text' must be an object");
  const ojson* f = member(text, "format");
  if (!f) return nullptr;
  if (!f->is_object()) throw invalid_value("text.format", "'text.format' must be an object");
  std::string type = str_field(*f, "type", "text.format");
  if (type == "text") return nullptr;
  if (type == "json_object") return {{"type", "json_object"}};
  if (type != "json_schema") throw invalid_value("text.format.type", "unknown text.format type '" + type + "'");
  ojson js = {{"name", str_field(*f, "name", "text.format", false)}};
  if (const ojson* s = member(*f, "schema")) js["schema"] = *s;
  else throw invalid_value("text.format.schema", "'text.format.schema' is required for json_schema");
  if (const ojson* d = member(*f, "description")) js["description"] = *d;
  if (const ojson* s = member(*f, "strict")) js["strict"] = *s;
  return {{"type", "json_schema"}, {"json_schema", js}};
}

}  // namespace

ojson responses_to_chat(const ojson& b) {
  if (member(b, "previous_response_id"))
    throw not_supported("previous_response_id", "lily's /v1/responses is stateless: 'previous_response_id' is not "
                                                "supported; send the earlier output items in 'input'");
  if (member(b, "conversation"))
    throw not_supported("conversation", "lily's /v1/responses is stateless: 'conversation' is not supported");
  if (const ojson* s = member(b, "store"); s && s->is_boolean() && s->get<bool>())
    throw not_supported("store", "lily does not store responses: set 'store' to false (or leave it out)");
  if (const ojson* s = member(b, "background"); s && s->is_boolean() && s->get<bool>())
    throw not_supported("background", "background responses are not supported");
  if (const ojson* t = member(b, "top_logprobs"); t && !(t->is_number_integer() && t->get<int64_t>() == 0))
    throw not_supported("top_logprobs", "'top_logprobs' is not supported on /v1/responses; use /v1/chat/completions");
  ojson chat = ojson::object();
  if (const ojson* m = member(b, "model")) chat["model"] = *m;
  const ojson* input = member(b, "input");
  if (!input) throw invalid_value("input", "'input' is required");
  ojson msgs = input_messages(*input);
  if (const ojson* ins = member(b, "instructions")) {
    if (!ins->is_string()) throw invalid_value("instructions", "'instructions' must be a string");
    msgs.insert(msgs.begin(), ojson({{"role", "system"}, {"content", *ins}}));
  }
  chat["messages"] = msgs;
  if (const ojson* t = member(b, "tools"); t && !t->empty()) chat["tools"] = map_tools(*t);
  if (const ojson* tc = member(b, "tool_choice")) chat["tool_choice"] = map_tool_choice(*tc);
  if (const ojson* t = member(b, "text")) {
    ojson rf = map_text_format(*t);
    if (!rf.is_null()) chat["response_format"] = rf;
  }
  if (const ojson* r = member(b, "reasoning")) {
    if (!r->is_object()) throw invalid_value("reasoning", "'reasoning' must be an object");
    if (const ojson* e = member(*r, "effort")) chat["reasoning_effort"] = *e;
  }
  if (const ojson* m = member(b, "max_output_tokens")) chat["max_tokens"] = *m;
  // The sampling fields both APIs share, plus lily extensions (documented in docs/api-mapping.md).
  for (const char* k : {"temperature", "top_p", "parallel_tool_calls", "stream", "top_k", "min_p", "seed",
                        "logit_bias", "presence_penalty", "frequency_penalty", "repetition_penalty", "stop",
                        "chat_template_kwargs"})
    if (const ojson* v = member(b, k)) chat[k] = *v;
  return chat;
}

ResponsesRequest parse_responses_request(const ojson& b, const RequestLimits& limits) {
  ResponsesRequest r;
  r.chat = responses_to_chat(b);
  try {
    r.chat_req = parse_chat_request(r.chat, limits);
  } catch (const ApiError& e) {
    rethrow_renamed(e, {{"max_tokens", "max_output_tokens"}, {"response_format", "text.format"},
                        {"reasoning_effort", "reasoning.effort"}}, "input");
  }
  auto get = [&](const char* k, ojson dflt) { const ojson* v = member(b, k); return v ? *v : dflt; };
  r.echo = {{"instructions", get("instructions", nullptr)},
            {"max_output_tokens", get("max_output_tokens", nullptr)},
            {"parallel_tool_calls", r.chat_req.parallel_tool_calls},
            {"previous_response_id", nullptr},
            {"reasoning", {{"effort", member(b, "reasoning") ? b["reasoning"].value("effort", ojson(nullptr)) : ojson(nullptr)},
                           {"summary", nullptr}}},
            {"store", false},
            {"temperature", get("temperature", nullptr)},
            {"text", {{"format", member(b, "text") && member(b["text"], "format") ? b["text"]["format"]
                                                                                   : ojson({{"type", "text"}})}}},
            {"tool_choice", get("tool_choice", "auto")},
            {"tools", get("tools", ojson::array())},
            {"top_p", get("top_p", nullptr)},
            {"truncation", "disabled"},
            {"metadata", get("metadata", ojson::object())}};
  return r;
}

// ---- formatting ----

std::string ResponsesFormat::new_id(const char* prefix) {
  return std::string(prefix) + "_" + id.substr(id.find('_') + 1) + std::to_string(n_ids_++);
}

ojson ResponsesFormat::object(const std::string& status, const ojson& output, const GenResult* r) const {
  ojson o = {{"id", id}, {"object", "response"}, {"created_at", created}, {"status", status},
             {"error", nullptr}, {"incomplete_details", nullptr}};
  if (status == "incomplete") o["incomplete_details"] = {{"reason", "max_output_tokens"}};
  o["model"] = model;
  o["output"] = output;
  for (auto& [k, v] : echo_.items()) o[k] = v;
  if (r) {
    o["usage"] = {{"input_tokens", r->n_prompt},
                  {"input_tokens_details", {{"cached_tokens", r->n_cached}}},
                  {"output_tokens", r->n_generated},
                  {"output_tokens_details", {{"reasoning_tokens", r->reasoning_tokens}}},
                  {"total_tokens", r->n_prompt + r->n_generated}};
  } else {
    o["usage"] = nullptr;
  }
  return o;
}

namespace {
ojson reasoning_item(const std::string& id, const std::string& text) {
  return {{"id", id}, {"type", "reasoning"}, {"summary", ojson::array({{{"type", "summary_text"}, {"text", text}}})}};
}
ojson text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}};
}
ojson message_item(const std::string& id, const char* status, ojson content) {
  return {{"id", id}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", std::move(content)}};
}
ojson call_item(const std::string& id, const char* status, const std::string& call_id, const std::string& name,
                const std::string& args) {
  return {{"id", id}, {"type", "function_call"}, {"status", status}, {"arguments", args}, {"call_id", call_id},
          {"name", name}};
}
}  // namespace

ojson ResponsesFormat::response(const GenResult& r) {
  ojson out = ojson::array();
  if (!r.reasoning.empty()) out.push_back(reasoning_item(new_id("rs"), r.reasoning));
  if (!r.content.empty() || (r.tool_calls.empty() && r.reasoning.empty()))  // nothing at all: one empty message
    out.push_back(message_item(new_id("msg"), "completed", ojson::array({text_part(r.content)})));
  for (const auto& c : r.tool_calls) out.push_back(call_item(new_id("fc"), "completed", c.id, c.name, c.arguments));
  return object(r.length ? "incomplete" : "completed", out, &r);
}

std::string ResponsesFormat::emit(const std::string& type, ojson data) {
  ojson e = {{"type", type}, {"sequence_number", seq_++}};
  for (auto& [k, v] : data.items()) e[k] = std::move(v);
  return sse_event(type, e);
}

std::string ResponsesFormat::start() {
  std::string out = emit("response.created", {{"response", object("in_progress", ojson::array(), nullptr)}});
  out += emit("response.in_progress", {{"response", object("in_progress", ojson::array(), nullptr)}});
  return out;
}

std::string ResponsesFormat::open(Item kind, const OutEvent* header) {
  std::string out = close();
  cur_ = kind;
  text_.clear();
  const int oi = static_cast<int>(output_.size());
  if (kind == Item::reasoning) {
    item_ = {{"id", new_id("rs")}, {"type", "reasoning"}, {"summary", ojson::array()}};
    out += emit("response.output_item.added", {{"output_index", oi}, {"item", item_}});
    out += emit("response.reasoning_summary_part.added",
                {{"item_id", item_["id"]}, {"output_index", oi}, {"summary_index", 0},
                 {"part", {{"type", "summary_text"}, {"text", ""}}}});
  } else if (kind == Item::message) {
    item_ = message_item(new_id("msg"), "in_progress", ojson::array());
    out += emit("response.output_item.added", {{"output_index", oi}, {"item", item_}});
    out += emit("response.content_part.added",
                {{"item_id", item_["id"]}, {"output_index", oi}, {"content_index", 0}, {"part", text_part("")}});
  } else {
    tool_index_ = header->index;
    item_ = call_item(new_id("fc"), "in_progress", header->id, header->name, "");
    out += emit("response.output_item.added", {{"output_index", oi}, {"item", item_}});
  }
  return out;
}

std::string ResponsesFormat::close() {
  std::string out;
  const int oi = static_cast<int>(output_.size());
  const ojson iid = cur_ == Item::none ? ojson(nullptr) : item_["id"];
  switch (cur_) {
    case Item::none: return out;
    case Item::reasoning:
      out += emit("response.reasoning_summary_text.done",
                  {{"item_id", iid}, {"output_index", oi}, {"summary_index", 0}, {"text", text_}});
      out += emit("response.reasoning_summary_part.done",
                  {{"item_id", iid}, {"output_index", oi}, {"summary_index", 0},
                   {"part", {{"type", "summary_text"}, {"text", text_}}}});
      item_ = reasoning_item(iid.get<std::string>(), text_);
      break;
    case Item::message:
      out += emit("response.output_text.done", {{"item_id", iid}, {"output_index", oi}, {"content_index", 0},
                                                 {"text", text_}, {"logprobs", ojson::array()}});
      out += emit("response.content_part.done",
                  {{"item_id", iid}, {"output_index", oi}, {"content_index", 0}, {"part", text_part(text_)}});
      item_["status"] = "completed";
      item_["content"] = ojson::array({text_part(text_)});
      break;
    case Item::function_call:
      out += emit("response.function_call_arguments.done",
                  {{"item_id", iid}, {"output_index", oi}, {"name", item_["name"]}, {"arguments", text_}});
      item_["status"] = "completed";
      item_["arguments"] = text_;
      break;
  }
  out += emit("response.output_item.done", {{"output_index", oi}, {"item", item_}});
  output_.push_back(item_);
  cur_ = Item::none;
  return out;
}

std::string ResponsesFormat::events(const std::vector<OutEvent>& ev) {
  std::string out;
  for (const auto& e : ev) {
    switch (e.kind) {
      case OutEvent::Kind::reasoning:
        if (e.text.empty()) break;
        if (cur_ != Item::reasoning) out += open(Item::reasoning, nullptr);
        text_ += e.text;
        out += emit("response.reasoning_summary_text.delta", {{"item_id", item_["id"]},
                    {"output_index", output_.size()}, {"summary_index", 0}, {"delta", e.text}});
        break;
      case OutEvent::Kind::content:
      case OutEvent::Kind::text:
        if (e.text.empty()) break;
        if (cur_ != Item::message) out += open(Item::message, nullptr);
        text_ += e.text;
        out += emit("response.output_text.delta", {{"item_id", item_["id"]}, {"output_index", output_.size()},
                    {"content_index", 0}, {"delta", e.text}, {"logprobs", ojson::array()}});
        break;
      case OutEvent::Kind::tool_header:
        out += open(Item::function_call, &e);
        break;
      case OutEvent::Kind::tool_args:
        if (e.text.empty() || cur_ != Item::function_call || e.index != tool_index_) break;
        text_ += e.text;
        out += emit("response.function_call_arguments.delta",
                    {{"item_id", item_["id"]}, {"output_index", output_.size()}, {"delta", e.text}});
        break;
    }
  }
  return out;
}

std::string ResponsesFormat::finish(const GenResult& r) {
  std::string out;
  // No output at all still answers with one (empty) message item, as the non-streaming body does.
  if (cur_ == Item::none && output_.empty()) out += open(Item::message, nullptr);
  out += close();
  const bool incomplete = r.length;
  out += emit(incomplete ? "response.incomplete" : "response.completed",
              {{"response", object(incomplete ? "incomplete" : "completed", output_, &r)}});
  return out;
}

std::string ResponsesFormat::error(const std::string& message, const std::string& code) {
  std::string out = close();
  ojson o = object("failed", output_, nullptr);
  o["error"] = {{"code", code.empty() ? "server_error" : code}, {"message", message}};
  out += emit("response.failed", {{"response", o}});
  return out;
}

}  // namespace lily::server
