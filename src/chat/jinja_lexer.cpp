// Jinja lexer with transformers' environment (trim_blocks=True, lstrip_blocks=True): data, {{ }}, {% %},
// {# #} with `-`/`+` whitespace control, {% raw %} blocks, Python string-literal escapes.
#include <cctype>
#include <cstring>

#include "chat/jinja_ast.h"

namespace lily::jinja {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

struct Lexer {
  std::string src;
  size_t pos = 0;
  int line = 1;
  std::vector<Token> out;

  [[noreturn]] void error(const std::string& msg) const {
    throw_error("template syntax error (line " + std::to_string(line) + "): " + msg);
  }

  void advance_to(size_t p) {
    for (size_t k = pos; k < p && k < src.size(); ++k)
      if (src[k] == '\n') ++line;
    pos = p;
  }

  bool at(const char* s) const { return src.compare(pos, std::strlen(s), s) == 0; }

  // After a tag ends at `end` (just past the closing chars): `-` strips all following whitespace;
  // otherwise for blocks and comments trim_blocks removes one newline.
  void after_tag(size_t end, bool minus, bool trim) {
    size_t p = end;
    if (minus) {
      while (p < src.size() && is_ws(src[p])) ++p;
    } else if (trim && p < src.size() && src[p] == '\n') {
      ++p;
    }
    advance_to(p);
  }

  void emit(Token::Kind k, std::string text) { out.push_back({k, std::move(text), line}); }

