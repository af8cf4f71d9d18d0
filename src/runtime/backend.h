// The seam between the engine and a compute backend (CPU reference, CUDA). A backend owns one sequence's
// state (KV cache, GDN conv and recurrent states) and advances it token by token or a prompt at a time.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"

namespace lily {

// A copy of one sequence's recurrent state (GDN conv + recurrent states of every linear-attention layer)
// at a given position, in host memory; used by the prefix cache. KV is not included: it can be cut.
struct StateSnapshot {
  int position = 0;                   // tokens consumed when taken
  std::vector<uint8_t> bytes;         // backend-defined layout
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
  // `logits` when all_logits, else only the last position's [vocab]; `logits` may be null (no head).
  virtual void forward(std::span<const int32_t> tokens, float* logits, bool all_logits) = 0;

  // Prefix cache support: snapshot the recurrent state now; restore it and keep the first
  // snapshot.position KV entries (the tokens must be the same ones that produced the snapshot).
  virtual StateSnapshot save_state() const = 0;
  virtual void restore_state(const StateSnapshot& s) = 0;
};

}  // namespace lily
