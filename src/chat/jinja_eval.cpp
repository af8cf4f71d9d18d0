// Tree-walking evaluator of the Jinja AST with Jinja2's scoping: a for-loop iteration and a macro call get
// their own frame (assignments inside them do not leak out), if-blocks do not; names resolve innermost first,
// then the template's globals, then the builtin functions.
#include <algorithm>

#include "chat/jinja_ast.h"
#include "chat/jinja_internal.h"

namespace lily::jinja {
namespace {

using Frame = std::vector<std::pair<std::string, Value>>;

enum class Flow { Normal, Break, Continue };

struct Evaluator {
  Budget budget;
  std::vector<Frame*> scopes;  // scopes[0]: template globals
  Frame builtins;
  int call_depth = 0;
  int loop_depth = 0;
  int nesting = 0;  // eval / exec frames on the stack (Limits::max_nesting)

  struct Nest {
    Evaluator& e;
    explicit Nest(Evaluator& x) : e(x) {
      if (++e.nesting > e.budget.limits.max_nesting) {
        --e.nesting;
        throw_error("template nested too deeply when rendered (over " + std::to_string(e.budget.limits.max_nesting) +
                    " levels of expressions and statements)");
      }
    }
    ~Nest() { --e.nesting; }
  };

  Value lookup(const std::string& name) const {
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it)
      for (const auto& [k, v] : **it)
        if (k == name) return v;
    for (const auto& [k, v] : builtins)
      if (k == name) return v;
    return Value::undefined(name);
  }

  static void assign(Frame& f, const std::string& name, Value v) {
    for (auto& [k, old] : f)
      if (k == name) {
        old = std::move(v);
        return;
      }
    f.emplace_back(name, std::move(v));
  }

  void assign_targets(Frame& f, const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      assign(f, targets[0], v);
      return;
    }
    ValueList items = iterate(v);
    if (items.size() != targets.size())
      throw_error("cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()) +
                  " names");
    for (size_t k = 0; k < targets.size(); ++k) assign(f, targets[k], items[k]);
  }

  void emit(std::string& out, const std::string& s) {
    out += s;
    budget.check_size(out.size());
  }

  // ---- statements ----

