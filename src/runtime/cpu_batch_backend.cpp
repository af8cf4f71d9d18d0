// CpuBatchBackend: slot bookkeeping and validation around CpuBatchForward.
#include "runtime/cpu_batch_backend.h"

#include <utility>

#include "util/check.h"

namespace lily {

CpuBatchBackend::CpuBatchBackend(const Model& model, int max_seqs, int max_context, ThreadPool* pool)
    : f_(model, pool) {
  LILY_CHECK(max_seqs >= 1, "cpu batch backend: max_seqs is ", max_seqs, ", expected at least 1");
  max_context_ = max_context > 0 ? max_context : f_.config().max_position_embeddings;
  if (max_context_ <= 0) max_context_ = 1 << 18;
  slots_.reserve(max_seqs);
  for (int i = 0; i < max_seqs; ++i) slots_.push_back(f_.new_state());
}

int CpuBatchBackend::check_slot(int slot, const char* what) const {
  LILY_CHECK(!is_open_, "cpu batch backend: ", what, " while a step is open (step_end first)");
  LILY_CHECK(slot >= 0 && slot < max_seqs(), "cpu batch backend: ", what, ": slot ", slot, " outside [0, ",
             max_seqs(), ")");
  return slot;
}

void CpuBatchBackend::reset(int slot) { f_.reset(slots_[check_slot(slot, "reset")]); }

CpuBatchBackend::~CpuBatchBackend() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard l(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void CpuBatchBackend::step(std::span<const BatchEntry> batch) {
  load(batch, "step");
  f_.forward(groups_);
}

void CpuBatchBackend::step_begin(std::span<const BatchEntry> batch) {
  load(batch, "step_begin");
  if (!worker_.joinable()) worker_ = std::thread([this] { run_worker(); });
  {
    std::lock_guard l(mu_);
    has_job_ = true;
    job_done_ = false;
    error_ = nullptr;
  }
  is_open_ = true;
  cv_.notify_all();
}

void CpuBatchBackend::step_end() {
  LILY_CHECK(is_open_, "cpu batch backend: step_end without step_begin");
  std::unique_lock l(mu_);
  cv_.wait(l, [&] { return job_done_; });
  is_open_ = false;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void CpuBatchBackend::run_worker() {
  std::unique_lock l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return has_job_ || quit_; });
    if (quit_) return;
    has_job_ = false;
    l.unlock();
    std::exception_ptr err;
    try {
      f_.forward(groups_);
    } catch (...) {
      err = std::current_exception();
    }
    l.lock();
    error_ = err;
    job_done_ = true;
    cv_.notify_all();
  }
}

void CpuBatchBackend::load(std::span<const BatchEntry> batch, const char* what) {
  LILY_CHECK(!is_open_, "cpu batch backend: ", what, " while a step is open");
  // Everything is checked before any slot changes.
  std::vector<char> used(slots_.size(), 0);
  const int vocab = config().vocab;
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchEntry& e = batch[i];
    check_slot(e.slot, "step");
    LILY_CHECK(!used[e.slot], "cpu batch backend: step: slot ", e.slot, " appears twice in one step");
    used[e.slot] = 1;
    const int64_t n = static_cast<int64_t>(e.tokens.size());
    LILY_CHECK(n >= 1, "cpu batch backend: step: slot ", e.slot, " has no tokens");
    const int pos = slots_[e.slot].position;
    LILY_CHECK(pos + n <= max_context_, "cpu batch backend: step: slot ", e.slot, ": ", pos, " + ", n,
               " tokens exceed the context limit of ", max_context_);
    for (size_t t = 0; t < e.tokens.size(); ++t)
      LILY_CHECK(e.tokens[t] >= 0 && e.tokens[t] < vocab, "cpu batch backend: step: slot ", e.slot, ": token id ",
                 e.tokens[t], " (at ", t, ") outside [0, ", vocab, ")");
  }
  groups_.clear();
  for (const BatchEntry& e : batch) groups_.push_back({&slots_[e.slot], e.tokens, e.logits, false});
}

StateSnapshot CpuBatchBackend::save_state(int slot) const {
  const CpuSequenceState& s = slots_[check_slot(slot, "save_state")];
  StateSnapshot snap;
  snap.position = s.position;
  snap.bytes = f_.save_state(s);
  return snap;
}

void CpuBatchBackend::restore_state(int slot, const StateSnapshot& s) {
  check_slot(slot, "restore_state");
  LILY_CHECK(!s.device, "cpu batch backend: a device snapshot cannot be restored here");
  f_.restore_state(slots_[slot], s.position, s.bytes);
}

void CpuBatchBackend::copy_prefix(int dst, int src, int n_tokens) {
  check_slot(dst, "copy_prefix (dst)");
  check_slot(src, "copy_prefix (src)");
  f_.copy_prefix(slots_[dst], slots_[src], n_tokens);
}

}  // namespace lily
