// Python semantics of Jinja runtime values: truthiness, str/repr, ==, ordering, `in`, len, iteration,
// float repr and transformers' tojson. See jinja_value.h.
#include "chat/jinja_value.h"
#include "util/json_escape.h"
#include "util/utf8.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace lily::jinja {

void throw_error(const std::string& msg) { throw TemplateError(msg); }

namespace {
constexpr size_t kMaxReprBytes = size_t{64} << 20;  // repr/tojson of one value (cyclic namespaces expand)
}

Value Value::undefined(std::string name, std::string hint) {
  Value v;
  v.name = std::move(name);
  v.hint = std::move(hint);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::Bool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::Int;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::Float;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::String;
  v.s = std::make_shared<const std::string>(std::move(x));
  return v;
}
Value Value::make_list(ValueList x) {
  Value v;
  v.kind = Kind::List;
  v.list = std::make_shared<ValueList>(std::move(x));
  return v;
}
Value Value::make_tuple(ValueList x) {
  Value v = make_list(std::move(x));
  v.tuple = true;
  return v;
}
Value Value::make_dict(DictItems x) {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<DictItems>(std::move(x));
  return v;
}
Value Value::namespace_(DictItems x) {
  Value v = make_dict(std::move(x));
  v.kind = Kind::Namespace;
  return v;
}
Value Value::callable(std::string name, NativeFn f) {
  Value v;
  v.kind = Kind::Callable;
  v.name = std::move(name);
  v.fn = std::make_shared<NativeFn>(std::move(f));
  return v;
}

const Value* Value::find(std::string_view key) const {
  if (!dict) return nullptr;
  for (const auto& [k, v] : *dict)
    if (k == key) return &v;
  return nullptr;
}

void Value::set_item(const std::string& key, Value v) {
  for (auto& [k, old] : *dict)
    if (k == key) {
      old = std::move(v);
      return;
    }
  dict->emplace_back(key, std::move(v));
}

const Value* Args::get(size_t index, std::string_view name) const {
  if (index < pos.size()) return &pos[index];
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

Value Args::get_or(size_t index, std::string_view name, Value def) const {
  const Value* v = get(index, name);
  return v ? *v : std::move(def);
}

void Args::expect_at_most(size_t n, std::string_view what) const {
  if (pos.size() > n) throw_error(std::string(what) + " takes at most " + std::to_string(n) + " positional argument(s)");
}

// ---- UTF-8 ----

std::vector<char32_t> decode_utf8(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    size_t len;
    if (utf8_classify(p + i, s.size() - i, len) == Utf8Seq::valid) {
      out.push_back(utf8_next(s, i));
    } else {
      out.push_back(0xdc00 + p[i]);  // surrogateescape: invalid byte kept, re-encoded as itself
      ++i;
    }
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp >= 0xdc80 && cp <= 0xdcff) {
    out += static_cast<char>(cp - 0xdc00);  // surrogate escape: an undecodable input byte
  } else {
    ::lily::append_utf8(out, static_cast<uint32_t>(cp));
  }
}

std::string encode_utf8(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  end = std::min(end, cps.size());
  for (size_t k = begin; k < end; ++k) append_utf8(out, cps[k]);
  return out;
}

bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// ---- Python semantics ----

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.b;
    case Value::Kind::Int: return v.i != 0;
    case Value::Kind::Float: return v.f != 0;
    case Value::Kind::String: return !v.s->empty();
    case Value::Kind::List: return !v.list->empty();
    case Value::Kind::Dict: return !v.dict->empty();
    case Value::Kind::Namespace:
    case Value::Kind::Callable: return true;
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List: return "list";
    case Value::Kind::Dict: return "dict";
    case Value::Kind::Namespace: return "Namespace";
    case Value::Kind::Callable: return "function";
  }
  return "object";
}

