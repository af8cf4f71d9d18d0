// Tool-call argument values (chat.md §3.4): the declared JSON-schema type of each tool parameter, conversion of
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
std::string dump_json(const OrderedJson& v);
// JSON string escaping of valid UTF-8 (no quotes added): \" \\ \n \r \t \b \f, other controls as \u00XX.
void append_json_escaped(std::string& out, std::string_view utf8);

// UTF-8 sanitising. Decoding walks sequences from `data[0]`; a maximal invalid subpart becomes one U+FFFD.
// `utf8_split` returns the largest prefix length that ends on a sequence boundary and after which no
// incomplete-but-valid sequence is left (the rest may still be completed by later bytes).
size_t utf8_split(std::string_view data);
// Appends `data` with invalid sequences replaced by U+FFFD (an incomplete tail is replaced too).
void append_utf8_sanitized(std::string& out, std::string_view data);
std::string utf8_sanitized(std::string_view data);

// Incremental sanitiser: feed bytes, get back only complete, valid UTF-8; `flush` ends the text.
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);
  std::string flush();

 private:
  std::string tail_;  // incomplete sequence held back, [0, 3] bytes
};

}  // namespace lily::chat
