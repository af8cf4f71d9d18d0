// Request-body validation (see request.h). Every failure is an ApiError naming the field.
#include "server/request.h"

#include "server/structured_output.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "server/api_error.h"
#include "server/json_fields.h"
#include "util/utf8.h"

namespace lily::server {
namespace {

const char* type_name(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null: return "null";
    case ojson::value_t::boolean: return "boolean";
    case ojson::value_t::string: return "string";
    case ojson::value_t::array: return "array";
    case ojson::value_t::object: return "object";
    case ojson::value_t::number_float: return "number";
    default: return "integer";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const char* want, const ojson& v) {
  throw invalid_value(param, "'" + param + "' must be " + want + ", got " + type_name(v));
}

// Replays a body through nlohmann's SAX interface keeping the JSON path of the value being read, to name the
// field of a parse failure (a number that overflows a double, 1e400, which the DOM parser reports without a
// place). Used only after the DOM parse failed, so valid bodies are parsed once.
class PathTracker : public nlohmann::json_sax<ojson> {
 public:
  std::string path;          // where the failure happened: "messages[0].content", "metadata.x", "" (the root)
  std::string token;         // the offending token as written (cut to 64 bytes)
  bool failed = false;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override { return open(false); }
  bool key(string_t& k) override {
    frames_.back().key = k;
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(true); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string& last_token, const nlohmann::detail::exception&) override {
    failed = true;
    token = last_token.substr(0, 64);
    for (size_t i = 0; i < frames_.size(); ++i) {
      const Frame& f = frames_[i];
      if (f.array) path += "[" + std::to_string(f.index) + "]";
      else path += (i ? "." : "") + f.key;
    }
    return false;
  }

 private:
  struct Frame {
    bool array;
    size_t index = 0;  // array: elements completed so far (the index of the one being read)
    std::string key;   // object: the member being read
  };
  bool value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  bool open(bool array) {
    frames_.push_back(Frame{array, 0, {}});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return value();
  }
  std::vector<Frame> frames_;
};

std::optional<double> get_number(const ojson& obj, const char* key, double lo, double hi, bool lo_open = false) {
  const ojson* v = member(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(key, "a number", *v);
  double x = v->get<double>();
  if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) {
    auto num = [](double v) {  // 0 and 2, not 0.000000 and 2.000000
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", v);
      return std::string(buf);
    };
    std::string range = (lo_open ? "(" : "[") + num(lo) + ", " + num(hi) + "]";
    throw invalid_value(key, "'" + std::string(key) + "' must be in " + range);
  }
  return x;
}

std::optional<int64_t> get_int(const ojson& obj, const char* key, int64_t lo, int64_t hi) {
  const ojson* v = member(obj, key);
  if (!v) return std::nullopt;
  int64_t x = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      throw invalid_value(key, "'" + std::string(key) + "' is out of range");
    x = v->get<int64_t>();
  } else if (v->is_number_float()) {
    double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15) wrong_type(key, "an integer", *v);
    x = static_cast<int64_t>(d);
  } else {
    wrong_type(key, "an integer", *v);
  }
  if (x < lo || x > hi)
    throw invalid_value(key, "'" + std::string(key) + "' must be between " + std::to_string(lo) + " and " +
                                 std::to_string(hi) + ", got " + std::to_string(x));
  return x;
}

std::optional<bool> get_bool(const ojson& obj, const char* key) {
  const ojson* v = member(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

std::vector<std::string> get_stop(const ojson& obj) {
  std::vector<std::string> out;
  const ojson* v = member(obj, "stop");
  if (!v) return out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (auto& s : *v) {
      if (!s.is_string()) wrong_type("stop", "a string or an array of strings", s);
      out.push_back(s.get<std::string>());
    }
  } else {
    wrong_type("stop", "a string or an array of strings", *v);
  }
  if (out.size() > 16) throw invalid_value("stop", "'stop' may hold at most 16 strings");
  for (auto& s : out)
    if (s.empty() || s.size() > 256) throw invalid_value("stop", "each stop string must be 1 to 256 bytes long");
  return out;
}

SamplingRequest get_sampling(const ojson& b, const RequestLimits& limits) {
  SamplingRequest s;
  if (auto x = get_number(b, "temperature", 0, 2)) s.temperature = float(*x);
  if (auto x = get_number(b, "top_p", 0, 1, true)) s.top_p = float(*x);
  if (auto x = get_int(b, "top_k", -1, limits.n_vocab)) s.top_k = int(*x);
  if (auto x = get_number(b, "min_p", 0, 1)) s.min_p = float(*x);
  if (auto x = get_number(b, "presence_penalty", -2, 2)) s.presence_penalty = float(*x);
  if (auto x = get_number(b, "frequency_penalty", -2, 2)) s.frequency_penalty = float(*x);
  if (auto x = get_number(b, "repetition_penalty", 0, 10, true)) s.repetition_penalty = float(*x);
  if (const ojson* v = member(b, "seed")) {
    if (v->is_number_unsigned()) s.seed = v->get<uint64_t>();
    else if (v->is_number_integer()) s.seed = static_cast<uint64_t>(v->get<int64_t>());
    else wrong_type("seed", "an integer", *v);
  }
  if (const ojson* v = member(b, "logit_bias")) {
    if (!v->is_object()) wrong_type("logit_bias", "an object", *v);
    if (v->size() > 1024) throw invalid_value("logit_bias", "'logit_bias' may hold at most 1024 entries");
    for (auto& [key, val] : v->items()) {
      char* end = nullptr;
      long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0 || id >= limits.n_vocab)
        throw invalid_value("logit_bias", "'logit_bias' key '" + key + "' is not a token id in [0, " +
                                              std::to_string(limits.n_vocab) + ")");
      if (!val.is_number()) wrong_type("logit_bias", "an object of numbers", val);
      double bias = val.get<double>();
      if (!std::isfinite(bias) || bias < -100 || bias > 100)
        throw invalid_value("logit_bias", "'logit_bias' values must be in [-100, 100]");
      s.logit_bias.emplace_back(int32_t(id), float(bias));
    }
  }
  return s;
}

