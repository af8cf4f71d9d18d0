// JSON Schema → grammar. Output form: keys in the schema's `properties` order, whitespace allowed between tokens
// (spaces, tabs, newlines), no properties beyond `properties` unless `additionalProperties` allows them (absent
// counts as false, as in OpenAI strict mode). Every keyword is either enforced, an annotation, or a GrammarError.
#include <cmath>
#include <set>

#include "grammar/frontends.h"

namespace lily::grammar {

namespace {

using ojson = nlohmann::ordered_json;

const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$schema", "$id",
                                            "$comment", "deprecated", "readOnly", "writeOnly", "$anchor",
                                            "contentEncoding", "contentMediaType", "strict", "name"};
const std::set<std::string> kKeywords = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum", "const", "anyOf",
    "oneOf", "allOf", "$ref", "$defs", "definitions", "minItems", "maxItems", "minLength", "maxLength", "pattern",
    "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "nullable", "uniqueItems"};

const char* kFormats[][2] = {
    {"date", "(?:[0-9]{4})-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|"
             "02-(?:0[1-9]|1[0-9]|2[0-8]))"},
    {"time", "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"},
    {"email", "[A-Za-z0-9_+-]+(?:\\.[A-Za-z0-9_+-]+)*@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\\.)+"
              "[A-Za-z]{2,24}"},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
    {"uri", "(?:https?|ftp)://[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]*"
            "[A-Za-z0-9])?)*(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~!$&'()*+,;=:@-]*)*(?:\\?[A-Za-z0-9._~!$&'()*+,;=:@/?-]*)?"},
};

std::string digits_class(char a, char b) {
  if (a == b) return std::string(1, a);
  return std::string("[") + a + "-" + b + "]";
}

// Regex alternatives for the decimal numbers in [lo, hi], both of n digits (leading zeros allowed inside).
void same_len(const std::string& lo, const std::string& hi, const std::string& prefix, std::vector<std::string>& out) {
  size_t n = lo.size();
  if (n == 0) { out.push_back(prefix); return; }
  if (lo == hi) { out.push_back(prefix + lo); return; }
  if (lo[0] == hi[0]) { same_len(lo.substr(1), hi.substr(1), prefix + lo[0], out); return; }
  std::string zeros(n - 1, '0'), nines(n - 1, '9');
  char start = lo[0], end = hi[0];
  if (lo.substr(1) != zeros) {
    same_len(lo.substr(1), nines, prefix + lo[0], out);
    ++start;
  }
  bool hi_full = hi.substr(1) == nines;
  if (!hi_full) --end;
  if (start <= end) out.push_back(prefix + digits_class(start, end) + (n > 1 ? "[0-9]{" + std::to_string(n - 1) + "}" : ""));
  if (!hi_full) same_len(zeros, hi.substr(1), prefix + hi[0], out);
}

// Regex for the non-negative integers in [a, b] (b < 0: unbounded), without leading zeros.
std::string nonneg_range(int64_t a, int64_t b) {
  std::vector<std::string> parts;
  std::string sa = std::to_string(a);
  size_t last = b < 0 ? sa.size() : std::to_string(b).size();
  for (size_t len = sa.size(); len <= last; ++len) {
    int64_t p10 = 1;
    for (size_t k = 1; k < len; ++k) p10 *= 10;
    int64_t lo = std::max(a, len == 1 ? 0 : p10), hi = (b < 0 || len < last) ? p10 * 10 - 1 : b;
    if (lo <= hi) same_len(std::to_string(lo), std::to_string(hi), "", parts);
  }
  if (b < 0) parts.push_back("[1-9][0-9]{" + std::to_string(sa.size()) + ",}");
  std::string r;
  for (const auto& p : parts) r += (r.empty() ? "" : "|") + p;
  return r;
}

constexpr size_t kMaxSpace = 20;
constexpr int64_t kMaxBound = 1000000000000000LL;  // 1e15: exact in a double and in int64 arithmetic

}  // namespace

class SchemaCompiler {
 public:
  explicit SchemaCompiler(Grammar& g) : g_(g) {}

