// Tool-call value conversion (docs/chat.md §3.4, row by row), schema type extraction, the Python-style JSON writer,
// the Python-literal subset, and the UTF-8 sanitiser (piecewise == whole, property-tested on random bytes).
#include <gtest/gtest.h>

#include <random>

#include "chat/tool_values.h"

namespace lily::chat {
namespace {

ParamType type_of(const char* schema_json) { return param_type_from_schema(OrderedJson::parse(schema_json)); }

// Converts `s` under the schema and returns the JSON text.
std::string conv(std::string_view s, const char* schema_json) {
  return python_json_dumps(convert_value(s, type_of(schema_json)));
}

TEST(ToolValues, SchemaTypes) {
  EXPECT_EQ(type_of(R"({"type": "string"})").mask, ParamType::string);
  for (const char* t : {"str", "text", "varchar", "char", "STRING"})
    EXPECT_EQ(type_of((std::string(R"({"type": ")") + t + "\"}").c_str()).mask, ParamType::string) << t;
  for (const char* t : {"integer", "int", "int64", "uint8", "long", "short", "unsigned"})
    EXPECT_EQ(type_of((std::string(R"({"type": ")") + t + "\"}").c_str()).mask, ParamType::integer) << t;
  for (const char* t : {"number", "num", "float", "float32", "double"})
    EXPECT_EQ(type_of((std::string(R"({"type": ")") + t + "\"}").c_str()).mask, ParamType::number) << t;
  for (const char* t : {"boolean", "bool", "binary"})
    EXPECT_EQ(type_of((std::string(R"({"type": ")") + t + "\"}").c_str()).mask, ParamType::boolean) << t;
  for (const char* t : {"object", "dict", "dictionary"})
    EXPECT_EQ(type_of((std::string(R"({"type": ")") + t + "\"}").c_str()).mask, ParamType::object) << t;
  for (const char* t : {"array", "list", "arr"})
    EXPECT_EQ(type_of((std::string(R"({"type": ")") + t + "\"}").c_str()).mask, ParamType::array) << t;
  EXPECT_EQ(type_of(R"({"enum": ["a", "b"]})").mask, ParamType::string);
  EXPECT_EQ(type_of(R"({"type": ["integer", "null"]})").mask, ParamType::integer | ParamType::null);
  EXPECT_EQ(type_of(R"({"anyOf": [{"type": "array"}, {"type": "null"}]})").mask, ParamType::array | ParamType::null);
  EXPECT_EQ(type_of(R"({"oneOf": [{"type": "number"}, {"type": "string"}]})").mask,
            ParamType::number | ParamType::string);
  EXPECT_EQ(type_of(R"({"description": "no type"})").mask, 0);
  EXPECT_EQ(type_of(R"({"type": "frobnicate"})").mask, 0);
  EXPECT_TRUE(type_of(R"({"type": "string"})").pure_string());
  EXPECT_FALSE(type_of(R"({"type": ["string", "null"]})").pure_string());
}

TEST(ToolValues, ToolSetFromRequest) {
  const auto set = ToolSet::from_json(OrderedJson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"name": "bare_form", "parameters": {"properties": {"x": {"type": "boolean"}}}},
    {"type": "function", "function": {"name": "no_params"}},
    {"type": "function", "function": {"name": 5}}, "junk"
  ])"));
  ASSERT_EQ(set.tools.size(), 3u);
  EXPECT_EQ(set.max_name_len, std::string("get_weather").size());
  ASSERT_NE(set.find("get_weather"), nullptr);
  EXPECT_TRUE(set.find("get_weather")->has_properties);
  EXPECT_EQ(set.find("get_weather")->params.at("days").mask, ParamType::integer);
  EXPECT_EQ(set.find("bare_form")->params.at("x").mask, ParamType::boolean);
  EXPECT_FALSE(set.find("no_params")->has_properties);
  EXPECT_EQ(set.find("missing"), nullptr);
  EXPECT_TRUE(ToolSet::from_json(OrderedJson::parse("{}")).tools.empty());
}