std::optional<int> get_max_tokens(const ojson& b) {
  auto a = get_int(b, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max());
  auto m = get_int(b, "max_tokens", 1, std::numeric_limits<int32_t>::max());
  if (a) return int(*a);
  if (m) return int(*m);
  return std::nullopt;
}

void get_stream(const ojson& b, bool& stream, bool& include_usage) {
  stream = get_bool(b, "stream").value_or(false);
  if (const ojson* so = member(b, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    include_usage = get_bool(*so, "include_usage").value_or(false);
  }
}

void check_content(const ojson& content, const std::string& param, bool allow_null) {
  if (content.is_null()) {
    if (!allow_null) throw invalid_value(param, "'" + param + "' must not be null");
    return;
  }
  if (content.is_string()) return;
  if (!content.is_array()) wrong_type(param, "a string or an array of content parts", content);
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& part = content[i];
    std::string p = param + "[" + std::to_string(i) + "]";
    if (!part.is_object()) wrong_type(p, "an object", part);
    auto t = part.find("type");
    if (t == part.end() || !t->is_string()) throw invalid_value(p + ".type", "content parts need a string 'type'");
    std::string type = t->get<std::string>();
    if (type == "text") {
      auto x = part.find("text");
      if (x == part.end() || !x->is_string()) throw invalid_value(p + ".text", "text parts need a string 'text'");
    } else if (type == "image_url" || type == "input_audio" || type == "file" || type == "input_image") {
      throw not_supported(p + ".type", "content part type '" + type + "' is not supported (text-only model)");
    } else {
      throw invalid_value(p + ".type", "unknown content part type '" + type + "'");
    }
  }
}

void check_messages(const ojson& b) {
  const ojson* msgs = member(b, "messages");
  if (!msgs) throw invalid_value("messages", "'messages' is required");
  if (!msgs->is_array()) wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) throw invalid_value("messages", "'messages' must not be empty");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ojson& m = (*msgs)[i];
    std::string p = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) wrong_type(p, "an object", m);
    auto r = m.find("role");
    if (r == m.end()) throw invalid_value(p + ".role", "'" + p + ".role' is required");
    if (!r->is_string()) wrong_type(p + ".role", "a string", *r);
    std::string role = r->get<std::string>();
    bool assistant = role == "assistant";
    if (role != "system" && role != "developer" && role != "user" && !assistant && role != "tool")
      throw invalid_value(p + ".role", "unsupported role '" + role + "' (system, developer, user, assistant, tool)");
    auto c = m.find("content");
    bool has_calls = assistant && m.contains("tool_calls") && !m["tool_calls"].is_null();
    if (c == m.end()) {
      if (!assistant) throw invalid_value(p + ".content", "'" + p + ".content' is required");
    } else {
      check_content(*c, p + ".content", assistant);
    }
    for (const char* key : {"reasoning_content", "reasoning"}) {
      auto x = m.find(key);
      if (x != m.end() && !x->is_null() && !x->is_string()) wrong_type(p + "." + key, "a string", *x);
    }
    if (has_calls) {
      const ojson& calls = m["tool_calls"];
      if (!calls.is_array()) wrong_type(p + ".tool_calls", "an array", calls);
      for (size_t k = 0; k < calls.size(); ++k) {
        std::string q = p + ".tool_calls[" + std::to_string(k) + "]";
        const ojson& tc = calls[k];
        if (!tc.is_object()) wrong_type(q, "an object", tc);
        auto f = tc.find("function");
        if (f == tc.end() || !f->is_object()) throw invalid_value(q + ".function", "tool calls need a 'function' object");
        auto name = f->find("name");
        if (name == f->end() || !name->is_string()) throw invalid_value(q + ".function.name", "tool calls need a name");
        auto args = f->find("arguments");
        if (args != f->end() && args->is_string()) {
          auto parsed = ojson::parse(args->get<std::string>(), nullptr, false);
          if (parsed.is_discarded() || !parsed.is_object())
            throw invalid_value(q + ".function.arguments", "'arguments' is not a JSON object string");
        } else if (args != f->end() && !args->is_object() && !args->is_null()) {
          wrong_type(q + ".function.arguments", "a JSON string", *args);
        }
      }
    }
    if (role == "tool") {
      auto id = m.find("tool_call_id");
      if (id != m.end() && !id->is_null() && !id->is_string()) wrong_type(p + ".tool_call_id", "a string", *id);
    }
  }
}

