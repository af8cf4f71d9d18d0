// The seam between the engine and a compute backend (CPU reference, CUDA). A backend owns one sequence's
// state (KV cache, GDN conv and recurrent states) and advances it token by token or a prompt at a time.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "runtime/sampler.h"

namespace lily {

// A copy of one sequence's recurrent state (GDN conv + recurrent states of every linear-attention layer)
// at a given position; used by the prefix cache. KV is not included: it can be cut. In host memory, or (CUDA
// backend, within its device budget) in device memory owned by the backend's allocator.
struct StateSnapshot {
  int position = 0;                   // tokens consumed when taken
  std::vector<uint8_t> bytes;         // host copy, backend-defined layout (empty when `device` holds the state)
  std::shared_ptr<void> device;       // device copy; the last reference returns it to the backend's pool
  size_t device_bytes = 0;            // bytes behind `device`
  size_t size() const { return bytes.size() + device_bytes; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const Config& config() const = 0;
  virtual std::string name() const = 0;     // "cpu", "cuda"
  virtual int max_context() const = 0;      // tokens the caches can hold
  virtual int position() const = 0;         // tokens consumed so far by this sequence
  virtual void reset() = 0;                 // empty sequence at position 0

  // Consume `tokens` at positions position()..position()+n-1. Writes float32 logits [n, vocab] to
  // `logits` when all_logits, else only the last position's [vocab]; `logits` may be null (a device-sampling
  // backend still computes the last position's logits on the device).
  virtual void forward(std::span<const int32_t> tokens, float* logits, bool all_logits) = 0;

  // Sampling where the logits are (optional; the CUDA backend): no vocab-sized copy to the host and no host
  // sampler per token, the sampled id written straight into the next step's input. begin_device_sampling()
  // returns false when this backend or these parameters cannot be sampled there with the host Sampler's
  // semantics; the caller then samples on the host from forward()'s logits. Otherwise it starts one
  // generation: RNG counter 0, the penalty counts from `prompt` (repetition penalty) and nothing generated;
  // with `logprobs` each result carries the id's log-probability (else NaN), with params.top_logprobs > 0 the
  // most likely ids (SampleResult::top).
  virtual bool begin_device_sampling(const SamplingParams& /*params*/, std::span<const int32_t> /*prompt*/,
                                     bool /*logprobs*/) {
    return false;
  }
  // The next id from the logits of the last consumed position (consume the prompt with forward(..., nullptr,
  // false): the logits stay on the device). It becomes the pending id; position() is unchanged.
  virtual SampleResult sample_device() { return {}; }
  // Consumes the pending id (position() + 1) and samples the next one from its logits, which becomes pending.
  // decode_device_launch() starts that and returns at once (the host may stream the id meanwhile);
  // decode_device_wait() then returns the new pending id. decode_sample_device() does both. Two launches may
  // be queued (the second consumes the id the first samples, before the host has seen it); waits return their
  // ids in launch order.
  virtual void decode_device_launch() {}
  virtual SampleResult decode_device_wait() { return {}; }
  SampleResult decode_sample_device() {
    decode_device_launch();
    return decode_device_wait();
  }

  // Prefix cache support: snapshot the recurrent state now; restore it and keep the first
  // snapshot.position KV entries (the tokens must be the same ones that produced the snapshot).
  virtual StateSnapshot save_state() const = 0;
  virtual void restore_state(const StateSnapshot& s) = 0;
};

}  // namespace lily
