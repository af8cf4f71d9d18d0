// GBNF text grammars (llama.cpp's format) → grammar IR.
#include <cstring>
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "grammar/frontends.h"

namespace lily::grammar {

namespace {

class GbnfParser {
 public:
  GbnfParser(std::string_view text) : s_(text) {}

  Grammar parse() {
    skip_space(true);
    while (!eof()) {
      std::string name = ident();
      if (name.empty()) error("expected a rule name");
      skip_space(false);
      if (s_.substr(i_, 3) != "::=") error("expected '::=' after rule name '" + name + "'");
      i_ += 3;
      skip_space(true);
      uint32_t r = rule_id(name);
      if (defined_.count(r)) error("rule '" + name + "' defined twice");
      defined_.insert(r);
      g_.rules[r] = alternatives(false);
      skip_space(true);
    }
    for (auto& [name, id] : ids_)
      if (!defined_.count(id)) throw GrammarError("grammar: rule '" + name + "' is used but not defined");
    auto root = ids_.find("root");
    if (root == ids_.end()) throw GrammarError("grammar: no rule named 'root'");
    g_.root = root->second;
    validate(g_);
    return std::move(g_);
  }

 private:
  [[noreturn]] void error(const std::string& what) {
    size_t line = 1 + size_t(std::count(s_.begin(), s_.begin() + long(std::min(i_, s_.size())), '\n'));
    throw GrammarError("grammar line " + std::to_string(line) + ": " + what);
  }
  bool eof() const { return i_ >= s_.size(); }
  // Spaces and comments; newlines too when `newlines` (inside parentheses, or between rules).
  void skip_space(bool newlines) {
    while (!eof()) {
      char c = s_[i_];
      if (c == '#') {
        while (!eof() && s_[i_] != '\n') ++i_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++i_;
      } else {
        break;
      }
    }
  }
  std::string ident() {
    size_t b = i_;
    while (!eof() && (isalnum(uint8_t(s_[i_])) || s_[i_] == '-' || s_[i_] == '_')) ++i_;
    return std::string(s_.substr(b, i_ - b));
  }
  uint32_t rule_id(const std::string& name) {
    auto [it, fresh] = ids_.emplace(name, 0);
    if (fresh) {
      it->second = g_.add_rule(name);
    }
    return it->second;
  }

  // A continuation line starts with '|' or the rule goes on after a newline inside parentheses; a new rule
  // starts with `name ::=`.
  bool at_new_rule() {
    size_t save = i_;
    std::string name = ident();
    skip_space(false);
    bool yes = !name.empty() && s_.substr(i_, 3) == "::=";
    i_ = save;
    return yes;
  }

  std::vector<Seq> alternatives(bool nested) {
    std::vector<Seq> alts{sequence(nested)};
    while (true) {
      size_t save = i_;
      skip_space(true);
      if (!eof() && s_[i_] == '|') {
        ++i_;
        skip_space(true);
        alts.push_back(sequence(nested));
      } else {
        i_ = save;
        break;
      }
    }
    return alts;
  }

  Seq sequence(bool nested) {
    Seq out;
    while (true) {
      skip_space(nested);
      if (eof()) break;
      char c = s_[i_];
      if (c == '|' || c == ')') break;
      if (c == '\n') {  // end of the rule unless the next line continues it with '|'
        size_t save = i_;
        skip_space(true);
        if (!eof() && s_[i_] == '|') { i_ = save; break; }
        i_ = save;
        break;
      }
      if (!nested && (isalpha(uint8_t(c)) || c == '_') && at_new_rule()) break;
      size_t before = out.size();
      CpRanges cls;
      bool is_class = element(out, cls);
      postfix(out, before, is_class, cls);
    }
    return out;
  }

