// The CPU batch backend: the reference forward pass over `max_seqs` sequence slots (model/forward_cpu.h),
// one CpuBatchForward pass per step, so each weight is read once per step for all slots in it.
#pragma once
#include <condition_variable>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "model/forward_cpu.h"
#include "runtime/batch_backend.h"

namespace lily {

class CpuBatchBackend : public BatchBackend {
 public:
  // `model` must outlive the backend. max_context <= 0: config.max_position_embeddings. pool: null = the
  // global pool, looked up at each step().
  CpuBatchBackend(const Model& model, int max_seqs, int max_context = 0, ThreadPool* pool = nullptr);
  ~CpuBatchBackend() override;

  const Config& config() const override { return f_.config(); }
  std::string name() const override { return "cpu"; }
  int max_seqs() const override { return static_cast<int>(slots_.size()); }
  int max_context() const override { return max_context_; }
  int position(int slot) const override { return slots_[check_slot(slot, "position")].position; }
  void reset(int slot) override;
  void step(std::span<const BatchEntry> batch) override;
  // The pass runs on the backend's own thread between the two (the caller's host work overlaps it).
  void step_begin(std::span<const BatchEntry> batch) override;
  void step_end() override;
  StateSnapshot save_state(int slot) const override;
  void restore_state(int slot, const StateSnapshot& s) override;
  void copy_prefix(int dst, int src, int n_tokens) override;

 private:
  int check_slot(int slot, const char* what) const;  // returns slot; throws naming `what` if out of range
  // Checks the batch (naming the call `what`) and builds groups_ from it.
  void load(std::span<const BatchEntry> batch, const char* what);
  void run_worker();

  CpuBatchForward f_;
  int max_context_ = 0;
  std::vector<CpuSequenceState> slots_;  // [max_seqs]
  std::vector<CpuGroup> groups_;         // the open step's groups (kept to reuse the allocation)
  // The thread that runs a step between step_begin and step_end (started at the first step_begin).
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool has_job_ = false, job_done_ = false, quit_ = false, is_open_ = false;
  std::exception_ptr error_;             // what the open step threw
};

}  // namespace lily
