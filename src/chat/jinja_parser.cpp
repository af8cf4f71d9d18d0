// Recursive-descent parser for Jinja templates, following Jinja2's grammar and operator precedence:
// cond-expr < or < and < not < compare < +,- < ~ < *,/,//,% < ** < unary < filters/tests < postfix < primary.
#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "chat/jinja_ast.h"

namespace lily::jinja {
namespace {

constexpr int kMaxDepth = 200;  // nesting bound: malformed input must not overflow the stack

struct Parser {
  const std::vector<Token>& t;
  size_t p = 0;
  int depth = 0;

  struct DepthGuard {
    Parser& ps;
    explicit DepthGuard(Parser& x) : ps(x) {
      if (++ps.depth > kMaxDepth) ps.error("template nested too deeply");
    }
    ~DepthGuard() { --ps.depth; }
  };

  [[noreturn]] void error(const std::string& msg) const {
    throw_error("template syntax error (line " + std::to_string(t[p].line) + "): " + msg);
  }
  const Token& cur() const { return t[p]; }
  bool is_op(const char* op) const { return cur().kind == Token::Kind::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == Token::Kind::Name && cur().text == n; }
  void next() {
    if (cur().kind != Token::Kind::End) ++p;
  }
  void expect_op(const char* op) {
    if (!is_op(op)) error(std::string("expected '") + op + "'" + got());
    next();
  }
  std::string got() const {
    switch (cur().kind) {
      case Token::Kind::End: return ", got end of template";
      case Token::Kind::BlockEnd: return ", got '%}'";
      case Token::Kind::VarEnd: return ", got '}}'";
      default: return ", got '" + cur().text + "'";
    }
  }
  std::string expect_name() {
    if (cur().kind != Token::Kind::Name) error("expected a name" + got());
    std::string n = cur().text;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().kind != Token::Kind::BlockEnd) error("expected end of statement block" + got());
    next();
  }
  NodePtr node(Node::Kind k) { return std::make_unique<Node>(k, cur().line); }

  // Left-nested chains (a+b+c..., x.a.b..., x|f|g...) are built iteratively; bound their height so that the
  // evaluator and the destructor never recurse too deep.
  NodePtr finish(NodePtr n) {
    int h = 0;
    for (const auto& k : n->kids)
      if (k) h = std::max(h, k->height);
    for (const auto& k : n->kw_values)
      if (k) h = std::max(h, k->height);
    n->height = h + 1;
    if (n->height > kMaxDepth) error("expression nested too deeply");
    return n;
  }

  // ---- statements ----

  // Parses statements until a block tag whose name is in `stops`; leaves p at that name.
  NodePtr parse_body(const std::vector<std::string>& stops) {
    DepthGuard g(*this);
    auto body = node(Node::Kind::Template);
    while (true) {
      const Token& tk = cur();
      if (tk.kind == Token::Kind::End) {
        if (!stops.empty()) error("unexpected end of template, expected '" + stops[0] + "'");
        return body;
      }
      if (tk.kind == Token::Kind::Text) {
        auto n = node(Node::Kind::Text);
        n->str = tk.text;
        next();
        body->kids.push_back(std::move(n));
      } else if (tk.kind == Token::Kind::VarBegin) {
        next();
        auto n = node(Node::Kind::Output);
        n->kids.push_back(parse_expression());
        if (cur().kind != Token::Kind::VarEnd) error("expected '}}'" + got());
        next();
        body->kids.push_back(std::move(n));
      } else if (tk.kind == Token::Kind::BlockBegin) {
        next();
        if (cur().kind == Token::Kind::Name)
          for (const auto& s : stops)
            if (cur().text == s) return body;
        auto st = parse_statement();
        if (st) body->kids.push_back(std::move(st));
      } else {
        error("unexpected token" + got());
      }
    }
  }

  NodePtr parse_statement() {
    std::string kw = expect_name();
    if (kw == "if") return parse_if();
    if (kw == "for") return parse_for();
    if (kw == "set") return parse_set();
    if (kw == "macro") return parse_macro();
    if (kw == "break" || kw == "continue") {
      auto n = node(kw == "break" ? Node::Kind::Break : Node::Kind::Continue);
      expect_block_end();
      return n;
    }
    if (kw == "generation") {  // transformers' {% generation %} marker: renders its body unchanged
      expect_block_end();
      auto body = parse_body({"endgeneration"});
      next();
      expect_block_end();
      return body;
    }
    error("unknown tag '" + kw + "'");
  }

