// Grammar IR builders (UTF-8 classes, repetition), validation and flattening.
#include "grammar/grammar.h"

#include <algorithm>
#include <functional>

namespace lily::grammar {

uint32_t Grammar::add_rule(std::string name) {
  names.push_back(std::move(name));
  rules.emplace_back();
  return uint32_t(rules.size() - 1);
}

uint32_t Grammar::rule(std::string name, std::vector<Seq> alts) {
  uint32_t r = add_rule(std::move(name));
  rules[r] = std::move(alts);
  return r;
}

uint32_t Grammar::set_index(const ByteSet& s) {
  auto [it, fresh] = set_ids_.emplace(s, uint32_t(sets.size()));
  if (fresh) sets.push_back(s);
  return it->second;
}

Elem Grammar::byte(uint8_t b) {
  ByteSet s{};
  add(s, b);
  return bytes(s);
}

void Grammar::literal(Seq& out, std::string_view text) {
  for (char c : text) out.push_back(byte(uint8_t(c)));
}

size_t Grammar::elem_count() const {
  size_t n = 0;
  for (const auto& r : rules)
    for (const auto& a : r) n += a.size() + 1;
  return n;
}

CpRanges normalize(CpRanges r) {
  std::sort(r.begin(), r.end());
  CpRanges out;
  for (auto [lo, hi] : r) {
    if (lo > hi) continue;
    if (!out.empty() && lo <= out.back().second + 1)
      out.back().second = std::max(out.back().second, hi);
    else
      out.push_back({lo, hi});
  }
  return out;
}

CpRanges negate(const CpRanges& ranges) {
  CpRanges out;
  uint32_t next = 0;
  for (auto [lo, hi] : normalize(ranges)) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
  return out;
}

namespace {

using ByteRangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;

int utf8_encode(uint32_t cp, uint8_t* b) {
  if (cp < 0x80) { b[0] = uint8_t(cp); return 1; }
  if (cp < 0x800) { b[0] = uint8_t(0xC0 | (cp >> 6)); b[1] = uint8_t(0x80 | (cp & 63)); return 2; }
  if (cp < 0x10000) {
    b[0] = uint8_t(0xE0 | (cp >> 12)); b[1] = uint8_t(0x80 | ((cp >> 6) & 63)); b[2] = uint8_t(0x80 | (cp & 63));
    return 3;
  }
  b[0] = uint8_t(0xF0 | (cp >> 18)); b[1] = uint8_t(0x80 | ((cp >> 12) & 63));
  b[2] = uint8_t(0x80 | ((cp >> 6) & 63)); b[3] = uint8_t(0x80 | (cp & 63));
  return 4;
}

// Splits [lo, hi] into sequences of byte ranges whose cross product is exactly the UTF-8 encodings of the range.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>& out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {  // surrogates are not characters
    if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
    return;
  }
  for (uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu})
    if (lo <= max && hi > max) {
      utf8_sequences(lo, max, out);
      utf8_sequences(max + 1, hi, out);
      return;
    }
  uint8_t a[4], b[4];
  int n = utf8_encode(lo, a);
  utf8_encode(hi, b);
  for (int i = 1; i < n; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  ByteRangeSeq s;
  for (int i = 0; i < n; ++i) s.push_back({a[i], b[i]});
  out.push_back(std::move(s));
}

void split_ascii(const CpRanges& ranges, ByteSet& ascii, std::vector<ByteRangeSeq>& multi) {
  ascii = {};
  for (auto [lo, hi] : normalize(ranges)) {
    if (lo < 0x80) add_range(ascii, uint8_t(lo), uint8_t(std::min<uint32_t>(hi, 0x7F)));
    if (hi >= 0x80) utf8_sequences(std::max<uint32_t>(lo, 0x80), std::min<uint32_t>(hi, 0x10FFFF), multi);
  }
}

bool empty_set(const ByteSet& s) { return !(s[0] | s[1] | s[2] | s[3]); }

}  // namespace

Elem Grammar::utf8_class(const CpRanges& ranges, const std::string& name) {
  ByteSet ascii;
  std::vector<ByteRangeSeq> multi;
  split_ascii(ranges, ascii, multi);
  if (multi.empty()) {
    if (empty_set(ascii)) throw GrammarError("empty character class in " + name);
    return bytes(ascii);
  }
  std::vector<Seq> alts;
  if (!empty_set(ascii)) alts.push_back({bytes(ascii)});
  for (const auto& m : multi) {
    Seq s;
    for (auto [lo, hi] : m) {
      ByteSet b{};
      add_range(b, lo, hi);
      s.push_back(bytes(b));
    }
    alts.push_back(std::move(s));
  }
  return ref(rule(name, std::move(alts)));
}