ojson check_tools(const ojson& b) {
  const ojson* tools = member(b, "tools");
  if (!tools) return nullptr;
  if (!tools->is_array()) wrong_type("tools", "an array", *tools);
  for (size_t i = 0; i < tools->size(); ++i) {
    const ojson& t = (*tools)[i];
    std::string p = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) wrong_type(p, "an object", t);
    auto type = t.find("type");
    if (type == t.end() || !type->is_string() || type->get<std::string>() != "function")
      throw invalid_value(p + ".type", "only tools of type 'function' are supported");
    auto f = t.find("function");
    if (f == t.end() || !f->is_object()) throw invalid_value(p + ".function", "'function' must be an object");
    auto name = f->find("name");
    if (name == f->end() || !name->is_string() || name->get<std::string>().empty())
      throw invalid_value(p + ".function.name", "the function needs a non-empty string 'name'");
    auto params = f->find("parameters");
    if (params != f->end() && !params->is_null() && !params->is_object())
      throw invalid_value(p + ".function.parameters", "'parameters' must be a JSON Schema object");
    auto desc = f->find("description");
    if (desc != f->end() && !desc->is_null() && !desc->is_string())
      wrong_type(p + ".function.description", "a string", *desc);
    auto strict = f->find("strict");
    if (strict != f->end() && !strict->is_null() && !strict->is_boolean())
      wrong_type(p + ".function.strict", "a boolean", *strict);
  }
  return tools->empty() ? ojson(nullptr) : *tools;
}

}  // namespace

bool valid_utf8(std::string_view s) { return utf8_valid(s); }