  NodePtr parse_if() {
    auto n = node(Node::Kind::If);
    while (true) {
      n->kids.push_back(parse_expression());
      expect_block_end();
      n->kids.push_back(parse_body({"elif", "else", "endif"}));
      std::string k = expect_name();
      if (k == "elif") continue;
      if (k == "else") {
        expect_block_end();
        n->kids.push_back(parse_body({"endif"}));
        n->has_else = true;
        next();
      }
      expect_block_end();
      return n;
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = is_op("(");
    if (paren) next();
    names.push_back(expect_name());
    while (is_op(",")) {
      next();
      if (cur().kind != Token::Kind::Name) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  NodePtr parse_for() {
    auto n = node(Node::Kind::For);
    n->targets = parse_targets();
    if (!is_name("in")) error("expected 'in'" + got());
    next();
    n->kids.push_back(parse_or_expr_no_cond());
    NodePtr filter;
    if (is_name("if")) {
      next();
      filter = parse_expression();
    }
    if (is_name("recursive")) error("recursive loops are not supported");
    expect_block_end();
    n->kids.push_back(parse_body({"else", "endfor"}));
    if (expect_name() == "else") {
      expect_block_end();
      n->kids.push_back(parse_body({"endfor"}));
      next();
    } else {
      n->kids.push_back(node(Node::Kind::Template));
    }
    expect_block_end();
    if (filter) n->kids.push_back(std::move(filter));
    return n;
  }

  NodePtr parse_set() {
    auto n = node(Node::Kind::Set);
    std::string first = expect_name();
    if (is_op(".")) {
      next();
      n->targets = {first, expect_name()};
      n->attr_set = true;
    } else {
      n->targets = {first};
      while (is_op(",")) {
        next();
        n->targets.push_back(expect_name());
      }
    }
    if (is_op("=")) {
      next();
      n->kids.push_back(parse_tuple_or_expression());
      expect_block_end();
      return n;
    }
    if (n->attr_set || n->targets.size() != 1) error("expected '='" + got());
    while (is_op("|")) error("filtered block set is not supported");
    expect_block_end();
    n->kids.push_back(parse_body({"endset"}));
    n->has_else = true;  // marks the block form
    next();
    expect_block_end();
    return n;
  }

  NodePtr parse_macro() {
    auto n = node(Node::Kind::Macro);
    n->str = expect_name();
    expect_op("(");
    std::vector<NodePtr> defaults;
    while (!is_op(")")) {
      if (!n->params.empty()) expect_op(",");
      if (is_op(")")) break;
      n->params.push_back(expect_name());
      if (is_op("=")) {
        next();
        defaults.push_back(parse_expression());
      } else {
        if (!defaults.empty() && defaults.back()) error("non-default argument follows default argument");
        defaults.push_back(nullptr);
      }
    }
    next();
    expect_block_end();
    n->kids = std::move(defaults);
    n->kids.push_back(parse_body({"endmacro"}));
    next();
    if (cur().kind == Token::Kind::Name && cur().text == n->str) next();
    expect_block_end();
    return n;
  }

  // ---- expressions ----

  NodePtr parse_tuple_or_expression() {
    auto first = parse_expression();
    if (!is_op(",")) return first;
    auto lst = node(Node::Kind::ListLit);
    lst->is_tuple = true;
    lst->kids.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (cur().kind == Token::Kind::BlockEnd || cur().kind == Token::Kind::VarEnd) break;
      lst->kids.push_back(parse_expression());
    }
    return finish(std::move(lst));
  }

  NodePtr parse_expression() {
    DepthGuard g(*this);
    auto e = parse_or();
    while (is_name("if")) {
      auto c = node(Node::Kind::Cond);
      next();
      auto cond = parse_or();
      NodePtr other;
      if (is_name("else")) {
        next();
        other = parse_expression();
      }
      c->kids.push_back(std::move(e));
      c->kids.push_back(std::move(cond));
      c->kids.push_back(std::move(other));
      e = finish(std::move(c));
    }
    return e;
  }

  NodePtr parse_or_expr_no_cond() { return parse_or(); }

  NodePtr binary(const char* op, NodePtr a, NodePtr b) {
    auto n = std::make_unique<Node>(Node::Kind::Binary, a->line);
    n->str = op;
    n->kids.push_back(std::move(a));
    n->kids.push_back(std::move(b));
    return finish(std::move(n));
  }

  NodePtr parse_or() {
    auto e = parse_and();
    while (is_name("or")) {
      next();
      e = binary("or", std::move(e), parse_and());
    }
    return e;
  }
  NodePtr parse_and() {
    auto e = parse_not();
    while (is_name("and")) {
      next();
      e = binary("and", std::move(e), parse_not());
    }
    return e;
  }
  NodePtr parse_not() {
    DepthGuard g(*this);
    if (is_name("not")) {
      auto n = node(Node::Kind::Unary);
      n->str = "not";
      next();
      n->kids.push_back(parse_not());
      return finish(std::move(n));
    }
    return parse_compare();
  }
  NodePtr parse_compare() {
    auto first = parse_math1();
    NodePtr cmp;
    while (true) {
      std::string op;
      if (cur().kind == Token::Kind::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" || cur().text == ">" ||
           cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && t[p + 1].kind == Token::Kind::Name && t[p + 1].text == "in") {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Node::Kind::Compare);
        cmp->kids.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->kids.push_back(parse_math1());
    }
    return cmp ? finish(std::move(cmp)) : std::move(first);
  }
  NodePtr parse_math1() {
    auto e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      next();
      e = binary(op == "+" ? "+" : "-", std::move(e), parse_concat());
    }
    return e;
  }
  NodePtr parse_concat() {
    auto e = parse_math2();
    while (is_op("~")) {
      next();
      e = binary("~", std::move(e), parse_math2());
    }
    return e;
  }
  NodePtr parse_math2() {
    auto e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      next();
      auto rhs = parse_pow();
      auto n = std::make_unique<Node>(Node::Kind::Binary, e->line);
      n->str = op;
      n->kids.push_back(std::move(e));
      n->kids.push_back(std::move(rhs));
      e = finish(std::move(n));
    }
    return e;
  }
  NodePtr parse_pow() {
    auto e = parse_unary(true);
    while (is_op("**")) {
      next();
      e = binary("**", std::move(e), parse_unary(true));
    }
    return e;
  }
  NodePtr parse_unary(bool with_filter) {
    DepthGuard g(*this);
    NodePtr e;
    if (is_op("-") || is_op("+")) {
      auto n = node(Node::Kind::Unary);
      n->str = cur().text;
      next();
      n->kids.push_back(parse_unary(false));
      e = finish(std::move(n));
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filters(std::move(e)) : std::move(e);
  }

  void parse_call_args(Node& n) {
    expect_op("(");
    size_t nargs = 0;
    while (!is_op(")")) {
      if (nargs++ > 0) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (cur().kind == Token::Kind::Name && t[p + 1].kind == Token::Kind::Op && t[p + 1].text == "=") {
        n.kw_names.push_back(cur().text);
        next();
        next();
        n.kw_values.push_back(parse_expression());
      } else {
        if (!n.kw_names.empty()) error("positional argument follows keyword argument");
        n.kids.push_back(parse_expression());
      }
    }
    next();
  }

  NodePtr parse_postfix(NodePtr e) {
    while (true) {
      if (is_op(".")) {
        next();
        auto n = node(Node::Kind::Attr);
        if (cur().kind == Token::Kind::Name) {
          n->str = cur().text;
          next();
          n->kids.push_back(std::move(e));
          e = finish(std::move(n));
        } else if (cur().kind == Token::Kind::Int) {
          auto it = node(Node::Kind::Item);
          auto key = node(Node::Kind::Literal);
          key->value = Value::integer(std::strtoll(cur().text.c_str(), nullptr, 10));
          next();
          it->kids.push_back(std::move(e));
          it->kids.push_back(std::move(key));
          e = finish(std::move(it));
        } else {
          error("expected an attribute name" + got());
        }
      } else if (is_op("[")) {
        next();
        e = finish(parse_subscript(std::move(e)));
      } else if (is_op("(")) {
        auto n = node(Node::Kind::Call);
        n->kids.push_back(std::move(e));
        parse_call_args(*n);
        e = finish(std::move(n));
      } else {
        return e;
      }
    }
  }

  NodePtr parse_subscript(NodePtr obj) {
    NodePtr parts[3];
    int idx = 0;
    bool is_slice = false;
    while (!is_op("]")) {
      if (is_op(":")) {
        is_slice = true;
        if (++idx > 2) error("too many ':' in slice");
        next();
        continue;
      }
      if (parts[idx]) error("expected ']'" + got());
      parts[idx] = parse_expression();
    }
    next();
    if (!is_slice) {
      if (!parts[0]) error("empty subscript");
      auto n = std::make_unique<Node>(Node::Kind::Item, obj->line);
      n->kids.push_back(std::move(obj));
      n->kids.push_back(std::move(parts[0]));
      return n;
    }
    auto n = std::make_unique<Node>(Node::Kind::Slice, obj->line);
    n->kids.push_back(std::move(obj));
    for (auto& x : parts) n->kids.push_back(std::move(x));
    return n;
  }

  NodePtr parse_filters(NodePtr e) {
    while (true) {
      if (is_op("|")) {
        next();
        auto n = node(Node::Kind::Filter);
        n->str = expect_name();
        while (is_op(".")) {
          next();
          n->str += "." + expect_name();
        }
        n->kids.push_back(std::move(e));
        if (is_op("(")) parse_call_args(*n);
        e = finish(std::move(n));
      } else if (is_name("is")) {
        next();
        auto n = node(Node::Kind::Test);
        if (is_name("not")) {
          n->negated = true;
          next();
        }
        n->str = expect_name();
        while (is_op(".")) {
          next();
          n->str += "." + expect_name();
        }
        n->kids.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*n);
        } else if ((cur().kind == Token::Kind::Name && cur().text != "else" && cur().text != "or" &&
                    cur().text != "and" && cur().text != "if" && cur().text != "is" && cur().text != "in" &&
                    cur().text != "not") ||
                   cur().kind == Token::Kind::String || cur().kind == Token::Kind::Int ||
                   cur().kind == Token::Kind::Float || is_op("[") || is_op("{")) {
          n->kids.push_back(parse_postfix(parse_primary()));
        }
        e = finish(std::move(n));
      } else {
        return e;
      }
    }
  }