void Grammar::utf8_star(Seq& out, const CpRanges& ranges, const std::string& name) {
  ByteSet ascii;
  std::vector<ByteRangeSeq> multi;
  split_ascii(ranges, ascii, multi);
  if (!empty_set(ascii)) out.push_back(star(ascii));
  if (multi.empty()) return;
  // loop ::= "" | MULTIBYTE ascii* loop   (tail-recursive: the matcher's stack stays flat)
  uint32_t loop = add_rule(name);
  std::vector<Seq> alts{{}};
  for (const auto& m : multi) {
    Seq s;
    for (auto [lo, hi] : m) {
      ByteSet b{};
      add_range(b, lo, hi);
      s.push_back(bytes(b));
    }
    if (!empty_set(ascii)) s.push_back(star(ascii));
    s.push_back(ref(loop));
    alts.push_back(std::move(s));
  }
  rules[loop] = std::move(alts);
  out.push_back(ref(loop));
}

uint32_t Grammar::repeat(const Seq& item, int64_t min, int64_t max, const std::string& name) {
  if (min < 0 || min > kMaxRepeat || (max >= 0 && (max < min || max - min > kMaxRepeat)))
    throw GrammarError("repetition bounds {" + std::to_string(min) + "," + std::to_string(max) + "} of " + name +
                       " exceed the limit of " + std::to_string(kMaxRepeat));
  if (min * int64_t(item.size() + 1) > int64_t(kMaxElems)) throw GrammarError("repetition too large in " + name);
  Seq head;
  for (int64_t i = 0; i < min; ++i) head.insert(head.end(), item.begin(), item.end());
  if (max < 0) {
    if (item.size() == 1 && item[0].kind == Kind::bytes) {
      head.push_back({Kind::star, item[0].arg});
    } else {
      uint32_t loop = add_rule(name + "-loop");
      Seq again = item;
      again.push_back(ref(loop));
      rules[loop] = {std::move(again), {}};
      head.push_back(ref(loop));
    }
  } else if (max > min && item.size() == 1 && item[0].kind == Kind::bytes) {
    head.insert(head.end(), size_t(max - min), Elem{Kind::opt, item[0].arg});  // an inline run, no helper rules
  } else if (max > min) {
    uint32_t prev = UINT32_MAX;
    for (int64_t k = 1; k <= max - min; ++k) {
      Seq more = item;
      if (prev != UINT32_MAX) more.push_back(ref(prev));
      prev = rule(name + "-opt" + std::to_string(k), {std::move(more), {}});
    }
    head.push_back(ref(prev));
  }
  return rule(name, {std::move(head)});
}

void validate(const Grammar& g) {
  size_t n = g.rules.size();
  if (g.root >= n) throw GrammarError("grammar has no root rule");
  if (g.elem_count() > kMaxElems) throw GrammarError("grammar too large (more than 2^20 elements)");
  for (size_t r = 0; r < n; ++r) {
    if (g.rules[r].empty()) throw GrammarError("rule '" + g.names[r] + "' has no alternatives");
    for (const auto& alt : g.rules[r])
      for (const Elem& e : alt) {
        if (e.kind == Kind::rule && e.arg >= n) throw GrammarError("rule '" + g.names[r] + "' references no rule");
        if ((e.kind == Kind::bytes || e.kind == Kind::star || e.kind == Kind::opt) && e.arg >= g.sets.size())
          throw GrammarError("rule '" + g.names[r] + "' references no byte set");
      }
  }
  // Nullable rules (can match the empty string), to a fixpoint.
  std::vector<char> nullable(n, 0);
  auto elem_nullable = [&](const Elem& e) {
    return e.kind == Kind::star || e.kind == Kind::opt || (e.kind == Kind::rule && nullable[e.arg]);
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const auto& alt : g.rules[r])
        if (std::all_of(alt.begin(), alt.end(), elem_nullable)) {
          nullable[r] = 1;
          changed = true;
          break;
        }
    }
  }
  // Left calls: r -> s when s is referenced after only nullable elements. A cycle is left recursion.
  std::vector<std::vector<uint32_t>> left(n);
  for (size_t r = 0; r < n; ++r)
    for (const auto& alt : g.rules[r])
      for (const Elem& e : alt) {
        if (e.kind == Kind::rule) left[r].push_back(e.arg);
        if (!elem_nullable(e)) break;
      }
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on stack, 2 done
  for (size_t start = 0; start < n; ++start) {
    if (color[start]) continue;
    std::vector<std::pair<uint32_t, size_t>> stack{{uint32_t(start), 0}};
    color[start] = 1;
    while (!stack.empty()) {
      auto& [r, i] = stack.back();
      if (i < left[r].size()) {
        uint32_t s = left[r][i++];
        if (color[s] == 1) throw GrammarError("left recursion through rule '" + g.names[s] + "'");
        if (color[s] == 0) {
          color[s] = 1;
          stack.push_back({s, 0});
        }
      } else {
        color[r] = 2;
        stack.pop_back();
      }
    }
  }
}

Flat flatten(const Grammar& g) {
  validate(g);
  Flat f;
  f.sets = g.sets;
  f.root = g.root;
  f.alt_begin.push_back(0);
  for (const auto& rule : g.rules) {
    for (const auto& alt : rule) {
      f.alt_start.push_back(uint32_t(f.elems.size()));
      f.elems.insert(f.elems.end(), alt.begin(), alt.end());
      f.elems.push_back({Kind::end, 0});
    }
    f.alt_begin.push_back(uint32_t(f.alt_start.size()));
  }
  return f;
}

}  // namespace lily::grammar
