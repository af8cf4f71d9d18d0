// Tokenizer benchmark (not a test): load time, and single-thread encode throughput (MB/s, tokens/s) on the
// oracle corpus written by tests/tokenizer/oracle_corpus.js, both string by string and as one joined text.
// Compare with bench/bench_tokenizer_oracle.js (the HF `tokenizers` npm oracle) on the same corpus.
// Usage: bench_tokenizer TOKENIZER(dir or tokenizer.json) CORPUS(cases.json) [REPEATS=5]
// Reports wall time and thread CPU time (the CPU figure is robust on a shared, loaded machine).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace {

struct Clock {
  double wall, cpu;
  static Clock now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    double w = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    return {w, double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec)};
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER CORPUS_JSON [REPEATS]\n", argv[0]);
    return 2;
  }
  const int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
  std::vector<double> load_wall, load_cpu;
  for (int r = 0; r < 3; ++r) {
    Clock a = Clock::now();
    lily::Tokenizer t = lily::Tokenizer::load(argv[1]);
    Clock b = Clock::now();
    load_wall.push_back(b.wall - a.wall);
    load_cpu.push_back(b.cpu - a.cpu);
  }
  lily::Tokenizer tok = lily::Tokenizer::load(argv[1]);
  std::ifstream in(argv[2]);
  nlohmann::json cases = nlohmann::json::parse(in);
  std::vector<std::string> texts;
  size_t bytes = 0;
  for (const auto& c : cases) {
    texts.push_back(c["t"].get<std::string>());
    bytes += texts.back().size();
  }
  std::string joined;
  for (const auto& t : texts) joined += t;
  std::printf("tokenizer %s: vocab %d, load median wall %.1f ms, cpu %.1f ms\n", argv[1], tok.vocab_size(),
              1e3 * median(load_wall), 1e3 * median(load_cpu));
  std::printf("corpus %s: %zu strings, %.2f MB\n", argv[2], texts.size(), double(bytes) / 1e6);
  size_t tokens = 0;
  for (const auto& t : texts) tokens += tok.encode(t).size();  // warm-up
  std::vector<double> wall, cpu, jwall, jcpu;
  size_t jtokens = 0;
  for (int r = 0; r < repeats; ++r) {
    Clock a = Clock::now();
    size_t n = 0;
    for (const auto& t : texts) n += tok.encode(t).size();
    Clock b = Clock::now();
    jtokens = tok.encode(joined).size();
    Clock c = Clock::now();
    if (n != tokens) return 1;
    wall.push_back(b.wall - a.wall);
    cpu.push_back(b.cpu - a.cpu);
    jwall.push_back(c.wall - b.wall);
    jcpu.push_back(c.cpu - b.cpu);
  }
  auto report = [&](const char* what, double w, double c, size_t toks) {
    std::printf("%-22s wall %7.1f ms  %6.2f MB/s  %9.0f tok/s | cpu %7.1f ms  %6.2f MB/s  %9.0f tok/s\n", what,
                1e3 * w, double(bytes) / 1e6 / w, double(toks) / w, 1e3 * c, double(bytes) / 1e6 / c,
                double(toks) / c);
  };
  report("encode per string", median(wall), median(cpu), tokens);
  report("encode joined text", median(jwall), median(jcpu), jtokens);
  // Adversarial inputs at 256 KiB and 1 MiB: linear time shows as equal MB/s at both sizes.
  const std::pair<const char*, std::string> units[] = {
      {"a+U+0300", "a\xCC\x80"}, {"no spaces", "abcdefghij,klmnopqrstu.vwxyz-0123"},
      {"emoji ZWJ", "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB"}, {"spaces", " "}};
  for (const auto& [name, unit] : units) {
    for (size_t size : {size_t(256) << 10, size_t(1) << 20}) {
      std::string s;
      while (s.size() < size) s += unit;
      Clock a = Clock::now();
      size_t n = tok.encode(s).size();
      Clock b = Clock::now();
      std::printf("adversarial %-10s %5zu KiB: %8zu tokens, cpu %7.1f ms, %6.2f MB/s\n", name, size >> 10, n,
                  1e3 * (b.cpu - a.cpu), double(s.size()) / 1e6 / (b.cpu - a.cpu));
    }
  }
  return 0;
}
