// Structured output: request fields → grammar IR (parse time) → compiled grammar (cache) → per-request filter.
#include "server/structured_output.h"

#include <algorithm>

#include "grammar/frontends.h"
#include "server/api_error.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

namespace lily::server {

using ojson = nlohmann::ordered_json;
using grammar::Elem;
using grammar::Grammar;
using grammar::GrammarError;
using grammar::Seq;

namespace {

// Token elements standing for <tool_call> / </tool_call> until the served vocabulary's ids are known.
constexpr int32_t kToolOpen = -2, kToolClose = -3;

ApiError schema_error(const std::string& param, const GrammarError& e) {
  return invalid_value(param, std::string(e.what()), e.keyword.empty() ? "invalid_value" : "unsupported_schema");
}

// The parameter's value is raw text (docs/chat.md §3.4: strings unquoted) when its schema is exactly a string.
bool raw_string_param(const ojson& s) {
  if (!s.is_object()) return false;
  if (s.contains("type")) return s["type"].is_string() && s["type"] == "string";
  for (const char* kw : {"enum", "const"}) {
    if (!s.contains(kw)) continue;
    const ojson& v = s[kw];
    if (v.is_string()) return true;
    return v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), [](const ojson& x) { return x.is_string(); });
  }
  return false;
}

// <tool_call>\n<function=NAME>\n(<parameter=KEY>\nVALUE\n</parameter>\n)*</function>\n</tool_call> for one tool
// (without the opening token when `open` is false: the filter starts after it).
uint32_t tool_call_rule(Grammar& g, grammar::JsonSchemaBuilder& b, const ojson& fn, const std::string& param,
                        bool open = true) {
  std::string name = fn["name"].get<std::string>();
  static const ojson kNoParams = ojson::object();
  const ojson& params = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : kNoParams;
  static const char* kTopLevel[] = {"type", "properties", "required", "additionalProperties", "$defs", "definitions",
                                    "title", "description", "$schema", "$id", "$comment", "strict", "default",
                                    "examples"};
  for (auto it = params.begin(); it != params.end(); ++it)
    if (std::find(std::begin(kTopLevel), std::end(kTopLevel), it.key()) == std::end(kTopLevel))
      throw invalid_value(param, "schema keyword '" + it.key() + "' at #: not supported by the grammar engine (it "
                                 "would not be enforced)", "unsupported_schema");
  if (params.contains("type") && params["type"] != "object")
    throw invalid_value(param, "tool parameters must be an object schema");
  static const ojson kNoProps = ojson::object();
  const ojson& props = params.contains("properties") && params["properties"].is_object() ? params["properties"] : kNoProps;
  std::vector<std::string> required;
  if (params.contains("required") && params["required"].is_array())
    for (const auto& r : params["required"]) {
      if (!r.is_string() || !props.contains(r.get<std::string>()))
        throw invalid_value(param, "schema keyword 'required' at #: names a property not in 'properties'",
                            "unsupported_schema");
      required.push_back(r.get<std::string>());
    }
  Seq body;
  if (open) body.push_back(Grammar::token(kToolOpen));
  g.literal(body, "\n<function=" + name + ">\n");
  for (auto it = props.begin(); it != props.end(); ++it) {
    const std::string& key = it.key();
    if (key.empty() || key.find_first_of("<>\n\r") != std::string::npos)
      throw invalid_value(param, "parameter name '" + key + "' cannot be written in the tool-call format");
    std::string path = "#/properties/" + key;
    uint32_t value;
    try {
      value = raw_string_param(it.value()) ? b.raw_string(it.value(), params, path) : b.value_in(params, it.value(), path);
    } catch (const GrammarError& e) {
      throw schema_error(param, e);
    }
    Seq p = g.literal("<parameter=" + key + ">\n");
    p.push_back(Grammar::ref(value));
    g.literal(p, "\n</parameter>\n");
    bool req = std::find(required.begin(), required.end(), key) != required.end();
    if (req) body.insert(body.end(), p.begin(), p.end());
    else body.push_back(Grammar::ref(g.rule("param-opt", {p, {}})));
  }
  g.literal(body, "</function>\n");
  body.push_back(Grammar::token(kToolClose));
  return g.rule("call " + name, {body});
}

