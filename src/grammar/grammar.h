// The grammar IR shared by every front end (JSON Schema, GBNF, regex): a context-free grammar over bytes.
// A rule is a list of alternatives; an alternative is a sequence of elements: a byte class (one byte from a
// set), an optional byte class, a starred byte class (zero or more bytes from a set, kept inline so string bodies and whitespace stay
// inside their rule), a reference to a rule, or one special-token id (for <tool_call>-style added tokens that
// have no byte spelling in the grammar). Repetition of anything else becomes right-recursive helper rules,
// which the matcher runs as tail calls (constant stack). See docs/structured_output.md.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/check.h"

namespace lily::grammar {

// A grammar or schema the engine cannot compile. `keyword` and `path` name the offending schema keyword and
// its JSON pointer (JSON Schema), or are empty (GBNF / regex errors carry the position in the message).
struct GrammarError : lily::Error {
  std::string keyword, path;
  explicit GrammarError(const std::string& msg, std::string kw = {}, std::string p = {})
      : lily::Error(msg), keyword(std::move(kw)), path(std::move(p)) {}
};

using ByteSet = std::array<uint64_t, 4>;  // bit b set = byte b allowed
inline bool has(const ByteSet& s, uint8_t b) { return (s[b >> 6] >> (b & 63)) & 1; }
inline void add(ByteSet& s, uint8_t b) { s[b >> 6] |= uint64_t(1) << (b & 63); }
inline void add_range(ByteSet& s, uint8_t lo, uint8_t hi) {
  for (unsigned b = lo; b <= hi; ++b) add(s, uint8_t(b));
}

enum class Kind : uint8_t { bytes, star, opt, rule, token, end };
struct Elem {
  Kind kind;
  uint32_t arg;  // bytes/star/opt: index into Grammar::sets; rule: rule index; token: token id; end: 0
};
using Seq = std::vector<Elem>;

// Code-point ranges [lo, hi] (inclusive) of a character class.
using CpRanges = std::vector<std::pair<uint32_t, uint32_t>>;

struct Grammar {
  std::vector<std::string> names;        // [rule] for messages
  std::vector<std::vector<Seq>> rules;   // [rule][alternative] sequence of elements
  std::vector<ByteSet> sets;             // [set] byte classes referenced by bytes/star elements
  uint32_t root = 0;

  uint32_t add_rule(std::string name);   // a rule with no alternatives yet (to be filled; allows recursion)
  uint32_t rule(std::string name, std::vector<Seq> alts);  // add_rule + set alternatives
  uint32_t set_index(const ByteSet& s);  // deduplicated
  Elem bytes(const ByteSet& s) { return {Kind::bytes, set_index(s)}; }
  Elem byte(uint8_t b);
  Elem star(const ByteSet& s) { return {Kind::star, set_index(s)}; }
  // Zero or one byte from `s`. A run of opt elements matches up to run-length bytes; skipping one skips the rest
  // of the run (bounded whitespace without helper rules).
  Elem opt(const ByteSet& s) { return {Kind::opt, set_index(s)}; }
  static Elem ref(uint32_t rule) { return {Kind::rule, rule}; }
  static Elem token(int32_t id) { return {Kind::token, uint32_t(id)}; }
  void literal(Seq& out, std::string_view text);  // appends one single-byte element per byte
  Seq literal(std::string_view text) { Seq s; literal(s, text); return s; }
  // One UTF-8 encoded code point from `ranges` (surrogates excluded): a single byte class when every range is
  // ASCII, else a reference to a rule whose alternatives are the byte-range sequences.
  Elem utf8_class(const CpRanges& ranges, const std::string& name);
  // `ranges`* as elements to inline (a star for the ASCII part, looping through a helper rule for multi-byte).
  void utf8_star(Seq& out, const CpRanges& ranges, const std::string& name);
  // A rule matching `item` repeated min..max times (max < 0: unbounded). Bounded repetition expands into
  // max - min nested optional rules, so callers cap max (kMaxRepeat).
  uint32_t repeat(const Seq& item, int64_t min, int64_t max, const std::string& name);
  size_t elem_count() const;

 private:
  std::map<ByteSet, uint32_t> set_ids_;
};

constexpr int64_t kMaxRepeat = 1024;      // largest finite bound of a counted repetition
constexpr size_t kMaxElems = 1u << 20;    // grammar size limit (elements over all rules)

CpRanges negate(const CpRanges& ranges);  // complement within [0, 0x10FFFF]
CpRanges normalize(CpRanges ranges);      // sorted, merged

// Checks a finished grammar: every rule has an alternative, references are in range, no left recursion (the
// matcher expands rules eagerly, so a rule that can call itself without consuming a byte would not end).
void validate(const Grammar& g);

// The matcher's flat form: every alternative's elements back to back, each followed by an `end` element.
struct Flat {
  std::vector<Elem> elems;          // [position]
  std::vector<uint32_t> alt_begin;  // [rule + 1] index into alt_start; rule r's alternatives are
                                    // alt_start[alt_begin[r] .. alt_begin[r + 1])
  std::vector<uint32_t> alt_start;  // [alternative] first position
  std::vector<ByteSet> sets;
  uint32_t root = 0;
};
Flat flatten(const Grammar& g);

}  // namespace lily::grammar
