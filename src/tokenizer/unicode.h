// Unicode helpers for the tokenizer: UTF-8 decoding/validation, NFC with the reference library's data
// (Unicode 9.0, see tools/gen_unicode_tables.py), and the regex class additions that make PCRE2's older
// tables agree with the reference pre-tokenizer (Oniguruma, Unicode 16).
#pragma once
#include "util/utf8.h"
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace lily::unicode {

struct CpRange {
  uint32_t lo, hi;  // inclusive
};

// The UTF-8 helpers are util/utf8.h's; these are the tokenizer's names for them.
using ::lily::append_utf8;
using ::lily::utf8_lossy;
// Decodes one code point at s[i] (s valid UTF-8), advancing i.
inline uint32_t next_cp(std::string_view s, size_t& i) { return utf8_next(s, i); }
// Byte offset of the first invalid UTF-8 sequence, or npos when `s` is valid (no surrogates, no overlongs).
inline size_t find_invalid_utf8(std::string_view s) { return utf8_find_invalid(s); }
// Length of the valid-but-incomplete UTF-8 sequence that ends `s` (0..3).
inline size_t incomplete_utf8_tail(std::string_view s) { return utf8_incomplete_tail(s); }

// NFC with Unicode 9.0 data (what the reference normaliser implements). Input must be valid UTF-8.
// Text without any character that NFC could change is returned unchanged without allocation work.
std::string nfc(std::string_view s);
// True when nfc(s) == s is guaranteed without running the algorithm (a fast check; may say false).
bool nfc_quick_yes(std::string_view s);

// Code points the reference counts in \p{L}, \p{M}, \p{N} but PCRE2 10.42 (Unicode 14) does not.
std::span<const CpRange> extra_letter();
std::span<const CpRange> extra_mark();
std::span<const CpRange> extra_number();
// The reference's \s in full (White_Space; PCRE2's \s differs: it also matches U+180E).
std::span<const CpRange> white_space();

// White_Space (Rust char::is_whitespace): used for added-token lstrip/rstrip.
bool is_white_space(uint32_t cp);

}  // namespace lily::unicode
