// Regular expressions (ECMAScript subset) → grammar rules.
#include <cstring>

#include "grammar/frontends.h"

namespace lily::grammar {

namespace {

// Decodes one UTF-8 code point at s[i] (advancing i); invalid bytes map to themselves.
uint32_t next_cp(std::string_view s, size_t& i) {
  uint8_t c = uint8_t(s[i++]);
  int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
  uint32_t cp = n == 3 ? c & 7 : n == 2 ? c & 15 : n == 1 ? c & 31 : c;
  for (int k = 0; k < n && i < s.size() && (uint8_t(s[i]) & 0xC0) == 0x80; ++k) cp = (cp << 6) | (uint8_t(s[i++]) & 63);
  return cp;
}

std::string encode_cp(uint32_t cp) {
  std::string o;
  if (cp < 0x80) o += char(cp);
  else if (cp < 0x800) { o += char(0xC0 | (cp >> 6)); o += char(0x80 | (cp & 63)); }
  else if (cp < 0x10000) { o += char(0xE0 | (cp >> 12)); o += char(0x80 | ((cp >> 6) & 63)); o += char(0x80 | (cp & 63)); }
  else {
    o += char(0xF0 | (cp >> 18)); o += char(0x80 | ((cp >> 12) & 63));
    o += char(0x80 | ((cp >> 6) & 63)); o += char(0x80 | (cp & 63));
  }
  return o;
}

const CpRanges kDigit{{'0', '9'}};
const CpRanges kWord{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const CpRanges kSpace{{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x2028, 0x2029}, {0xFEFF, 0xFEFF}};

class RegexParser {
 public:
  RegexParser(Grammar& g, std::string_view p, std::string name, bool json)
      : g_(g), p_(p), name_(std::move(name)), json_(json) {}

  uint32_t parse(bool search) {
    bool start_anchor = false, end_anchor = false;
    if (!p_.empty() && p_[0] == '^') { start_anchor = true; ++i_; }
    std::vector<Seq> alts = alternation();
    if (i_ < p_.size() && p_[i_] == '$') { end_anchor = true; ++i_; }
    if (i_ != p_.size()) error("unexpected '" + std::string(1, p_[i_]) + "'");
    uint32_t body = g_.rule(name_, std::move(alts));
    if (!search || (start_anchor && end_anchor)) return body;
    Seq s;
    if (!start_anchor) g_.utf8_star(s, any(), name_ + "-pre");
    s.push_back(Grammar::ref(body));
    if (!end_anchor) g_.utf8_star(s, any(), name_ + "-post");
    return g_.rule(name_ + "-search", {std::move(s)});
  }

 private:
  [[noreturn]] void error(const std::string& what) {
    throw GrammarError("regex /" + std::string(p_) + "/ at offset " + std::to_string(i_) + ": " + what);
  }
  bool eof() const { return i_ >= p_.size(); }

  // Characters a class may produce: in a JSON string not '"', '\' or control characters (they need escapes).
  CpRanges restrict(CpRanges r) {
    r = normalize(std::move(r));
    if (!json_) return r;
    CpRanges out;
    for (auto [lo, hi] : r) {
      auto push = [&](uint32_t a, uint32_t b) { if (a <= b) out.push_back({a, b}); };
      if (hi < 0x20) continue;
      lo = std::max<uint32_t>(lo, 0x20);
      if (lo <= '"' && hi >= '"') { push(lo, '"' - 1); lo = '"' + 1; }
      if (lo <= '\\' && hi >= '\\') { push(lo, '\\' - 1); lo = '\\' + 1; }
      push(lo, hi);
    }
    return out;
  }
  CpRanges any() { return restrict({{0, '\n' - 1}, {'\n' + 1, '\r' - 1}, {'\r' + 1, 0x10FFFF}}); }

  std::vector<Seq> alternation() {
    std::vector<Seq> alts{sequence()};
    while (!eof() && p_[i_] == '|') {
      ++i_;
      alts.push_back(sequence());
    }
    return alts;
  }

  // One atom as a sequence, and its class when it is a single character class (for inline stars).
  struct Atom {
    Seq seq;
    bool is_class = false;
    CpRanges cls;
  };

  Seq sequence() {
    Seq out;
    while (!eof() && p_[i_] != '|' && p_[i_] != ')' && !(p_[i_] == '$' && i_ + 1 == p_.size())) {
      Atom a = atom();
      quantified(a, out);
    }
    return out;
  }

  void quantified(Atom& a, Seq& out) {
    int64_t min = 1, max = 1;
    if (eof()) { out.insert(out.end(), a.seq.begin(), a.seq.end()); return; }
    char c = p_[i_];
    if (c == '*') { min = 0; max = -1; ++i_; }
    else if (c == '+') { min = 1; max = -1; ++i_; }
    else if (c == '?') { min = 0; max = 1; ++i_; }
    else if (c == '{' && i_ + 1 < p_.size() && isdigit(uint8_t(p_[i_ + 1]))) {
      ++i_;
      min = number();
      max = min;
      if (!eof() && p_[i_] == ',') {
        ++i_;
        max = (!eof() && isdigit(uint8_t(p_[i_]))) ? number() : -1;
      }
      if (eof() || p_[i_] != '}') error("unterminated {m,n}");
      ++i_;
    } else {
      out.insert(out.end(), a.seq.begin(), a.seq.end());
      return;
    }
    if (!eof() && p_[i_] == '?') ++i_;  // lazy: same language
    if (!eof() && (p_[i_] == '*' || p_[i_] == '+' || p_[i_] == '?' || p_[i_] == '{')) error("nested quantifier");
    if (a.is_class && max < 0) {  // class{min,}: inline star, no helper stack frames
      for (int64_t k = 0; k < min; ++k) out.insert(out.end(), a.seq.begin(), a.seq.end());
      g_.utf8_star(out, a.cls, name_ + "-star" + std::to_string(counter_++));
      return;
    }
    out.push_back(Grammar::ref(g_.repeat(a.seq, min, max, name_ + "-rep" + std::to_string(counter_++))));
  }

  int64_t number() {
    int64_t v = 0;
    while (!eof() && isdigit(uint8_t(p_[i_]))) {
      v = v * 10 + (p_[i_++] - '0');
      if (v > kMaxRepeat) error("repetition count above " + std::to_string(kMaxRepeat));
    }
    return v;
  }

  Atom class_atom(CpRanges r) {
    Atom a;
    a.is_class = true;
    a.cls = restrict(std::move(r));
    if (a.cls.empty()) error("character class matches nothing here");
    a.seq.push_back(g_.utf8_class(a.cls, name_ + "-class" + std::to_string(counter_++)));
    return a;
  }

  Atom literal_atom(uint32_t cp) {
    Atom a;
    if (json_ && (cp < 0x20 || cp == '"' || cp == '\\')) {
      static const char* hex = "0123456789abcdef";
      std::string esc = cp == '"' ? "\\\"" : cp == '\\' ? "\\\\" : cp == '\n' ? "\\n" : cp == '\t' ? "\\t" :
                        cp == '\r' ? "\\r" : std::string("\\u00") + hex[cp >> 4] + hex[cp & 15];
      g_.literal(a.seq, esc);
      return a;
    }
    g_.literal(a.seq, encode_cp(cp));
    return a;
  }

  // An escape after '\' inside or outside a class: a class (d, w, s...) or one code point.
  bool escape(uint32_t& cp, CpRanges& cls) {
    if (eof()) error("dangling backslash");
    char c = p_[i_++];
    switch (c) {
      case 'd': cls = kDigit; return true;
      case 'D': cls = negate(kDigit); return true;
      case 'w': cls = kWord; return true;
      case 'W': cls = negate(kWord); return true;
      case 's': cls = kSpace; return true;
      case 'S': cls = negate(kSpace); return true;
      case 'n': cp = '\n'; return false;
      case 't': cp = '\t'; return false;
      case 'r': cp = '\r'; return false;
      case 'f': cp = '\f'; return false;
      case 'v': cp = '\v'; return false;
      case '0': cp = 0; return false;
      case 'x': cp = uint32_t(hex(2)); return false;
      case 'u':
        if (!eof() && p_[i_] == '{') error("\\u{...} is not supported");
        cp = uint32_t(hex(4));
        return false;
      case 'b': case 'B': error("word boundaries (\\b, \\B) are not supported");
      default:
        if (isdigit(uint8_t(c))) error("backreferences are not supported");
        if (isalnum(uint8_t(c))) error(std::string("unknown escape \\") + c);
        cp = uint8_t(c);
        return false;
    }
  }

  long hex(int n) {
    long v = 0;
    for (int k = 0; k < n; ++k) {
      if (eof() || !isxdigit(uint8_t(p_[i_]))) error("bad hex escape");
      char h = p_[i_++];
      v = v * 16 + (isdigit(uint8_t(h)) ? h - '0' : (tolower(h) - 'a' + 10));
    }
    return v;
  }

  Atom bracket() {
    bool neg = !eof() && p_[i_] == '^';
    if (neg) ++i_;
    CpRanges r;
    bool first = true;
    while (true) {
      if (eof()) error("unterminated character class");
      if (p_[i_] == ']' && !first) { ++i_; break; }
      first = false;
      uint32_t lo;
      CpRanges cls;
      if (p_[i_] == '\\') {
        ++i_;
        if (escape(lo, cls)) { r.insert(r.end(), cls.begin(), cls.end()); continue; }
      } else {
        lo = next_cp(p_, i_);
      }
      uint32_t hi = lo;
      if (i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        if (p_[i_] == '\\') {
          ++i_;
          if (escape(hi, cls)) error("class escape as a range end");
        } else {
          hi = next_cp(p_, i_);
        }
        if (hi < lo) error("range out of order");
      }
      r.push_back({lo, hi});
    }
    return class_atom(neg ? negate(r) : r);
  }

  Atom atom() {
    char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (!eof() && p_[i_] == '?') {
        ++i_;
        if (!eof() && p_[i_] == ':') ++i_;
        else if (!eof() && p_[i_] == '<' && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!') {
          size_t close = p_.find('>', i_);
          if (close == std::string_view::npos) error("unterminated group name");
          i_ = close + 1;
        } else {
          error("lookaround and inline flags are not supported");
        }
      }
      std::vector<Seq> alts = alternation();
      if (eof() || p_[i_] != ')') error("missing ')'");
      ++i_;
      Atom a;
      if (alts.size() == 1) a.seq = std::move(alts[0]);
      else a.seq.push_back(Grammar::ref(g_.rule(name_ + "-group" + std::to_string(counter_++), std::move(alts))));
      // A quantified multi-element group must repeat as a unit: wrap it.
      if (a.seq.size() > 1 && !eof() && strchr("*+?{", p_[i_]))
        a.seq = {Grammar::ref(g_.rule(name_ + "-group" + std::to_string(counter_++), {std::move(a.seq)}))};
      return a;
    }
    if (c == '[') { ++i_; return bracket(); }
    if (c == '.') { ++i_; return class_atom(any()); }
    if (c == '^' || c == '$') error("anchors are supported only at the start and end of the pattern");
    if (c == '*' || c == '+' || c == '?') error("quantifier without an operand");
    if (c == '\\') {
      ++i_;
      uint32_t cp;
      CpRanges cls;
      if (escape(cp, cls)) return class_atom(cls);
      return literal_atom(cp);
    }
    uint32_t cp = next_cp(p_, i_);
    return literal_atom(cp);
  }

  Grammar& g_;
  std::string_view p_;
  std::string name_;
  bool json_;
  size_t i_ = 0;
  int counter_ = 0;
};

}  // namespace

uint32_t add_regex(Grammar& g, std::string_view pattern, const std::string& name, bool json_string, bool search) {
  return RegexParser(g, pattern, name, json_string).parse(search);
}

Grammar regex_grammar(std::string_view pattern) {
  Grammar g;
  g.root = add_regex(g, pattern, "regex", false, false);
  validate(g);
  return g;
}

}  // namespace lily::grammar
