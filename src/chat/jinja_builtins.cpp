// Jinja builtins with Python semantics: attribute/item lookup (sandboxed: mutating methods are unsafe),
// str/dict/list methods, operators, filters, tests and the globals transformers adds.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>

#include "chat/jinja_internal.h"

namespace lily::jinja {
namespace {

std::string object_repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::None: return "None";
    case Value::Kind::Namespace: return "Namespace object";
    default: return type_name(v) + " object";
  }
}

Value missing_attr(const Value& obj, const std::string& name) {
  return Value::undefined(name, "'" + object_repr(obj) + "' has no attribute '" + name + "'");
}

const std::string& need_str(const Value& v, const char* what) {
  if (!v.is_string()) throw_error(std::string(what) + " expects a string, got " + type_name(v));
  return v.str();
}

int64_t need_int(const Value& v, const char* what) {
  if (v.kind == Value::Kind::Int) return v.i;
  if (v.kind == Value::Kind::Bool) return v.b;
  throw_error(std::string(what) + " expects an integer, got " + type_name(v));
}

// Simple case mapping for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (the scripts chat templates
// might case-convert); other code points are left unchanged.
char32_t to_upper_c(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 32;
  if (c == 0xff) return 0x178;
  if (c >= 0x100 && c <= 0x17f) {
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return (c % 2 == 0) ? c - 1 : c;
    if (c == 0x131) return 'I';
    if (c == 0x17f) return 'S';
    if (c != 0x138 && c != 0x149 && c != 0x130 && (c < 0x139 || c > 0x148) && c % 2 == 1) return c - 1;
    return c;
  }
  if (c >= 0x3b1 && c <= 0x3c9) return c == 0x3c2 ? 0x3a3 : c - 32;
  if (c >= 0x430 && c <= 0x44f) return c - 32;
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  return c;
}
char32_t to_lower_c(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 32;
  if (c == 0x178) return 0xff;
  if (c >= 0x100 && c <= 0x17f) {
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return (c % 2 == 1) ? c + 1 : c;
    if (c == 0x130) return 'i';  // Python gives "i̇"; close enough for templates
    if (c != 0x138 && c != 0x149 && c != 0x131 && c != 0x17f && c % 2 == 0) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
  if (c >= 0x410 && c <= 0x42f) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  return c;
}
bool is_lower_c(char32_t c) { return to_upper_c(c) != c || c == 0xdf; }
bool is_upper_c(char32_t c) { return to_lower_c(c) != c; }

std::string map_chars(const std::string& s, char32_t (*f)(char32_t)) {
  std::string out;
  for (char32_t c : decode_utf8(s)) {
    if (c == 0xdf && f == to_upper_c) out += "SS";  // ß
    else append_utf8(out, f(c));
  }
  return out;
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t u : decode_utf8(s)) {
    bool cased = is_upper_c(u) || is_lower_c(u);
    append_utf8(out, cased ? (prev_cased ? to_lower_c(u) : to_upper_c(u)) : u);
    prev_cased = cased;
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  auto cps = decode_utf8(s);
  std::string out;
  for (size_t k = 0; k < cps.size(); ++k) append_utf8(out, k == 0 ? to_upper_c(cps[k]) : to_lower_c(cps[k]));
  return out;
}

// Python str.split / str.rsplit.
ValueList py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  ValueList out;
  if (sep.is_none() || sep.is_undefined()) {
    auto cps = decode_utf8(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t k = 0;
    while (k < cps.size()) {
      while (k < cps.size() && is_py_space(cps[k])) ++k;
      if (k >= cps.size()) break;
      size_t b = k;
      while (k < cps.size() && !is_py_space(cps[k])) ++k;
      words.emplace_back(b, k);
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (!from_right) {
        size_t b = words[maxsplit].first;
        size_t e = cps.size();
        while (e > b && is_py_space(cps[e - 1])) --e;
        words.resize(maxsplit);
        words.emplace_back(b, e);
      } else {
        size_t keep = words.size() - maxsplit;
        size_t b = 0;
        while (b < cps.size() && is_py_space(cps[b])) ++b;
        std::vector<std::pair<size_t, size_t>> w2{{b, words[keep - 1].second}};
        w2.insert(w2.end(), words.begin() + keep, words.end());
        words = std::move(w2);
      }
    }
    for (auto [b, e] : words) out.push_back(Value::string(encode_utf8(cps, b, e)));
    return out;
  }
  const std::string& d = need_str(sep, "split");
  if (d.empty()) throw_error("empty separator");
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t f = s.find(d, start);
    if (f == std::string::npos) break;
    parts.push_back(s.substr(start, f - start));
    start = f + d.size();
  }
  parts.push_back(s.substr(start));
  if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) > maxsplit + 1) {
    std::vector<std::string> merged;
    if (!from_right) {
      merged.assign(parts.begin(), parts.begin() + maxsplit);
      std::string rest = parts[maxsplit];
      for (size_t k = maxsplit + 1; k < parts.size(); ++k) rest += d + parts[k];
      merged.push_back(rest);
    } else {
      size_t keep = parts.size() - maxsplit;
      std::string head = parts[0];
      for (size_t k = 1; k < keep; ++k) head += d + parts[k];
      merged.push_back(head);
      merged.insert(merged.end(), parts.begin() + keep, parts.end());
    }
    parts = std::move(merged);
  }
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