ojson parse_body(const std::string& body, const RequestLimits& limits) {
  if (!valid_utf8(body))
    throw ApiError(400, "invalid_request_error", "invalid_utf8", "", "the request body is not valid UTF-8");
  // Bound the nesting depth before the (recursive) JSON parser runs.
  int depth = 0;
  bool in_string = false, escape = false;
  for (char c : body) {
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limits.max_nesting)
        throw ApiError(400, "invalid_request_error", "invalid_json", "",
                       "the request body nests deeper than " + std::to_string(limits.max_nesting) + " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  ojson j;
  try {
    j = ojson::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    bool utf = what.find("surrogate") != std::string::npos || what.find("UTF-8") != std::string::npos;
    throw ApiError(400, "invalid_request_error", utf ? "invalid_utf8" : "invalid_json", "",
                   std::string("the request body is not valid JSON: ") + what);
  } catch (const nlohmann::json::out_of_range&) {
    // A number beyond a double (1e400, -1e999, a 400-digit integer): name the field it stands in.
    PathTracker where;
    ojson::sax_parse(body, &where);
    const std::string field = where.path.empty() ? "the request body" : "'" + where.path + "'";
    throw invalid_value(where.path, field + ": the number " + where.token + " is out of range (beyond a double)");
  }
  if (!j.is_object())
    throw ApiError(400, "invalid_request_error", "invalid_json", "", "the request body must be a JSON object");
  return j;
}

ChatRequest parse_chat_request(const ojson& b, const RequestLimits& limits) {
  ChatRequest r;
  const ojson* model = member(b, "model");
  if (model && !model->is_string()) wrong_type("model", "a string", *model);
  check_messages(b);
  r.messages = b["messages"];
  r.n = int(get_int(b, "n", 1, kMaxChoices).value_or(1));
  r.max_tokens = get_max_tokens(b);
  r.sampling = get_sampling(b, limits);
  r.stop = get_stop(b);
  get_stream(b, r.stream, r.include_usage);
  r.logprobs = get_bool(b, "logprobs").value_or(false);
  r.top_logprobs = int(get_int(b, "top_logprobs", 0, 20).value_or(0));
  r.tools = check_tools(b);
  if (const ojson* tc = member(b, "tool_choice")) {
    if (tc->is_string()) {
      r.tool_choice = tc->get<std::string>();
      if (r.tool_choice != "auto" && r.tool_choice != "none" && r.tool_choice != "required")
        throw invalid_value("tool_choice", "'tool_choice' must be auto, none, required or a function object");
    } else if (tc->is_object()) {
      auto f = tc->find("function");
      if (f == tc->end() || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
        throw invalid_value("tool_choice", "'tool_choice' object needs function.name");
      r.tool_choice = "function";
      r.tool_choice_name = (*f)["name"].get<std::string>();
    } else {
      wrong_type("tool_choice", "a string or an object", *tc);
    }
  }
  if ((r.tool_choice == "required" || r.tool_choice == "function") && r.tools.is_null())
    throw invalid_value("tool_choice", "'tool_choice' requires 'tools'");
  if (r.tool_choice == "none") r.tools = nullptr;
  r.parallel_tool_calls = get_bool(b, "parallel_tool_calls").value_or(true);
  r.structured = parse_structured_output(b, r.tools, r.tool_choice, r.tool_choice_name, r.parallel_tool_calls);
  if (const ojson* k = member(b, "chat_template_kwargs")) {
    if (!k->is_object()) wrong_type("chat_template_kwargs", "an object", *k);
    for (const char* key : {"enable_thinking", "preserve_thinking", "add_vision_id"}) {
      auto x = k->find(key);
      if (x != k->end() && !x->is_null() && !x->is_boolean())
        wrong_type(std::string("chat_template_kwargs.") + key, "a boolean", *x);
    }
    r.chat_template_kwargs = *k;
  }
  if (const ojson* e = member(b, "reasoning_effort")) {
    if (!e->is_string()) wrong_type("reasoning_effort", "a string", *e);
    std::string v = e->get<std::string>();
    if (!r.chat_template_kwargs.contains("enable_thinking"))
      r.chat_template_kwargs["enable_thinking"] = !(v == "none" || v == "minimal");
  }
  r.include_reasoning = get_bool(b, "include_reasoning").value_or(true);
  if (get_int(b, "reasoning_budget", 0, std::numeric_limits<int32_t>::max()))
    throw not_supported("reasoning_budget", "'reasoning_budget' is not implemented yet; use max_tokens");
  return r;
}

CompletionRequest parse_completion_request(const ojson& b, const RequestLimits& limits) {
  CompletionRequest r;
  const ojson* model = member(b, "model");
  if (model && !model->is_string()) wrong_type("model", "a string", *model);
  const ojson* p = member(b, "prompt");
  if (!p) throw invalid_value("prompt", "'prompt' is required");
  ojson prompt = *p;
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) prompt = prompt[0];
  if (prompt.is_string()) {
    r.prompt_text = prompt.get<std::string>();
    if (r.prompt_text.empty()) throw invalid_value("prompt", "'prompt' must not be empty");
  } else if (prompt.is_array()) {
    if (prompt.empty()) throw invalid_value("prompt", "'prompt' must not be empty");
    for (auto& t : prompt) {
      if (!t.is_number_integer()) throw invalid_value("prompt", "'prompt' holds more than one prompt or invalid tokens");
      int64_t id = t.get<int64_t>();
      if (id < 0 || id >= limits.n_vocab)
        throw invalid_value("prompt", "invalid tokens: id " + std::to_string(id) + " is outside [0, " +
                                          std::to_string(limits.n_vocab) + ")");
      r.prompt_tokens.push_back(int32_t(id));
    }
    r.prompt_is_tokens = true;
  } else {
    wrong_type("prompt", "a string or an array of token ids", prompt);
  }
  r.n = int(get_int(b, "n", 1, kMaxChoices).value_or(1));
  if (auto bo = get_int(b, "best_of", 1, std::numeric_limits<int32_t>::max()); bo && *bo > 1)
    throw not_supported("best_of", "best_of > 1 is not supported");
  if (const ojson* s = member(b, "suffix")) {
    if (!s->is_string()) wrong_type("suffix", "a string", *s);
    if (!s->get<std::string>().empty()) throw not_supported("suffix", "'suffix' is not supported");
  }
  r.max_tokens = get_max_tokens(b);
  r.sampling = get_sampling(b, limits);
  r.stop = get_stop(b);
  get_stream(b, r.stream, r.include_usage);
  r.echo = get_bool(b, "echo").value_or(false);
  if (auto lp = get_int(b, "logprobs", 0, 5)) r.logprobs = int(*lp);
  return r;
}

}  // namespace lily::server
