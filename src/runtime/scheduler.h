// Continuous batching: every step runs one forward pass over the decode token of each running sequence plus
// pieces of waiting prompts (chunked prefill mixed into the same steps, so a long prompt never freezes the
// streams already running), then samples each sequence with its own Sampler and reports the ids.
// Resources: a sequence is admitted when a state slot is free and the KV pages of its whole context fit (the
// pool of kv_pages pages of kv_page_tokens tokens); otherwise it waits in FIFO order. A slot whose sequence
// ended keeps its tokens (its KV and live state) for the prefix cache until its pages are needed. When a running
// sequence needs a page and none is left, the most recently admitted running sequence is preempted: its slot and
// pages are dropped and it waits at the head of the queue to be recomputed (prompt + the ids it generated), then
// goes on sampling where it stopped (same sampler, same RNG counter): its output does not change.
// Prefix reuse: a new sequence starts from the longest prefix of its context that some slot's KV holds and for
// which the slot's live state or a PrefixCache snapshot gives the recurrent state (KV copied between slots with
// BatchBackend::copy_prefix). A sequence whose prompt shares a prefix with one still being consumed (the same
// long system prompt; n samples of one prompt) waits until that prefix is done and starts from it, so the
// common tokens are computed once. One thread (the caller's) drives it.
// Overlap: the ids a step drew are reported (on_token, on_done) in the next step() call while the backend runs
// that call's pass (BatchBackend::step_begin / step_end), so the host's work per id (the server's streaming)
// does not stall the device. Stop ids and max_tokens are known when an id is drawn, so a sequence that ends
// there is not in the next pass; one that its on_token ends (a stop string, a disconnect) has consumed that id in
// the pass already running, which only leaves its slot one token further (the slot records it).
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/batch_backend.h"
#include "runtime/generate.h"
#include "runtime/prefix_cache.h"
#include "runtime/resources.h"
#include "runtime/sampler.h"

