// libFuzzer target for the grammar compilers (scripts/fuzz.sh builds it with ASan + UBSan and runs it for a
// bounded time). Input: first byte selects the front end (GBNF, regex, JSON Schema), the rest is its source.
// Compiled against a small byte vocabulary, then a short walk takes the first allowed token at each step. The
// only acceptable failure is lily::grammar::GrammarError (or a JSON parse error for the schema input).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "grammar/frontends.h"
#include "grammar/token_mask.h"

namespace {

std::shared_ptr<const lily::grammar::Vocab> vocab() {
  static auto v = [] {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.push_back(std::string(1, char(b)));
    for (const char* s : {"\":", "\",", "ab", "{\"", "12", "true", "<|x|>"}) t.push_back(s);
    return lily::grammar::Vocab::build(t, {int32_t(t.size() - 1)});
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string src(reinterpret_cast<const char*>(data) + 1, size - 1);
  using namespace lily::grammar;
  try {
    Grammar g;
    switch (data[0] % 3) {
      case 0: g = gbnf_grammar(src); break;
      case 1: g = regex_grammar(src); break;
      default: {
        auto j = nlohmann::ordered_json::parse(src, nullptr, false);
        if (j.is_discarded()) return 0;
        g = json_schema_grammar(j);
      }
    }
    if (g.elem_count() > 20000) return 0;  // keep each input fast; size limits are tested in unit tests
    auto cg = CompiledGrammar::compile(g, vocab());
    Matcher m(cg);
    std::vector<uint32_t> mask(cg->vocab().mask_words());
    for (int step = 0; step < 32 && m.can_continue(); ++step) {
      m.fill_mask(mask);
      int32_t pick = -1;
      for (int32_t id = 0; id < cg->vocab().size() && pick < 0; ++id)
        if ((mask[size_t(id) / 32] >> (id % 32)) & 1) pick = id;
      if (pick < 0) break;
      if (!m.accept_token(pick)) {
        std::fprintf(stderr, "masked token %d rejected\n", pick);
        std::abort();
      }
    }
  } catch (const GrammarError&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    std::abort();
  }
  return 0;
}