  uint32_t value(const ojson& root, const std::string& path) {
    root_ = &root;
    refs_.clear();
    return compile(root, path);
  }
  uint32_t value_in(const ojson& root, const ojson& schema, const std::string& path) {
    root_ = &root;
    refs_.clear();
    return compile(schema, path);
  }
  uint32_t any_object() {
    value_rule();
    return object_any_;
  }
  uint32_t raw_string(const ojson& s, const ojson& root, const std::string& path);
  // Whitespace between JSON tokens: up to kMaxSpace bytes (unbounded runs let a model loop on newlines).
  Seq ws() {
    ByteSet s{};
    add(s, ' '); add(s, '\t'); add(s, '\n'); add(s, '\r');
    return Seq(kMaxSpace, g_.opt(s));
  }

 private:
  [[noreturn]] static void error(const std::string& kw, const std::string& path, const std::string& what) {
    throw GrammarError("schema keyword '" + kw + "' at " + path + ": " + what, kw, path);
  }

  Seq lit(std::string_view t) { return g_.literal(t); }
  static Seq cat(std::initializer_list<Seq> parts) {
    Seq o;
    for (const auto& p : parts) o.insert(o.end(), p.begin(), p.end());
    return o;
  }
  uint32_t regex_rule(const std::string& re, const std::string& name) { return add_regex(g_, re, name, false, false); }

