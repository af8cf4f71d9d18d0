// Tool-call argument values: schema types, §3.4 conversion, Python-style JSON writer, UTF-8 sanitising.
#include "chat/tool_values.h"
#include "util/utf8.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

namespace lily::chat {

namespace {

constexpr int kMaxDepth = 64;  // nesting limit for parsed values (fuzzing: no deep recursion)

std::string lower(std::string_view s) {
  std::string r(s);
  for (auto& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

bool starts(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

uint8_t type_from_name(std::string_view name) {
  const std::string t = lower(name);
  if (t == "string" || t == "str" || t == "text" || t == "varchar" || t == "char" || t == "enum")
    return ParamType::string;
  if (starts(t, "int") || starts(t, "uint") || starts(t, "long") || starts(t, "short") || starts(t, "unsigned"))
    return ParamType::integer;
  if (starts(t, "num") || starts(t, "float") || t == "double") return ParamType::number;
  if (t == "boolean" || t == "bool" || t == "binary") return ParamType::boolean;
  if (t == "object" || starts(t, "dict")) return ParamType::object;
  if (t == "array" || starts(t, "list") || starts(t, "arr")) return ParamType::array;
  if (t == "null") return ParamType::null;
  return 0;
}

uint8_t type_of_json(const OrderedJson& v) {
  switch (v.type()) {
    case OrderedJson::value_t::null: return ParamType::null;
    case OrderedJson::value_t::boolean: return ParamType::boolean;
    case OrderedJson::value_t::number_integer:
    case OrderedJson::value_t::number_unsigned: return ParamType::integer;
    case OrderedJson::value_t::number_float: return ParamType::number;
    case OrderedJson::value_t::string: return ParamType::string;
    case OrderedJson::value_t::object: return ParamType::object;
    case OrderedJson::value_t::array: return ParamType::array;
    default: return 0;
  }
}

uint8_t schema_mask(const OrderedJson& node, int depth) {
  if (!node.is_object() || depth > 8) return 0;
  uint8_t mask = 0;
  if (auto it = node.find("type"); it != node.end()) {
    if (it->is_string()) mask |= type_from_name(it->get_ref<const std::string&>());
    if (it->is_array())
      for (const auto& t : *it)
        if (t.is_string()) mask |= type_from_name(t.get_ref<const std::string&>());
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (auto it = node.find(key); it != node.end() && it->is_array())
      for (const auto& member : *it) mask |= schema_mask(member, depth + 1);
  }
  if (mask == 0) {
    if (auto it = node.find("enum"); it != node.end() && it->is_array())
      for (const auto& v : *it) mask |= type_of_json(v);
  }
  return mask;
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

// Nesting of brackets outside strings never exceeds kMaxDepth (checked before handing text to a parser).
bool depth_ok(std::string_view s) {
  int depth = 0;
  char quote = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == '\\') ++i;
      else if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '[' || c == '{' || c == '(') {
      if (++depth > kMaxDepth) return false;
    } else if (c == ']' || c == '}' || c == ')') {
      --depth;
    }
  }
  return true;
}

bool parse_json(std::string_view s, OrderedJson& out) {
  if (!depth_ok(s)) return false;
  out = OrderedJson::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
  return !out.is_discarded();
}

// [+-]? digits
bool is_decimal_integer(std::string_view s) {
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// [+-]? (digits [. digits?] | . digits) ([eE] [+-]? digits)?  -> finite double
bool parse_double(std::string_view s, double& x) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  size_t digits = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    size_t e = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++e;
    if (e == 0) return false;
  }
  if (i != s.size()) return false;
  std::string tmp(s[0] == '+' ? s.substr(1) : s);
  x = std::strtod(tmp.c_str(), nullptr);
  return std::isfinite(x);
}

// Number rule of §3.4: integral values with |x| < 2^53 become integers.
OrderedJson number_value(double x) {
  if (std::floor(x) == x && std::fabs(x) < 9007199254740992.0) return static_cast<int64_t>(x);
  return x;
}

OrderedJson integer_value(std::string_view s) {
  int64_t i = 0;
  const std::string_view d = s[0] == '+' ? s.substr(1) : s;
  auto [p, ec] = std::from_chars(d.data(), d.data() + d.size(), i);
  if (ec == std::errc() && p == d.data() + d.size()) return i;
  uint64_t u = 0;
  auto [pu, ecu] = std::from_chars(d.data(), d.data() + d.size(), u);
  if (ecu == std::errc() && pu == d.data() + d.size()) return u;
  double x = 0;
  if (parse_double(s, x)) return x;
  return std::string(s);
}

bool type_allowed(const OrderedJson& v, ParamType t) {
  const uint8_t jt = type_of_json(v);
  if (t.allows(jt)) return true;
  if (jt == ParamType::integer && t.allows(ParamType::number)) return true;
  if (jt == ParamType::number && t.allows(ParamType::integer)) {
    const double x = v.get<double>();
    return std::floor(x) == x;
  }
  return false;
}

// Parses s as JSON, then as a Python literal; a string result holding JSON is parsed once more (double
// encoding). Succeeds only with a value whose type `accept` allows.
bool parse_structured(std::string_view s, ParamType accept, OrderedJson& out) {
  OrderedJson v;
  if (!parse_json(s, v) && !parse_python_literal(s, v)) return false;
  if (v.is_string() && !accept.allows(ParamType::string)) {
    OrderedJson inner;
    if (parse_json(v.get_ref<const std::string&>(), inner) && type_allowed(inner, accept)) {
      out = std::move(inner);
      return true;
    }
  }
  if (!type_allowed(v, accept)) return false;
  out = std::move(v);
  return true;
}

// --- Python literal subset ---------------------------------------------------------------------------------
struct PyParser {
  std::string_view s;
  size_t i = 0;

