// Lexer tokens and the syntax tree of the Jinja interpreter. One Node type with a kind tag keeps the parser
// and the evaluator (jinja_parser.cpp, jinja_eval.cpp) small; the meaning of `kids` is listed per kind.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "chat/jinja_value.h"

namespace lily::jinja {

struct Token {
  enum class Kind { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
  Kind kind;
  std::string text;  // Text: data; Name: identifier; String: unescaped value; Op: the operator; numbers: literal
  int line = 1;
};

// Splits a template into tokens with transformers' environment: trim_blocks, lstrip_blocks, `-` and `+`
// whitespace control, comments dropped, a single trailing newline removed.
std::vector<Token> tokenize(const std::string& src);

struct Node;
using NodePtr = std::unique_ptr<Node>;

struct Node {
  enum class Kind {
    // statements
    Template,  // kids: body statements
    Text,      // str: the data
    Output,    // kids[0]: expression
    If,        // kids: cond0, body0 (a Template node), cond1, body1, ..., [else body]; has_else
    For,       // targets (names); kids: iterable, body, else-body (maybe empty Template), [filter cond]
    Set,       // targets or (name, attr); kids[0]: value, or kids[0]: body when block set
    Macro,     // str: name; params; kids: defaults (nullptr when none)…, body last
    Break,
    Continue,
    // expressions
    Literal,   // value
    Name,      // str
    ListLit,   // kids: items
    DictLit,   // kids: key0, val0, key1, val1, ...
    Attr,      // kids[0]: object; str: attribute
    Item,      // kids[0]: object, kids[1]: key
    Slice,     // kids[0]: object, kids[1..3]: start/stop/step (nullptr when absent)
    Call,      // kids[0]: callee, kids[1..]: positional; kw_names + kw_values: keywords
    Filter,    // str: filter name; kids[0]: operand, then args like Call
    Test,      // str: test name; negated; kids[0]: operand, kids[1..]: args
    Unary,     // str: "not" | "-" | "+"; kids[0]
    Binary,    // str: operator (+ - * / // % ** ~ and or); kids[0], kids[1]
    Compare,   // kids[0]: first operand; ops[i] with kids[i+1] (chained, Python semantics)
    Cond,      // kids: then, cond, else (nullptr when absent)
  };
  Kind kind;
  int line = 0;
  int height = 1;  // expression height (bounded by the parser)
  std::string str;
  Value value;
  bool has_else = false;
  bool negated = false;
  bool is_tuple = false;  // ListLit written as a tuple: (a, b) or a, b
  std::vector<std::string> targets;  // For/Set: assigned names; Set attribute form: {name, attr}, attr_set
  bool attr_set = false;
  std::vector<std::string> params;  // Macro parameter names
  std::vector<std::string> ops;     // Compare operators
  std::vector<std::string> kw_names;
  std::vector<NodePtr> kw_values;
  std::vector<NodePtr> kids;

  Node(Kind k, int l) : kind(k), line(l) {}
};

NodePtr parse(const std::vector<Token>& tokens);

}  // namespace lily::jinja
