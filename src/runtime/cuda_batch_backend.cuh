// The CUDA batch backend: `max_seqs` sequence states (GDN rings + recurrent states, KV pages) over a CUDA
// backend's engine (its weights, stream and prompt-path buffers). A step runs one pass of the prompt path over
// every entry's tokens (model/prefill_cuda.cu: each weight read once per pass; the one-token rows' GDN and
// attention in one launch each, prompt pieces per sequence), then one lm_head GEMM over the rows that want
// logits, copied to the host for the scheduler's samplers. A step with few one-token rows (<= graph_rows) runs
// those through their slot's captured decode step instead, one after another (the batch-1 kernels are faster
// than a pass over a few rows), and its prompt pieces through the pass.
// Precision: the prompt path's (fp32 activations split into two bf16 halves on the tensor cores), or the decode
// step's; both within the bounds test_cuda_batch states, so a sequence's logits can differ in the last bits with
// the number of one-token rows that share its step.
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
  // graph_rows < 0: the engine's KernelOptions::batch_graph_rows.
  CudaBatchBackend(CudaEngine& engine, int max_seqs, int graph_rows = -1);
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
  // The one-token entries `which` through their slots' decode graphs, one after another.
  void decode_graphs(std::span<const BatchEntry> batch, const std::vector<int>& which);

  CudaEngine& eng_;
  std::vector<SeqStateDev> slots_;      // [max_seqs]
  std::vector<int> pos_;                // [max_seqs] tokens consumed
  float* logits_ = nullptr;             // device [max_seqs][vocab]
  float* staged_ = nullptr;             // pinned host [max_seqs][vocab]: one copy for the pass's logits
  int64_t kv_capacity_ = 0;             // KV tokens the free device memory held at construction (less a margin)
  int graph_rows_ = 0;                  // steps with at most this many one-token rows use the decode graphs
  std::vector<cudaGraphExec_t> graphs_; // [max_seqs] each slot's decode step (captured on first use)
  StepDev* step_host_ = nullptr;        // pinned [max_seqs]: the token and position each graph launch reads
};

}  // namespace lily::cuda