  std::string read_string(char quote) {
    int start_line = line;
    ++pos;
    std::string v;
    while (true) {
      if (pos >= src.size()) {
        line = start_line;
        error("unterminated string literal");
      }
      char c = src[pos];
      if (c == quote) {
        ++pos;
        return v;
      }
      if (c == '\n') ++line;
      if (c != '\\' || pos + 1 >= src.size()) {
        v += c;
        ++pos;
        continue;
      }
      char e = src[pos + 1];
      pos += 2;
      auto hex = [&](int n) {
        char32_t cp = 0;
        for (int k = 0; k < n; ++k) {
          if (pos >= src.size() || !std::isxdigit(static_cast<unsigned char>(src[pos])))
            error("truncated \\x/\\u escape in string literal");
          char h = src[pos++];
          cp = cp * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        if (cp > 0x10ffff) error("illegal Unicode escape in string literal");
        append_utf8(v, cp);
      };
      switch (e) {
        case '\n': ++line; break;
        case '\\': v += '\\'; break;
        case '\'': v += '\''; break;
        case '"': v += '"'; break;
        case 'a': v += '\a'; break;
        case 'b': v += '\b'; break;
        case 'f': v += '\f'; break;
        case 'n': v += '\n'; break;
        case 'r': v += '\r'; break;
        case 't': v += '\t'; break;
        case 'v': v += '\v'; break;
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default:
          if (e >= '0' && e <= '7') {
            int cp = e - '0';
            for (int k = 0; k < 2 && pos < src.size() && src[pos] >= '0' && src[pos] <= '7'; ++k)
              cp = cp * 8 + (src[pos++] - '0');
            append_utf8(v, static_cast<char32_t>(cp));
          } else {
            v += '\\';
            v += e;
            if (e == '\n') ++line;
          }
      }
    }
  }

  void read_number() {
    size_t p = pos;
    auto digits = [&] {
      size_t s = p;
      while (p < src.size() && (std::isdigit(static_cast<unsigned char>(src[p])) ||
                                (src[p] == '_' && p + 1 < src.size() && std::isdigit(static_cast<unsigned char>(src[p + 1])))))
        ++p;
      return p > s;
    };
    digits();
    bool is_float = false;
    if (p + 1 < src.size() && src[p] == '.' && std::isdigit(static_cast<unsigned char>(src[p + 1]))) {
      ++p;
      digits();
      is_float = true;
    }
    if (p < src.size() && (src[p] == 'e' || src[p] == 'E')) {
      size_t q = p + 1;
      if (q < src.size() && (src[q] == '+' || src[q] == '-')) ++q;
      if (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) {
        p = q;
        digits();
        is_float = true;
      }
    }
    std::string lit;
    for (size_t k = pos; k < p; ++k)
      if (src[k] != '_') lit += src[k];
    emit(is_float ? Token::Kind::Float : Token::Kind::Int, lit);
    pos = p;
  }

  // Tokens inside {{ }} or {% %} up to the closing delimiter.
  void read_tag(bool is_block) {
    static const char* ops2[] = {"//", "**", "==", "!=", "<=", ">="};
    int depth = 0;  // open brackets: "}}" inside {'a': {'b': 1}} closes a dict, not the tag (as in Jinja2)
    while (true) {
      while (pos < src.size() && is_ws(src[pos])) advance_to(pos + 1);
      if (pos >= src.size()) error(is_block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'");
      const char* close = is_block ? "%}" : "}}";
      bool minus = depth == 0 && at(is_block ? "-%}" : "-}}");
      bool plus = depth == 0 && is_block && at("+%}");
      if (minus || plus || (depth == 0 && at(close))) {
        emit(is_block ? Token::Kind::BlockEnd : Token::Kind::VarEnd, "");
        after_tag(pos + (minus || plus ? 3 : 2), minus, is_block && !plus);
        return;
      }
      char c = src[pos];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t p = pos;
        while (p < src.size() && (std::isalnum(static_cast<unsigned char>(src[p])) || src[p] == '_')) ++p;
        emit(Token::Kind::Name, src.substr(pos, p - pos));
        pos = p;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        read_number();
      } else if (c == '\'' || c == '"') {
        int l = line;
        std::string v = read_string(c);
        out.push_back({Token::Kind::String, std::move(v), l});
      } else {
        bool done = false;
        for (const char* op : ops2)
          if (at(op)) {
            emit(Token::Kind::Op, op);
            pos += 2;
            done = true;
            break;
          }
        if (done) continue;
        if (!std::strchr("+-*/%~<>=()[]{},.:|", c)) error(std::string("unexpected character '") + c + "'");
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        emit(Token::Kind::Op, std::string(1, c));
        ++pos;
      }
    }
  }

  // True when the block tag at `p` is `{% raw %}` (any whitespace control); sets `body_start`.
  bool raw_block(size_t p, size_t& body_start, bool& minus_end) {
    size_t q = p + 2;
    if (q < src.size() && (src[q] == '-' || src[q] == '+')) ++q;
    while (q < src.size() && is_ws(src[q])) ++q;
    if (src.compare(q, 3, "raw") != 0) return false;
    q += 3;
    while (q < src.size() && is_ws(src[q])) ++q;
    minus_end = src.compare(q, 3, "-%}") == 0;
    if (!minus_end && src.compare(q, 2, "%}") != 0) return false;
    body_start = q + (minus_end ? 3 : 2);
    return true;
  }

  void run() {
    bool line_starting = true;
    while (pos < src.size()) {
      size_t tag = pos;
      while (true) {
        tag = src.find('{', tag);
        if (tag == std::string::npos || tag + 1 >= src.size()) {
          tag = std::string::npos;
          break;
        }
        char n = src[tag + 1];
        if (n == '{' || n == '%' || n == '#') break;
        ++tag;
      }
      if (tag == std::string::npos) {
        emit(Token::Kind::Text, src.substr(pos));
        advance_to(src.size());
        break;
      }
      char kind = src[tag + 1];
      char sign = tag + 2 < src.size() ? src[tag + 2] : 0;
      size_t data_end = tag;
      if (sign == '-') {
        while (data_end > pos && is_ws(src[data_end - 1])) --data_end;
      } else if (sign != '+' && kind != '{') {
        size_t p = data_end;
        while (p > pos && src[p - 1] != '\n' && is_ws(src[p - 1])) --p;
        if ((p > pos && src[p - 1] == '\n') || (p == pos && line_starting)) data_end = p;
      }
      if (data_end > pos) emit(Token::Kind::Text, src.substr(pos, data_end - pos));
      advance_to(tag);
      if (kind == '#') {
        size_t end = src.find("#}", tag + 2);
        if (end == std::string::npos) error("missing end of comment tag");
        bool minus = end > tag + 2 && src[end - 1] == '-';
        after_tag(end + 2, minus, true);
      } else {
        size_t body = 0;
        bool minus_end = false;
        if (kind == '%' && raw_block(tag, body, minus_end)) {
          size_t p = minus_end ? body : body;
          if (minus_end)
            while (p < src.size() && is_ws(src[p])) ++p;
          else if (p < src.size() && src[p] == '\n')
            ++p;
          // Find {% endraw %} (with optional whitespace control).
          size_t e = p;
          size_t close_start = 0, close_end = 0;
          bool strip_before = false, strip_after = false;
          while (true) {
            e = src.find("{%", e);
            if (e == std::string::npos) error("missing {% endraw %}");
            size_t q = e + 2;
            bool m = q < src.size() && src[q] == '-';
            if (q < src.size() && (src[q] == '-' || src[q] == '+')) ++q;
            while (q < src.size() && is_ws(src[q])) ++q;
            if (src.compare(q, 6, "endraw") == 0) {
              q += 6;
              while (q < src.size() && is_ws(src[q])) ++q;
              bool ma = src.compare(q, 3, "-%}") == 0;
              if (ma || src.compare(q, 2, "%}") == 0) {
                close_start = e;
                close_end = q + (ma ? 3 : 2);
                strip_before = m;
                strip_after = ma;
                break;
              }
            }
            e += 2;
          }
          size_t text_end = close_start;
          if (strip_before)
            while (text_end > p && is_ws(src[text_end - 1])) --text_end;
          if (text_end > p) emit(Token::Kind::Text, src.substr(p, text_end - p));
          advance_to(close_start);
          after_tag(close_end, strip_after, true);
        } else {
          emit(kind == '{' ? Token::Kind::VarBegin : Token::Kind::BlockBegin, "");
          advance_to(tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0));
          read_tag(kind == '%');
        }
      }
      line_starting = pos == 0 || src[pos - 1] == '\n';
    }
    emit(Token::Kind::End, "");
  }
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) {
  Lexer lx;
  // Jinja2 normalises newlines to "\n" and drops one trailing newline (keep_trailing_newline=False).
  lx.src.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      lx.src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      lx.src += source[k];
    }
  }
  if (!lx.src.empty() && lx.src.back() == '\n') lx.src.pop_back();
  lx.run();
  return lx.out;
}

}  // namespace lily::jinja
