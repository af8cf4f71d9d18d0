// Runtime values of the Jinja interpreter (src/chat/jinja_*.cpp), with Python semantics: the chat templates are
// written for Python's Jinja2 as configured by transformers, so str(), repr(), ==, truthiness, json.dumps and
// the str methods follow CPython. Strings are UTF-8; operations that Python defines on code points (len,
// slicing, strip) decode them. Lists and dicts are shared by reference, like Python objects.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/check.h"

namespace lily::jinja {

// Every failure while parsing or rendering a template: syntax errors, Python TypeErrors, undefined access,
// and raise_exception(msg) (then what() is exactly msg).
struct TemplateError : lily::Error {
  using lily::Error::Error;
};

[[noreturn]] void throw_error(const std::string& msg);

struct Value;
struct Args;
using ValueList = std::vector<Value>;
using DictItems = std::vector<std::pair<std::string, Value>>;  // insertion order, unique keys
using NativeFn = std::function<Value(Args&)>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<const std::string> s;  // String
  std::shared_ptr<ValueList> list;       // List
  bool tuple = false;                    // List: a Python tuple (repr "(1, 2)"; never equal to a list)
  std::shared_ptr<DictItems> dict;       // Dict and Namespace attributes
  std::shared_ptr<NativeFn> fn;          // Callable
  std::string name;                      // Undefined: the missing name (for messages); Callable: its name
  std::string hint;                      // Undefined: the message raised where Jinja rejects it (else "'name' is undefined")

  static Value undefined(std::string name = "", std::string hint = "");
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value make_list(ValueList v = {});
  static Value make_tuple(ValueList v);
  static Value make_dict(DictItems v = {});
  static Value namespace_(DictItems v = {});
  static Value callable(std::string name, NativeFn f);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }
  const std::string& str() const { return *s; }

  // Dict/namespace lookup; nullptr when absent.
  const Value* find(std::string_view key) const;
  void set_item(const std::string& key, Value v);
};

// Call arguments: positional then keyword.
struct Args {
  ValueList pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Python-style binding of parameter `index`/`name`: positional first, then keyword, else `def`.
  const Value* get(size_t index, std::string_view name) const;
  Value get_or(size_t index, std::string_view name, Value def) const;
  void expect_at_most(size_t n, std::string_view what) const;
};

// Python semantics.
bool truthy(const Value& v);
std::string type_name(const Value& v);         // Python's type name: 'str', 'int', 'NoneType', ...
std::string to_str(const Value& v);            // str(v); Undefined renders as ""
std::string repr(const Value& v);              // repr(v)
std::string float_repr(double d);              // repr(float): shortest round-trip, '1.0', '1e+16'
bool equals(const Value& a, const Value& b);   // a == b
int compare(const Value& a, const Value& b, std::string_view op);  // <0, 0, >0; TypeError if unordered
bool contains(const Value& container, const Value& item);          // item in container
int64_t length(const Value& v);                // len(v); TypeError if unsized
ValueList iterate(const Value& v);             // list(v): list items, dict keys, string chars; Undefined → []
[[noreturn]] void raise_undefined(const Value& v);  // UndefinedError for a use of `v` that Jinja rejects

// transformers' tojson: json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...)
std::string to_json(const Value& v, int indent = -1, bool sort_keys = false,
                    std::string_view item_sep = "", std::string_view key_sep = "");

// Conversions with nlohmann::ordered_json (object key order preserved both ways).
Value from_json(const nlohmann::ordered_json& j);

// UTF-8 helpers: code points of a string (invalid bytes map to U+FFFD-like single units) and back.
std::vector<char32_t> decode_utf8(std::string_view s);
std::string encode_utf8(const std::vector<char32_t>& cps, size_t begin = 0, size_t end = SIZE_MAX);
void append_utf8(std::string& out, char32_t cp);
bool is_py_space(char32_t c);                  // str.isspace()

}  // namespace lily::jinja