namespace lily {

struct SeqResult {
  FinishReason finish = FinishReason::none;
  bool stopped_by_id = false;           // ended on a stop id (passed to on_token with stop_id = true)
  int n_cached = 0;                     // prompt tokens restored (prefix reuse) at the first admission
  int n_generated = 0;                  // ids sampled (the stop id included)
  int preemptions = 0;
  std::string error;                    // finish == error: the message
  bool nan_logits = false;              // finish == error because the logits were not finite
};

// One generation as the scheduler runs it. Callbacks run on the scheduler's thread, inside step().
struct SeqSpec {
  std::vector<int32_t> prompt;          // [n >= 1]
  int max_tokens = 16;                  // ids to sample at most (>= 1)
  std::vector<int32_t> stop_ids;        // ids that end the generation
  SamplingSetup sampling;               // host sampling; `filter` (not owned) must live until on_done
  std::vector<int> checkpoints;         // prompt positions where the state goes into the prefix cache
  std::vector<int32_t> turn_tail;       // after stopping on turn_tail[0]: fed (and cached) so the slot's state
                                        // sits where the conversation's next turn starts
  std::function<FinishReason()> interrupt;       // before each step: cancelled / length (time limit) / none
  std::function<void(int n_cached)> on_admitted; // first admission: prompt tokens restored from a prefix
  std::function<void()> on_prefilled;            // the prompt is consumed (before the first sample)
  // Every sampled id in order (stop ids too); returns a reason to end after it, or none.
  std::function<FinishReason(const SampledToken& token, int index, bool stop_id)> on_token;
  std::function<void(const SeqResult&)> on_done; // once, when the sequence ends for any reason
};

struct SchedulerOptions {
  int max_step_tokens = 2048;           // tokens per step: decode ids first, prompt pieces fill the rest
  int decode_step_tokens = 0;           // while some sequence decodes, a step's tokens at most this (its streams'
                                        // gap between ids while prompts are processed; at least 64 prompt
                                        // tokens still go); 0: max_step_tokens
  int prefill_chunk = 2048;             // tokens per prompt piece at most
  int kv_page_tokens = 256;
  int kv_pages = 0;                     // the KV pool; <= 0: every slot can hold max_context tokens
  bool prefix_cache = true;
  size_t cache_bytes = size_t{1} << 30; // snapshot pool cap
  int checkpoint_interval = 8192;       // extra prompt checkpoint every K tokens (0: none)
};

struct SchedulerStats {
  int running = 0, waiting = 0;         // sequences holding a slot / queued
  int slots_used = 0, slots_total = 0;  // slots held by running sequences (idle cached ones not counted)
  int kv_pages_used = 0, kv_pages_total = 0, kv_page_tokens = 0;  // pages held (idle slots' cached KV included)
  int64_t preemptions = 0;              // since start
  int64_t cached_tokens = 0;            // prompt tokens restored from prefixes since start
  int64_t steps = 0;
  size_t cache_entries = 0, cache_bytes = 0;
};

class Scheduler {
 public:
  Scheduler(BatchBackend& backend, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a sequence. Throws lily::Error for an empty prompt, max_tokens < 1, invalid sampling parameters, or a
  // context that can never fit (prompt + 1 beyond max_context or the KV pool).
  void add(SeqSpec spec);
  bool idle() const { return running_.empty() && waiting_.empty(); }
  // Admits what fits, starts one forward pass, reports the previous step's ids while it runs, then samples.
  // Sequences that end call on_done inside (after their last on_token). Returns the number of sequences that
  // took part in the pass (0 when none ran: then only reports were due, or nothing).
  int step();
  // Ends every sequence with `reason` (on_done for each), slots emptied: shutdown or after a backend failure.
  void abort_all(FinishReason reason, const std::string& error = "");
  SchedulerStats stats() const;
  // Called after each forward pass with the sequences and tokens it carried (for a batch-size histogram).
  std::function<void(int seqs, int tokens)> on_step;

 private:
  struct Seq;
  struct Slot {
    Seq* owner = nullptr;               // running sequence, or null (idle)
    std::vector<int32_t> tokens;        // tokens whose KV the slot holds, in order
    bool live = false;                  // the recurrent state is the one after `tokens` (position == size)
    PageTable kv;
    uint64_t last_used = 0;
    explicit Slot(int page_tokens) : kv(page_tokens) {}
  };

  static constexpr int kMinPromptTokens = 64;  // prompt tokens a step takes under decode_step_tokens at least
  static constexpr int kSharedPrefixMin = 64;  // tokens in common worth waiting for (a whole prompt always is)
  bool waits_for_prefix(const Seq& s);
  bool admit(Seq& s);
  bool reserve(Slot& slot, int n_tokens);
  bool evict_idle(int pages_needed, const Slot* keep);
  void preempt(Seq& s);
  void finish(Seq& s, FinishReason reason);
  void release(Seq& s, bool keep_tokens);
  struct Drawn {
    SampledToken token;
    bool ok = false, nan = false;
    std::string error;
  };
  Drawn draw(Seq& s, const float* logits, bool use_mask);
  // An id drawn for `s`: into its context, and whether it ends there (stop id, max_tokens, context); reported
  // later by deliver().
  void commit(Seq& s, Drawn d);
  // Reports the id commit() left (on_token), then ends the sequence if it ends there.
  void deliver(Seq& s);
  void deliver_all();                          // every pending report, in the order of the step that drew them
  void drop_ended();                           // forgets sequences that ended (and fed their turn tail)

  BatchBackend& be_;
  SchedulerOptions opt_;
  int vocab_ = 0, max_context_ = 0;
  IdPool kv_pool_;
  std::vector<Slot> slots_;
  PrefixCache cache_;
  std::deque<std::unique_ptr<Seq>> waiting_;   // FIFO; preempted sequences go back to the front
  std::vector<std::unique_ptr<Seq>> running_;  // in admission order
  std::vector<Seq*> reports_;                  // sequences with an id to report (Seq::report)
  uint64_t clock_ = 0, admissions_ = 0, keys_ = 0;
  int64_t preemptions_ = 0, cached_tokens_ = 0, steps_ = 0;
  std::vector<float> logits_;                  // [max_seqs][vocab]
  std::vector<uint32_t> mask_;                 // [ceil(vocab / 32)]
};

}  // namespace lily