  // "chars" with per-level tail calls: plain characters, multi-byte UTF-8, and escapes.
  std::vector<Seq> char_alts(Elem next) {
    std::vector<Seq> alts;
    CpRanges plain = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}};
    Elem c = g_.utf8_class(plain, "char");  // a rule: inline its alternatives so `next` stays a tail call
    for (Seq a : std::vector<Seq>(g_.rules[c.arg])) {
      a.push_back(next);
      alts.push_back(std::move(a));
    }
    Seq esc = cat({lit("\\"), {g_.bytes(set_of("\"\\/bfnrt"))}});
    esc.push_back(next);
    alts.push_back(esc);
    Seq u = lit("\\u");
    ByteSet hex = set_of("0123456789abcdefABCDEF");
    for (int k = 0; k < 4; ++k) u.push_back(g_.bytes(hex));
    u.push_back(next);
    alts.push_back(u);
    return alts;
  }
  ByteSet set_of(std::string_view chars) {
    ByteSet s{};
    for (char ch : chars) add(s, uint8_t(ch));
    return s;
  }

  uint32_t string_rule() {  // any JSON string
    if (string_ != UINT32_MAX) return string_;
    // tail ::= "\"" | MULTIBYTE plain* tail | ESCAPE plain* tail;  string ::= "\"" plain* tail
    ByteSet plain{};
    add_range(plain, 0x20, 0x7F);
    plain[0x22 >> 6] &= ~(uint64_t(1) << (0x22 & 63));
    plain[0x5C >> 6] &= ~(uint64_t(1) << (0x5C & 63));
    uint32_t tail = g_.add_rule("string-tail");
    std::vector<Seq> alts{lit("\"")};
    Seq loop = {g_.star(plain), Grammar::ref(tail)};
    Elem mb = g_.utf8_class({{0x80, 0x10FFFF}}, "string-mb");
    alts.push_back(cat({{mb}, loop}));
    alts.push_back(cat({lit("\\"), {g_.bytes(set_of("\"\\/bfnrt"))}, loop}));
    Seq u = lit("\\u");
    ByteSet hex = set_of("0123456789abcdefABCDEF");
    for (int k = 0; k < 4; ++k) u.push_back(g_.bytes(hex));
    alts.push_back(cat({u, loop}));
    g_.rules[tail] = std::move(alts);
    string_ = g_.rule("string", {cat({lit("\""), loop})});
    return string_;
  }

  uint32_t value_rule() {  // any JSON value
    if (value_ != UINT32_MAX) return value_;
    value_ = g_.add_rule("value");
    uint32_t str = string_rule();
    Seq kv = cat({{Grammar::ref(str)}, ws(), lit(":"), ws(), {Grammar::ref(value_)}});
    Seq more_kv = cat({ws(), lit(","), ws(), kv});
    uint32_t kvs = g_.repeat(more_kv, 0, -1, "object-more");
    object_any_ = g_.rule("object", {cat({lit("{"), ws(), kv, {Grammar::ref(kvs)}, ws(), lit("}")}),
                                     cat({lit("{"), ws(), lit("}")})});
    Seq item = {Grammar::ref(value_)};
    Seq more_item = cat({ws(), lit(","), ws(), item});
    uint32_t items = g_.repeat(more_item, 0, -1, "array-more");
    uint32_t arr = g_.rule("array", {cat({lit("["), ws(), item, {Grammar::ref(items)}, ws(), lit("]")}),
                                     cat({lit("["), ws(), lit("]")})});
    g_.rules[value_] = {{Grammar::ref(object_any_)}, {Grammar::ref(arr)}, {Grammar::ref(str)},
                        {Grammar::ref(number_rule())}, lit("true"), lit("false"), lit("null")};
    return value_;
  }

  uint32_t number_rule() {
    if (number_ == UINT32_MAX)
      number_ = regex_rule("-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?", "number");
    return number_;
  }

  const ojson& resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#') error("$ref", path, "only local references ('#/...') are supported");
    const ojson* cur = root_;
    size_t i = 1;
    while (i < ref.size()) {
      if (ref[i] != '/') error("$ref", path, "bad JSON pointer '" + ref + "'");
      size_t j = ref.find('/', i + 1);
      std::string tok = ref.substr(i + 1, j == std::string::npos ? std::string::npos : j - i - 1);
      for (size_t k; (k = tok.find("~1")) != std::string::npos;) tok.replace(k, 2, "/");
      for (size_t k; (k = tok.find("~0")) != std::string::npos;) tok.replace(k, 2, "~");
      if (cur->is_object() && cur->contains(tok)) cur = &(*cur)[tok];
      else if (cur->is_array() && !tok.empty() && std::all_of(tok.begin(), tok.end(), ::isdigit) &&
               std::stoul(tok) < cur->size())
        cur = &(*cur)[std::stoul(tok)];
      else error("$ref", path, "'" + ref + "' does not resolve");
      i = j == std::string::npos ? ref.size() : j;
    }
    return *cur;
  }

  uint32_t compile(const ojson& s, const std::string& path) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) error("false", path, "the schema 'false' matches nothing");
      return value_rule();
    }
    if (!s.is_object()) error("schema", path, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!kKeywords.count(it.key()) && !kAnnotations.count(it.key()))
        error(it.key(), path, "not supported by the grammar engine (it would not be enforced)");
    auto only_annotations_beside = [&](const char* kw, const char* also = "") {
      for (auto it = s.begin(); it != s.end(); ++it)
        if (it.key() != kw && it.key() != also && !kAnnotations.count(it.key()) && it.key() != "$defs" &&
            it.key() != "definitions")
          error(it.key(), path, std::string("cannot be combined with '") + kw + "'");
    };
    // `type` beside `enum`/`const` (as zod and Pydantic write them) keeps the values of that type.
    auto of_type = [&](const ojson& v) {
      if (!s.contains("type")) return true;
      const ojson& t = s["type"];
      if (!t.is_string() && !t.is_array()) error("type", path, "must be a string or an array of strings");
      for (const auto& x : t.is_array() ? t : ojson::array({t})) {
        std::string n = x.is_string() ? x.get<std::string>() : "";
        if ((n == "null" && v.is_null()) || (n == "boolean" && v.is_boolean()) || (n == "object" && v.is_object()) ||
            (n == "array" && v.is_array()) || (n == "string" && v.is_string()) || (n == "number" && v.is_number()) ||
            (n == "integer" && (v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>())))))
          return true;
      }
      return false;
    };
    if (s.contains("$ref")) {
      only_annotations_beside("$ref");
      if (!s["$ref"].is_string()) error("$ref", path, "must be a string");
      std::string ref = s["$ref"].get<std::string>();
      auto it = refs_.find(ref);
      if (it != refs_.end()) return it->second;
      uint32_t r = g_.add_rule("ref " + ref);
      refs_[ref] = r;
      const ojson& target = resolve(ref, path);
      g_.rules[r] = {{Grammar::ref(compile(target, ref))}};
      return r;
    }
    std::vector<Seq> alts;
    if (s.contains("const")) {
      only_annotations_beside("const", "type");
      if (!of_type(s["const"])) error("const", path, "the value is not of the schema's 'type'");
      return g_.rule("const", {lit(s["const"].dump())});
    }
    if (s.contains("enum")) {
      only_annotations_beside("enum", "type");
      if (!s["enum"].is_array() || s["enum"].empty()) error("enum", path, "must be a non-empty array");
      for (const auto& v : s["enum"])
        if (of_type(v)) alts.push_back(lit(v.dump()));
      if (alts.empty()) error("enum", path, "no value is of the schema's 'type'");
      return g_.rule("enum", std::move(alts));
    }
    for (const char* kw : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(kw)) continue;
      only_annotations_beside(kw);
      const ojson& list = s[kw];
      if (!list.is_array() || list.empty()) error(kw, path, "must be a non-empty array");
      if (std::string(kw) == "allOf" && list.size() != 1)
        error(kw, path, "only a single-member allOf is supported");
      for (size_t i = 0; i < list.size(); ++i)
        alts.push_back({Grammar::ref(compile(list[i], path + "/" + kw + "/" + std::to_string(i)))});
      return g_.rule(kw, std::move(alts));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array() && !t.empty())
        for (const auto& x : t) {
          if (!x.is_string()) error("type", path, "must be a string or an array of strings");
          types.push_back(x.get<std::string>());
        }
      else error("type", path, "must be a string or a non-empty array of strings");
    } else {
      for (auto [kw, ty] : {std::pair{"properties", "object"}, {"additionalProperties", "object"},
                            {"required", "object"}, {"items", "array"}, {"prefixItems", "array"},
                            {"minItems", "array"}, {"maxItems", "array"}, {"minLength", "string"},
                            {"maxLength", "string"}, {"pattern", "string"}, {"format", "string"}})
        if (s.contains(kw) && std::find(types.begin(), types.end(), ty) == types.end()) types.push_back(ty);
      if (types.empty()) {
        for (const char* kw : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
          if (s.contains(kw)) { types.push_back("number"); break; }
      }
      if (types.empty()) {
        if (s.value("nullable", false)) return value_rule();
        return value_rule();
      }
    }
    if (s.value("nullable", false)) types.push_back("null");
    for (const std::string& t : types) {
      if (t == "string") alts.push_back({Grammar::ref(string_schema(s, path))});
      else if (t == "integer") alts.push_back({Grammar::ref(number_schema(s, path, true))});
      else if (t == "number") alts.push_back({Grammar::ref(number_schema(s, path, false))});
      else if (t == "boolean") { alts.push_back(lit("true")); alts.push_back(lit("false")); }
      else if (t == "null") alts.push_back(lit("null"));
      else if (t == "object") alts.push_back({Grammar::ref(object_schema(s, path))});
      else if (t == "array") alts.push_back({Grammar::ref(array_schema(s, path))});
      else error("type", path, "unknown type '" + t + "'");
    }
    return g_.rule("typed", std::move(alts));
  }

  static int64_t count_kw(const ojson& s, const char* kw, const std::string& path, int64_t dflt) {
    if (!s.contains(kw)) return dflt;
    const ojson& v = s[kw];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) error(kw, path, "must be a non-negative integer");
    if (v.get<int64_t>() > kMaxRepeat) error(kw, path, "values above " + std::to_string(kMaxRepeat) + " are not supported");
    return v.get<int64_t>();
  }

  uint32_t string_schema(const ojson& s, const std::string& path) {
    int64_t min = count_kw(s, "minLength", path, 0), max = count_kw(s, "maxLength", path, -1);
    bool counted = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("format")) {
      if (!s["format"].is_string()) error("format", path, "must be a string");
      std::string f = s["format"].get<std::string>();
      if (s.contains("pattern") || counted) error("format", path, "cannot be combined with pattern/minLength/maxLength");
      std::string re;
      if (f == "date-time") re = std::string(kFormats[0][1]) + "T" + kFormats[1][1];
      for (auto& [name, r] : kFormats)
        if (f == name) re = r;
      if (re.empty()) error("format", path, "format '" + f + "' is not supported (date-time, date, time, email, uuid, uri)");
      uint32_t body = add_regex(g_, re, "format-" + f, true, false);
      return g_.rule("string-" + f, {cat({lit("\""), {Grammar::ref(body)}, lit("\"")})});
    }
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) error("pattern", path, "must be a string");
      if (counted) error("pattern", path, "cannot be combined with minLength/maxLength");
      uint32_t body;
      try {
        body = add_regex(g_, s["pattern"].get<std::string>(), "pattern", true, true);
      } catch (const GrammarError& e) {
        error("pattern", path, e.what());
      }
      return g_.rule("string-pattern", {cat({lit("\""), {Grammar::ref(body)}, lit("\"")})});
    }
    if (!counted) return string_rule();
    if (max >= 0 && max < min) error("maxLength", path, "is below minLength");
    // level i = characters so far; each level's alternatives tail-call the next.
    int64_t levels = max >= 0 ? max : min;
    std::vector<uint32_t> lv(size_t(levels) + 1);
    for (auto& r : lv) r = g_.add_rule("string-level");
    for (int64_t i = 0; i <= levels; ++i) {
      std::vector<Seq> alts;
      if (i == levels && max < 0) {  // at least min reached: the unbounded body
        string_rule();  // string ::= '"' plain* tail: continue with its body after the quote
        const Seq& full = g_.rules[string_][0];
        alts.push_back(Seq(full.begin() + 1, full.end()));
      } else {
        if (i >= min) alts.push_back(lit("\""));
        if (i < levels) {
          auto more = char_alts(Grammar::ref(lv[size_t(i + 1)]));
          alts.insert(alts.end(), more.begin(), more.end());
        }
      }
      g_.rules[lv[size_t(i)]] = std::move(alts);
    }
    return g_.rule("string-counted", {cat({lit("\""), {Grammar::ref(lv[0])}})});
  }

  static std::optional<double> bound(const ojson& s, const char* kw, const std::string& path) {
    if (!s.contains(kw)) return std::nullopt;
    if (!s[kw].is_number()) error(kw, path, "must be a number");
    double v = s[kw].get<double>();
    if (std::fabs(v) > double(kMaxBound)) error(kw, path, "bounds beyond ±1e15 are not supported");
    return v;
  }

  uint32_t number_schema(const ojson& s, const std::string& path, bool integer) {
    auto mn = bound(s, "minimum", path), mx = bound(s, "maximum", path);
    auto emn = bound(s, "exclusiveMinimum", path), emx = bound(s, "exclusiveMaximum", path);
    if (!mn && !mx && !emn && !emx)
      return integer ? regex_rule("-?(?:0|[1-9][0-9]*)", "integer") : number_rule();
    // Effective bounds: lo/hi and whether exclusive.
    std::optional<double> lo = mn, hi = mx;
    bool lo_ex = false, hi_ex = false;
    if (emn && (!lo || *emn >= *lo)) { lo = emn; lo_ex = true; }
    if (emx && (!hi || *emx <= *hi)) { hi = emx; hi_ex = true; }
    std::string re;
    auto alt = [&](const std::string& r) { if (!r.empty()) re += (re.empty() ? "" : "|") + r; };
    if (integer) {
      int64_t a = lo ? int64_t(lo_ex ? std::floor(*lo) + 1 : std::ceil(*lo)) : INT64_MIN;
      int64_t b = hi ? int64_t(hi_ex ? std::ceil(*hi) - 1 : std::floor(*hi)) : INT64_MAX;
      if (a > b) error(lo_ex ? "exclusiveMinimum" : "minimum", path, "no integer satisfies the bounds");
      if (b >= 0) alt("(?:" + nonneg_range(std::max<int64_t>(a, 0), b == INT64_MAX ? -1 : b) + ")");
      if (a < 0) alt("-(?:" + nonneg_range(b < 0 ? -b : 1, a == INT64_MIN ? -1 : -a) + ")");
      return regex_rule(re, "integer-range");
    }
    for (auto [v, kw] : {std::pair{lo, "minimum"}, {hi, "maximum"}})
      if (v && *v != std::floor(*v)) error(kw, path, "non-integer bounds on numbers are not supported");
    const std::string frac = "(?:\\.[0-9]{1,15})?";
    // Non-negative values with an integer part in [a, hi - 1] and any fraction, plus hi itself when inclusive.
    int64_t a = !lo || *lo < 0 ? 0 : int64_t(*lo) + (lo_ex ? 1 : 0);
    if (lo && lo_ex && *lo >= 0) alt(std::to_string(int64_t(*lo)) + "\\.[0-9]{0,14}[1-9]");
    if (!hi) alt("(?:" + nonneg_range(a, -1) + ")" + frac);
    else if (int64_t(*hi) - 1 >= a) alt("(?:" + nonneg_range(a, int64_t(*hi) - 1) + ")" + frac);
    if (hi && !hi_ex && *hi >= 0 && int64_t(*hi) >= a) alt(std::to_string(int64_t(*hi)));
    // Negative values -(J.f): J <= -lo - 1 keeps them >= lo; J >= c keeps them <= hi.
    if (!lo || *lo < 0) {
      int64_t c = !hi ? 0 : *hi >= 0 ? (hi_ex && *hi == 0 ? 1 : 0) : int64_t(-*hi) + (hi_ex ? 1 : 0);
      int64_t d = lo ? int64_t(-*lo) - 1 : -1;
      if (!lo || d >= c) alt("-(?:" + nonneg_range(c, d) + ")" + frac);
      if (lo && !lo_ex && (!hi || *lo <= *hi)) alt(std::to_string(int64_t(*lo)));
    }
    if (re.empty()) error("minimum", path, "no number satisfies the bounds");
    return regex_rule(re, "number-range");
  }

  uint32_t object_schema(const ojson& s, const std::string& path) {
    if (s.contains("properties") && !s["properties"].is_object()) error("properties", path, "must be an object");
    static const ojson kEmpty = ojson::object();
    const ojson& props = s.contains("properties") ? s["properties"] : kEmpty;
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) error("required", path, "must be an array of strings");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) error("required", path, "must be an array of strings");
        if (!props.contains(r.get<std::string>()))
          error("required", path, "required property '" + r.get<std::string>() + "' is not in 'properties'");
        required.insert(r.get<std::string>());
      }
    }
    std::optional<uint32_t> extra;  // value rule for additional properties
    if (s.contains("additionalProperties")) {
      const ojson& ap = s["additionalProperties"];
      if (!(ap.is_boolean() && !ap.get<bool>())) extra = compile(ap, path + "/additionalProperties");
    }
    std::vector<Seq> kvs;
    std::vector<bool> req;
    for (auto it = props.begin(); it != props.end(); ++it) {
      uint32_t v = compile(it.value(), path + "/properties/" + it.key());
      kvs.push_back(cat({lit(ojson(it.key()).dump()), ws(), lit(":"), ws(), {Grammar::ref(v)}}));
      req.push_back(required.count(it.key()) > 0);
    }
    size_t n = kvs.size();
    Seq sep = cat({ws(), lit(","), ws()});
    // first[i]: properties i.. with none written yet; rest[i]: after at least one (each prefixed by a comma).
    std::vector<uint32_t> first(n + 1), rest(n + 1);
    for (size_t i = 0; i <= n; ++i) { first[i] = g_.add_rule("props-first"); rest[i] = g_.add_rule("props-rest"); }
    if (extra) {
      Seq kv = cat({{Grammar::ref(string_rule())}, ws(), lit(":"), ws(), {Grammar::ref(*extra)}});
      uint32_t more = g_.repeat(cat({sep, kv}), 0, -1, "props-extra");
      g_.rules[rest[n]] = {{Grammar::ref(more)}};
      g_.rules[first[n]] = {cat({kv, {Grammar::ref(more)}}), {}};
    } else {
      g_.rules[rest[n]] = {{}};
      g_.rules[first[n]] = {{}};
    }
    for (size_t k = n; k-- > 0;) {
      Seq with = cat({kvs[k], {Grammar::ref(rest[k + 1])}});
      g_.rules[first[k]] = {with};
      g_.rules[rest[k]] = {cat({sep, with})};
      if (!req[k]) {
        g_.rules[first[k]].push_back({Grammar::ref(first[k + 1])});
        g_.rules[rest[k]].push_back({Grammar::ref(rest[k + 1])});
      }
    }
    return g_.rule("object", {cat({lit("{"), ws(), {Grammar::ref(first[0])}, ws(), lit("}")})});
  }

  uint32_t array_schema(const ojson& s, const std::string& path) {
    if (s.contains("uniqueItems") && s["uniqueItems"] != false) error("uniqueItems", path, "cannot be enforced");
    int64_t min = count_kw(s, "minItems", path, 0), max = count_kw(s, "maxItems", path, -1);
    if (max >= 0 && max < min) error("maxItems", path, "is below minItems");
    std::vector<Seq> prefix;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) error("prefixItems", path, "must be an array");
      for (size_t i = 0; i < s["prefixItems"].size(); ++i)
        prefix.push_back({Grammar::ref(compile(s["prefixItems"][i], path + "/prefixItems/" + std::to_string(i)))});
    }
    int64_t k = int64_t(prefix.size());
    std::optional<uint32_t> item;
    if (s.contains("items") && !(s["items"].is_boolean() && !s["items"].get<bool>()))
      item = compile(s["items"], path + "/items");
    else if (!s.contains("items") && prefix.empty())
      item = value_rule();
    else if (!s.contains("items") && min > k)
      item = value_rule();
    if (max >= 0 && max < k) error("maxItems", path, "is below the number of prefixItems");
    if (!item && min > k) error("minItems", path, "needs more items than prefixItems allows");
    Seq sep = cat({ws(), lit(","), ws()});
    Seq body;
    int64_t emin = std::max<int64_t>(0, min - k), emax = !item ? 0 : max < 0 ? -1 : max - k;
    if (k > 0) {
      for (int64_t i = 0; i < k; ++i) body = i == 0 ? prefix[0] : cat({body, sep, prefix[size_t(i)]});
      if (emax != 0) body.push_back(Grammar::ref(g_.repeat(cat({sep, {Grammar::ref(*item)}}), emin, emax, "items")));
    } else if (emax != 0) {
      Seq one = {Grammar::ref(*item)};
      uint32_t more = g_.repeat(cat({sep, one}), std::max<int64_t>(0, emin - 1), emax < 0 ? -1 : emax - 1, "items");
      Seq some = cat({one, {Grammar::ref(more)}});
      body = emin > 0 ? some : Seq{Grammar::ref(g_.rule("items-opt", {some, {}}))};
    }
    return g_.rule("array", {cat({lit("["), ws(), body, ws(), lit("]")})});
  }

  const ojson* root_ = nullptr;
  Grammar& g_;
  std::map<std::string, uint32_t> refs_;
  uint32_t string_ = UINT32_MAX, value_ = UINT32_MAX, number_ = UINT32_MAX, object_any_ = UINT32_MAX;
};

