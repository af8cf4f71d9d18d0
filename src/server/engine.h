// The engine thread: the only thread that touches the backend and the prefix cache. HTTP threads submit
// GenJobs into a bounded FIFO (full -> 429 queue_full with Retry-After). Over a BatchBackend (the CPU backend)
// the engine runs the continuous-batching scheduler (runtime/scheduler.h): every admitted job advances in each
// step, prompts in pieces between decode ids. Over a single-sequence Backend (the CUDA backend until its batched
// step lands) it runs one job at a time: restore the longest usable prefix (live state or a PrefixCache
// snapshot), then the runtime's generation loop (runtime/generate.h). Either way every prompt piece and decode
// step checks the job's cancel flag and deadline, so a client disconnect frees its resources within one step
// (docs/api.md §10.1 rows 6-7).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/backend.h"
#include "runtime/batch_backend.h"
#include "runtime/generate.h"
#include "runtime/prefix_cache.h"
#include "runtime/scheduler.h"
#include "runtime/sampler.h"
#include "runtime/token_filter.h"
#include "server/metrics.h"
#include "runtime/prefix_cache.h"

namespace lily::server {

using Clock = std::chrono::steady_clock;

struct GenJob {
  // ---- input, set before submit ----
  std::vector<int32_t> prompt;          // [n_prompt] tokens
  SamplingParams sampling;              // resolved (defaults applied, n_valid and top_logprobs set)
  bool logprobs = false;                // the response reports log-probabilities
  int max_tokens = 1;                   // already clamped to the context
  std::vector<int> checkpoints;         // prompt positions after which to snapshot the state
  std::vector<int32_t> stop_ids;        // end-of-generation tokens (not emitted)
  std::vector<int32_t> turn_tail;       // fed after a stop id so the state sits at the next turn's start
  Clock::time_point arrival = Clock::now();
  Clock::time_point deadline = Clock::time_point::max();
  // Per generated token, on the engine thread; returns false to end generation (a stop string matched).
  std::function<bool(const SampledToken&)> on_token;
  std::shared_ptr<TokenFilter> filter;  // structured output: the allowed ids per position (null: free)
  // Called once on the engine thread when the job ends (any reason), after the result fields are set.
  std::function<void()> on_done;

  // ---- control ----
  std::atomic<bool> cancel{false};      // set by the HTTP thread (client disconnect, shutdown)

  // ---- result, written by the engine before on_done ----
  FinishReason finish = FinishReason::none;
  std::string error;                    // finish == error: the message
  std::string error_code;               // finish == error: the API error code (nan_logits, internal_error)
  int n_cached = 0;                     // prompt tokens restored from the prefix cache
  int n_generated = 0;                  // tokens passed to on_token
  bool stopped_by_id = false;           // a stop id was sampled (counted in usage, not emitted)
  double queue_ms = 0, prompt_ms = 0, gen_ms = 0;
};

struct EngineOptions {
  int queue_size = 16;                  // waiting jobs (running ones not counted)
  int kv_tokens = 0;                    // batched: the KV pool in tokens (<= 0: every slot its full context)
  bool prefix_cache = true;
  size_t cache_bytes = size_t{8} << 30; // prefix-cache pool cap
  int checkpoint_interval = 8192;       // extra snapshot every K prompt tokens
  int prefill_chunk = 4096;             // prompt tokens per Backend::prefill call: cancellation and the deadline
                                        // are checked between pieces (and every few layers inside one on CUDA);
                                        // a piece of the CUDA prompt path's chunk size reads the weights once per
                                        // 4,096 tokens
  int decode_step_tokens = 512;         // batched: a step's tokens while some request decodes (its inter-token
                                        // gap while prompts are processed: ~40 ms on the H200); 0: prefill_chunk
};

class Engine {
 public:
  Engine(Backend& backend, Metrics& metrics, EngineOptions options);       // one job at a time
  Engine(BatchBackend& backend, Metrics& metrics, EngineOptions options);  // continuous batching
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a job. Throws ApiError 429 (queue full, with retry_after) or 503 (shutting down).
  void submit(std::shared_ptr<GenJob> job);
  // Queues jobs together (the n choices of one request): all or none, and the engine thread takes them in one go,
  // so the scheduler sees them in the same step (the choices after the first wait for its prompt and reuse it).
  void submit_all(const std::vector<std::shared_ptr<GenJob>>& jobs);
  // Removes a waiting job from the queue (its on_done runs with finish = cancelled), or flags a running one.
  void cancel(const std::shared_ptr<GenJob>& job);
  // Stops taking jobs; running and queued jobs keep going until drain_deadline, then are cancelled.
  // Returns when the engine thread has exited.
  void shutdown(Clock::time_point drain_deadline);
  bool accepting() const { return accepting_.load(); }
  int max_context() const { return max_context_; }
  int max_seqs() const { return max_seqs_; }      // jobs that run at once
  // Seconds a new request would wait (>= 1), for Retry-After.
  int estimated_wait_s() const;

 private:
  void loop();
  void loop_batched();
  SeqSpec spec_for(const std::shared_ptr<GenJob>& job);
  void run(GenJob& job);
  int prepare_prefix(GenJob& job);
  void finish(GenJob& job, FinishReason reason);
  void update_gauges();
  void start_over();  // backend at position 0, nothing resident

  Backend* backend_ = nullptr;          // one job at a time, or
  BatchBackend* batch_ = nullptr;       // continuous batching through sched_
  std::unique_ptr<Scheduler> sched_;
  Metrics& metrics_;
  EngineOptions opt_;
  int max_context_ = 0;
  int max_seqs_ = 1;
  PrefixCache cache_;
  std::vector<int32_t> resident_;       // tokens whose KV (and, at the end, live state) the backend holds

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GenJob>> queue_;
  std::shared_ptr<GenJob> running_;     // one job at a time: the running one
  int sched_running_ = 0, sched_waiting_ = 0;  // batched: jobs in the scheduler (under mu_)
  std::vector<std::shared_ptr<GenJob>> in_scheduler_;  // batched: handed to the scheduler, not done (under mu_)
  bool stop_ = false;
  std::atomic<bool> accepting_{true};
  std::atomic<bool> exited_{false};
  double avg_job_s_ = 1.0;              // moving average of job durations
  std::thread thread_;
};

}  // namespace lily::server
