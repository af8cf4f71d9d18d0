#include "runtime/bench_prompt.h"

#include <algorithm>
#include <chrono>

#include "runtime/generate.h"
#include "util/check.h"

namespace lily {
namespace {

using Clock = std::chrono::steady_clock;

// One fresh prompt of n tokens through generate() as the server runs it; ms to the first id.
double prompt_ms(Backend& be, int n, const PromptBenchOptions& opt) {
  std::vector<int32_t> prompt(n);
  for (int i = 0; i < n; ++i) prompt[i] = (i * 7919 + 13) % be.config().vocab;
  be.reset();
  GenerateOptions g;
  g.max_tokens = 1;
  g.sampling.params.temperature = 0;
  g.prefill_chunk = opt.piece;
  for (int c = opt.checkpoint_interval; opt.checkpoint_interval > 0 && c < n; c += opt.checkpoint_interval)
    g.checkpoints.push_back(c);
  g.on_checkpoint = [&](int) { (void)be.save_state(); };  // the server's snapshot (its cache insert aside)
  Clock::time_point first;
  g.on_token = [&](const SampledToken&, int, bool) {
    first = Clock::now();
    return FinishReason::none;
  };
  const Clock::time_point t0 = Clock::now();
  const GenerateResult r = generate(be, prompt, 0, g);
  LILY_CHECK(r.prefilled && r.tokens.size() == 1, "lily bench --prompts: the loop stopped early");
  return std::chrono::duration<double, std::milli>(first - t0).count();
}

}  // namespace

std::vector<PromptPoint> run_prompt_bench(Backend& be, const PromptBenchOptions& opt) {
  std::vector<PromptPoint> out;
  bool warm = false;
  for (int n : opt.prompts) {
    if (n < 1 || n + 1 > be.max_context()) continue;
    if (!warm) {  // the first length once more before any timing (graphs, buffers, clocks)
      prompt_ms(be, n, opt);
      warm = true;
    }
    PromptPoint p;
    p.tokens = n;
    p.runs = n >= 32768 ? 1 : std::max(1, opt.runs);
    std::vector<double> t;
    for (int i = 0; i < p.runs; ++i) t.push_back(prompt_ms(be, n, opt));
    std::sort(t.begin(), t.end());
    p.ttft_ms = t[t.size() / 2];
    p.tok_per_s = n / (p.ttft_ms / 1000);
    if (opt.profile && be.profile_begin()) {
      p.profiled_ms = prompt_ms(be, n, opt);
      p.families = be.profile_end();
      const FamilyTime g = gemm_total(p.families);
      p.gemm_ms = g.ms, p.gemm_flops = g.flops;
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace lily