  void ws() {
    while (i < s.size() && is_ws(s[i])) ++i;
  }
  bool eat(char c) {
    ws();
    if (i < s.size() && s[i] == c) return ++i, true;
    return false;
  }
  bool word(std::string_view w) {
    if (s.substr(i, w.size()) != w) return false;
    const size_t j = i + w.size();
    if (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) return false;
    i = j;
    return true;
  }
  static void put_utf8(std::string& o, uint32_t cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
    ::lily::append_utf8(o, cp);
  }
  bool hex(size_t n, uint32_t& cp) {
    if (i + n > s.size()) return false;
    cp = 0;
    for (size_t k = 0; k < n; ++k) {
      const char c = s[i + k];
      const int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                    : (c >= 'a' && c <= 'f')                    ? c - 'a' + 10
                    : (c >= 'A' && c <= 'F')                    ? c - 'A' + 10
                                                                : -1;
      if (d < 0) return false;
      cp = cp * 16 + static_cast<uint32_t>(d);
    }
    i += n;
    return true;
  }
  bool str(std::string& o) {
    const char q = s[i++];
    while (i < s.size()) {
      const char c = s[i++];
      if (c == q) return true;
      if (c == '\n') return false;
      if (c != '\\') {
        o += c;
        continue;
      }
      if (i >= s.size()) return false;
      const char e = s[i++];
      uint32_t cp = 0;
      switch (e) {
        case 'n': o += '\n'; break;
        case 't': o += '\t'; break;
        case 'r': o += '\r'; break;
        case '0': o += '\0'; break;
        case '\\': case '\'': case '"': o += e; break;
        case 'x': if (!hex(2, cp)) return false; put_utf8(o, cp); break;
        case 'u': if (!hex(4, cp)) return false; put_utf8(o, cp); break;
        case 'U': if (!hex(8, cp) || cp > 0x10FFFF) return false; put_utf8(o, cp); break;
        default: o += '\\'; o += e; break;
      }
    }
    return false;
  }
  bool value(OrderedJson& out, int depth) {
    if (depth > kMaxDepth) return false;
    ws();
    if (i >= s.size()) return false;
    const char c = s[i];
    if (word("None")) return out = nullptr, true;
    if (word("True")) return out = true, true;
    if (word("False")) return out = false, true;
    if (c == '\'' || c == '"') {
      std::string o;
      if (!str(o)) return false;
      out = utf8_lossy(o);
      return true;
    }
    if (c == '[' || c == '(') {
      const char close = c == '[' ? ']' : ')';
      ++i;
      out = OrderedJson::array();
      while (true) {
        if (eat(close)) return true;
        OrderedJson item;
        if (!value(item, depth + 1)) return false;
        out.push_back(std::move(item));
        if (eat(',')) continue;
        return eat(close);
      }
    }
    if (c == '{') {
      ++i;
      out = OrderedJson::object();
      while (true) {
        if (eat('}')) return true;
        ws();
        if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) return false;
        std::string key;
        if (!str(key) || !eat(':')) return false;
        OrderedJson v;
        if (!value(v, depth + 1)) return false;
        key = utf8_lossy(key);
        if (!out.contains(key)) out[key] = std::move(v);
        if (eat(',')) continue;
        return eat('}');
      }
    }
    size_t j = i;
    while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '.' || s[j] == '-' ||
                            s[j] == '+'))
      ++j;
    const std::string_view num = s.substr(i, j - i);
    double x = 0;
    if (is_decimal_integer(num)) out = integer_value(num);
    else if (parse_double(num, x)) out = x;
    else return false;
    i = j;
    return true;
  }
};

// --- JSON writer ---------------------------------------------------------------------------------------------
void append_float(std::string& out, double x) {
  if (!std::isfinite(x)) {
    out += "null";
    return;
  }
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  std::string sign;
  if (sci[0] == '-') sign = "-", sci.remove_prefix(1);
  const size_t epos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, epos))
    if (c != '.') digits += c;
  int exp10 = 0;
  std::string_view es = sci.substr(epos + 1);
  if (es[0] == '+') es.remove_prefix(1);
  std::from_chars(es.data(), es.data() + es.size(), exp10);
  out += sign;
  if (exp10 < -4 || exp10 >= 16) {  // Python repr switches to exponent form outside [1e-4, 1e16)
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += e;
  } else if (exp10 >= 0) {
    const size_t int_len = static_cast<size_t>(exp10) + 1;
    if (digits.size() <= int_len) {
      out += digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  } else {
    out += "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
  }
}

