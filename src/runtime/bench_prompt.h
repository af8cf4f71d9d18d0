// `lily bench --prompts`: prompts to their first token the way `lily serve` runs a fresh one (generate() in the
// server's prompt pieces, a prefix-cache snapshot at its checkpoint interval, nothing cached), and where the
// time goes: one more run per length with the backend's per-family profile (model/pass_profile.h).
#pragma once
#include <vector>

#include "runtime/backend.h"

namespace lily {

struct PromptBenchOptions {
  std::vector<int> prompts = {1024, 8192, 32768, 131072};  // lengths past the backend's context are skipped
  int piece = 2048;                     // tokens per Backend::prefill call (server: EngineOptions::prefill_chunk)
  int checkpoint_interval = 8192;       // a state snapshot every K tokens (server: EngineOptions, the same)
  int runs = 3;                         // timed runs per length (one for 32K tokens and more), after a warm-up
  bool profile = true;                  // one profiled run per length
};

struct PromptPoint {
  int tokens = 0;
  double ttft_ms = 0;                   // median over the runs: from the call to the first id
  double tok_per_s = 0;                 // tokens / ttft
  int runs = 0;
  double profiled_ms = 0;               // the profiled run's time to the first id (events or clocks add a little)
  std::vector<FamilyTime> families;     // the profiled run's, in order of first appearance
  double gemm_ms = 0, gemm_flops = 0;   // the families named gemm_*, summed
};

std::vector<PromptPoint> run_prompt_bench(Backend& be, const PromptBenchOptions& opt);

}  // namespace lily