  // Parses one element into `out`; true (and `cls`) when it is a single character class.
  bool element(Seq& out, CpRanges& cls) {
    char c = s_[i_];
    if (c == '"') {
      ++i_;
      while (true) {
        if (eof() || s_[i_] == '\n') error("unterminated string literal");
        if (s_[i_] == '"') { ++i_; break; }
        g_.literal(out, encode(char_or_escape()));
      }
      return false;
    }
    if (c == '[') {
      ++i_;
      bool neg = !eof() && s_[i_] == '^';
      if (neg) ++i_;
      CpRanges r;
      while (true) {
        if (eof()) error("unterminated character class");
        if (s_[i_] == ']') { ++i_; break; }
        uint32_t lo = char_or_escape(), hi = lo;
        if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
          ++i_;
          hi = char_or_escape();
          if (hi < lo) error("character range out of order");
        }
        r.push_back({lo, hi});
      }
      cls = neg ? negate(r) : normalize(r);
      if (cls.empty()) error("empty character class");
      out.push_back(g_.utf8_class(cls, "class" + std::to_string(counter_++)));
      return true;
    }
    if (c == '.') {
      ++i_;
      cls = {{0, 0x10FFFF}};
      out.push_back(g_.utf8_class(cls, "any" + std::to_string(counter_++)));
      return true;
    }
    if (c == '(') {
      ++i_;
      std::vector<Seq> alts = alternatives(true);
      skip_space(true);
      if (eof() || s_[i_] != ')') error("missing ')'");
      ++i_;
      if (alts.size() == 1) out.insert(out.end(), alts[0].begin(), alts[0].end());
      else out.push_back(Grammar::ref(g_.rule("group" + std::to_string(counter_++), std::move(alts))));
      return false;
    }
    if (c == '<' && i_ + 1 < s_.size() && s_[i_ + 1] == '[') {
      i_ += 2;
      long id = 0;
      if (eof() || !isdigit(uint8_t(s_[i_]))) error("expected a token id in <[ID]>");
      while (!eof() && isdigit(uint8_t(s_[i_]))) {
        id = id * 10 + (s_[i_++] - '0');
        if (id > (1L << 30)) error("token id too large");
      }
      if (s_.substr(i_, 2) != "]>") error("expected ']>'");
      i_ += 2;
      out.push_back(Grammar::token(int32_t(id)));
      return false;
    }
    if (isalpha(uint8_t(c)) || c == '_' || c == '-') {
      std::string name = ident();
      out.push_back(Grammar::ref(rule_id(name)));
      return false;
    }
    error(std::string("unexpected character '") + c + "'");
  }

  void postfix(Seq& out, size_t before, bool is_class, const CpRanges& cls) {
    if (eof()) return;
    char c = s_[i_];
    int64_t min, max;
    if (c == '*') { min = 0; max = -1; ++i_; }
    else if (c == '+') { min = 1; max = -1; ++i_; }
    else if (c == '?') { min = 0; max = 1; ++i_; }
    else if (c == '{') {
      ++i_;
      skip_space(false);
      min = number();
      max = min;
      skip_space(false);
      if (!eof() && s_[i_] == ',') {
        ++i_;
        skip_space(false);
        max = (!eof() && isdigit(uint8_t(s_[i_]))) ? number() : -1;
        skip_space(false);
      }
      if (eof() || s_[i_] != '}') error("expected '}'");
      ++i_;
    } else {
      return;
    }
    Seq item(out.begin() + long(before), out.end());
    out.resize(before);
    if (is_class && max < 0) {
      for (int64_t k = 0; k < min; ++k) out.insert(out.end(), item.begin(), item.end());
      g_.utf8_star(out, cls, "star" + std::to_string(counter_++));
    } else {
      out.push_back(Grammar::ref(g_.repeat(item, min, max, "rep" + std::to_string(counter_++))));
    }
  }

  int64_t number() {
    if (eof() || !isdigit(uint8_t(s_[i_]))) error("expected a number");
    int64_t v = 0;
    while (!eof() && isdigit(uint8_t(s_[i_]))) {
      v = v * 10 + (s_[i_++] - '0');
      if (v > kMaxRepeat) error("repetition count above " + std::to_string(kMaxRepeat));
    }
    return v;
  }

  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      if (eof() || !isxdigit(uint8_t(s_[i_]))) error("bad hex escape");
      char h = s_[i_++];
      v = v * 16 + uint32_t(isdigit(uint8_t(h)) ? h - '0' : tolower(h) - 'a' + 10);
    }
    if (v > 0x10FFFF) error("code point out of range");
    return v;
  }

  uint32_t char_or_escape() {
    if (s_[i_] != '\\') {
      uint8_t c = uint8_t(s_[i_++]);
      int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
      uint32_t cp = n == 3 ? c & 7 : n == 2 ? c & 15 : n == 1 ? c & 31 : c;
      for (int k = 0; k < n && !eof() && (uint8_t(s_[i_]) & 0xC0) == 0x80; ++k) cp = (cp << 6) | (uint8_t(s_[i_++]) & 63);
      return cp;
    }
    ++i_;
    if (eof()) error("dangling backslash");
    char c = s_[i_++];
    switch (c) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      case '\\': case '"': case '[': case ']': case '-': case '^': return uint8_t(c);
      default: error(std::string("unknown escape \\") + c);
    }
  }

  static std::string encode(uint32_t cp) {
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

  std::string_view s_;
  size_t i_ = 0;
  Grammar g_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::unordered_set<uint32_t> defined_;
  int counter_ = 0;
};

}  // namespace

Grammar gbnf_grammar(std::string_view text) { return GbnfParser(text).parse(); }

}  // namespace lily::grammar