uint32_t SchemaCompiler::raw_string(const ojson& s, const ojson& root, const std::string& path) {
  root_ = &root;
  if (!s.is_object()) error("schema", path, "a string parameter schema must be an object");
  for (auto it = s.begin(); it != s.end(); ++it)
    if (!kKeywords.count(it.key()) && !kAnnotations.count(it.key()))
      error(it.key(), path, "not supported by the grammar engine (it would not be enforced)");
  std::vector<Seq> alts;
  auto raw = [&](const ojson& v, const char* kw) {
    if (!v.is_string()) error(kw, path, "a raw string parameter needs string values");
    alts.push_back(lit(v.get<std::string>()));
  };
  if (s.contains("const")) {
    raw(s["const"], "const");
    return g_.rule("raw-const", std::move(alts));
  }
  if (s.contains("enum")) {
    if (!s["enum"].is_array() || s["enum"].empty()) error("enum", path, "must be a non-empty array");
    for (const auto& v : s["enum"]) raw(v, "enum");
    return g_.rule("raw-enum", std::move(alts));
  }
  int64_t min = count_kw(s, "minLength", path, 0), max = count_kw(s, "maxLength", path, -1);
  bool counted = s.contains("minLength") || s.contains("maxLength");
  if (s.contains("format") || s.contains("pattern")) {
    if (counted || (s.contains("format") && s.contains("pattern")))
      error(s.contains("format") ? "format" : "pattern", path, "cannot be combined with pattern/minLength/maxLength");
    std::string re;
    if (s.contains("format")) {
      std::string f = s["format"].is_string() ? s["format"].get<std::string>() : "";
      if (f == "date-time") re = std::string(kFormats[0][1]) + "T" + kFormats[1][1];
      for (auto& [name, r] : kFormats)
        if (f == name) re = r;
      if (re.empty()) error("format", path, "format '" + f + "' is not supported (date-time, date, time, email, uuid, uri)");
      return add_regex(g_, re, "raw-format", false, false);
    }
    if (!s["pattern"].is_string()) error("pattern", path, "must be a string");
    try {
      return add_regex(g_, s["pattern"].get<std::string>(), "raw-pattern", false, true);
    } catch (const GrammarError& e) {
      error("pattern", path, e.what());
    }
  }
  const CpRanges any = {{0, 0x10FFFF}};
  if (!counted) {
    Seq body;
    g_.utf8_star(body, any, "raw-loop");
    return g_.rule("raw-string", {body});
  }
  if (max >= 0 && max < min) error("maxLength", path, "is below minLength");
  int64_t levels = max >= 0 ? max : min;
  std::vector<uint32_t> lv(size_t(levels) + 1);
  for (auto& r : lv) r = g_.add_rule("raw-level");
  Elem c = g_.utf8_class(any, "raw-char");
  for (int64_t i = 0; i <= levels; ++i) {
    std::vector<Seq> level;
    if (i == levels && max < 0) {
      Seq body;
      g_.utf8_star(body, any, "raw-loop");
      level.push_back(body);
    } else {
      if (i >= min) level.push_back({});
      if (i < levels)
        for (Seq a : std::vector<Seq>(g_.rules[c.arg])) {
          a.push_back(Grammar::ref(lv[size_t(i + 1)]));
          level.push_back(std::move(a));
        }
    }
    g_.rules[lv[size_t(i)]] = std::move(level);
  }
  return lv[0];
}

