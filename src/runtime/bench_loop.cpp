// run_loop_bench: generate() timed from the host, as a client of the loop sees it (see bench_loop.h).
#include "runtime/bench_loop.h"

#include <chrono>

#include "runtime/generate.h"
#include "util/check.h"

namespace lily {
namespace {

using Clock = std::chrono::steady_clock;

double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// Decode µs per token of generate() from a 1-token prompt (max_tokens = steps + 1, no stop ids).
double decode_us(Backend& be, const SamplingSetup& setup, int steps) {
  be.reset();
  GenerateOptions g;
  g.max_tokens = steps + 1;
  g.sampling = setup;
  Clock::time_point first, last;
  g.on_token = [&](const SampledToken&, int i, bool) {
    (i == 0 ? first : last) = Clock::now();
    return FinishReason::none;
  };
  const std::vector<int32_t> prompt{1000};
  const GenerateResult r = generate(be, prompt, 0, g);
  LILY_CHECK(r.tokens.size() == static_cast<size_t>(steps + 1), "lily bench: the loop stopped early");
  return us_between(first, last) / steps;
}

// A structured-output stand-in: about one id in 16 allowed, the pattern moved by every accepted id, so each
// position fills the whole mask (the cost of a grammar's memoised mask: a copy of the vocabulary's words).
class BenchFilter : public TokenFilter {
 public:
  bool allowed(std::span<uint32_t> mask) override {
    const uint32_t shift = static_cast<uint32_t>(last_) & 15u;
    for (size_t w = 0; w < mask.size(); ++w) mask[w] = 0x00010001u << ((shift + w) & 15u);
    return true;
  }
  void accept(int32_t token) override { last_ = token; }

 private:
  int32_t last_ = 0;
};

}  // namespace

LoopBenchReport run_loop_bench(Backend& be, const LoopBenchOptions& opt) {
  LoopBenchReport rep;
  SamplingSetup greedy;
  greedy.params.temperature = 0;
  SamplingSetup chat;  // the server's chat defaults without thinking (server/job_setup.cpp)
  chat.params.temperature = 0.7f;
  chat.params.top_k = 20;
  chat.params.top_p = 0.8f;
  chat.params.presence_penalty = 1.5f;
  chat.params.seed = 1;
  decode_us(be, greedy, opt.warmup);  // warm-up (captures the decode graph)
  {  // what a request costs before its first token: another sampling configuration, only another seed, and a
     // configuration used before
    const std::vector<int32_t> one{1000};
    const auto setup_us = [&](const SamplingSetup& s) {
      be.reset();
      const auto t0 = Clock::now();
      be.begin_sampling(s, one);
      return us_between(t0, Clock::now());
    };
    rep.sampler_setup_us = setup_us(chat);
    SamplingSetup reseeded = chat;
    reseeded.params.seed = 987654321;
    rep.seed_setup_us = setup_us(reseeded);
    rep.cached_setup_us = setup_us(greedy);
  }
  // prompts to their first token, through the loop in the given pieces
  bool warm = false;
  for (int chunk : opt.prefill_chunks)
    for (int n : opt.prompts) {
      if (n + 1 > be.max_context()) continue;
      std::vector<int32_t> prompt(n);
      for (int i = 0; i < n; ++i) prompt[i] = (i * 7919) % be.config().vocab;
      be.reset();
      GenerateOptions g;
      g.max_tokens = 1;
      g.sampling = greedy;
      g.prefill_chunk = chunk;
      const auto t0 = Clock::now();
      generate(be, prompt, 0, g);
      const double us = us_between(t0, Clock::now());
      if (!warm) {  // the first: a warm-up
        warm = true;
        continue;
      }
      rep.loops.push_back({"prompt of " + std::to_string(n) + " tokens to its first token, " +
                               (chunk > 0 ? "pieces of " + std::to_string(chunk) : std::string("one piece")) +
                               ", per token",
                           us / n});
    }
  for (bool host : {true, false}) {
    const char* where = host ? "host sampling (logits copied)" : "device sampling";
    SamplingSetup g = greedy, c = chat;
    g.host = c.host = host;
    rep.loops.push_back({std::string("greedy, ") + where, decode_us(be, g, opt.steps)});
    rep.loops.push_back({std::string("chat defaults (T 0.7, top-k 20, top-p 0.8, presence 1.5), ") + where,
                         decode_us(be, c, opt.steps)});
  }
  SamplingSetup with_top = chat;
  with_top.params.top_logprobs = 5;
  with_top.logprobs = true;
  rep.loops.push_back({"chat defaults with logprobs and top_logprobs 5", decode_us(be, with_top, opt.steps)});
  SamplingSetup nucleus = chat;  // top_k off: the device sampler's full-vocabulary path
  nucleus.params.top_k = 0;
  nucleus.params.top_p = 0.95f;
  nucleus.params.temperature = 1.0f;
  rep.loops.push_back({"top-p 0.95 alone (T 1, top-k off, presence 1.5)", decode_us(be, nucleus, opt.steps)});
  for (bool host : {true, false}) {  // structured output: the same defaults under a mask that changes per token
    BenchFilter filter;
    SamplingSetup masked = chat;
    masked.filter = &filter;
    masked.host = host;
    const double us = decode_us(be, masked, opt.steps);
    rep.loops.push_back({std::string("chat defaults + structured output (1 id in 16 allowed, per token), ") +
                             (be.samples_on_device() ? "device sampling" : "host sampling (logits copied)"),
                         us});
  }
  return rep;
}

}  // namespace lily
