// A Jinja2 interpreter for chat templates (lexer → AST → tree-walking evaluator), configured like transformers'
// apply_chat_template: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols),
// globals raise_exception and strftime_now, and a tojson filter equal to json.dumps(x, ensure_ascii=False)
// (", " / ": " separators, keys in insertion order, no HTML escaping). Values follow Python semantics
// (see jinja_value.h). Every failure, including raise_exception(msg), throws TemplateError.
//
// Known deviations from CPython: str.upper/lower/title/capitalize change ASCII letters only; integers are
// 64-bit (overflow is an error, not a bigint); '%' string formatting is not supported.
#pragma once
#include <memory>
#include <string>

#include "chat/jinja_value.h"

namespace lily::jinja {

struct Node;

// Bounds that keep hostile templates from hanging or exhausting memory; exceeding one is a TemplateError.
struct Limits {
  size_t max_output_bytes = size_t{256} << 20;  // rendered text, and any single string or list built
  uint64_t max_steps = 200'000'000;            // evaluated nodes (expressions, statements, loop iterations)
  int max_call_depth = 64;                     // nested macro calls
  int max_nesting = 512;                       // nested evaluations (expressions and statements, through macro
                                               // calls): the parser bounds one expression's height, this the
                                               // stack of a render (~5 KB a level under AddressSanitizer)
};

class Template {
 public:
  // Parses `source`; throws TemplateError on a syntax error or an unknown filter/test name.
  explicit Template(const std::string& source);
  // Renders with `context` (a Dict value: the template's variables).
  std::string render(const Value& context, const Limits& limits = {}) const;
  std::string render(const nlohmann::ordered_json& context, const Limits& limits = {}) const;

 private:
  std::shared_ptr<Node> root_;
};

}  // namespace lily::jinja
