// The seam between the scheduler (runtime/scheduler.h) and a backend that runs many sequences at once. The
// backend holds `max_seqs()` state slots (each: one sequence's recurrent state and KV entries); the scheduler
// decides which sequence lives in which slot and calls step() with one entry per slot that advances: decode
// tokens of running sequences and pieces of prompts, mixed in one forward pass so each weight is read once per
// step. A slot's result must not depend on which other slots share its step (bit for bit on the CPU).
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "model/config.h"
#include "runtime/backend.h"
#include "runtime/sampler.h"

namespace lily {

// One slot's part of a step: `tokens` consumed at positions position(slot) .. position(slot) + n - 1.
struct BatchEntry {
  int slot = 0;
  std::span<const int32_t> tokens;      // [n >= 1]
  float* logits = nullptr;              // [vocab] the last token's logits, or null (a prompt piece that is not last)
  // Drawn by the backend (draws(params) was true): the next id from the last token's logits with this sampler's
  // parameters, penalties and draw counter, into *drawn (token < 0: a logit was NaN), recorded in the sampler
  // (record_drawn). `key` names the sequence the sampler belongs to (nonzero; distinct for the sequences a
  // slot holds between two reset / restore_state / copy_prefix calls on it). logits may then be null.
  Sampler* sampler = nullptr;
  SampledToken* drawn = nullptr;
  uint64_t key = 0;
};

class BatchBackend {
 public:
  virtual ~BatchBackend() = default;
  virtual const Config& config() const = 0;
  virtual std::string name() const = 0;       // "cpu"
  virtual int max_seqs() const = 0;           // state slots
  virtual int max_context() const = 0;        // tokens one slot can hold
  virtual int position(int slot) const = 0;   // tokens the slot has consumed
  // KV tokens the backend's memory can hold for all slots together (the scheduler's default KV budget), or 0:
  // every slot its whole context.
  virtual int64_t kv_capacity_tokens() const { return 0; }
  virtual void reset(int slot) = 0;           // empty sequence at position 0
  // Whether step() can draw ids with these parameters itself (BatchEntry::sampler); by default never.
  virtual bool draws(const SamplingParams& /*params*/) const { return false; }
  // As Backend::prompt_grid: prompt checkpoints at multiples of it restore the whole prompt's bits.
  virtual int prompt_grid() const { return 1; }

  // One forward pass over every entry (distinct slots, in any order). Token ids are validated before any
  // state changes.
  virtual void step(std::span<const BatchEntry> batch) = 0;
  // step() in two halves, so the caller can do host work while the pass runs: step_begin() checks the batch and
  // starts the pass, step_end() waits for it and fills the entries' logits and drawn ids. In between the caller
  // keeps `batch` and what it points to alive and unchanged and makes no other call on the backend. By default
  // step_begin() runs step() and step_end() returns at once.
  virtual void step_begin(std::span<const BatchEntry> batch) { step(batch); }
  virtual void step_end() {}

  // The slot's recurrent state now (StateSnapshot::position = position(slot)), and its restoration: the slot
  // keeps KV entries [0, s.position) and takes the snapshot's recurrent state (the tokens must be the same ones
  // that produced the snapshot; s.position <= position(slot)).
  virtual StateSnapshot save_state(int slot) const = 0;
  virtual void restore_state(int slot, const StateSnapshot& s) = 0;
  // dst's KV entries become src's first n_tokens (n_tokens <= position(src)); dst's position becomes n_tokens and
  // its recurrent state is undefined until restore_state() (a snapshot at n_tokens) or reset(). src unchanged.
  virtual void copy_prefix(int dst, int src, int n_tokens) = 0;

  // As Backend::profile_begin / profile_end, for the steps between them (`lily bench --concurrency
  // --profile-steps`): each kernel family's time (model/pass_profile.h), summed over the steps.
  virtual bool profile_begin() { return false; }
  virtual std::vector<FamilyTime> profile_end() { return {}; }
};

// A BatchBackend that passes every call to another one: the base of wrappers that change one call (a benchmark's
// timing of step(), a test's backend that draws nothing).
class ForwardingBatchBackend : public BatchBackend {
 public:
  explicit ForwardingBatchBackend(BatchBackend& inner) : inner_(inner) {}
  const Config& config() const override { return inner_.config(); }
  std::string name() const override { return inner_.name(); }
  int max_seqs() const override { return inner_.max_seqs(); }
  int max_context() const override { return inner_.max_context(); }
  int position(int slot) const override { return inner_.position(slot); }
  int64_t kv_capacity_tokens() const override { return inner_.kv_capacity_tokens(); }
  void reset(int slot) override { inner_.reset(slot); }
  bool draws(const SamplingParams& params) const override { return inner_.draws(params); }
  int prompt_grid() const override { return inner_.prompt_grid(); }
  void step(std::span<const BatchEntry> batch) override { inner_.step(batch); }
  void step_begin(std::span<const BatchEntry> batch) override { inner_.step_begin(batch); }
  void step_end() override { inner_.step_end(); }
  StateSnapshot save_state(int slot) const override { return inner_.save_state(slot); }
  void restore_state(int slot, const StateSnapshot& s) override { inner_.restore_state(slot, s); }
  void copy_prefix(int dst, int src, int n_tokens) override { inner_.copy_prefix(dst, src, n_tokens); }
  bool profile_begin() override { return inner_.profile_begin(); }
  std::vector<FamilyTime> profile_end() override { return inner_.profile_end(); }

 protected:
  BatchBackend& inner_;
};

}  // namespace lily