// §3.4 row: string — verbatim, never JSON-parsed.
TEST(ToolValues, RowString) {
  EXPECT_EQ(conv("42", R"({"type": "string"})"), R"("42")");
  EXPECT_EQ(conv(R"({"a": 1})", R"({"type": "str"})"), R"("{\"a\": 1}")");
  EXPECT_EQ(conv("null", R"({"type": "string"})"), R"("null")");
  EXPECT_EQ(conv("None", R"({"enum": ["x", "None"]})"), R"("None")");
  EXPECT_EQ(conv(" padded \n", R"({"type": "text"})"), R"(" padded \n")");
}

// §3.4 row: integer.
TEST(ToolValues, RowInteger) {
  const char* t = R"({"type": "integer"})";
  EXPECT_EQ(conv("42", t), "42");
  EXPECT_EQ(conv("-7", t), "-7");
  EXPECT_EQ(conv("+8", t), "8");
  EXPECT_EQ(conv(" 5 ", t), "5");
  EXPECT_EQ(conv("18446744073709551615", t), "18446744073709551615");
  EXPECT_EQ(conv("3.5", t), "3.5");   // not an integer but a number
  EXPECT_EQ(conv("1e3", t), "1000");  // integral number -> integer
  EXPECT_EQ(conv("abc", t), R"("abc")");
  EXPECT_EQ(conv("None", t), "null");
  EXPECT_EQ(conv("null", R"({"type": "int32"})"), "null");
}

// §3.4 row: number.
TEST(ToolValues, RowNumber) {
  const char* t = R"({"type": "number"})";
  EXPECT_EQ(conv("2.5", t), "2.5");
  EXPECT_EQ(conv("3", t), "3");
  EXPECT_EQ(conv("3.0", t), "3");
  EXPECT_EQ(conv("-0.125", t), "-0.125");
  EXPECT_EQ(conv("1e20", t), "1e+20");                        // |x| >= 2^53 stays a float
  EXPECT_EQ(conv("9007199254740993", t), "9007199254740992.0");  // 2^53 + 1 rounds; not < 2^53
  EXPECT_EQ(conv("1.5e-7", t), "1.5e-07");
  EXPECT_EQ(conv("inf", t), R"("inf")");
  EXPECT_EQ(conv("nan", t), R"("nan")");
  EXPECT_EQ(conv("1e999", t), R"("1e999")");
  EXPECT_EQ(conv("twelve", R"({"type": "float"})"), R"("twelve")");
}

// §3.4 row: boolean.
TEST(ToolValues, RowBoolean) {
  const char* t = R"({"type": "boolean"})";
  EXPECT_EQ(conv("true", t), "true");
  EXPECT_EQ(conv("True", t), "true");
  EXPECT_EQ(conv("FALSE", t), "false");
  EXPECT_EQ(conv("yes", t), R"("yes")");
  EXPECT_EQ(conv("1", R"({"type": "bool"})"), R"("1")");
  EXPECT_EQ(conv("None", t), "null");
}

// §3.4 row: object / array.
TEST(ToolValues, RowObjectArray) {
  EXPECT_EQ(conv(R"({"b":1,"a":[true,null,"é"]})", R"({"type": "object"})"), R"({"b": 1, "a": [true, null, "é"]})");
  EXPECT_EQ(conv("[1, 2.5, \"x\"]", R"({"type": "array"})"), R"([1, 2.5, "x"])");
  EXPECT_EQ(conv("{'a': None, 'b': (True, False), \"c\": 'it\\'s'}", R"({"type": "dict"})"),
            R"({"a": null, "b": [true, false], "c": "it's"})");
  EXPECT_EQ(conv(R"("{\"a\": 1}")", R"({"type": "object"})"), R"({"a": 1})");  // double-encoded
  EXPECT_EQ(conv("[1,", R"({"type": "list"})"), R"("[1,")");
  EXPECT_EQ(conv("None", R"({"type": "array"})"), "null");
}

// §3.4 row: null and nullable.
TEST(ToolValues, RowNull) {
  EXPECT_EQ(conv("anything", R"({"type": "null"})"), "null");
  EXPECT_EQ(conv("null", R"({"type": ["string", "null"]})"), "null");
  EXPECT_EQ(conv("None", R"({"type": ["string", "null"]})"), "null");
  EXPECT_EQ(conv("text", R"({"type": ["string", "null"]})"), R"("text")");
}

// §3.4 row: unions.
TEST(ToolValues, RowUnion) {
  const char* is = R"({"anyOf": [{"type": "integer"}, {"type": "string"}]})";
  EXPECT_EQ(conv("5", is), "5");
  EXPECT_EQ(conv("abc", is), R"("abc")");
  EXPECT_EQ(conv(R"("quoted")", is), R"("quoted")");
  EXPECT_EQ(conv("[1]", is), R"("[1]")");  // array not allowed -> string
  const char* an = R"({"anyOf": [{"type": "array"}, {"type": "null"}]})";
  EXPECT_EQ(conv("None", an), "null");
  EXPECT_EQ(conv("[\"a\"]", an), R"(["a"])");
  EXPECT_EQ(conv(R"("[\"a\", \"b\"]")", an), R"(["a", "b"])");  // double-encoded (vLLM #36032)
  EXPECT_EQ(conv("['a']", an), R"(["a"])");
  EXPECT_EQ(conv("not json", an), R"("not json")");
  const char* bi = R"({"type": ["boolean", "integer"]})";
  EXPECT_EQ(conv("True", bi), "true");
  EXPECT_EQ(conv("12", bi), "12");
  EXPECT_EQ(conv("2.0", R"({"type": ["integer", "boolean"]})"), "2.0");
  EXPECT_EQ(conv("2.5", R"({"type": ["integer", "boolean"]})"), R"("2.5")");
  EXPECT_EQ(conv("null", R"({"oneOf": [{"type": "integer"}, {"type": "string"}]})"), R"("null")");
}

// §3.4 row: key not in schema / unknown type.
TEST(ToolValues, RowUnknown) {
  EXPECT_EQ(python_json_dumps(convert_value(R"({"a": 1})", ParamType{})), R"({"a": 1})");
  EXPECT_EQ(python_json_dumps(convert_value("[1, 2]", ParamType{})), "[1, 2]");
  EXPECT_EQ(python_json_dumps(convert_value("5", ParamType{})), R"("5")");
  EXPECT_EQ(python_json_dumps(convert_value("true", ParamType{})), R"("true")");
  EXPECT_EQ(python_json_dumps(convert_value("{bad", ParamType{})), R"("{bad")");
  EXPECT_EQ(python_json_dumps(convert_value(" {\"a\": 1}", ParamType{})), R"(" {\"a\": 1}")");
}

TEST(ToolValues, DumpJsonIsPythonStyle) {
  const auto v = OrderedJson::parse(R"({"z": 1, "a": {"k": [1, 2]}, "s": "città \"q\" \u0001\t/", "e": []})");
  EXPECT_EQ(python_json_dumps(v), "{\"z\": 1, \"a\": {\"k\": [1, 2]}, \"s\": \"città \\\"q\\\" \\u0001\\t/\", \"e\": []}");
  EXPECT_EQ(python_json_dumps(OrderedJson::object()), "{}");
  // Python float repr.
  const std::pair<double, const char*> floats[] = {{0.1, "0.1"},        {2.5, "2.5"},       {1e16, "1e+16"},
                                                   {1e15, "1000000000000000.0"},           {1e-5, "1e-05"},
                                                   {0.0001, "0.0001"}, {-2.5, "-2.5"},     {1.5e300, "1.5e+300"},
                                                   {3.0, "3.0"},       {123.456, "123.456"}};
  for (auto [x, s] : floats) EXPECT_EQ(python_json_dumps(OrderedJson(x)), s) << x;
  EXPECT_EQ(python_json_dumps(OrderedJson(std::numeric_limits<double>::infinity())), "null");
}

TEST(ToolValues, PythonLiterals) {
  OrderedJson v;
  ASSERT_TRUE(parse_python_literal("[None, True, False, -3, 2.5, 'a\\n', \"b\", (1,), {'k': []}]", v));
  EXPECT_EQ(python_json_dumps(v), R"([null, true, false, -3, 2.5, "a\n", "b", [1], {"k": []}])");
  for (const char* bad : {"foo", "[1,", "{1: 2}", "'unterminated", "Nonesuch", "[1] 2", ""})
    EXPECT_FALSE(parse_python_literal(bad, v)) << bad;
  EXPECT_FALSE(parse_python_literal(std::string(200, '[') + std::string(200, ']'), v)) << "depth limit";
  OrderedJson deep;
  EXPECT_FALSE(parse_json_limited(std::string(200, '[') + std::string(200, ']'), deep));
  EXPECT_TRUE(parse_json_limited(std::string(60, '[') + std::string(60, ']'), deep));
}

TEST(ToolValues, Utf8Sanitizer) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy("plain é 東 🎉"), "plain é 東 🎉");
  EXPECT_EQ(utf8_lossy("a\xE4\xBD"), "a" + fffd);                         // incomplete tail
  EXPECT_EQ(utf8_lossy("\xE4\xBDx"), fffd + "x");                         // maximal subpart -> one U+FFFD
  EXPECT_EQ(utf8_lossy("\xC0\x80"), fffd + fffd);                         // overlong
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), fffd + fffd + fffd);              // surrogate
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);   // > U+10FFFF
  EXPECT_EQ(utf8_lossy("\xFF"), fffd);
  EXPECT_EQ(utf8_split("ab\xF0\x9F\x8E"), 2u);
  EXPECT_EQ(utf8_split("ab\xF0\x9F\x8E\x89"), 6u);
  EXPECT_EQ(utf8_split("ab\xF0\x41"), 4u);  // decided invalid: nothing to wait for
}

// Property: feeding random bytes to Utf8Stream in random pieces equals sanitising them whole.
TEST(ToolValues, Utf8StreamPiecewiseEqualsWhole) {
  std::mt19937 rng(1234);
  const unsigned char pool[] = {'a', ' ', 0x80, 0xBF, 0xC3, 0xA9, 0xE4, 0xBD, 0xA0, 0xF0, 0x9F, 0x8E, 0x89, 0xED,
                                0xA0, 0xF4, 0x90, 0xFF, 0xC0};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) s += static_cast<char>(pool[rng() % sizeof pool]);
    Utf8Stream stream;
    std::string out;
    for (size_t i = 0; i < s.size();) {
      const size_t k = 1 + rng() % 5;
      out += stream.push(s.substr(i, k));
      i += k;
    }
    out += stream.flush();
    ASSERT_EQ(out, utf8_lossy(s)) << "trial " << trial;
    ASSERT_EQ(utf8_lossy(out), out);
  }
}

}  // namespace
}  // namespace lily::chat
