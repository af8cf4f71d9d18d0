// UTF-8 helpers and NFC (Unicode 9.0 data, generated into unicode_data.inc) for the tokenizer.
// note: NFC works chunk by chunk. A chunk starts at an "inert" code point (ccc 0, never the second half of a
// composition, unchanged by NFC on its own), which no normalisation step can cross, so chunks without any
// non-inert code point are copied verbatim and only the others run the full decompose/reorder/compose.
#include "tokenizer/unicode.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

namespace lily::unicode {
namespace {

struct CccRange {
  uint32_t lo, hi;
  uint8_t ccc;
};
struct Decomp {
  uint32_t cp, a, b;  // b == 0: singleton decomposition
  uint8_t composes;
};
#include "tokenizer/unicode_data.inc"

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;
constexpr uint32_t kTableSize = 0x30000;  // every code point with Unicode 9.0 NFC data lies below this

struct Tables {
  std::vector<uint8_t> ccc;       // [kTableSize]
  std::vector<uint8_t> non_inert; // [kTableSize]; 1 when NFC may change the text around this code point
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> decomp;
  std::unordered_map<uint64_t, uint32_t> compose;  // (a << 21 | b) → composite
};

uint8_t ccc_of(const Tables& t, uint32_t cp) { return cp < kTableSize ? t.ccc[cp] : 0; }

void decompose(const Tables& t, uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp < kTableSize) {
    auto it = t.decomp.find(cp);
    if (it != t.decomp.end()) {
      decompose(t, it->second.first, out);  // depth is bounded by the data (at most 4 levels)
      if (it->second.second) decompose(t, it->second.second, out);
      return;
    }
  }
  out.push_back(cp);
}

bool compose_pair(const Tables& t, uint32_t a, uint32_t b, uint32_t& c) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    c = kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    return true;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount) {
    c = a + (b - kTBase);
    return true;
  }
  auto it = t.compose.find(uint64_t(a) << 21 | b);
  if (it == t.compose.end()) return false;
  c = it->second;
  return true;
}

// Full NFC of a code point sequence, in place.
void nfc_full(const Tables& t, std::vector<uint32_t>& cps, std::vector<uint32_t>& tmp) {
  tmp.clear();
  for (uint32_t cp : cps) decompose(t, cp, tmp);
  // Canonical ordering: stable sort each run of non-starters by combining class.
  for (size_t i = 0; i < tmp.size();) {
    if (!ccc_of(t, tmp[i])) { ++i; continue; }
    size_t j = i;
    while (j < tmp.size() && ccc_of(t, tmp[j])) ++j;
    if (j - i > 1)
      std::stable_sort(tmp.begin() + i, tmp.begin() + j,
                       [&](uint32_t x, uint32_t y) { return ccc_of(t, x) < ccc_of(t, y); });
    i = j;
  }
  cps.clear();
  ptrdiff_t starter = -1;
  int last_class = 0;
  for (uint32_t c : tmp) {
    int cc = ccc_of(t, c);
    uint32_t comp;
    if (starter >= 0 && (last_class < cc || (last_class == 0 && size_t(starter) + 1 == cps.size())) &&
        compose_pair(t, cps[starter], c, comp)) {
      cps[starter] = comp;
      continue;
    }
    if (cc == 0) starter = ptrdiff_t(cps.size());
    last_class = cc;
    cps.push_back(c);
  }
}

const Tables& tables() {
  static const Tables t = [] {
    Tables t;
    t.ccc.assign(kTableSize, 0);
    t.non_inert.assign(kTableSize, 0);
    for (const auto& r : kCcc)
      for (uint32_t c = r.lo; c <= r.hi; ++c) t.ccc[c] = r.ccc, t.non_inert[c] = 1;
    for (const auto& d : kDecomp) {
      t.decomp.emplace(d.cp, std::make_pair(d.a, d.b));
      if (d.composes) {
        t.compose.emplace(uint64_t(d.a) << 21 | d.b, d.cp);
        t.non_inert[d.b] = 1;  // may join the preceding character
      }
    }
    for (uint32_t c = kVBase; c < kVBase + kVCount; ++c) t.non_inert[c] = 1;
    for (uint32_t c = kTBase + 1; c < kTBase + kTCount; ++c) t.non_inert[c] = 1;
    std::vector<uint32_t> one, tmp;
    for (const auto& d : kDecomp) {
      one.assign(1, d.cp);
      nfc_full(t, one, tmp);
      if (one.size() != 1 || one[0] != d.cp) t.non_inert[d.cp] = 1;
    }
    return t;
  }();
  return t;
}

bool non_inert(const Tables& t, uint32_t cp) { return cp < kTableSize && t.non_inert[cp]; }

}  // namespace

bool nfc_quick_yes(std::string_view s) {
  const Tables& t = tables();
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) { ++i; continue; }
    if (non_inert(t, next_cp(s, i))) return false;
  }
  return true;
}

std::string nfc(std::string_view s) {
  const Tables& t = tables();
  if (nfc_quick_yes(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  std::vector<uint32_t> cps, tmp;
  size_t chunk = 0, i = 0;
  bool dirty = false;
  auto finish = [&](size_t end) {
    if (!dirty) {
      out.append(s.data() + chunk, end - chunk);
      return;
    }
    cps.clear();
    for (size_t j = chunk; j < end;) cps.push_back(next_cp(s, j));
    nfc_full(t, cps, tmp);
    for (uint32_t c : cps) append_utf8(out, c);
  };
  while (i < s.size()) {
    size_t at = i;
    uint32_t cp = next_cp(s, i);
    if (!non_inert(t, cp)) {
      finish(at);
      chunk = at;
      dirty = false;
    } else {
      dirty = true;
    }
  }
  finish(s.size());
  return out;
}

std::span<const CpRange> extra_letter() { return kExtraLetter; }
std::span<const CpRange> extra_mark() { return kExtraMark; }
std::span<const CpRange> extra_number() { return kExtraNumber; }
std::span<const CpRange> white_space() { return kWhiteSpace; }

bool is_white_space(uint32_t cp) {
  for (const auto& r : kWhiteSpace)
    if (cp >= r.lo && cp <= r.hi) return true;
  return false;
}

}  // namespace lily::unicode
