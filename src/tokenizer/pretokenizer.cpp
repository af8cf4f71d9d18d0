// Split pre-tokenizer on PCRE2 (see pretokenizer.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <cctype>
#include <cstdint>
#include <cstdio>

#include "tokenizer/unicode.h"
#include "util/check.h"
#include "util/log.h"

namespace lily {
namespace {

std::string ranges_text(std::span<const unicode::CpRange> rs) {
  std::string out;
  char buf[48];
  for (const auto& r : rs) {
    if (r.lo == r.hi) std::snprintf(buf, sizeof buf, "\\x{%X}", r.lo);
    else std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", r.lo, r.hi);
    out += buf;
  }
  return out;
}

}  // namespace

std::string adapt_regex(std::string_view p, const std::string& where) {
  const std::string extra_l = ranges_text(unicode::extra_letter());
  const std::string extra_m = ranges_text(unicode::extra_mark());
  const std::string extra_n = ranges_text(unicode::extra_number());
  const std::string space = ranges_text(unicode::white_space());
  std::string out;
  bool in_class = false;
  size_t class_start = 0;  // index in p just after '[' or '[^'
  auto refuse = [&](const std::string& what) {
    fail(where, ": the pre-tokenizer regex uses ", what, ", whose reference (Oniguruma) semantics lily does ",
         "not reproduce; regex: ", p);
  };
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\') {
      LILY_CHECK(i + 1 < p.size(), where, ": the pre-tokenizer regex ends with a backslash");
      char e = p[++i];
      if (e == 'p') {
        std::string_view rest = p.substr(i + 1);
        std::string prop;
        if (rest.starts_with("{L}")) prop = "\\p{L}" + extra_l;
        else if (rest.starts_with("{M}")) prop = "\\p{M}" + extra_m;
        else if (rest.starts_with("{N}")) prop = "\\p{N}" + extra_n;
        else refuse("a \\p property other than {L}, {M}, {N}");
        i += 3;
        out += in_class ? prop : "[" + prop + "]";
      } else if (e == 's') {
        out += in_class ? space : "[" + space + "]";
      } else if (e == 'S') {
        if (in_class) refuse("\\S inside a character class");
        out += "[^" + space + "]";
      } else if (std::string_view("rntfv").find(e) != std::string_view::npos ||
                 !(std::isalnum(static_cast<unsigned char>(e)))) {
        out += '\\';
        out += e;
      } else {
        refuse(std::string("\\") + e);
      }
      continue;
    }
    if (in_class) {
      if (c == ']' && i > class_start) in_class = false;
      else if (c == '[') refuse("a nested character class or POSIX class");
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      class_start = i + 1;
      continue;
    }
    if (c == '^' || c == '$') refuse("an anchor (^ or $ are per line in Oniguruma's Ruby syntax)");
    if (c == '(' && i + 1 < p.size() && p[i + 1] == '?') {
      std::string_view rest = p.substr(i + 2);
      if (!(rest.starts_with(":") || rest.starts_with("i:") || rest.starts_with("=") || rest.starts_with("!") ||
            rest.starts_with("<=") || rest.starts_with("<!")))
        refuse("a group kind other than (?: (?i: (?= (?! (?<= (?<!");
    }
    out += c;
  }
  LILY_CHECK(!in_class, where, ": the pre-tokenizer regex has an unterminated character class");
  return out;
}

struct Splitter::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

Splitter::Splitter(std::string_view pattern, const std::string& where)
    : impl_(std::make_unique<Impl>()), pattern_(pattern) {
  std::string adapted = adapt_regex(pattern, where);
  int err = 0;
  PCRE2_SIZE off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(adapted.data()), adapted.size(), PCRE2_UTF | PCRE2_UCP,
                              &err, &off, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail(where, ": PCRE2 cannot compile the pre-tokenizer regex at offset ", off, ": ",
         reinterpret_cast<const char*>(msg), "; regex: ", pattern);
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
  if (!impl_->jit) log::warn("tokenizer: PCRE2 JIT unavailable; the pre-tokenizer runs interpreted (slower)");
  char ver[64] = {};
  pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, ver);
  if (std::string_view(ver) > "16.9")
    log::warn("tokenizer: PCRE2 uses Unicode ", ver, "; the reference uses 16.0, so code points assigned later ",
              "may split differently");
}

Splitter::Splitter(Splitter&&) noexcept = default;
Splitter::~Splitter() = default;

size_t Splitter::next_char(std::string_view text, size_t i) {
  if (i >= text.size()) return text.size() + 1;
  unicode::next_cp(text, i);
  return i;
}

namespace {
// Per-thread PCRE2 match state: match data, and a context with a large JIT stack and no match limit, used
// only when a match exceeds the defaults (a whitespace run of ~1 MiB needs more than the 32 KiB JIT stack;
// ~10 MiB more than the default match limit). Both grow linearly with the piece, never with recursion.
struct MatchState {
  pcre2_match_data* md = pcre2_match_data_create(16, nullptr);
  pcre2_match_context* big_ctx = nullptr;
  pcre2_jit_stack* big_stack = nullptr;
  ~MatchState() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(big_ctx);
    pcre2_jit_stack_free(big_stack);
  }
  pcre2_match_context* big() {
    if (!big_ctx) {
      big_ctx = pcre2_match_context_create(nullptr);
      big_stack = pcre2_jit_stack_create(64 << 10, 1 << 30, nullptr);
      pcre2_jit_stack_assign(big_ctx, nullptr, big_stack);
      pcre2_set_match_limit(big_ctx, UINT32_MAX);
      pcre2_set_depth_limit(big_ctx, UINT32_MAX);
    }
    return big_ctx;
  }
};
}  // namespace

bool Splitter::find(std::string_view text, size_t start, size_t& b, size_t& e) const {
  thread_local MatchState st;
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, st.md, nullptr)
                      : pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, st.md, nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT)
    rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, st.md, st.big())
                    : pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, st.md, st.big());
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    fail("tokenizer: the pre-tokenizer regex failed at byte ", start, " of a ", text.size(), "-byte text: ",
         reinterpret_cast<const char*>(msg));
  }
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
  b = ov[0];
  e = ov[1];
  return true;
}

}  // namespace lily