bool starts_or_ends(const std::string& s, const Value& arg, bool ends) {
  auto one = [&](const Value& a) {
    const std::string& x = need_str(a, ends ? "endswith" : "startswith");
    if (x.size() > s.size()) return false;
    return ends ? s.compare(s.size() - x.size(), x.size(), x) == 0 : s.compare(0, x.size(), x) == 0;
  };
  if (arg.is_list()) {
    for (const auto& a : *arg.list)
      if (one(a)) return true;
    return false;
  }
  return one(arg);
}

// Bound methods of str, dict and list; nullopt-like undefined when `name` is not a method.
Value method(const Value& obj, const std::string& name) {
  auto m = [&](NativeFn f) { return Value::callable(name, std::move(f)); };
  if (obj.is_string()) {
    const std::string s = obj.str();
    if (name == "startswith" || name == "endswith") {
      bool ends = name == "endswith";
      return m([s, ends](Args& a) {
        if (a.pos.empty()) throw_error("startswith/endswith takes at least 1 argument");
        return Value::boolean(starts_or_ends(s, a.pos[0], ends));
      });
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      bool l = name != "rstrip", r = name != "lstrip";
      return m([s, l, r](Args& a) { return Value::string(py_strip(s, a.get_or(0, "chars", Value::none()), l, r)); });
    }
    if (name == "split" || name == "rsplit") {
      bool right = name == "rsplit";
      return m([s, right](Args& a) {
        return Value::make_list(py_split(s, a.get_or(0, "sep", Value::none()),
                                         need_int(a.get_or(1, "maxsplit", Value::integer(-1)), "split"), right));
      });
    }
    if (name == "splitlines")
      return m([s](Args&) {
        ValueList out;
        size_t start = 0;
        for (size_t k = 0; k < s.size(); ++k)
          if (s[k] == '\n' || s[k] == '\r') {
            out.push_back(Value::string(s.substr(start, k - start)));
            if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
            start = k + 1;
          }
        if (start < s.size()) out.push_back(Value::string(s.substr(start)));
        return Value::make_list(std::move(out));
      });
    if (name == "replace")
      return m([s](Args& a) {
        const Value* o = a.get(0, "old");
        const Value* n = a.get(1, "new");
        if (!o || !n) throw_error("replace expects 2 arguments");
        return Value::string(py_replace(s, need_str(*o, "replace"), need_str(*n, "replace"),
                                        need_int(a.get_or(2, "count", Value::integer(-1)), "replace"), nullptr));
      });
    if (name == "lower") return m([s](Args&) { return Value::string(map_chars(s, to_lower_c)); });
    if (name == "upper") return m([s](Args&) { return Value::string(map_chars(s, to_upper_c)); });
    if (name == "title") return m([s](Args&) { return Value::string(py_title(s)); });
    if (name == "capitalize") return m([s](Args&) { return Value::string(py_capitalize(s)); });
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
      return m([s, name](Args& a) {
        if (a.pos.empty()) throw_error(name + " takes at least 1 argument");
        const std::string& x = need_str(a.pos[0], name.c_str());
        if (name == "count") {
          if (x.empty()) return Value::integer(length(Value::string(s)) + 1);
          int64_t c = 0;
          for (size_t p = s.find(x); p != std::string::npos; p = s.find(x, p + x.size())) ++c;
          return Value::integer(c);
        }
        size_t p = name[0] == 'r' ? s.rfind(x) : s.find(x);
        if (p == std::string::npos) {
          if (name == "index" || name == "rindex") throw_error("substring not found");
          return Value::integer(-1);
        }
        return Value::integer(static_cast<int64_t>(decode_utf8(s.substr(0, p)).size()));
      });
    }
    if (name == "join")
      return m([s](Args& a) {
        if (a.pos.empty()) throw_error("join takes 1 argument");
        std::string out;
        bool first = true;
        for (const auto& x : iterate(a.pos[0])) {
          if (!first) out += s;
          out += need_str(x, "join");
          first = false;
        }
        return Value::string(std::move(out));
      });
    if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
        name == "islower")
      return m([s, name](Args&) {
        auto cps = decode_utf8(s);
        if (cps.empty()) return Value::boolean(false);
        bool any_cased = false;
        for (char32_t c : cps) {
          bool digit = c >= '0' && c <= '9', alpha = is_upper_c(c) || is_lower_c(c);
          if (name == "isdigit" && !digit) return Value::boolean(false);
          if (name == "isalpha" && !alpha) return Value::boolean(false);
          if (name == "isalnum" && !alpha && !digit) return Value::boolean(false);
          if (name == "isspace" && !is_py_space(c)) return Value::boolean(false);
          if (name == "isupper" && is_lower_c(c)) return Value::boolean(false);
          if (name == "islower" && is_upper_c(c)) return Value::boolean(false);
          any_cased = any_cased || alpha;
        }
        return Value::boolean((name != "isupper" && name != "islower") || any_cased);
      });
    return missing_attr(obj, name);
  }
  if (obj.is_dict()) {
    const Value d = obj;
    if (name == "get")
      return m([d](Args& a) {
        if (a.pos.empty()) throw_error("get expected at least 1 argument");
        const Value* v = a.pos[0].is_string() ? d.find(a.pos[0].str()) : nullptr;
        return v ? *v : a.get_or(1, "default", Value::none());
      });
    if (name == "items")
      return m([d](Args&) {
        ValueList out;
        for (const auto& [k, v] : *d.dict) out.push_back(Value::make_tuple({Value::string(k), v}));
        return Value::make_list(std::move(out));
      });
    if (name == "keys") return m([d](Args&) { return Value::make_list(iterate(d)); });
    if (name == "values")
      return m([d](Args&) {
        ValueList out;
        for (const auto& kv : *d.dict) out.push_back(kv.second);
        return Value::make_list(std::move(out));
      });
    if (name == "copy") return m([d](Args&) { return Value::make_dict(*d.dict); });
    if (name == "update" || name == "pop" || name == "popitem" || name == "setdefault" || name == "clear")
      return Value::undefined(name, "access to attribute '" + name + "' of 'dict' object is unsafe.");
    return Value::undefined(name, "'dict object' has no attribute '" + name + "'");
  }
  if (obj.is_list()) {
    const Value l = obj;
    if (name == "index" || name == "count")
      return m([l, name](Args& a) {
        if (a.pos.empty()) throw_error(name + " takes 1 argument");
        int64_t c = 0;
        for (size_t k = 0; k < l.list->size(); ++k)
          if (equals((*l.list)[k], a.pos[0])) {
            if (name == "index") return Value::integer(static_cast<int64_t>(k));
            ++c;
          }
        if (name == "index") throw_error(repr(a.pos[0]) + " is not in list");
        return Value::integer(c);
      });
    if (name == "copy") return m([l](Args&) { return Value::make_list(*l.list); });
    if (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
        name == "clear" || name == "sort" || name == "reverse")
      return Value::undefined(name, "access to attribute '" + name + "' of 'list' object is unsafe.");
  }
  return missing_attr(obj, name);
}

}  // namespace

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  auto cps = decode_utf8(s);
  std::vector<char32_t> set;
  bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) set = decode_utf8(need_str(chars, "strip"));
  auto strip_it = [&](char32_t c) { return ws ? is_py_space(c) : std::find(set.begin(), set.end(), c) != set.end(); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return encode_utf8(cps, b, e);
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count,
                       Budget* budget) {
  std::string out;
  if (old.empty()) {
    // Python inserts `repl` before every code point and at the end.
    auto cps = decode_utf8(s);
    int64_t n = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (k < cps.size()) append_utf8(out, cps[k]);
      if (budget) budget->check_size(out.size());
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t f = s.find(old, start);
    if (f == std::string::npos) break;
    out.append(s, start, f - start);
    out += repl;
    if (budget) budget->check_size(out.size());
    start = f + old.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Value::Kind::Undefined: raise_undefined(obj);
    case Value::Kind::Namespace: {
      const Value* v = obj.find(name);
      return v ? *v : missing_attr(obj, name);
    }
    case Value::Kind::Dict: {
      Value m = method(obj, name);
      if (!m.is_undefined() || !m.hint.starts_with("'dict object'")) return m;
      const Value* v = obj.find(name);
      return v ? *v : m;
    }
    case Value::Kind::String:
    case Value::Kind::List: return method(obj, name);
    default: return missing_attr(obj, name);
  }
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) raise_undefined(obj);
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.find(key.str())) return *v;
    return get_attr(obj, key.str());
  }
  if ((obj.is_list() || obj.is_string()) && (key.kind == Value::Kind::Int || key.kind == Value::Kind::Bool)) {
    int64_t i = key.kind == Value::Kind::Int ? key.i : key.b;
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.list->size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined("", "list object has no element " + std::to_string(key.i));
      return (*obj.list)[i];
    }
    auto cps = decode_utf8(obj.str());
    int64_t n = static_cast<int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("", "str object has no element " + std::to_string(key.i));
    return Value::string(encode_utf8(cps, i, i + 1));
  }
  if (key.is_string()) return get_attr(obj, key.str());
  return Value::undefined("", "'" + object_repr(obj) + "' has no element " + repr(key));
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) raise_undefined(obj);
  auto opt_int = [](const Value& v, int64_t def) {
    if (v.is_none()) return def;
    return need_int(v, "slice");
  };
  int64_t st = opt_int(step, 1);
  if (st == 0) throw_error("slice step cannot be zero");
  std::vector<char32_t> cps;
  int64_t n;
  if (obj.is_string()) {
    cps = decode_utf8(obj.str());
    n = static_cast<int64_t>(cps.size());
  } else if (obj.is_list()) {
    n = static_cast<int64_t>(obj.list->size());
  } else {
    throw_error("'" + type_name(obj) + "' object is not subscriptable");
  }
  auto clamp = [&](const Value& v, int64_t def_pos, int64_t def_neg) {
    if (v.is_none()) return st > 0 ? def_pos : def_neg;
    int64_t i = need_int(v, "slice");
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t b = clamp(start, 0, n - 1), e = clamp(stop, n, -1);
  std::vector<int64_t> idx;
  for (int64_t i = b; st > 0 ? i < e : i > e;) {
    idx.push_back(i);
    if (__builtin_add_overflow(i, st, &i)) break;
  }
  if (obj.is_string()) {
    std::string out;
    for (int64_t i : idx) append_utf8(out, cps[i]);
    return Value::string(std::move(out));
  }
  ValueList out;
  for (int64_t i : idx) out.push_back((*obj.list)[i]);
  return obj.tuple ? Value::make_tuple(std::move(out)) : Value::make_list(std::move(out));
}