  NodePtr literal(Value v) {
    auto n = node(Node::Kind::Literal);
    n->value = std::move(v);
    return n;
  }

  NodePtr parse_primary() {
    DepthGuard g(*this);
    const Token& tk = cur();
    switch (tk.kind) {
      case Token::Kind::Name: {
        std::string n = tk.text;
        if (n == "true" || n == "True") return next(), literal(Value::boolean(true));
        if (n == "false" || n == "False") return next(), literal(Value::boolean(false));
        if (n == "none" || n == "None") return next(), literal(Value::none());
        auto nm = node(Node::Kind::Name);
        nm->str = n;
        next();
        return nm;
      }
      case Token::Kind::String: {
        std::string s;
        int line = tk.line;
        while (cur().kind == Token::Kind::String) {
          s += cur().text;
          next();
        }
        auto n = literal(Value::string(std::move(s)));
        n->line = line;
        return n;
      }
      case Token::Kind::Int: {
        errno = 0;
        long long v = std::strtoll(tk.text.c_str(), nullptr, 10);
        if (errno == ERANGE) error("integer literal out of range");
        next();
        return literal(Value::integer(v));
      }
      case Token::Kind::Float: {
        double v = std::strtod(tk.text.c_str(), nullptr);
        next();
        return literal(Value::number(v));
      }
      case Token::Kind::Op:
        if (tk.text == "(") {
          next();
          if (is_op(")")) {
            next();
            auto empty = node(Node::Kind::ListLit);
            empty->is_tuple = true;
            return empty;
          }
          auto e = parse_expression();
          if (is_op(",")) {
            auto lst = node(Node::Kind::ListLit);
            lst->is_tuple = true;
            lst->kids.push_back(std::move(e));
            while (is_op(",")) {
              next();
              if (is_op(")")) break;
              lst->kids.push_back(parse_expression());
            }
            e = finish(std::move(lst));
          }
          expect_op(")");
          return e;
        }
        if (tk.text == "[") {
          auto lst = node(Node::Kind::ListLit);
          next();
          while (!is_op("]")) {
            if (!lst->kids.empty()) {
              expect_op(",");
              if (is_op("]")) break;
            }
            lst->kids.push_back(parse_expression());
          }
          next();
          return finish(std::move(lst));
        }
        if (tk.text == "{") {
          auto d = node(Node::Kind::DictLit);
          next();
          while (!is_op("}")) {
            if (!d->kids.empty()) {
              expect_op(",");
              if (is_op("}")) break;
            }
            d->kids.push_back(parse_expression());
            expect_op(":");
            d->kids.push_back(parse_expression());
          }
          next();
          return finish(std::move(d));
        }
        break;
      default: break;
    }
    error("unexpected token" + got());
  }
};

}  // namespace

NodePtr parse(const std::vector<Token>& tokens) {
  Parser ps{tokens};
  auto root = ps.parse_body({});
  return root;
}

}  // namespace lily::jinja
