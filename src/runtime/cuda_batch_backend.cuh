// The CUDA batch backend: `max_seqs` sequence states (GDN rings + recurrent states, KV pages) over a CUDA
// backend's engine (its weights, stream and prompt-path buffers), and one pass of the prompt path per step over
// every entry's tokens (model/prefill_cuda.cu: each weight read once per pass; GDN and attention per sequence),
// then one lm_head GEMM over the rows that want logits, copied to the host for the scheduler's samplers.
// Precision: the prompt path's (fp32 activations split into two bf16 halves on the tensor cores).
#pragma once
#include <span>
#include <string>
#include <vector>

#include "model/cuda_engine.h"
#include "runtime/batch_backend.h"

namespace lily::cuda {

class CudaBatchBackend : public BatchBackend {
 public:
  // `engine` (a CUDA backend's) must outlive this; only one of the two runs at a time (the engine thread).
  CudaBatchBackend(CudaEngine& engine, int max_seqs);
  ~CudaBatchBackend() override;

  const Config& config() const override { return eng_.config(); }
  std::string name() const override { return "cuda"; }
  int max_seqs() const override { return static_cast<int>(slots_.size()); }
  int max_context() const override { return eng_.max_context(); }
  int position(int slot) const override { return pos_.at(check(slot)); }
  int64_t kv_capacity_tokens() const override { return kv_capacity_; }
  void reset(int slot) override;
  void step(std::span<const BatchEntry> batch) override;
  StateSnapshot save_state(int slot) const override;
  void restore_state(int slot, const StateSnapshot& s) override;
  void copy_prefix(int dst, int src, int n_tokens) override;

 private:
  int check(int slot) const;
  // One pass (<= kPrefillChunk rows): pieces of entries, each {entry index, first token, tokens}.
  struct Piece {
    int entry, first, n;
  };
  void pass(std::span<const BatchEntry> batch, const std::vector<Piece>& pieces);

  CudaEngine& eng_;
  std::vector<SeqStateDev> slots_;      // [max_seqs]
  std::vector<int> pos_;                // [max_seqs] tokens consumed
  float* logits_ = nullptr;             // device [max_seqs][vocab]
  float* staged_ = nullptr;             // pinned host [max_seqs][vocab]: one copy for the pass's logits
  int64_t kv_capacity_ = 0;             // KV tokens the free device memory held at construction (less a margin)
};

}  // namespace lily::cuda