std::shared_ptr<Grammar> tool_grammar(const ojson& tools, const std::string& choice, const std::string& name,
                                      bool parallel) {
  auto g = std::make_shared<Grammar>();
  grammar::JsonSchemaBuilder b(*g);
  std::vector<Seq> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const ojson& fn = t.contains("function") ? t["function"] : t;
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string()) continue;
    if (choice == "function" && fn["name"] != name) continue;
    std::string param = "tools[" + std::to_string(i) + "].function.parameters";
    calls.push_back({Grammar::ref(tool_call_rule(*g, b, fn, param))});
  }
  if (calls.empty()) throw invalid_value("tool_choice", "'tool_choice' names function '" + name + "', which is not in 'tools'");
  uint32_t call = g->rule("call", std::move(calls));
  grammar::ByteSet nl{};
  grammar::add(nl, '\n');
  grammar::add(nl, ' ');
  Seq root(4, g->opt(nl));  // the model's "\n\n" after </think>
  root.push_back(Grammar::ref(call));
  if (parallel) {
    Seq more(2, g->opt(nl));
    more.push_back(Grammar::ref(call));
    root.push_back(Grammar::ref(g->repeat(more, 0, -1, "more-calls")));
  }
  g->root = g->rule("root", {root});
  grammar::validate(*g);
  return g;
}

// tool_choice auto with strict tools: one call body after <tool_call>; strict functions follow their schemas,
// the others any text up to </function>.
std::shared_ptr<Grammar> strict_tools_grammar(const ojson& tools) {
  auto g = std::make_shared<Grammar>();
  grammar::JsonSchemaBuilder b(*g);
  std::vector<Seq> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const ojson& fn = t.contains("function") ? t["function"] : t;
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string()) continue;
    if (fn.value("strict", false) == true) {
      std::string param = "tools[" + std::to_string(i) + "].function.parameters";
      calls.push_back({Grammar::ref(tool_call_rule(*g, b, fn, param, false))});
    } else {
      Seq free = g->literal("\n<function=" + fn["name"].get<std::string>() + ">\n");
      g->utf8_star(free, {{0, 0x10FFFF}}, "free-args");
      g->literal(free, "</function>\n");
      free.push_back(Grammar::token(kToolClose));
      calls.push_back(free);
    }
  }
  g->root = g->rule("call", std::move(calls));
  grammar::validate(*g);
  return g;
}

}  // namespace

std::shared_ptr<const StructuredSpec> parse_structured_output(const ojson& body, const ojson& tools,
                                                              const std::string& tool_choice,
                                                              const std::string& tool_choice_name,
                                                              bool parallel_tool_calls) {
  auto spec = std::make_shared<StructuredSpec>();
  std::vector<std::string> given;  // the constraining fields present, to refuse combinations
  if (auto rf = body.find("response_format"); rf != body.end() && !rf->is_null()) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      throw invalid_value("response_format", "'response_format' must be an object with a string 'type'");
    std::string t = (*rf)["type"].get<std::string>();
    if (t == "json_object") {
      spec->kind = "json_object";
      spec->key = "json_object";
      spec->grammar = std::make_shared<Grammar>(grammar::json_object_grammar());
      given.push_back("response_format");
    } else if (t == "json_schema") {
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object() || !js->contains("schema"))
        throw invalid_value("response_format.json_schema", "'json_schema' must be an object with a 'schema'");
      const ojson& schema = (*js)["schema"];
      if (!schema.is_object() && !schema.is_boolean())
        throw invalid_value("response_format.json_schema.schema", "the schema must be a JSON object");
      try {
        spec->grammar = std::make_shared<Grammar>(grammar::json_schema_grammar(schema));
      } catch (const GrammarError& e) {
        throw schema_error("response_format.json_schema.schema", e);
      }
      spec->kind = "json_schema";
      spec->key = "json_schema:" + schema.dump();
      given.push_back("response_format");
    } else if (t != "text") {
      throw invalid_value("response_format", "unknown response_format type '" + t + "'");
    }
  }
  for (const char* field : {"grammar", "regex"}) {
    auto f = body.find(field);
    if (f == body.end() || f->is_null()) continue;
    if (!f->is_string() || f->get<std::string>().empty())
      throw invalid_value(field, std::string("'") + field + "' must be a non-empty string");
    std::string text = f->get<std::string>();
    try {
      spec->grammar = std::make_shared<Grammar>(std::string(field) == "grammar" ? grammar::gbnf_grammar(text)
                                                                                : grammar::regex_grammar(text));
    } catch (const GrammarError& e) {
      throw invalid_value(field, e.what());
    }
    spec->kind = field;
    spec->key = std::string(field) + ":" + text;
    given.push_back(field);
  }
  if (tool_choice == "required" || tool_choice == "function") {
    if (!tools.is_array() || tools.empty()) throw invalid_value("tool_choice", "'tool_choice' requires 'tools'");
    spec->grammar = tool_grammar(tools, tool_choice, tool_choice_name, parallel_tool_calls);
    spec->kind = "tool_call";
    spec->key = "tools:" + tool_choice + ":" + tool_choice_name + ":" + (parallel_tool_calls ? "p:" : "1:") + tools.dump();
    given.push_back("tool_choice");
  }
  if (given.size() > 1)
    throw invalid_value(given[1], "'" + given[1] + "' cannot be combined with '" + given[0] + "'");
  bool strict_tools = tool_choice == "auto" && tools.is_array() &&
                      std::any_of(tools.begin(), tools.end(), [](const ojson& t) {
                        const ojson& fn = t.contains("function") ? t["function"] : t;
                        return fn.is_object() && fn.value("strict", false) == true;
                      });
  if (given.empty() && strict_tools) {  // the model chooses whether to call; a call it starts follows the schema
    spec->grammar = strict_tools_grammar(tools);
    spec->kind = "tool_strict";
    spec->key = "strict-tools:" + tools.dump();
    spec->triggered = true;
    return spec;
  }
  if (given.empty()) return nullptr;
  return spec;
}