  Flow exec_body(const Node& body, std::string& out) {
    for (const auto& st : body.kids) {
      Flow f = exec(*st, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Node& n, std::string& out) {
    budget.step();
    const Nest nest(*this);
    switch (n.kind) {
      case Node::Kind::Template: return exec_body(n, out);
      case Node::Kind::Text: emit(out, n.str); return Flow::Normal;
      case Node::Kind::Output: emit(out, to_str(eval(*n.kids[0]))); return Flow::Normal;
      case Node::Kind::If: {
        size_t k = 0;
        for (; k + 1 < n.kids.size(); k += 2)
          if (truthy(eval(*n.kids[k]))) return exec_body(*n.kids[k + 1], out);
        if (n.has_else) return exec_body(*n.kids.back(), out);
        return Flow::Normal;
      }
      case Node::Kind::For: return exec_for(n, out);
      case Node::Kind::Set: {
        Frame& f = *scopes.back();
        if (n.attr_set) {
          Value ns = lookup(n.targets[0]);
          if (ns.kind != Value::Kind::Namespace)
            throw_error("can only assign attributes on namespace objects ('" + n.targets[0] + "' is " +
                        type_name(ns) + ")");
          ns.set_item(n.targets[1], eval(*n.kids[0]));
        } else if (n.has_else) {
          std::string captured;
          exec_body(*n.kids[0], captured);
          budget.check_size(out.size() + captured.size());
          assign(f, n.targets[0], Value::string(std::move(captured)));
        } else {
          assign_targets(f, n.targets, eval(*n.kids[0]));
        }
        return Flow::Normal;
      }
      case Node::Kind::Macro: {
        assign(*scopes.back(), n.str, make_macro(n));
        return Flow::Normal;
      }
      case Node::Kind::Break:
      case Node::Kind::Continue:
        if (loop_depth == 0) throw_error(std::string("'") + (n.kind == Node::Kind::Break ? "break" : "continue") +
                                         "' outside of a loop");
        return n.kind == Node::Kind::Break ? Flow::Break : Flow::Continue;
      default: throw_error("internal: expression used as statement");
    }
  }

  Flow exec_for(const Node& n, std::string& out) {
    ValueList items = iterate(eval(*n.kids[0]));
    const Node* filter = n.kids.size() > 3 ? n.kids[3].get() : nullptr;
    if (filter) {
      ValueList kept;
      for (auto& it : items) {
        Frame f;
        assign_targets(f, n.targets, it);
        scopes.push_back(&f);
        bool keep = truthy(eval(*filter));
        scopes.pop_back();
        if (keep) kept.push_back(std::move(it));
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec_body(*n.kids[2], out);
    const int64_t len = static_cast<int64_t>(items.size());
    ++loop_depth;
    for (int64_t k = 0; k < len; ++k) {
      budget.step();
      Frame f;
      DictItems loop{
          {"index0", Value::integer(k)},
          {"index", Value::integer(k + 1)},
          {"revindex0", Value::integer(len - k - 1)},
          {"revindex", Value::integer(len - k)},
          {"first", Value::boolean(k == 0)},
          {"last", Value::boolean(k == len - 1)},
          {"length", Value::integer(len)},
          {"depth", Value::integer(1)},
          {"depth0", Value::integer(0)},
          {"previtem", k > 0 ? items[k - 1] : Value::undefined("previtem", "there is no previous item")},
          {"nextitem", k + 1 < len ? items[k + 1] : Value::undefined("nextitem", "there is no next item")},
      };
      loop.emplace_back("cycle", Value::callable("loop.cycle", [k](Args& a) {
                          if (a.pos.empty()) throw_error("no items for cycling given");
                          return a.pos[static_cast<size_t>(k) % a.pos.size()];
                        }));
      Value lv = Value::namespace_(std::move(loop));
      lv.name = "LoopContext";
      f.emplace_back("loop", lv);
      assign_targets(f, n.targets, items[k]);
      scopes.push_back(&f);
      Flow fl;
      try {
        fl = exec_body(*n.kids[1], out);
      } catch (...) {
        scopes.pop_back();
        --loop_depth;
        throw;
      }
      scopes.pop_back();
      if (fl == Flow::Break) break;
    }
    --loop_depth;
    return Flow::Normal;
  }

  Value make_macro(const Node& n) {
    const Node* node = &n;
    return Value::callable(n.str, [this, node](Args& a) -> Value {
      const auto& params = node->params;
      if (a.pos.size() > params.size())
        throw_error("macro '" + node->str + "' takes not more than " + std::to_string(params.size()) +
                    " argument(s)");
      if (++call_depth > budget.limits.max_call_depth) {
        --call_depth;
        throw_error("macro calls nested too deeply");
      }
      Frame f;
      std::vector<Frame*> saved;
      saved.swap(scopes);
      scopes.push_back(saved.front());
      scopes.push_back(&f);
      int saved_loops = loop_depth;
      loop_depth = 0;
      std::string out;
      try {
        for (size_t k = 0; k < params.size(); ++k) {
          if (const Value* v = a.get(k, params[k])) {
            assign(f, params[k], *v);
          } else if (node->kids[k]) {
            assign(f, params[k], eval(*node->kids[k]));
          } else {
            assign(f, params[k], Value::undefined(params[k]));
          }
        }
        for (const auto& [kname, kv] : a.kw)
          if (std::find(params.begin(), params.end(), kname) == params.end())
            throw_error("macro '" + node->str + "' takes no keyword argument '" + kname + "'");
        exec_body(*node->kids.back(), out);
      } catch (...) {
        scopes.swap(saved);
        loop_depth = saved_loops;
        --call_depth;
        throw;
      }
      scopes.swap(saved);
      loop_depth = saved_loops;
      --call_depth;
      return Value::string(std::move(out));
    });
  }

  // ---- expressions ----

  Args eval_args(const Node& n, size_t first_pos) {
    Args a;
    for (size_t k = first_pos; k < n.kids.size(); ++k) a.pos.push_back(eval(*n.kids[k]));
    for (size_t k = 0; k < n.kw_names.size(); ++k) a.kw.emplace_back(n.kw_names[k], eval(*n.kw_values[k]));
    return a;
  }

  Value eval(const Node& n) {
    budget.step();
    const Nest nest(*this);
    switch (n.kind) {
      case Node::Kind::Literal: return n.value;
      case Node::Kind::Name: return lookup(n.str);
      case Node::Kind::ListLit: {
        ValueList items;
        for (const auto& k : n.kids) items.push_back(eval(*k));
        return n.is_tuple ? Value::make_tuple(std::move(items)) : Value::make_list(std::move(items));
      }
      case Node::Kind::DictLit: {
        Value d = Value::make_dict();
        for (size_t k = 0; k + 1 < n.kids.size(); k += 2) {
          Value key = eval(*n.kids[k]);
          if (!key.is_string()) throw_error("dict keys must be strings, got " + type_name(key));
          d.set_item(key.str(), eval(*n.kids[k + 1]));
        }
        return d;
      }
      case Node::Kind::Attr: return get_attr(eval(*n.kids[0]), n.str);
      case Node::Kind::Item: return get_item(eval(*n.kids[0]), eval(*n.kids[1]));
      case Node::Kind::Slice: {
        Value obj = eval(*n.kids[0]);
        auto opt = [&](size_t k) { return n.kids[k] ? eval(*n.kids[k]) : Value::none(); };
        return slice(obj, opt(1), opt(2), opt(3));
      }
      case Node::Kind::Call: {
        Value callee = eval(*n.kids[0]);
        Args a = eval_args(n, 1);
        if (callee.kind != Value::Kind::Callable) {
          if (callee.is_undefined()) raise_undefined(callee);
          throw_error("'" + type_name(callee) + "' object is not callable");
        }
        return (*callee.fn)(a);
      }
      case Node::Kind::Filter: {
        Value v = eval(*n.kids[0]);
        Args a = eval_args(n, 1);
        return apply_filter(n.str, v, a, budget);
      }
      case Node::Kind::Test: {
        Value v = eval(*n.kids[0]);
        Args a = eval_args(n, 1);
        return Value::boolean(apply_test(n.str, v, a) != n.negated);
      }
      case Node::Kind::Unary: {
        Value v = eval(*n.kids[0]);
        if (n.str == "not") return Value::boolean(!truthy(v));
        return unary_op(n.str, v);
      }
      case Node::Kind::Binary: {
        if (n.str == "and") {
          Value a = eval(*n.kids[0]);
          return truthy(a) ? eval(*n.kids[1]) : a;
        }
        if (n.str == "or") {
          Value a = eval(*n.kids[0]);
          return truthy(a) ? a : eval(*n.kids[1]);
        }
        Value a = eval(*n.kids[0]);
        Value b = eval(*n.kids[1]);
        if (n.str == "~") {
          std::string s = to_str(a);
          s += to_str(b);
          budget.check_size(s.size());
          return Value::string(std::move(s));
        }
        return binary_op(n.str, a, b, budget);
      }
      case Node::Kind::Compare: {
        Value left = eval(*n.kids[0]);
        for (size_t k = 0; k < n.ops.size(); ++k) {
          Value right = eval(*n.kids[k + 1]);
          const std::string& op = n.ops[k];
          bool r;
          if (op == "==") r = equals(left, right);
          else if (op == "!=") r = !equals(left, right);
          else if (op == "in") r = contains(right, left);
          else if (op == "not in") r = !contains(right, left);
          else {
            int c = compare(left, right, op);
            r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
          }
          if (!r) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Node::Kind::Cond: {
        if (truthy(eval(*n.kids[1]))) return eval(*n.kids[0]);
        return n.kids[2] ? eval(*n.kids[2]) : Value::undefined();
      }
      default: throw_error("internal: statement used as expression");
    }
  }
};

// Rejects unknown filter and test names at load time, as Jinja2 does when compiling.
void validate(const Node& n) {
  if (n.kind == Node::Kind::Filter && !has_filter(n.str)) throw_error("no filter named '" + n.str + "'");
  if (n.kind == Node::Kind::Test && !has_test(n.str)) throw_error("no test named '" + n.str + "'");
  for (const auto& k : n.kids)
    if (k) validate(*k);
  for (const auto& k : n.kw_values)
    if (k) validate(*k);
}

}  // namespace

Template::Template(const std::string& source) {
  auto tokens = tokenize(source);
  root_ = std::shared_ptr<Node>(parse(tokens).release());
  validate(*root_);
}

std::string Template::render(const Value& context, const Limits& limits) const {
  Evaluator ev;
  ev.budget.limits = limits;
  add_globals(ev.builtins, ev.budget);
  Frame globals;
  if (context.is_dict())
    for (const auto& [k, v] : *context.dict) globals.emplace_back(k, v);
  ev.scopes.push_back(&globals);
  std::string out;
  ev.exec(*root_, out);
  return out;
}

std::string Template::render(const nlohmann::ordered_json& context, const Limits& limits) const {
  return render(from_json(context), limits);
}

}  // namespace lily::jinja
