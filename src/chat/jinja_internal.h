// Interfaces shared by the Jinja evaluator (jinja_eval.cpp) and its builtins (jinja_builtins.cpp): attribute
// and item lookup with Jinja2's sandboxed semantics, filters, tests, global functions, Python operators.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "chat/jinja.h"

namespace lily::jinja {

// Budget shared by a render: output/string sizes and evaluation steps. It also holds the namespaces the render
// creates: namespaces are the only mutable values, so only they can form reference cycles (`{% set ns.self = ns
// %}`); their contents are dropped when the render ends, so a cycle does not outlive it (found by fuzz_jinja as
// a leak).
struct Budget {
  Limits limits;
  uint64_t steps = 0;
  std::vector<std::shared_ptr<DictItems>> namespaces;
  Budget() = default;
  Budget(const Budget&) = delete;
  Budget& operator=(const Budget&) = delete;
  ~Budget() {
    for (auto& d : namespaces) d->clear();
  }
  void step() {
    if (++steps > limits.max_steps) throw_error("template evaluation exceeded the step limit");
  }
  void check_size(size_t bytes) const {
    if (bytes > limits.max_output_bytes) throw_error("template output exceeded the size limit");
  }
};

// obj.name (Jinja2 getattr: Python attribute first, then item) and obj[key] (item first, then attribute).
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// Python binary operators (+ - * / // % **) and unary minus/plus.
Value binary_op(const std::string& op, const Value& a, const Value& b, Budget& budget);
Value unary_op(const std::string& op, const Value& a);

bool has_filter(const std::string& name);
bool has_test(const std::string& name);
Value apply_filter(const std::string& name, const Value& v, Args& args, Budget& budget);
bool apply_test(const std::string& name, const Value& v, Args& args);

// Global functions: namespace, range, dict, raise_exception, strftime_now.
void add_globals(DictItems& globals, Budget& budget);

// Python str methods used as functions by filters (code-point based).
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);
std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count,
                       Budget* budget);

}  // namespace lily::jinja
