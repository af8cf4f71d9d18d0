// The Split pre-tokenizer (behaviour "Isolated"): the regex from tokenizer.json compiled with PCRE2
// (UTF | UCP, JIT). Its Unicode classes are widened so that PCRE2's tables agree with the reference
// (Oniguruma) on every code point; see adapt_regex and tools/gen_unicode_tables.py.
#pragma once
#include <memory>
#include <string>
#include <string_view>

namespace lily {

// Rewrites a pre-tokenizer regex for PCRE2: \p{L}, \p{M}, \p{N}, \s and \S gain the code points the
// reference counts in them and PCRE2 10.42 does not. Throws lily::Error (naming `where`) on constructs whose
// reference semantics lily does not reproduce (\w, \d, \b, ^, $, other properties, inline flags but (?i:).
std::string adapt_regex(std::string_view pattern, const std::string& where);

class Splitter {
 public:
  Splitter(std::string_view pattern, const std::string& where);
  Splitter(Splitter&&) noexcept;
  ~Splitter();
  // Calls on_piece(begin, end) for each match and each gap between matches, in order, skipping empty pieces.
  // `text` must be valid UTF-8. Linear in the text for the Qwen regexes; no recursion.
  template <typename F>
  void split(std::string_view text, F&& on_piece) const {
    size_t gap = 0, search = 0, b, e;
    while (search < text.size() && find(text, search, b, e)) {
      if (e == b) {  // an empty match splits nothing; search again one character later
        search = next_char(text, b);
        continue;
      }
      if (b > gap) on_piece(gap, b);
      on_piece(b, e);
      gap = search = e;
    }
    if (gap < text.size()) on_piece(gap, text.size());
  }
  const std::string& pattern() const { return pattern_; }

 private:
  bool find(std::string_view text, size_t start, size_t& b, size_t& e) const;
  static size_t next_char(std::string_view text, size_t i);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

}  // namespace lily
