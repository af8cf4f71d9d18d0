// Tool-call argument values (docs/chat.md §3.4): the declared JSON-schema type of each tool parameter, conversion of
// a raw generated value to JSON by that type, and the Python-style JSON writer used for `arguments`
// (`json.dumps(x, ensure_ascii=False)`: keys in order, separators ", " and ": ", non-ASCII unescaped).
// Also the UTF-8 sanitiser shared by every text the output parser emits (invalid bytes -> U+FFFD), written so
// that sanitising a text piecewise at the boundaries it reports gives the same bytes as sanitising it whole.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "util/json_escape.h"
#include "util/utf8.h"

namespace lily::chat {

using OrderedJson = nlohmann::ordered_json;

// Allowed JSON types of one parameter, as a bit set. `none` = no usable type declared (unknown key/type).
struct ParamType {
  enum : uint8_t { string = 1, integer = 2, number = 4, boolean = 8, object = 16, array = 32, null = 64 };
  uint8_t mask = 0;

  bool known() const { return mask != 0; }
  bool allows(uint8_t t) const { return (mask & t) != 0; }
  // Exactly `string` (not nullable, not a union): such values stream as they arrive.
  bool pure_string() const { return mask == string; }
};

// The parameter types of one tool (`tools[].function.parameters.properties`), keyed by parameter name.
struct ToolSchema {
  bool has_properties = false;                 // false: keys are not checked, every type is unknown
  std::map<std::string, ParamType> params;     // parameter name -> declared type
};

// Every tool of a request, keyed by function name.
struct ToolSet {
  std::map<std::string, ToolSchema> tools;
  size_t max_name_len = 0;                     // longest tool name, bounds the bare-call look-ahead

  // From the request's `tools` array (OpenAI objects {"type":"function","function":{name, parameters}} or bare
  // {name, parameters}). Entries without a string name are skipped; never throws on odd schemas.
  static ToolSet from_json(const OrderedJson& tools);
  const ToolSchema* find(std::string_view name) const;
};

// Type of one JSON-schema node: `type` (string or array, aliases like "int", "str", "dict"), `anyOf`/`oneOf`
// members, `enum` values. Returns mask 0 when nothing usable is declared.
ParamType param_type_from_schema(const OrderedJson& schema);

// §3.4: converts the stripped raw value `s` by its declared type (pass ParamType{} for unknown keys).
OrderedJson convert_value(std::string_view s, ParamType type);

// JSON parse that refuses nesting deeper than 64 (the writer recurses). False on any error.
bool parse_json_limited(std::string_view s, OrderedJson& out);

// Parses a Python literal subset (None, True, False, numbers, '...'/"..." strings, lists, tuples, dicts).
// Returns false on anything else. Depth-limited.
bool parse_python_literal(std::string_view s, OrderedJson& out);

// Python `json.dumps(v, ensure_ascii=False)`: ordered keys, ", " / ": ", floats as Python repr, non-finite -> null.
std::string python_json_dumps(const OrderedJson& v);
// JSON string escaping: util/json_escape.h. UTF-8 sanitising (a maximal invalid subpart, or an incomplete
// tail, becomes one U+FFFD): util/utf8.h's utf8_lossy.
// The largest prefix length of `data` after which no incomplete-but-valid sequence is left (the rest may still
// be completed by later bytes).
inline size_t utf8_split(std::string_view data) { return data.size() - utf8_incomplete_tail(data); }

// Incremental sanitiser: feed bytes, get back only complete, valid UTF-8; `flush` ends the text.
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);
  std::string flush();

 private:
  std::string tail_;  // incomplete sequence held back, [0, 3] bytes
};

}  // namespace lily::chat
