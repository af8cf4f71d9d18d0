// Front ends that build grammar IR: regular expressions, GBNF text grammars, JSON Schema.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"

namespace lily::grammar {

// Regex subset (ECMAScript syntax): literals, `.`, classes `[a-z]` `[^...]`, escapes \d \w \s \D \W \S \n \t \r
// \f \v \0 \xHH \uHHHH and escaped punctuation, groups `( )` `(?: )` `(?<name> )`, alternation `|`, quantifiers
// `* + ? {n} {n,} {n,m}` (lazy forms match the same language), `^` only at the start and `$` only at the end.
// Not supported (GrammarError): backreferences, lookaround, \b \B, flags.
// In a JSON string (json_string = true) the pattern matches the decoded string: a literal `"` or `\` is written
// escaped, and classes / `.` never produce `"`, `\` or control characters (they would need escapes). Without
// `^` the match may start anywhere, without `$` it may end anywhere (JSON Schema semantics) when `search`.
uint32_t add_regex(Grammar& g, std::string_view pattern, const std::string& name, bool json_string, bool search);
// A grammar whose language is exactly the regex (full match; `^`/`$` optional).
Grammar regex_grammar(std::string_view pattern);

// GBNF (llama.cpp's grammar format): `name ::= alternatives` rules, root rule `root`; "literals" with \n \t \r
// \\ \" \xHH \uHHHH \UHHHHHHHH escapes, [classes], `.` (any character), ( groups ), `|`, `* + ? {m} {m,} {m,n}`,
// `#` comments, and `<[ID]>` for one token by id (special tokens such as <tool_call>).
Grammar gbnf_grammar(std::string_view text);

class SchemaCompiler;
// Adds JSON Schema rules to a grammar (several schemas may share one builder: common rules are built once).
class JsonSchemaBuilder {
 public:
  explicit JsonSchemaBuilder(Grammar& g);
  ~JsonSchemaBuilder();
  // A rule for JSON values valid under `root` (the document $ref resolves against); `path` names it in errors.
  uint32_t value(const nlohmann::ordered_json& root, const std::string& path);
  // The same for a subschema of `root`.
  uint32_t value_in(const nlohmann::ordered_json& root, const nlohmann::ordered_json& schema, const std::string& path);
  // A rule for the raw (unquoted, unescaped) text of a string valid under `schema`: tool-call parameters.
  uint32_t raw_string(const nlohmann::ordered_json& schema, const nlohmann::ordered_json& root, const std::string& path);
  uint32_t any_object();
  Seq ws();  // optional whitespace between JSON tokens (bounded)

 private:
  std::unique_ptr<SchemaCompiler> impl_;
};

// JSON Schema → grammar for one JSON value (leading whitespace allowed). Throws GrammarError naming the keyword and its schema path for
// anything it cannot enforce. See docs/structured_output.md for the supported subset.
Grammar json_schema_grammar(const nlohmann::ordered_json& schema);
// Any JSON object (response_format json_object).
Grammar json_object_grammar();

}  // namespace lily::grammar
