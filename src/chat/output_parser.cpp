// Output parser state machine (docs/chat.md §3.2–3.5, §4). Text between delimiter ids accumulates in `buf`, the
// pending input of the current state; each state consumes what it can decide without seeing later bytes and
// keeps the rest. A delimiter id (or the end) first lets the state resolve its pending text knowing what follows,
// then acts. Every decision depends only on bytes and delimiter positions, never on token boundaries.
#include "chat/output_parser.h"

#include <algorithm>
#include <random>
#include <set>

#include "util/log.h"

namespace lily::chat {

namespace {

constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParamOpen = "<parameter=";
constexpr std::string_view kParamClose = "</parameter>";
constexpr size_t kMaxNameLen = 256;       // function names and parameter keys
constexpr size_t kMaxLookaheadWs = 64;    // whitespace after <tool_call> inside reasoning before giving up
// Longest undecided stretch (whitespace, repeated </parameter>) a structural decision may wait for; beyond it the
// text is not structural. Bounds the re-scans, so degenerate output (endless whitespace) stays linear.
constexpr size_t kMaxPending = 1024;

// What follows the buffered text: nothing known yet, a delimiter id, or the end of output.
enum class Next { none, tool_open, tool_close, think_open, think_close, end };
enum class Match { no, yes, more };

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool name_char_ok(char c) {
  return !is_ws(c) && c != '{' && c != '}' && c != '<' && c != '>' && c != '"' && c != '\'' && c != '\f' &&
         c != '\v';
}

// Does s[pos..] start with lit (yes), is it a proper prefix of lit (more), or neither (no)?
Match match_lit(std::string_view s, size_t pos, std::string_view lit) {
  const size_t n = std::min(s.size() - pos, lit.size());
  if (s.compare(pos, n, lit.substr(0, n)) != 0) return Match::no;
  return n == lit.size() ? Match::yes : Match::more;
}

size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}

const char* literal(Next k) {
  switch (k) {
    case Next::tool_open: return "<tool_call>";
    case Next::tool_close: return "</tool_call>";
    case Next::think_open: return "<think>";
    case Next::think_close: return "</think>";
    default: return "";
  }
}

// Reads `<tag>NAME>` at s[pos..] (tag already known to match): NAME up to '>' (no newline, bounded).
Match read_tag_name(std::string_view s, size_t pos, std::string_view tag, size_t max_len, bool strict_chars,
                    std::string& name, size_t& end) {
  const Match m = match_lit(s, pos, tag);
  if (m != Match::yes) return m;
  for (size_t k = pos + tag.size(); k < s.size(); ++k) {
    const char c = s[k];
    if (c == '>') {
      if (k == pos + tag.size()) return Match::no;
      name.assign(s.substr(pos + tag.size(), k - pos - tag.size()));
      end = k + 1;
      return Match::yes;
    }
    if (c == '\n' || (strict_chars && !name_char_ok(c)) || k - pos - tag.size() >= max_len) return Match::no;
  }
  return Match::more;
}

// Accumulates one output text field (reasoning or content) and emits its deltas: leading whitespace dropped,
// a trailing whitespace run held back until more text follows (dropped at `cut`), UTF-8 reassembled.
class Channel {
 public:
  Channel(ParserEvent::Kind kind, std::string& out) : kind_(kind), out_(out) {}

  void text(std::string_view s, std::vector<ParserEvent>& ev) {
    size_t i = 0;
    while (i < s.size()) {
      size_t j = i;
      const bool ws = is_ws(s[i]);
      while (j < s.size() && is_ws(s[j]) == ws) ++j;
      if (ws) {
        emit(utf8_.flush(), ev);  // an incomplete sequence cannot continue past an ASCII byte
        if (started_) pending_.append(s.substr(i, j - i));
      } else {
        std::string t = utf8_.push(s.substr(i, j - i));
        emit(pending_, ev);
        pending_.clear();
        emit(t, ev);
        started_ = true;
      }
      i = j;
    }
  }
  // End of a segment (before a tool call, at </think>, at the end): drop held whitespace, flush UTF-8.
  void cut(std::vector<ParserEvent>& ev) {
    pending_.clear();
    emit(utf8_.flush(), ev);
  }

