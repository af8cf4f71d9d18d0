// Jinja2 filters, tests and the globals of transformers' chat-template environment, with the argument names
// and edge cases of Jinja2 3.1 (e.g. `default` only replaces undefined unless boolean=true; `sort`, `min`,
// `max`, `unique` compare strings case-insensitively by default; sandboxed `range` is capped at 100000).
#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "chat/jinja_internal.h"

namespace lily::jinja {
namespace {

using FilterFn = Value (*)(const Value&, Args&, Budget&);
using TestFn = bool (*)(const Value&, Args&);

bool arg_bool(const Args& a, size_t i, const char* name, bool def) {
  const Value* v = a.get(i, name);
  return v ? truthy(*v) : def;
}

Value lower_if_str(const Value& v, bool case_sensitive) {
  if (case_sensitive || !v.is_string()) return v;
  std::string s = v.str();
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  return Value::string(std::move(s));
}

// Jinja2's attribute path lookup ("a.b.0") used by sort/map/join/... attribute= arguments.
Value attr_path(const Value& v, const Value& attribute) {
  if (attribute.is_none() || attribute.is_undefined()) return v;
  if (attribute.kind == Value::Kind::Int) return get_item(v, attribute);
  Value cur = v;
  std::string path = attribute.is_string() ? attribute.str() : to_str(attribute);
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = numeric && part.size() < 18 ? get_item(cur, Value::integer(std::stoll(part)))
                                      : get_item(cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

ValueList sorted(ValueList items, bool case_sensitive, const Value& attribute, bool reverse) {
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    Value a = lower_if_str(attr_path(x, attribute), case_sensitive);
    Value b = lower_if_str(attr_path(y, attribute), case_sensitive);
    return reverse ? compare(b, a, "<") < 0 : compare(a, b, "<") < 0;
  });
  return items;
}

Value f_default(const Value& v, Args& a, Budget&) {
  Value def = a.get_or(0, "default_value", Value::string(""));
  if (v.is_undefined() || (arg_bool(a, 1, "boolean", false) && !truthy(v))) return def;
  return v;
}
Value f_trim(const Value& v, Args& a, Budget&) {
  return Value::string(py_strip(to_str(v), a.get_or(0, "chars", Value::none()), true, true));
}
Value f_tojson(const Value& v, Args& a, Budget& b) {
  if (v.is_undefined()) throw_error("Object of type Undefined is not JSON serializable");
  Value indent = a.get_or(1, "indent", Value::none());
  Value seps = a.get_or(2, "separators", Value::none());
  std::string item_sep, key_sep;
  if (seps.is_list() && seps.list->size() == 2) {
    item_sep = to_str((*seps.list)[0]);
    key_sep = to_str((*seps.list)[1]);
  }
  int ind = -1;
  if (indent.kind == Value::Kind::Int) ind = static_cast<int>(std::clamp<int64_t>(indent.i, 0, 64));
  std::string out = to_json(v, ind, arg_bool(a, 3, "sort_keys", false), item_sep, key_sep);
  b.check_size(out.size());
  return Value::string(std::move(out));
}
Value f_items(const Value& v, Args&, Budget&) {
  if (v.is_undefined()) return Value::make_list();
  if (!v.is_dict()) throw_error("Can only get item pairs from a mapping.");
  ValueList out;
  for (const auto& [k, x] : *v.dict) out.push_back(Value::make_tuple({Value::string(k), x}));
  return Value::make_list(std::move(out));
}
Value f_string(const Value& v, Args&, Budget&) { return Value::string(to_str(v)); }
Value f_length(const Value& v, Args&, Budget&) { return Value::integer(length(v)); }
Value f_list(const Value& v, Args&, Budget&) { return Value::make_list(iterate(v)); }
Value f_first(const Value& v, Args&, Budget&) {
  ValueList items = iterate(v);
  return items.empty() ? Value::undefined("", "No first item, sequence was empty.") : items.front();
}
Value f_last(const Value& v, Args&, Budget&) {
  ValueList items = iterate(v);
  return items.empty() ? Value::undefined("", "No last item, sequence was empty.") : items.back();
}
Value f_join(const Value& v, Args& a, Budget& b) {
  std::string sep = to_str(a.get_or(0, "d", Value::string("")));
  Value attribute = a.get_or(1, "attribute", Value::none());
  std::string out;
  bool first = true;
  for (const auto& x : iterate(v)) {
    if (!first) out += sep;
    out += to_str(attr_path(x, attribute));
    first = false;
    b.check_size(out.size());
  }
  return Value::string(std::move(out));
}
Value f_lower(const Value& v, Args&, Budget&) {
  Args none;
  return (*get_attr(Value::string(to_str(v)), "lower").fn)(none);
}
Value f_upper(const Value& v, Args&, Budget&) {
  Args none;
  return (*get_attr(Value::string(to_str(v)), "upper").fn)(none);
}
Value f_capitalize(const Value& v, Args& a, Budget&) {
  Args none;
  return (*get_attr(Value::string(to_str(v)), "capitalize").fn)(none);
}
Value f_title(const Value& v, Args&, Budget&) {
  // Jinja2's do_title: words split on runs of '-', whitespace, '(', '{', '[', '<'.
  std::string s = to_str(v), out;
  bool at_word_start = true;
  for (char c : s) {
    bool sep = c == '-' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == '(' ||
               c == '{' || c == '[' || c == '<';
    char r = c;
    if (!sep) {
      if (at_word_start && c >= 'a' && c <= 'z') r = static_cast<char>(c - 32);
      if (!at_word_start && c >= 'A' && c <= 'Z') r = static_cast<char>(c + 32);
    }
    out += r;
    at_word_start = sep;
  }
  return Value::string(std::move(out));
}
Value f_replace(const Value& v, Args& a, Budget& b) {
  const Value* o = a.get(0, "old");
  const Value* n = a.get(1, "new");
  if (!o || !n) throw_error("replace expects 2 arguments");
  Value count = a.get_or(2, "count", Value::none());
  return Value::string(py_replace(to_str(v), to_str(*o), to_str(*n),
                                  count.kind == Value::Kind::Int ? count.i : -1, &b));
}
Value f_safe(const Value& v, Args&, Budget&) { return Value::string(to_str(v)); }
Value f_escape(const Value& v, Args&, Budget&) {
  std::string out;
  for (char c : to_str(v)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value::string(std::move(out));
}
Value f_reverse(const Value& v, Args&, Budget&) {
  if (v.is_string()) return slice(v, Value::none(), Value::none(), Value::integer(-1));
  ValueList items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::make_list(std::move(items));
}
Value f_sort(const Value& v, Args& a, Budget&) {
  return Value::make_list(sorted(iterate(v), arg_bool(a, 1, "case_sensitive", false),
                                 a.get_or(2, "attribute", Value::none()), arg_bool(a, 0, "reverse", false)));
}
Value f_unique(const Value& v, Args& a, Budget&) {
  bool cs = arg_bool(a, 0, "case_sensitive", false);
  Value attribute = a.get_or(1, "attribute", Value::none());
  ValueList out, seen;
  for (const auto& x : iterate(v)) {
    Value key = lower_if_str(attr_path(x, attribute), cs);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
      seen.push_back(key);
      out.push_back(x);
    }
  }
  return Value::make_list(std::move(out));
}
Value min_max(const Value& v, Args& a, bool want_max) {
  ValueList items = iterate(v);
  if (items.empty()) return Value::undefined("", "No aggregated item, sequence was empty.");
  bool cs = arg_bool(a, 0, "case_sensitive", false);
  Value attribute = a.get_or(1, "attribute", Value::none());
  Value best = items[0];
  for (size_t k = 1; k < items.size(); ++k) {
    int c = compare(lower_if_str(attr_path(items[k], attribute), cs), lower_if_str(attr_path(best, attribute), cs), "<");
    if (want_max ? c > 0 : c < 0) best = items[k];
  }
  return best;
}
Value f_min(const Value& v, Args& a, Budget&) { return min_max(v, a, false); }
Value f_max(const Value& v, Args& a, Budget&) { return min_max(v, a, true); }
Value f_sum(const Value& v, Args& a, Budget& b) {
  Value attribute = a.get_or(0, "attribute", Value::none());
  Value total = a.get_or(1, "start", Value::integer(0));
  for (const auto& x : iterate(v)) total = binary_op("+", total, attr_path(x, attribute), b);
  return total;
}
Value f_abs(const Value& v, Args&, Budget&) {
  if (v.kind == Value::Kind::Float) return Value::number(std::fabs(v.f));
  if (v.kind == Value::Kind::Int || v.kind == Value::Kind::Bool) {
    int64_t x = v.kind == Value::Kind::Int ? v.i : v.b;
    return x < 0 ? unary_op("-", Value::integer(x)) : Value::integer(x);
  }
  throw_error("bad operand type for abs(): '" + type_name(v) + "'");
}
Value f_int(const Value& v, Args& a, Budget&) {
  Value def = a.get_or(0, "default", Value::integer(0));
  if (v.kind == Value::Kind::Int) return v;
  if (v.kind == Value::Kind::Bool) return Value::integer(v.b);
  if (v.kind == Value::Kind::Float) {
    if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return def;
    return Value::integer(static_cast<int64_t>(v.f));
  }
  if (v.is_string()) {
    std::string s = py_strip(v.str(), Value::none(), true, true);
    size_t used = 0;
    try {
      long long x = std::stoll(s, &used, 10);
      if (used == s.size()) return Value::integer(x);
      double d = std::stod(s, &used);
      if (used == s.size() && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::integer(static_cast<int64_t>(d));
    } catch (const std::exception&) {
    }
  }
  return def;
}
Value f_float(const Value& v, Args& a, Budget&) {
  Value def = a.get_or(0, "default", Value::number(0.0));
  if (v.is_number()) return Value::number(v.kind == Value::Kind::Float ? v.f : v.kind == Value::Kind::Int ? v.i : v.b);
  if (v.is_string()) {
    std::string s = py_strip(v.str(), Value::none(), true, true);
    size_t used = 0;
    try {
      double d = std::stod(s, &used);
      if (used == s.size()) return Value::number(d);
    } catch (const std::exception&) {
    }
  }
  return def;
}
Value f_round(const Value& v, Args& a, Budget&) {
  int64_t prec = 0;
  if (const Value* p = a.get(0, "precision"); p && p->kind == Value::Kind::Int) prec = std::clamp<int64_t>(p->i, -300, 300);
  std::string method = to_str(a.get_or(1, "method", Value::string("common")));
  if (!v.is_number()) throw_error("round expects a number, got " + type_name(v));
  double x = v.kind == Value::Kind::Float ? v.f : v.kind == Value::Kind::Int ? v.i : v.b;
  double scale = std::pow(10.0, static_cast<double>(prec));
  double y = x * scale;
  if (method == "common") y = std::round(y);
  else if (method == "ceil") y = std::ceil(y);
  else if (method == "floor") y = std::floor(y);
  else throw_error("method must be common, ceil or floor");
  return Value::number(y / scale);
}
Value f_indent(const Value& v, Args& a, Budget& b) {
  Value w = a.get_or(0, "width", Value::integer(4));
  std::string ind = w.is_string() ? w.str() : std::string(static_cast<size_t>(std::clamp<int64_t>(w.kind == Value::Kind::Int ? w.i : 4, 0, 1024)), ' ');
  bool first = arg_bool(a, 1, "first", false), blank = arg_bool(a, 2, "blank", false);
  std::string s = to_str(v) + "\n";
  Args none;
  ValueList lines = *(*get_attr(Value::string(s), "splitlines").fn)(none).list;
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    const std::string& ln = lines[k].str();
    if (k > 0) out += "\n" + ((blank || !ln.empty()) ? ind : std::string()) + ln;
    else out += ln;
    b.check_size(out.size());
  }
  return Value::string(first ? ind + out : out);
}
Value f_wordcount(const Value& v, Args&, Budget&) {
  int64_t n = 0;
  bool in_word = false;
  for (char c : to_str(v)) {
    bool w = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || static_cast<unsigned char>(c) >= 0x80;
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}
Value f_center(const Value& v, Args& a, Budget&) {
  std::string s = to_str(v);
  int64_t width = std::clamp<int64_t>(a.get_or(0, "width", Value::integer(80)).i, 0, 1 << 20);
  int64_t len = length(Value::string(s));
  if (width <= len) return Value::string(s);
  int64_t pad = width - len, left = pad / 2 + (pad & width & 1);
  return Value::string(std::string(left, ' ') + s + std::string(pad - left, ' '));
}
Value f_attr(const Value& v, Args& a, Budget&) {
  const Value* n = a.get(0, "name");
  if (!n || !n->is_string()) throw_error("attr expects a name");
  if (v.is_dict()) {
    Value m = get_attr(v, n->str());
    return m.kind == Value::Kind::Callable ? m : Value::undefined(n->str());
  }
  return get_attr(v, n->str());
}
Value f_dictsort(const Value& v, Args& a, Budget&) {
  if (!v.is_dict()) throw_error("You can only sort by either \"key\" or \"value\"");
  bool cs = arg_bool(a, 0, "case_sensitive", false);
  std::string by = to_str(a.get_or(1, "by", Value::string("key")));
  Value pos = Value::integer(by == "value" ? 1 : 0);
  ValueList items;
  for (const auto& [k, x] : *v.dict) items.push_back(Value::make_tuple({Value::string(k), x}));
  return Value::make_list(sorted(std::move(items), cs, pos, arg_bool(a, 2, "reverse", false)));
}

bool t_true(const Value& v, Args&) { return v.kind == Value::Kind::Bool && v.b; }
bool t_false(const Value& v, Args&) { return v.kind == Value::Kind::Bool && !v.b; }

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> m = {
      {"defined", [](const Value& v, Args&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, Args&) { return v.is_undefined(); }},
      {"none", [](const Value& v, Args&) { return v.is_none(); }},
      {"boolean", [](const Value& v, Args&) { return v.kind == Value::Kind::Bool; }},
      {"true", t_true},
      {"false", t_false},
      {"integer", [](const Value& v, Args&) { return v.kind == Value::Kind::Int; }},
      {"float", [](const Value& v, Args&) { return v.kind == Value::Kind::Float; }},
      {"number", [](const Value& v, Args&) { return v.is_number(); }},
      {"string", [](const Value& v, Args&) { return v.is_string(); }},
      {"mapping", [](const Value& v, Args&) { return v.is_dict(); }},
      {"iterable",
       [](const Value& v, Args&) { return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined(); }},
      {"sequence",
       [](const Value& v, Args&) { return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined(); }},
      {"callable", [](const Value& v, Args&) { return v.kind == Value::Kind::Callable; }},
      {"escaped", [](const Value&, Args&) { return false; }},
      {"lower",
       [](const Value& v, Args&) {
         Args none;
         return truthy((*get_attr(Value::string(to_str(v)), "islower").fn)(none));
       }},
      {"upper",
       [](const Value& v, Args&) {
         Args none;
         return truthy((*get_attr(Value::string(to_str(v)), "isupper").fn)(none));
       }},
      {"odd", [](const Value& v, Args&) { return v.kind == Value::Kind::Int && (v.i % 2 != 0); }},
      {"even", [](const Value& v, Args&) { return v.kind == Value::Kind::Int && v.i % 2 == 0; }},
      {"divisibleby",
       [](const Value& v, Args& a) {
         Budget b;
         const Value* n = a.get(0, "num");
         if (!n) throw_error("divisibleby expects an argument");
         return equals(binary_op("%", v, *n, b), Value::integer(0));
       }},
      {"sameas",
       [](const Value& v, Args& a) {
         const Value* o = a.get(0, "other");
         if (!o) throw_error("sameas expects an argument");
         if (v.kind != o->kind) return false;
         if (v.is_list()) return v.list == o->list;
         if (v.is_dict() || v.kind == Value::Kind::Namespace) return v.dict == o->dict;
         return equals(v, *o);
       }},
      {"in",
       [](const Value& v, Args& a) {
         const Value* o = a.get(0, "seq");
         if (!o) throw_error("in expects an argument");
         return contains(*o, v);
       }},
      {"filter", [](const Value& v, Args&) { return v.is_string() && has_filter(v.str()); }},
      {"test", [](const Value& v, Args&) { return v.is_string() && has_test(v.str()); }},
  };
  return m;
}

bool cmp_test(const std::string& name, const Value& v, Args& a, bool& result) {
  static const std::map<std::string, std::string> ops = {
      {"eq", "=="}, {"equalto", "=="}, {"==", "=="}, {"ne", "!="}, {"!=", "!="}, {"lt", "<"}, {"lessthan", "<"},
      {"<", "<"}, {"le", "<="}, {"<=", "<="}, {"gt", ">"}, {"greaterthan", ">"}, {">", ">"}, {"ge", ">="},
      {">=", ">="}};
  auto it = ops.find(name);
  if (it == ops.end()) return false;
  const Value* o = a.get(0, "other");
  if (!o) throw_error("test '" + name + "' expects an argument");
  const std::string& op = it->second;
  if (op == "==") result = equals(v, *o);
  else if (op == "!=") result = !equals(v, *o);
  else {
    int c = compare(v, *o, op);
    result = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
  }
  return true;
}

Value select_like(const Value& v, Args& a, bool by_attr, bool keep_if) {
  size_t k = 0;
  Value attribute;
  if (by_attr) {
    if (a.pos.empty()) throw_error("selectattr/rejectattr expect an attribute");
    attribute = a.pos[0];
    k = 1;
  }
  std::string test = a.pos.size() > k ? to_str(a.pos[k]) : "";
  Args targs;
  targs.pos.assign(a.pos.begin() + std::min(a.pos.size(), k + 1), a.pos.end());
  ValueList out;
  for (const auto& x : iterate(v)) {
    Value subject = by_attr ? attr_path(x, attribute) : x;
    bool r = test.empty() ? truthy(subject) : apply_test(test, subject, targs);
    if (r == keep_if) out.push_back(x);
  }
  return Value::make_list(std::move(out));
}

Value f_select(const Value& v, Args& a, Budget&) { return select_like(v, a, false, true); }
Value f_reject(const Value& v, Args& a, Budget&) { return select_like(v, a, false, false); }
Value f_selectattr(const Value& v, Args& a, Budget&) { return select_like(v, a, true, true); }
Value f_rejectattr(const Value& v, Args& a, Budget&) { return select_like(v, a, true, false); }
Value f_map(const Value& v, Args& a, Budget& b) {
  ValueList out;
  if (const Value* attribute = a.get(SIZE_MAX, "attribute")) {
    Value def = a.get_or(SIZE_MAX, "default", Value::undefined());
    for (const auto& x : iterate(v)) {
      Value r = attr_path(x, *attribute);
      out.push_back(r.is_undefined() && !def.is_undefined() ? def : r);
    }
    return Value::make_list(std::move(out));
  }
  if (a.pos.empty()) throw_error("map expects a filter name or attribute=");
  std::string name = to_str(a.pos[0]);
  if (!has_filter(name)) throw_error("no filter named '" + name + "'");
  Args fargs;
  fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
  fargs.kw = a.kw;
  for (const auto& x : iterate(v)) {
    Args copy = fargs;
    out.push_back(apply_filter(name, x, copy, b));
  }
  return Value::make_list(std::move(out));
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> m = {
      {"abs", f_abs},         {"attr", f_attr},           {"capitalize", f_capitalize}, {"center", f_center},
      {"count", f_length},    {"d", f_default},           {"default", f_default},       {"dictsort", f_dictsort},
      {"e", f_escape},        {"escape", f_escape},       {"first", f_first},           {"float", f_float},
      {"indent", f_indent},   {"int", f_int},             {"items", f_items},           {"join", f_join},
      {"last", f_last},       {"length", f_length},       {"list", f_list},             {"lower", f_lower},
      {"map", f_map},         {"max", f_max},             {"min", f_min},               {"reject", f_reject},
      {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},     {"round", f_round},
      {"safe", f_safe},       {"select", f_select},       {"selectattr", f_selectattr}, {"sort", f_sort},
      {"string", f_string},   {"sum", f_sum},             {"title", f_title},           {"tojson", f_tojson},
      {"trim", f_trim},       {"unique", f_unique},       {"upper", f_upper},           {"wordcount", f_wordcount},
  };
  return m;
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) > 0; }

bool has_test(const std::string& name) {
  static const char* cmp[] = {"eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=",
                              "gt", "greaterthan", ">", "ge", ">="};
  for (const char* c : cmp)
    if (name == c) return true;
  return tests().count(name) > 0;
}

Value apply_filter(const std::string& name, const Value& v, Args& args, Budget& budget) {
  auto it = filters().find(name);
  if (it == filters().end()) throw_error("no filter named '" + name + "'");
  return it->second(v, args, budget);
}

bool apply_test(const std::string& name, const Value& v, Args& args) {
  bool r = false;
  if (cmp_test(name, v, args, r)) return r;
  auto it = tests().find(name);
  if (it == tests().end()) throw_error("no test named '" + name + "'");
  return it->second(v, args);
}

void add_globals(DictItems& g, Budget& budget) {
  g.emplace_back("namespace", Value::callable("namespace", [&budget](Args& a) {
                   Value ns = Value::namespace_();
                   budget.namespaces.push_back(ns.dict);  // cleared when the render ends (Budget)
                   for (const auto& p : a.pos) {
                     if (!p.is_dict()) throw_error("namespace() positional argument must be a mapping");
                     for (const auto& [k, v] : *p.dict) ns.set_item(k, v);
                   }
                   for (const auto& [k, v] : a.kw) ns.set_item(k, v);
                   return ns;
                 }));
  g.emplace_back("dict", Value::callable("dict", [](Args& a) {
                   Value d = Value::make_dict();
                   for (const auto& p : a.pos) {
                     if (!p.is_dict()) throw_error("dict() positional argument must be a mapping");
                     for (const auto& [k, v] : *p.dict) d.set_item(k, v);
                   }
                   for (const auto& [k, v] : a.kw) d.set_item(k, v);
                   return d;
                 }));
  g.emplace_back("range", Value::callable("range", [](Args& a) {
                   if (a.pos.empty() || a.pos.size() > 3 || !a.kw.empty()) throw_error("range expects 1 to 3 integers");
                   int64_t start = 0, stop, step = 1;
                   for (const auto& p : a.pos)
                     if (p.kind != Value::Kind::Int && p.kind != Value::Kind::Bool)
                       throw_error("'" + type_name(p) + "' object cannot be interpreted as an integer");
                   auto iv = [](const Value& p) { return p.kind == Value::Kind::Int ? p.i : int64_t{p.b}; };
                   if (a.pos.size() == 1) {
                     stop = iv(a.pos[0]);
                   } else {
                     start = iv(a.pos[0]);
                     stop = iv(a.pos[1]);
                     if (a.pos.size() == 3) step = iv(a.pos[2]);
                   }
                   if (step == 0) throw_error("range() arg 3 must not be zero");
                   ValueList out;
                   for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
                     if (out.size() >= 100000)
                       throw_error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
                     out.push_back(Value::integer(i));
                     if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
                   }
                   return Value::make_list(std::move(out));
                 }));
  g.emplace_back("raise_exception", Value::callable("raise_exception", [](Args& a) -> Value {
                   throw_error(a.pos.empty() ? std::string() : to_str(a.pos[0]));
                 }));
  g.emplace_back("strftime_now", Value::callable("strftime_now", [](Args& a) {
                   std::string fmt = a.pos.empty() ? std::string("%Y-%m-%d") : to_str(a.pos[0]);
                   std::time_t t = std::time(nullptr);
                   std::tm tm{};
                   localtime_r(&t, &tm);
                   char buf[512];
                   size_t n = fmt.size() < 200 ? std::strftime(buf, sizeof buf, fmt.c_str(), &tm) : 0;
                   return Value::string(std::string(buf, n));
                 }));
  (void)budget;
}

}  // namespace lily::jinja
