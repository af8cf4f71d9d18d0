// The seam between the runtime and a compute backend (CPU reference, CUDA). A backend owns one sequence's
// state (KV cache, GDN conv and recurrent states) and advances it a prompt at a time or token by token.
// Generation has one protocol whatever samples the tokens: begin_sampling → prefill → sample → (decode_launch,
// decode_wait)*. This base class implements it on the host (the Sampler over forward()'s logits, synchronously);
// a backend that samples next to its logits (CUDA) overrides it and falls back to the host version where it must.
#pragma once
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/pass_profile.h"
#include "runtime/sampler.h"
#include "runtime/token_filter.h"

namespace lily {

// A copy of one sequence's recurrent state (GDN conv + recurrent states of every linear-attention layer)
// at a given position; used by the prefix cache. KV is not included: it can be cut. In host memory, or (CUDA
// backend, within its device budget) in device memory owned by the backend's snapshot pool.
struct StateSnapshot {
  int position = 0;                   // tokens consumed when taken
  std::vector<uint8_t> bytes;         // host copy, backend-defined layout (empty when `device` holds the state)
  std::shared_ptr<void> device;       // device copy; the last reference returns it to the backend's pool
  size_t device_bytes = 0;            // bytes behind `device`
  size_t size() const { return bytes.size() + device_bytes; }
};

// How one generation samples its tokens.
struct SamplingSetup {
  SamplingParams params;
  bool logprobs = false;              // each SampledToken carries its log-probability (else NaN)
  TokenFilter* filter = nullptr;      // structured output: the allowed ids per position (not owned)
  bool host = false;                  // sample on the host even where the backend could on its device (tests, bench)
};

// What a backend's resource pools hold now (runtime/resources.h), for /metrics and a scheduler's admission.
struct ResourceUse {
  int kv_pages = 0, kv_pages_total = 0;    // KV pages held by sequences / in the pool
  int kv_page_tokens = 0;                  // tokens per page
  int state_slots = 0, state_slots_total = 0;  // recurrent-state slots held / in the pool
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const Config& config() const = 0;
  virtual std::string name() const = 0;     // "cpu", "cuda"
  virtual int max_context() const = 0;      // tokens the caches can hold
  virtual int position() const = 0;         // tokens consumed so far by this sequence
  virtual void reset() = 0;                 // empty sequence at position 0
  virtual ResourceUse resources() const { return {}; }

  // Consume `tokens` at positions position()..position()+n-1. Writes float32 logits [n, vocab] to
  // `logits` when all_logits, else only the last position's [vocab]; `logits` may be null.
  virtual void forward(std::span<const int32_t> tokens, float* logits, bool all_logits) = 0;

  // Prefix cache support: snapshot the recurrent state now; restore it and keep the first
  // snapshot.position KV entries (the tokens must be the same ones that produced the snapshot).
  virtual StateSnapshot save_state() const = 0;
  virtual void restore_state(const StateSnapshot& s) = 0;

  // ---- generation ----
  // Starts one generation: the sampler's parameters, RNG counter 0, the penalty counts from `prompt` (the whole
  // context: it counts for the repetition penalty), nothing generated, nothing queued.
  virtual void begin_sampling(const SamplingSetup& setup, std::span<const int32_t> prompt);
  // Consumes prompt tokens; with `last`, this piece ends the prompt and its last token's logits are the ones
  // sample() draws from.
  virtual void prefill(std::span<const int32_t> tokens, bool last);
  // prefill() that can stop partway through the piece: stop() is checked between parts of it (not before it:
  // the caller does that) and once it returns true the rest is abandoned. Returns false then, and the sequence's
  // state is undefined until reset() or restore_state(). This base: the whole piece, never stopped; the CPU
  // backend checks every 256 tokens.
  virtual bool prefill_stoppable(std::span<const int32_t> tokens, bool last, const std::function<bool()>& stop);
  // The next id from the logits of the last consumed position. It becomes the pending id; position() is unchanged.
  virtual SampledToken sample();
  // Consumes the pending id (position() + 1) and samples the next one from its logits, which becomes pending.
  // decode_launch() starts that and may return at once (the host streams the id meanwhile); decode_wait() then
  // returns the new pending id. Two launches may be queued (the second consumes the id the first samples,
  // before the host has seen it); waits return their ids in launch order.
  virtual void decode_launch();
  virtual SampledToken decode_wait();
  // Whether this generation samples on the device (begin_sampling decided; for reports).
  virtual bool samples_on_device() const { return false; }
  // A prompt resumed from a state at a multiple of this position gets the whole prompt's bits (a prompt path
  // that works in pieces at fixed multiples, such as the chunked GDN's 64, rounds otherwise); the prefix cache's
  // prompt checkpoints keep to it (runtime/prefix_cache.h prompt_cut).
  virtual int prompt_grid() const { return 1; }

  // ---- profiling (`lily bench --prompts`) ----
  // Times each kernel family (model/pass_profile.h) of the prompt passes that follow, until profile_end, which
  // returns the table. False: this backend cannot (profile_end then returns nothing).
  virtual bool profile_begin() { return false; }
  virtual std::vector<FamilyTime> profile_end() { return {}; }

 protected:
  // The host implementation of the generation protocol (the base class's, and a device backend's fallback).
  void host_begin(const SamplingSetup& setup, std::span<const int32_t> prompt);
  void host_prefill(std::span<const int32_t> tokens, bool last);
  SampledToken host_sample();
  void host_launch();
  SampledToken host_wait();

 private:
  std::optional<Sampler> sampler_;
  TokenFilter* filter_ = nullptr;
  std::vector<float> logits_;           // [vocab] the last consumed position's logits
  std::vector<uint32_t> mask_;          // [ceil(vocab / 32)] the filter's allowed ids
  int32_t pending_ = -1;                // the last sampled id, not consumed yet
  struct Done {
    SampledToken token;
    std::exception_ptr error;           // a sampling failure (NaN logits), raised by host_wait as on a device
  };
  std::deque<Done> done_;               // sampled by host_launch, not yet returned by host_wait
  bool logprobs_ = false;
};

}  // namespace lily