Value unary_op(const std::string& op, const Value& a) {
  if (a.kind == Value::Kind::Float) return Value::number(op == "-" ? -a.f : a.f);
  if (a.kind == Value::Kind::Int || a.kind == Value::Kind::Bool) {
    int64_t v = a.kind == Value::Kind::Int ? a.i : a.b;
    if (op == "-" && v == INT64_MIN) throw_error("integer overflow");
    return Value::integer(op == "-" ? -v : v);
  }
  if (a.is_undefined()) raise_undefined(a);
  throw_error("bad operand type for unary " + op + ": '" + type_name(a) + "'");
}

Value binary_op(const std::string& op, const Value& a, const Value& b, Budget& budget) {
  auto bad = [&]() -> Value {
    if (a.is_undefined()) raise_undefined(a);
    if (b.is_undefined()) raise_undefined(b);
    throw_error("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  const bool ints = (a.kind == Value::Kind::Int || a.kind == Value::Kind::Bool) &&
                    (b.kind == Value::Kind::Int || b.kind == Value::Kind::Bool);
  if (a.is_number() && b.is_number()) {
    if (ints) {
      int64_t x = a.kind == Value::Kind::Int ? a.i : a.b, y = b.kind == Value::Kind::Int ? b.i : b.b, r = 0;
      if (op == "+" && !__builtin_add_overflow(x, y, &r)) return Value::integer(r);
      if (op == "-" && !__builtin_sub_overflow(x, y, &r)) return Value::integer(r);
      if (op == "*" && !__builtin_mul_overflow(x, y, &r)) return Value::integer(r);
      if (op == "//" || op == "%") {
        if (y == 0) throw_error("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) throw_error("integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return Value::integer(op == "//" ? q : m);
      }
      if (op == "**" && y >= 0) {
        if (x == 0) return Value::integer(y == 0 ? 1 : 0);
        if (x == 1) return Value::integer(1);
        if (x == -1) return Value::integer(y % 2 ? -1 : 1);
        int64_t res = 1;  // |x| >= 2: overflows within 64 steps
        for (int64_t k = 0; k < y; ++k)
          if (__builtin_mul_overflow(res, x, &res)) throw_error("integer overflow");
        return Value::integer(res);
      }
      if (op == "+" || op == "-" || op == "*") throw_error("integer overflow");
    }
    double x = a.kind == Value::Kind::Float ? a.f : a.kind == Value::Kind::Int ? a.i : a.b;
    double y = b.kind == Value::Kind::Float ? b.f : b.kind == Value::Kind::Int ? b.i : b.b;
    if (op == "+") return Value::number(x + y);
    if (op == "-") return Value::number(x - y);
    if (op == "*") return Value::number(x * y);
    if (op == "/") {
      if (y == 0) throw_error("division by zero");
      return Value::number(x / y);
    }
    if (op == "//" || op == "%") {  // CPython's float_divmod
      if (y == 0) throw_error("float divmod()");
      double m = std::fmod(x, y);
      double div = (x - m) / y;
      if (m != 0) {
        if ((y < 0) != (m < 0)) {
          m += y;
          div -= 1.0;
        }
      } else {
        m = std::copysign(0.0, y);
      }
      if (op == "%") return Value::number(m);
      if (div != 0) {
        double fd = std::floor(div);
        if (div - fd > 0.5) fd += 1.0;
        return Value::number(fd);
      }
      return Value::number(std::copysign(0.0, x / y));
    }
    if (op == "**") {
      if (x == 0 && y < 0) throw_error("0.0 cannot be raised to a negative power");
      return Value::number(std::pow(x, y));
    }
    return bad();
  }
  if (op == "+" && a.is_string() && b.is_string()) {
    budget.check_size(a.str().size() + b.str().size());
    return Value::string(a.str() + b.str());
  }
  if (op == "+" && a.is_list() && b.is_list()) {
    budget.check_size(a.list->size() + b.list->size());
    ValueList out = *a.list;
    out.insert(out.end(), b.list->begin(), b.list->end());
    return Value::make_list(std::move(out));
  }
  if (op == "*" && ((a.is_string() || a.is_list()) != (b.is_string() || b.is_list()))) {
    const Value& seq = a.is_string() || a.is_list() ? a : b;
    const Value& cnt = &seq == &a ? b : a;
    if (cnt.kind != Value::Kind::Int && cnt.kind != Value::Kind::Bool) return bad();
    int64_t n = std::max<int64_t>(0, cnt.kind == Value::Kind::Int ? cnt.i : cnt.b);
    size_t unit = seq.is_string() ? seq.str().size() : seq.list->size();
    // an empty sequence times anything is empty: no loop (the fuzzer found '' * 2 ** 33 spinning for minutes)
    if (unit == 0) return seq.is_string() ? Value::string(std::string()) : Value::make_list({});
    if (static_cast<uint64_t>(n) > budget.limits.max_output_bytes / unit) budget.check_size(SIZE_MAX);
    if (seq.is_string()) {
      std::string out;
      for (int64_t k = 0; k < n; ++k) out += seq.str();
      return Value::string(std::move(out));
    }
    ValueList out;
    for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
    return Value::make_list(std::move(out));
  }
  return bad();
}

}  // namespace lily::jinja
