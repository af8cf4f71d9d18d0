// The CPU backend: the reference forward pass (model/forward_cpu.h) behind the runtime's Backend, with the
// host implementation of the generation protocol (the Sampler over its logits).
#pragma once
#include <algorithm>
#include <functional>
#include <memory>
#include <span>

#include "model/forward_cpu.h"
#include "runtime/backend.h"
#include "runtime/resources.h"
#include "util/check.h"

namespace lily {

class CpuBackend : public Backend {
 public:
  static constexpr int kPromptChunk = CpuForward::kPromptChunk;

  // `model` must outlive the backend. max_context <= 0: config.max_position_embeddings. pool: null = the
  // global pool, looked up at each forward().
  explicit CpuBackend(const Model& model, int max_context = 0, ThreadPool* pool = nullptr)
      : f_(model, max_context, pool), kv_pool_(PageTable::pages_for(f_.max_context(), kPageTokens)) {
    state_slots_.alloc();  // this sequence's (the forward pass holds one state)
  }

  const Config& config() const override { return f_.config(); }
  std::string name() const override { return "cpu"; }
  int max_context() const override { return f_.max_context(); }
  int position() const override { return f_.position(); }
  void reset() override {
    f_.reset();
    kv_.release(kv_pool_);
  }
  ResourceUse resources() const override {
    return {kv_pool_.in_use(), kv_pool_.capacity(), kPageTokens, state_slots_.in_use(), state_slots_.capacity()};
  }
  void forward(std::span<const int32_t> tokens, float* logits, bool all_logits) override {
    const int n = f_.position() + static_cast<int>(tokens.size());
    LILY_CHECK(n <= f_.max_context() && kv_.reserve(kv_pool_, n), "cpu backend: ", n,
               " tokens exceed the context limit of ", f_.max_context());
    f_.forward(tokens, logits, all_logits);
  }
  StateSnapshot save_state() const override {
    StateSnapshot s;
    s.position = f_.position();
    s.bytes = f_.save_state();
    return s;
  }
  // Parts of 256 tokens (whole passes of the forward: the same passes, so the same bits, as one call), stop()
  // before each after the first.
  bool prefill_stoppable(std::span<const int32_t> tokens, bool last, const std::function<bool()>& stop) override {
    for (size_t i = 0; i < tokens.size(); i += kStopTokens) {
      if (i > 0 && stop && stop()) return false;
      const size_t m = std::min(kStopTokens, tokens.size() - i);
      prefill(tokens.subspan(i, m), last && i + m == tokens.size());
    }
    return true;
  }
  bool profile_begin() override {
    prof_.finish();
    f_.set_profiler(&prof_);
    return true;
  }
  std::vector<FamilyTime> profile_end() override {
    f_.set_profiler(nullptr);
    return prof_.finish();
  }
  void restore_state(const StateSnapshot& s) override {
    LILY_CHECK(!s.device, "cpu backend: a device snapshot cannot be restored here");
    f_.restore_state(s.position, s.bytes);
    kv_.truncate(kv_pool_, s.position);
  }

 private:
  static constexpr int kPageTokens = 256;  // KV accounting granularity (the vectors grow per token)
  static constexpr size_t kStopTokens = 2 * CpuForward::kPromptChunk;  // prefill_stoppable's parts
  CpuForward f_;
  IdPool kv_pool_;                 // this backend's KV pages (accounting: the forward pass owns the memory)
  PageTable kv_{kPageTokens};
  IdPool state_slots_{1};
  WallClockProfiler prof_;
};

}  // namespace lily