void raise_undefined(const Value& v) {
  if (!v.hint.empty()) throw_error(v.hint);
  if (v.name.empty()) throw_error("value is undefined");
  throw_error("'" + v.name + "' is undefined");
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then CPython's layout: exponent form iff decpt < -3 or decpt > 16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e+17"
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp10 = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  std::string out = neg ? "-" : "";
  if (d == 0) return out + "0.0";
  if (decpt < -3 || decpt > 16) {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return out + eb;
  }
  if (decpt <= 0) return out + "0." + std::string(-decpt, '0') + digits;
  if (static_cast<size_t>(decpt) >= digits.size())
    return out + digits + std::string(decpt - digits.size(), '0') + ".0";
  return out + digits.substr(0, decpt) + "." + digits.substr(decpt);
}

static std::string repr_string(const std::string& s) {
  bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
  char q = has_sq && !has_dq ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : decode_utf8(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      append_utf8(out, c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0) || (c >= 0xdc80 && c <= 0xdcff)) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(c & 0xff));
      out += b;
    } else {
      append_utf8(out, c);
    }
  }
  return out + q;
}

// Appends repr(v); `depth` and the size cap stop self-referencing namespaces.
static void repr_into(std::string& out, const Value& v, int depth) {
  if (depth > 200) throw_error("maximum recursion depth exceeded in repr");
  if (out.size() > kMaxReprBytes) throw_error("repr of a value exceeded the size limit");
  switch (v.kind) {
    case Value::Kind::String: out += repr_string(*v.s); return;
    case Value::Kind::List: {
      out += v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        repr_into(out, (*v.list)[k], depth + 1);
      }
      out += v.tuple ? (v.list->size() == 1 ? ",)" : ")") : "]";
      return;
    }
    case Value::Kind::Dict:
    case Value::Kind::Namespace: {
      out += v.kind == Value::Kind::Namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [key, val] : *v.dict) {
        out += (first ? "" : ", ") + repr_string(key) + ": ";
        repr_into(out, val, depth + 1);
        first = false;
      }
      out += v.kind == Value::Kind::Namespace ? "}>" : "}";
      return;
    }
    case Value::Kind::Undefined: out += "Undefined"; return;
    default: out += to_str(v);
  }
}

std::string repr(const Value& v) {
  std::string out;
  repr_into(out, v, 0);
  return out;
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.b ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.i);
    case Value::Kind::Float: return float_repr(v.f);
    case Value::Kind::String: return *v.s;
    case Value::Kind::Callable: return "<function " + v.name + ">";
    default: return repr(v);
  }
}

static double as_double(const Value& v) {
  return v.kind == Value::Kind::Float ? v.f : v.kind == Value::Kind::Int ? static_cast<double>(v.i) : v.b ? 1 : 0;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::Float && b.kind != Value::Kind::Float) {
      int64_t x = a.kind == Value::Kind::Int ? a.i : a.b, y = b.kind == Value::Kind::Int ? b.i : b.b;
      return x == y;
    }
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return *a.s == *b.s;
    case Value::Kind::List: {
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Value::Kind::Dict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [key, val] : *a.dict) {
        const Value* o = b.find(key);
        if (!o || !equals(val, *o)) return false;
      }
      return true;
    }
    case Value::Kind::Namespace: return a.dict == b.dict;
    case Value::Kind::Callable: return a.fn == b.fn;
    default: return false;
  }
}

int compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::Float && b.kind != Value::Kind::Float) {
      int64_t x = a.kind == Value::Kind::Int ? a.i : a.b, y = b.kind == Value::Kind::Int ? b.i : b.b;
      return x < y ? -1 : x > y ? 1 : 0;
    }
    double x = as_double(a), y = as_double(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.s->compare(*b.s) < 0 ? -1 : *a.s == *b.s ? 0 : 1;
  if (a.is_list() && b.is_list() && a.tuple == b.tuple) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k)
      if (!equals((*a.list)[k], (*b.list)[k])) return compare((*a.list)[k], (*b.list)[k], op);
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  throw_error("'" + std::string(op) + "' not supported between instances of '" + type_name(a) + "' and '" +
              type_name(b) + "'");
}