 private:
  void emit(const std::string& t, std::vector<ParserEvent>& ev) {
    if (t.empty()) return;
    out_ += t;
    if (!ev.empty() && ev.back().kind == kind_) ev.back().text += t;
    else ev.push_back(ParserEvent{kind_, t, -1, {}, {}});
  }

  ParserEvent::Kind kind_;
  std::string& out_;
  std::string pending_;  // held trailing whitespace
  Utf8Stream utf8_;
  bool started_ = false;
};

enum class St { reasoning, reason_lookahead, content, tool_header, bad_block, tool_json, body, value, after_function, done };

std::string escaped(std::string_view raw) {
  std::string out;
  append_json_escaped(out, utf8_lossy(raw));
  return out;
}

}  // namespace

struct OutputParser::Impl {
  ParserOptions opt;
  ToolSet tools;
  bool bare_enabled;
  ParseResult res;
  Channel reasoning{ParserEvent::Kind::reasoning, res.reasoning};
  Channel content{ParserEvent::Kind::content, res.content};
  std::vector<ParserEvent>* ev = nullptr;  // events of the current feed/finish call
  std::mt19937_64 rng;

  St st;
  std::string buf;                 // pending text of the current state
  bool any_output = false;         // any non-whitespace text or delimiter seen (a later <think> is literal)
  bool content_line_start = true;  // the last byte routed to content was '\n' (or content just started)
  bool swallow_tool_close = false; // the last call ended without its </tool_call>
  int lookahead_tokens = 0;        // tokens since <tool_call> in reasoning, reasoning iff the call is refuted

  // The open tool call.
  bool in_call = false;
  bool call_bare = false;
  const ToolSchema* schema = nullptr;
  std::vector<std::pair<std::string, OrderedJson>> params;  // parsed parameters, first occurrence per key
  std::set<std::string> seen;                               // raw keys seen in this call (duplicates skipped)
  bool json_from_reasoning = false;
  int open_keys = 0;  // keys whose `"key": ` was emitted in this call (== params.size() once values end)

  // The open parameter value.
  std::string key;
  ParamType type;
  bool dup = false;
  bool streaming = false;  // pure string: streamed as it arrives
  std::string raw;         // committed raw value bytes
  size_t emitted = 0;      // raw bytes already streamed

  Impl(ParserOptions o, ToolSet t) : opt(std::move(o)), tools(std::move(t)) {
    bare_enabled = !tools.tools.empty() && opt.format != ToolFormat::json;
    rng.seed(opt.id_seed ? *opt.id_seed : std::random_device{}());
    st = opt.start_in_reasoning ? St::reasoning : St::content;
  }