JsonSchemaBuilder::JsonSchemaBuilder(Grammar& g) : impl_(std::make_unique<SchemaCompiler>(g)) {}
JsonSchemaBuilder::~JsonSchemaBuilder() = default;
uint32_t JsonSchemaBuilder::value(const nlohmann::ordered_json& root, const std::string& path) {
  return impl_->value(root, path);
}
uint32_t JsonSchemaBuilder::raw_string(const nlohmann::ordered_json& schema, const nlohmann::ordered_json& root,
                                       const std::string& path) {
  return impl_->raw_string(schema, root, path);
}
uint32_t JsonSchemaBuilder::value_in(const nlohmann::ordered_json& root, const nlohmann::ordered_json& schema,
                                     const std::string& path) {
  return impl_->value_in(root, schema, path);
}
uint32_t JsonSchemaBuilder::any_object() { return impl_->any_object(); }
Seq JsonSchemaBuilder::ws() { return impl_->ws(); }

Grammar json_schema_grammar(const nlohmann::ordered_json& schema) {
  Grammar g;
  JsonSchemaBuilder b(g);
  uint32_t v = b.value(schema, "#");
  Seq root = b.ws();
  root.push_back(Grammar::ref(v));
  g.root = g.rule("root", {root});
  validate(g);
  return g;
}

Grammar json_object_grammar() {
  Grammar g;
  JsonSchemaBuilder b(g);
  uint32_t v = b.any_object();
  Seq root = b.ws();
  root.push_back(Grammar::ref(v));
  g.root = g.rule("root", {root});
  validate(g);
  return g;
}

}  // namespace lily::grammar
