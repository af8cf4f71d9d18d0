// JSON string escaping as Python's json.dumps(ensure_ascii=False) writes it (no quotes added): \" \\ \n \r \t
// \b \f, the other controls below U+0020 as \u00xx (lower-case hex), everything else verbatim. Used by the
// Jinja `tojson` filter and the tool-call `arguments` writer, whose output must match the reference byte for byte.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace lily {

// Appends the escaped form of `utf8` (bytes >= 0x80 are copied as they are).
void append_json_escaped(std::string& out, std::string_view utf8);
// Appends the escaped form of one code point; a surrogate (which has no UTF-8 form) is written as \udxxx.
void append_json_escaped_cp(std::string& out, uint32_t cp);

}  // namespace lily