std::shared_ptr<grammar::GrammarCache> make_grammar_cache(const Tokenizer& tok, size_t capacity) {
  return std::make_shared<grammar::GrammarCache>(grammar::Vocab::build(tok), capacity);
}

std::shared_ptr<TokenFilter> make_token_filter(const StructuredSpec& spec, grammar::GrammarCache& cache,
                                               const chat::DelimiterIds& ids, bool start_in_reasoning) {
  int32_t n_vocab = cache.vocab()->size();
  auto build = [&] {
    Grammar g = *spec.grammar;
    for (auto& rule : g.rules)
      for (auto& alt : rule)
        for (Elem& e : alt) {
          if (e.kind != grammar::Kind::token) continue;
          int32_t id = int32_t(e.arg);
          if (id == kToolOpen) id = ids.tool_open;
          if (id == kToolClose) id = ids.tool_close;
          if (id < 0 || id >= n_vocab || !cache.vocab()->is_added(id))
            throw invalid_value(spec.kind, "token <[" + std::to_string(int32_t(e.arg)) +
                                               "]> is not a special token of the served vocabulary");
          e.arg = uint32_t(id);
        }
    return g;
  };
  auto compiled = cache.get(std::to_string(ids.tool_open) + "/" + spec.key, build);
  log::debug("structured output: ", spec.kind, " grammar, ", compiled->bytes() / 1024, " KiB, compiled in ",
             compiled->compile_ms(), " ms");
  return std::make_shared<StructuredFilter>(compiled, ids, start_in_reasoning, spec.triggered);
}

StructuredFilter::StructuredFilter(std::shared_ptr<const grammar::CompiledGrammar> g, chat::DelimiterIds ids,
                                   bool start_in_reasoning, bool triggered)
    : g_(std::move(g)), matcher_(g_), ids_(std::move(ids)), reasoning_(start_in_reasoning), triggered_(triggered) {}

bool StructuredFilter::allowed(std::span<uint32_t> mask) {
  if (failed_ || (triggered_ && !in_call_)) return false;
  if (reasoning_) {  // free text, but the output may not end before the structure that must follow it
    if (triggered_ || matcher_.accepting()) return false;
    std::fill(mask.begin(), mask.end(), ~0u);
    for (int32_t id : ids_.stop)
      if (id >= 0 && size_t(id) / 32 < mask.size()) mask[size_t(id) / 32] &= ~(1u << (id % 32));
    return true;
  }
  size_t words = g_->vocab().mask_words();
  if (ended_ || !matcher_.can_continue()) {
    std::fill(mask.begin(), mask.end(), 0);
  } else {
    if (mask.size() < words) {  // the model's vocabulary is smaller than the tokenizer's: cannot constrain
      failed_ = true;
      return false;
    }
    matcher_.fill_mask(mask);
  }
  bool any = std::any_of(mask.begin(), mask.end(), [](uint32_t w) { return w != 0; });
  if (ended_ || matcher_.accepting() || !any)
    for (int32_t id : ids_.stop)
      if (id >= 0 && size_t(id) / 32 < mask.size()) mask[size_t(id) / 32] |= 1u << (id % 32);
  return true;
}

void StructuredFilter::accept(int32_t token) {
  if (failed_) return;
  if (reasoning_) {
    if (token == ids_.think_close) reasoning_ = false;
    return;
  }
  if (triggered_ && !in_call_) {  // free text; a call the model opens follows the grammar
    if (token == ids_.tool_open) {
      in_call_ = true;
      matcher_.reset();
    }
    return;
  }
  if (std::find(ids_.stop.begin(), ids_.stop.end(), token) != ids_.stop.end()) {
    ended_ = true;
    return;
  }
  if (ended_ || !matcher_.accept_token(token)) {
    log::warn("structured output: token ", token, " is outside the grammar; the constraint is off for this request");
    failed_ = true;
    return;
  }
  if (triggered_ && !matcher_.can_continue()) in_call_ = false;  // </tool_call>: free text again
}

}  // namespace lily::server