  // --- events ----------------------------------------------------------------------------------------------
  void emit_content(std::string_view s) {
    if (s.empty()) return;
    content.text(s, *ev);
    content_line_start = s.back() == '\n';
  }
  void emit_args(const std::string& t) {
    if (t.empty()) return;
    const int index = static_cast<int>(res.tool_calls.size()) - 1;
    res.tool_calls.back().arguments += t;
    auto& e = *ev;
    if (!e.empty() && e.back().kind == ParserEvent::Kind::tool_args && e.back().index == index) e.back().text += t;
    else e.push_back(ParserEvent{ParserEvent::Kind::tool_args, t, index, {}, {}});
  }
  std::string new_call_id() {
    if (opt.make_call_id) return opt.make_call_id();
    static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) id += kAlnum[rng() % 62];
    return id;
  }

  // --- tool calls ------------------------------------------------------------------------------------------
  void start_call(const std::string& raw_name, bool bare) {
    const std::string name = utf8_lossy(raw_name);
    in_call = true;
    call_bare = bare;
    schema = tools.find(name);
    params.clear();
    seen.clear();
    open_keys = 0;
    if (!schema && !tools.tools.empty()) log::warn("tool call to unknown function '", name, "'");
    ToolCall call{new_call_id(), name, ""};
    ev->push_back(ParserEvent{ParserEvent::Kind::tool_header, "", static_cast<int>(res.tool_calls.size()),
                              call.id, name});
    res.tool_calls.push_back(std::move(call));
  }
  // Closes the arguments object; the streamed text was built to equal the serialisation of `params`.
  void close_call(bool cut) {
    if (!in_call) return;
    in_call = false;
    emit_args(open_keys == 0 ? "{}" : "}");
    std::string args = "{";
    for (size_t i = 0; i < params.size(); ++i) {
      if (i) args += ", ";
      args += "\"" + escaped(params[i].first) + "\": " + python_json_dumps(params[i].second);
    }
    args += "}";
    if (args != res.tool_calls.back().arguments) {
      log::error("tool call arguments: streamed text differs from the final serialisation");
      res.tool_calls.back().arguments = args;
    }
    if (cut) res.call_cut = true;
  }
  void begin_value(std::string k) {
    key = std::move(k);
    dup = !seen.insert(key).second;
    type = schema && schema->has_properties ? [&] {
      auto it = schema->params.find(key);
      return it == schema->params.end() ? ParamType{} : it->second;
    }() : ParamType{};
    streaming = !dup && type.pure_string();
    raw.clear();
    emitted = 0;
    if (dup) {
      log::warn("tool call '", res.tool_calls.back().name, "': duplicate parameter '", key, "' ignored");
      return;
    }
    emit_args(std::string(open_keys == 0 ? "{" : ", ") + "\"" + escaped(key) + "\": " + (streaming ? "\"" : ""));
    ++open_keys;
  }

  // Streams the decided part of a string value: one leading '\n' dropped, a possible trailing '\n' and an
  // incomplete UTF-8 tail held back (unless final).
  void stream_value(bool final) {
    const size_t start = !raw.empty() && raw[0] == '\n' ? 1 : 0;
    emitted = std::max(emitted, start);
    size_t limit = raw.size();
    if (limit > start && raw.back() == '\n') --limit;
    if (limit <= emitted) return;
    std::string_view seg = std::string_view(raw).substr(emitted, limit - emitted);
    if (!final) seg = seg.substr(0, utf8_split(seg));
    emit_args(escaped(seg));
    emitted += seg.size();
  }
  void finish_value() {
    if (dup) return;
    const size_t start = !raw.empty() && raw[0] == '\n' ? 1 : 0;
    size_t limit = raw.size();
    if (limit > start && raw.back() == '\n') --limit;
    const std::string_view s = std::string_view(raw).substr(start, limit - start);
    if (streaming) {
      stream_value(true);
      emit_args("\"");
      params.emplace_back(key, utf8_lossy(s));
    } else {
      OrderedJson v = convert_value(s, type);
      emit_args(python_json_dumps(v));
      params.emplace_back(key, std::move(v));
    }
  }
  bool key_acceptable(const std::string& k) const {
    if (schema && schema->has_properties) return schema->params.count(k) && !seen.count(k);
    return true;
  }

  // Header after <tool_call>: whitespace, then `<function=NAME>` (xml) or `{` (json).
  struct Header {
    Match m = Match::no;
    bool json = false;
    std::string name;
    size_t end = 0;  // bytes consumed (json: up to the '{', which stays)
  };
  Header match_header(size_t ws_limit, bool strict_json) const {
    Header h;
    const size_t i = skip_ws(buf, 0);
    if (i > ws_limit) return h;
    if (i == buf.size()) return h.m = Match::more, h;
    if (buf[i] == '{' && opt.format != ToolFormat::xml) {
      h.json = true;
      h.end = i;
      if (!strict_json) return h.m = Match::yes, h;
      const size_t j = skip_ws(buf, i + 1);
      if (j == buf.size()) return h.m = Match::more, h;
      h.m = match_lit(buf, j, "\"name\"");
      return h;
    }
    if (opt.format == ToolFormat::json) return h;
    h.m = read_tag_name(buf, i, kFunctionOpen, kMaxNameLen, true, h.name, h.end);
    return h;
  }

  // After `</function>` at s[j..]: whitespace, then a terminator. A bare call has no </tool_call> to wait for:
  // there any next line ends it.
  Match after_function(size_t j, bool terminal) const {
    const size_t k = skip_ws(buf, j);
    if (k - j > kMaxPending) return Match::no;
    if (k == buf.size()) return terminal ? Match::yes : Match::more;
    return call_bare && buf[k - 1] == '\n' ? Match::yes : Match::no;
  }
  // Is `<parameter=KEY>` at j a structural start (key acceptable)?
  Match param_start(size_t j) const {
    std::string k;
    size_t end = 0;
    const Match m = read_tag_name(buf, j, kParamOpen, kMaxNameLen, false, k, end);
    if (m == Match::more) return m;
    return m == Match::yes && key_acceptable(k) ? Match::yes : Match::no;
  }

  // §3.3 structural end of a value at buf[i] == '<': yes (value ends at i, body parsing resumes at `resume`),
  // no, or more (undecided until more text; at a terminator the caller takes it as the truncated tag: yes).
  Match value_end_at(size_t i, bool terminal, size_t& resume) const {
    resume = i;
    Match m = match_lit(buf, i, kParamClose);
    if (m == Match::more) return m;
    if (m == Match::yes) {
      size_t j = i + kParamClose.size();
      while (true) {
        j = skip_ws(buf, j);
        resume = j;
        if (j - i > kMaxPending) return Match::no;
        if (j == buf.size()) return terminal ? Match::yes : Match::more;
        const Match again = match_lit(buf, j, kParamClose);
        if (again != Match::yes) {
          if (again == Match::more) return again;
          break;
        }
        j += kParamClose.size();
      }
      if (buf[j - 1] == '\n' && match_lit(buf, j, kParamOpen) != Match::no) return param_start(j);
      const Match f = match_lit(buf, j, kFunctionClose);
      if (f != Match::yes) return f;
      return after_function(j + kFunctionClose.size(), terminal);
    }
    m = match_lit(buf, i, kFunctionClose);
    if (m == Match::more) return m;
    if (m == Match::yes) return after_function(i + kFunctionClose.size(), terminal);
    const char prev = i > 0 ? buf[i - 1] : (raw.empty() ? '\0' : raw.back());
    if (prev == '\n') return param_start(i);
    return Match::no;
  }

  void commit(size_t n) {
    raw.append(buf, 0, n);
    buf.erase(0, n);
    if (streaming) stream_value(false);
  }

  // Qwen3 JSON call {"name": ..., "arguments": {...}}: true if it became a call.
  bool finish_json_call() {
    OrderedJson v;
    if (!parse_json_limited(buf, v) || !v.is_object()) return false;
    auto name = v.find("name");
    if (name == v.end() || !name->is_string()) return false;
    const std::string& n = name->get_ref<const std::string&>();
    if (n.empty() || n.size() > kMaxNameLen || !std::all_of(n.begin(), n.end(), name_char_ok)) return false;
    OrderedJson args = OrderedJson::object();
    auto a = v.find("arguments");
    if (a == v.end()) a = v.find("parameters");
    if (a != v.end()) {
      if (a->is_string()) {
        if (!parse_json_limited(a->get_ref<const std::string&>(), args)) return false;
      } else {
        args = *a;
      }
      if (!args.is_object()) return false;
    }
    content.cut(*ev);
    start_call(n, false);
    for (auto& [k, val] : args.items()) params.emplace_back(k, val);
    std::string text = "{";
    for (size_t i = 0; i < params.size(); ++i)
      text += (i ? ", \"" : "\"") + escaped(params[i].first) + "\": " + python_json_dumps(params[i].second);
    open_keys = static_cast<int>(params.size());
    emit_args(params.empty() ? "" : text);
    close_call(false);
    return true;
  }

  void end_reasoning() {
    reasoning.cut(*ev);
    res.reasoning_ended = true;
    st = St::content;
    content_line_start = true;
  }

  // --- the state machine -----------------------------------------------------------------------------------
  // One step of the current state over `buf`; returns true to run again (state changed or progress made).
  bool step(Next next) {
    const bool terminal = next != Next::none;
    switch (st) {
      case St::reasoning: {
        if (opt.thinking_close_fallback) {  // §4.6: literal </thinking> ends reasoning (off by default)
          constexpr std::string_view tag = "</thinking>";
          if (const size_t p = buf.find(tag); p != std::string::npos) {
            reasoning.text(std::string_view(buf).substr(0, p), *ev);
            buf.erase(0, p + tag.size());
            end_reasoning();
            return true;
          }
          size_t hold = 0;  // a tail that may still become the tag
          for (size_t n = std::min(buf.size(), tag.size() - 1); n > 0 && !terminal && hold == 0; --n)
            if (std::string_view(buf).substr(buf.size() - n) == tag.substr(0, n)) hold = n;
          reasoning.text(std::string_view(buf).substr(0, buf.size() - hold), *ev);
          buf.erase(0, buf.size() - hold);
          return false;
        }
        reasoning.text(buf, *ev);
        buf.clear();
        return false;
      }

      case St::reason_lookahead: {
        Header h = match_header(kMaxLookaheadWs, true);
        if (h.m == Match::more && !terminal) return false;
        if (h.m == Match::yes) {
          reasoning.cut(*ev);
          res.reasoning_ended = true;
          lookahead_tokens = 0;
          if (h.json) {
            buf.erase(0, h.end);
            st = St::tool_json;
            json_from_reasoning = true;
          } else {
            start_call(h.name, false);
            buf.erase(0, h.end);
            st = St::body;
          }
          return true;
        }
        // no call: the tag is reasoning text, and the reasoning state takes the buffered text (it may hold the
        // </thinking> fallback; dumping it here made the result depend on how much text one token carried)
        res.reasoning_tokens += lookahead_tokens;
        lookahead_tokens = 0;
        reasoning.text("<tool_call>", *ev);
        st = St::reasoning;
        return true;
      }

      case St::content: {
        size_t start = 0;
        for (size_t i = 0; bare_enabled && i < buf.size(); ++i) {
          const bool line_start = i == 0 ? content_line_start : buf[i - 1] == '\n';
          if (buf[i] != '<' || !line_start) continue;
          std::string name;
          size_t end = 0;
          Match m = read_tag_name(buf, i, kFunctionOpen, tools.max_name_len, true, name, end);
          if (m == Match::more && !terminal) {
            emit_content(std::string_view(buf).substr(start, i - start));
            buf.erase(0, i);
            return false;
          }
          if (m == Match::yes && tools.find(name)) {
            emit_content(std::string_view(buf).substr(start, i - start));
            content.cut(*ev);
            start_call(name, true);
            buf.erase(0, end);
            st = St::body;
            return true;
          }
        }
        emit_content(std::string_view(buf).substr(start));
        buf.clear();
        return false;
      }

      case St::tool_header: {
        Header h = match_header(kMaxPending, false);
        if (h.m == Match::more && !terminal) return false;
        if (h.m == Match::more && next == Next::end) {  // cut inside the header: nothing to return
          res.call_cut = true;
          buf.clear();
          st = St::content;
          return false;
        }
        if (h.m == Match::yes && h.json) {
          buf.erase(0, h.end);
          st = St::tool_json;
          json_from_reasoning = false;
          return true;
        }
        if (h.m == Match::yes) {
          content.cut(*ev);
          start_call(h.name, false);
          buf.erase(0, h.end);
          st = St::body;
          return true;
        }
        log::warn("tool call block without a valid <function=NAME> header returned as content");
        res.tool_call_parse_failures++;
        emit_content("<tool_call>");
        emit_content(buf);
        buf.clear();
        st = St::bad_block;
        return false;
      }

      case St::bad_block:
        emit_content(buf);
        buf.clear();
        return false;

      case St::tool_json:
        return false;  // resolved at </tool_call> or the end

      case St::body: {
        const size_t i = skip_ws(buf, 0);
        buf.erase(0, i);
        if (buf.empty()) return false;
        if (buf[0] == '<') {
          std::string k;
          size_t end = 0;
          const Match p = read_tag_name(buf, 0, kParamOpen, kMaxNameLen, false, k, end);
          if (p == Match::yes) {
            buf.erase(0, end);
            begin_value(std::move(k));
            st = St::value;
            return true;
          }
          const Match f = match_lit(buf, 0, kFunctionClose);
          if (f == Match::yes) {
            buf.erase(0, kFunctionClose.size());
            close_call(false);
            st = St::after_function;
            return true;
          }
          if ((p == Match::more || f == Match::more) && !terminal) return false;
        }
        const size_t next_tag = buf.find('<', 1);  // junk between parameters is dropped
        log::debug("tool call: dropped stray text between parameters");
        buf.erase(0, next_tag == std::string::npos ? buf.size() : next_tag);
        return true;
      }

      case St::value: {
        // </tool_call> and the end close the value; <tool_call> only completes a pending </parameter> or
        // </function> (a call whose closing tags were forgotten), else it is literal text of the value.
        const bool ends_value = next == Next::tool_close || next == Next::end;
        for (size_t i = 0; i < buf.size(); ++i) {
          if (buf[i] != '<') continue;
          size_t resume = 0;
          Match m = value_end_at(i, terminal, resume);
          if (m == Match::more && ends_value) m = Match::yes;  // output ends inside a tag: the value ends here
          if (m == Match::more) {
            commit(i);
            return false;
          }
          if (m == Match::yes) {
            commit(i);
            buf.erase(0, resume - i);
            finish_value();
            st = St::body;
            return true;
          }
        }
        commit(buf.size());
        if (!ends_value) return false;
        finish_value();
        st = St::body;
        return true;
      }

      case St::after_function: {
        const size_t i = skip_ws(buf, 0);  // whitespace stays until decided (it tells line starts)
        if (i == buf.size() && i <= kMaxPending) return false;
        swallow_tool_close = true;  // text after </function>: the call is complete, the rest is content
        content_line_start = false;  // the byte before buf was the '>' of </function>
        st = St::content;
        return true;
      }

      case St::done:
        buf.clear();
        return false;
    }
    return false;
  }

  void run(Next next) {
    while (step(next)) {
    }
  }

  // Acts on a delimiter once the pending text has been resolved.
  void on_delimiter(Next k) {
    switch (st) {
      case St::reasoning:
        if (k == Next::think_close) {
          ++res.reasoning_tokens;
          end_reasoning();
        } else if (k == Next::tool_open) {
          lookahead_tokens = 1;
          st = St::reason_lookahead;
        } else {
          ++res.reasoning_tokens;
          if (!(k == Next::think_open && !any_output)) reasoning.text(literal(k), *ev);
        }
        break;
      case St::content:
        if (k == Next::tool_open) {
          swallow_tool_close = false;
          st = St::tool_header;
        } else if (k == Next::think_open && !any_output) {
          st = St::reasoning;  // a leading <think> opens reasoning and is dropped
        } else if (k == Next::tool_close && swallow_tool_close) {
          swallow_tool_close = false;
        } else {
          emit_content(literal(k));
        }
        break;
      case St::bad_block:
        if (k == Next::tool_close) {
          emit_content(literal(k));
          st = St::content;
        } else if (k == Next::tool_open) {
          st = St::tool_header;
        } else {
          emit_content(literal(k));
        }
        break;
      case St::tool_json:
        if (k == Next::tool_close) {
          if (!finish_json_call()) {
            log::warn("tool call block with invalid JSON returned as content");
            res.tool_call_parse_failures++;
            emit_content("<tool_call>");
            emit_content(buf);
            emit_content("</tool_call>");
          }
          buf.clear();
          st = St::content;
        } else {
          buf += literal(k);
        }
        break;
      case St::body:
        if (k == Next::tool_close || k == Next::tool_open) {
          close_call(false);
          st = k == Next::tool_open ? St::tool_header : St::content;
          content_line_start = true;
        }
        break;
      case St::after_function:
        buf.clear();
        if (k == Next::tool_open) st = St::tool_header;
        if (k == Next::tool_close) st = St::content, content_line_start = true;
        break;
      default:
        break;
    }
  }

  Next classify(int32_t id) const {
    if (id == opt.ids.think_open) return Next::think_open;
    if (id == opt.ids.think_close) return Next::think_close;
    if (id == opt.ids.tool_open) return Next::tool_open;
    if (id == opt.ids.tool_close) return Next::tool_close;
    if (std::find(opt.ids.stop.begin(), opt.ids.stop.end(), id) != opt.ids.stop.end()) return Next::end;
    return Next::none;
  }

  void feed(int32_t id, std::string_view bytes) {
    if (st == St::done) return;
    Next k = classify(id);
    if (k == Next::end) return finish();
    if (k == Next::tool_open && st == St::value) run(k);
    // Inside a value or a JSON block, delimiters other than </tool_call> are literal text.
    if (k != Next::none && k != Next::tool_close && (st == St::value || st == St::tool_json)) {
      bytes = literal(k);
      k = Next::none;
    }
    if (k == Next::none) {
      if (st == St::reasoning) ++res.reasoning_tokens;
      if (st == St::reason_lookahead) ++lookahead_tokens;
      if (std::any_of(bytes.begin(), bytes.end(), [](char c) { return !is_ws(c); })) any_output = true;
      buf.append(bytes);
      run(Next::none);
      return;
    }
    run(k);
    on_delimiter(k);
    if (k != Next::think_open) any_output = true;
    run(Next::none);
  }

  void finish() {
    if (st == St::done) return;
    run(Next::end);
    if (st == St::tool_json && !finish_json_call()) res.call_cut = true;
    if (in_call) close_call(true);
    reasoning.cut(*ev);
    content.cut(*ev);
    buf.clear();
    st = St::done;
  }
};