bool contains(const Value& c, const Value& item) {
  switch (c.kind) {
    case Value::Kind::String:
      if (!item.is_string())
        throw_error("'in <string>' requires string as left operand, not " + type_name(item));
      return c.s->find(*item.s) != std::string::npos;
    case Value::Kind::List:
      for (const auto& x : *c.list)
        if (equals(x, item)) return true;
      return false;
    case Value::Kind::Dict:
      if (!item.is_string()) return false;
      return c.find(*item.s) != nullptr;
    case Value::Kind::Undefined: return false;
    default: throw_error("argument of type '" + type_name(c) + "' is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Value::Kind::String: return static_cast<int64_t>(decode_utf8(*v.s).size());
    case Value::Kind::List: return static_cast<int64_t>(v.list->size());
    case Value::Kind::Dict: return static_cast<int64_t>(v.dict->size());
    case Value::Kind::Undefined: return 0;
    default: throw_error("object of type '" + type_name(v) + "' has no len()");
  }
}

ValueList iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::List: return *v.list;
    case Value::Kind::Dict: {
      ValueList out;
      for (const auto& [k, val] : *v.dict) out.push_back(Value::string(k));
      return out;
    }
    case Value::Kind::String: {
      ValueList out;
      std::string one;
      for (char32_t c : decode_utf8(*v.s)) {
        one.clear();
        append_utf8(one, c);
        out.push_back(Value::string(one));
      }
      return out;
    }
    case Value::Kind::Undefined: return {};
    default: throw_error("'" + type_name(v) + "' object is not iterable");
  }
}

// ---- JSON ----

static void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (char32_t c : decode_utf8(s)) append_json_escaped_cp(out, c);  // an undecodable byte as \udcXX
  out += '"';
}

static void json_value(std::string& out, const Value& v, int indent, bool sort_keys, std::string_view item_sep,
                       std::string_view key_sep, int depth) {
  if (depth > 512) throw_error("tojson: value nested too deeply");
  if (out.size() > kMaxReprBytes) throw_error("tojson: output exceeded the size limit");
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * d, ' ');
  };
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.b ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.i); return;
    case Value::Kind::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(v.f);
      return;
    case Value::Kind::String: json_string(out, *v.s); return;
    case Value::Kind::List: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        json_value(out, (*v.list)[k], indent, sort_keys, item_sep, key_sep, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::Dict:
    case Value::Kind::Namespace: {
      if (v.dict->empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : *v.dict) items.push_back(&kv);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += item_sep;
        first = false;
        newline(depth + 1);
        json_string(out, kv->first);
        out += key_sep;
        json_value(out, kv->second, indent, sort_keys, item_sep, key_sep, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    case Value::Kind::Callable: throw_error("Object of type function is not JSON serializable");
  }
}

std::string to_json(const Value& v, int indent, bool sort_keys, std::string_view item_sep, std::string_view key_sep) {
  if (item_sep.empty()) item_sep = indent >= 0 ? "," : ", ";
  if (key_sep.empty()) key_sep = ": ";
  std::string out;
  json_value(out, v, indent, sort_keys, item_sep, key_sep, 0);
  return out;
}

Value from_json(const nlohmann::ordered_json& j) {
  using J = nlohmann::ordered_json;
  switch (j.type()) {
    case J::value_t::null: return Value::none();
    case J::value_t::boolean: return Value::boolean(j.get<bool>());
    case J::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case J::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) throw_error("integer " + std::to_string(u) + " is out of range");
      return Value::integer(static_cast<int64_t>(u));
    }
    case J::value_t::number_float: return Value::number(j.get<double>());
    case J::value_t::string: return Value::string(j.get<std::string>());
    case J::value_t::array: {
      ValueList out;
      out.reserve(j.size());
      for (const auto& x : j) out.push_back(from_json(x));
      return Value::make_list(std::move(out));
    }
    case J::value_t::object: {
      DictItems out;
      out.reserve(j.size());
      for (const auto& [k, x] : j.items()) out.emplace_back(k, from_json(x));
      return Value::make_dict(std::move(out));
    }
    default: throw_error("unsupported JSON value (binary)");
  }
}

}  // namespace lily::jinja
