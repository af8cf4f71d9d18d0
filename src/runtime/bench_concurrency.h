// `lily bench --concurrency`: total and per-stream decode rate through the continuous-batching scheduler
// (runtime/scheduler.h) with C sequences at once, each a ~100-token prompt and a fixed number of generated ids
// (no stop id), chat-default sampling. Measures what the scheduler and the batched step give, without HTTP.
#pragma once
#include <vector>

#include "runtime/batch_backend.h"

namespace lily {

struct ConcurrencyBenchOptions {
  std::vector<int> concurrency = {1, 4, 8, 16, 64};  // levels above the backend's slots are skipped
  int prompt_tokens = 100;
  int gen_tokens = 256;
  int profile_steps = 0;  // > 0: that many steps from the middle of each run with the backend's family profile
};

struct ConcurrencyPoint {
  int clients = 0;
  double total_tok_per_s = 0;           // generated ids of all sequences / wall time from start to the last id
  double stream_tok_per_s = 0;          // median over sequences of (ids - 1) / (last id - first id)
  double ttft_ms = 0;                   // median time to the first id
  double mean_batch = 0;                // sequences per step
  int steps = 0;
  double step_ms = 0;                   // median wall time of a scheduler step (forward, sampling, bookkeeping)
  double forward_ms = 0;                // median time of the backend's forward within it (logits on the host)
  double begin_ms = 0;                  // median host time of its step_begin (checks, inputs, launches): on a GPU,
                                        // most of what the device waits between two steps
  int profiled_steps = 0;               // steps the families below sum over (launched one by one: slower)
  std::vector<FamilyTime> families;     // model/pass_profile.h, in order of first appearance
};

std::vector<ConcurrencyPoint> run_concurrency_bench(BatchBackend& be, const ConcurrencyBenchOptions& opt);

}  // namespace lily
