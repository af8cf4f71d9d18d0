// `lily bench`'s measurement of the generation loop itself (runtime/generate.h, the loop `lily serve` runs) over
// any Backend: prompts of several lengths to their first token, in the server's prompt pieces, and decode time
// per token with sampling on the host and (where the backend can) on the device.
#pragma once
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace lily {

struct LoopBenchOptions {
  int steps = 128;                      // timed decode tokens per configuration
  int warmup = 8;
  // the first one is a warm-up; prompts longer than the backend's context are skipped
  std::vector<int> prompts = {64, 16, 64, 512, 1024, 4096, 8192, 16384, 32768, 131072};
  std::vector<int> prefill_chunks = {0};  // prompt piece sizes to time (0: the whole prompt in one call; the
                                          // server's is EngineOptions::prefill_chunk)
};

struct BenchLoop {
  std::string name;                     // e.g. "greedy, device sampling"
  double us_per_token = 0;              // decode: (last token time - first token time) / (tokens - 1); prompts:
                                        // time to the first token / prompt tokens
};

struct LoopBenchReport {
  std::vector<BenchLoop> loops;
  double sampler_setup_us = 0;          // begin_sampling with another configuration (device: decode graphs captured)
  double seed_setup_us = 0;             // begin_sampling with only another seed
  double cached_setup_us = 0;           // begin_sampling back to a configuration used before
};

// Runs on `be` (reset between runs); prompts longer than its context are skipped.
LoopBenchReport run_loop_bench(Backend& be, const LoopBenchOptions& opt);

}  // namespace lily