void dump_into(std::string& out, const OrderedJson& v) {
  switch (v.type()) {
    case OrderedJson::value_t::null: out += "null"; break;
    case OrderedJson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case OrderedJson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case OrderedJson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case OrderedJson::value_t::number_float: append_float(out, v.get<double>()); break;
    case OrderedJson::value_t::string:
      out += '"';
      append_json_escaped(out, utf8_lossy(v.get_ref<const std::string&>()));
      out += '"';
      break;
    case OrderedJson::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += ", ";
        first = false;
        dump_into(out, item);
      }
      out += ']';
      break;
    }
    case OrderedJson::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [k, item] : v.items()) {
        if (!first) out += ", ";
        first = false;
        out += '"';
        append_json_escaped(out, utf8_lossy(k));
        out += "\": ";
        dump_into(out, item);
      }
      out += '}';
      break;
    }
    default: out += "null"; break;
  }
}

}  // namespace

const ToolSchema* ToolSet::find(std::string_view name) const {
  auto it = tools.find(std::string(name));
  return it == tools.end() ? nullptr : &it->second;
}

ToolSet ToolSet::from_json(const OrderedJson& tools) {
  ToolSet set;
  if (!tools.is_array()) return set;
  for (const auto& entry : tools) {
    if (!entry.is_object()) continue;
    const OrderedJson* fn = &entry;
    if (auto it = entry.find("function"); it != entry.end() && it->is_object()) fn = &*it;
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) continue;
    ToolSchema schema;
    if (auto params = fn->find("parameters"); params != fn->end() && params->is_object()) {
      if (auto props = params->find("properties"); props != params->end() && props->is_object()) {
        schema.has_properties = true;
        for (const auto& [key, node] : props->items()) schema.params[key] = ParamType{schema_mask(node, 0)};
      }
    }
    const std::string& n = name->get_ref<const std::string&>();
    set.max_name_len = std::max(set.max_name_len, n.size());
    set.tools.emplace(n, std::move(schema));
  }
  return set;
}

bool parse_json_limited(std::string_view s, OrderedJson& out) { return parse_json(s, out); }

ParamType param_type_from_schema(const OrderedJson& schema) { return ParamType{schema_mask(schema, 0)}; }

bool parse_python_literal(std::string_view s, OrderedJson& out) {
  if (!depth_ok(s)) return false;
  PyParser p{s};
  OrderedJson v;
  if (!p.value(v, 0)) return false;
  p.ws();
  if (p.i != s.size()) return false;
  out = std::move(v);
  return true;
}

OrderedJson convert_value(std::string_view s, ParamType type) {
  if (!type.known()) {
    OrderedJson v;
    if (!s.empty() && (s[0] == '{' || s[0] == '[') && parse_json(s, v)) return v;
    return utf8_lossy(s);
  }
  const bool nullable = type.allows(ParamType::null);
  const uint8_t base = type.mask & static_cast<uint8_t>(~ParamType::null);
  const std::string_view t = trim(s);
  const bool null_word = t == "null" || t == "None";
  if (base == 0) return nullptr;                        // declared `null` only
  if ((base & (base - 1)) == 0) {                       // one type (maybe nullable)
    if (null_word && (base != ParamType::string || nullable)) return nullptr;
    double x = 0;
    switch (base) {
      case ParamType::string: break;
      case ParamType::integer:
        if (is_decimal_integer(t)) return integer_value(t);
        if (parse_double(t, x)) return number_value(x);
        break;
      case ParamType::number:
        if (parse_double(t, x)) return number_value(x);
        break;
      case ParamType::boolean: {
        const std::string l = lower(t);
        if (l == "true") return true;
        if (l == "false") return false;
        break;
      }
      default: {  // object / array
        OrderedJson v;
        if (parse_json(s, v) || parse_python_literal(s, v)) {
          OrderedJson inner;
          if (v.is_string() && parse_json(v.get_ref<const std::string&>(), inner)) return inner;
          return v;
        }
        break;
      }
    }
    return utf8_lossy(s);
  }
  if (null_word && nullable) return nullptr;            // union
  OrderedJson v;
  if (parse_structured(t, type, v)) return v;
  return utf8_lossy(s);
}

std::string python_json_dumps(const OrderedJson& v) {
  std::string out;
  dump_into(out, v);
  return out;
}

std::string Utf8Stream::push(std::string_view bytes) {
  tail_.append(bytes);
  const size_t k = utf8_split(tail_);
  std::string out = utf8_lossy(std::string_view(tail_).substr(0, k));
  tail_.erase(0, k);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out = utf8_lossy(tail_);
  tail_.clear();
  return out;
}

}  // namespace lily::chat