bool initial_reasoning_state(std::span<const int32_t> prompt, const DelimiterIds& ids) {
  for (size_t i = prompt.size(); i-- > 0;) {
    if (prompt[i] == ids.think_open) return true;
    if (prompt[i] == ids.think_close) return false;
  }
  return false;
}

OutputParser::OutputParser(ParserOptions options, ToolSet tools)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(tools))) {}
OutputParser::~OutputParser() = default;

void OutputParser::feed(int32_t id, std::string_view bytes, std::vector<ParserEvent>& events) {
  impl_->ev = &events;
  impl_->feed(id, bytes);
}

void OutputParser::finish(std::vector<ParserEvent>& events) {
  impl_->ev = &events;
  impl_->finish();
}

const ParseResult& OutputParser::result() const { return impl_->res; }

OrderedJson tool_call_json(const ToolCall& call) {
  OrderedJson j;
  j["id"] = call.id;
  j["type"] = "function";
  j["function"] = {{"name", call.name}, {"arguments", call.arguments}};
  return j;
}

OrderedJson tool_call_delta_json(const ParserEvent& event) {
  OrderedJson j;
  j["index"] = event.index;
  if (event.kind == ParserEvent::Kind::tool_header) {
    j["id"] = event.id;
    j["type"] = "function";
    j["function"] = {{"name", event.name}, {"arguments", ""}};
  } else {
    j["function"] = {{"arguments", event.text}};
  }
  return j;
}

ParseResult parse_output(std::span<const int32_t> ids, std::span<const std::string> texts, ParserOptions options,
                         const ToolSet& tools) {
  OutputParser parser(std::move(options), tools);
  std::vector<ParserEvent> events;
  for (size_t i = 0; i < ids.size(); ++i) {
    parser.feed(ids[i], i < texts.size() ? std::string_view(texts[i]) : std::string_view(), events);
    events.clear();
  }
  parser.finish(events);
  return parser.result();
}

}  // namespace lily::chat
