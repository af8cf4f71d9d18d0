// The CUDA batch backend: `max_seqs` sequence states (GDN rings + recurrent states, KV pages) over a CUDA
// backend's engine (its weights, stream and prompt-path buffers). A step runs one pass of the prompt path over
// every entry's tokens (model/prefill_cuda.cu: each weight read once per pass; the one-token rows' GDN and
// attention in one launch each, prompt pieces per sequence), then one lm_head GEMM over the rows that want
// logits; the rows whose sequences draw on the device (draws(): no structured output) are sampled there by
// kernels/sampling.h per row (penalties from the slot's device counts, which mirror its sequence's Sampler),
// only their ids and log-probabilities copied back; other rows' logits are copied to the host. A step with few
// one-token rows (<= graph_rows) runs those through their slot's captured decode step instead, one after another
// (the batch-1 kernels are faster than a pass over a few rows), and its prompt pieces through the pass.
// Precision: the prompt path's (fp32 activations split into two bf16 halves on the tensor cores), or the decode
// step's; both within the bounds test_cuda_batch states, so a sequence's logits can differ in the last bits with
// the number of one-token rows that share its step.
#pragma once
#include <span>
#include <string>
#include <vector>

#include "kernels/sampling.h"
#include "model/cuda_engine.h"
#include "model/event_profiler.cuh"
#include "runtime/batch_backend.h"
#include "runtime/snapshot_pool.cuh"

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
  int prompt_grid() const override { return eng_.prompt_grid(); }
  int position(int slot) const override { return pos_.at(check(slot)); }
  int64_t kv_capacity_tokens() const override { return kv_capacity_; }
  void reset(int slot) override;
  void step(std::span<const BatchEntry> batch) override;
  // step() is these two: the launches, then the wait for the ids' and logits' copies.
  void step_begin(std::span<const BatchEntry> batch) override;
  void step_end() override;
  StateSnapshot save_state(int slot) const override;
  void restore_state(int slot, const StateSnapshot& s) override;
  void copy_prefix(int dst, int src, int n_tokens) override;
  bool draws(const ::lily::SamplingParams& params) const override;
  // The passes' families (their launches one by one while profiled); steps through decode graphs mark nothing.
  bool profile_begin() override;
  std::vector<FamilyTime> profile_end() override;

 private:
  int check(int slot) const;
  // One pass (<= kPrefillChunk rows): pieces of entries, each {entry index, first token, tokens}.
  struct Piece {
    int entry, first, n;
  };
  void pass(std::span<const BatchEntry> batch, const std::vector<Piece>& pieces);
  // The one-token entries `which` through their slots' decode graphs, one after another.
  void decode_graphs(std::span<const BatchEntry> batch, const std::vector<int>& which);
  // Before the step's launches: a draw row per entry the backend draws for (in the batch's order), their slots'
  // counts brought up to date, their inputs (RNG, logit_bias) uploaded in one copy.
  void prepare_draws(std::span<const BatchEntry> batch);
  // Enqueues what an entry with a logits row on the device needs: its device draw (row row_of_[entry]) or the
  // copy of its logits into staged_ row j.
  // Enqueued on stream s (null: the engine's) with sampling scratch `scratch` (null: sample_scratch_).
  void enqueue_out(const BatchEntry& b, float* logits, int entry, cudaStream_t s = nullptr, void* scratch = nullptr);
  // An entry's draw on the fast path as a row of sample_rows (its logit_bias added first, on the engine's
  // stream); false where its parameters take the full path.
  bool draw_row(const BatchEntry& b, float* logits, int entry, cuda::SampleRow& row);
  // After the stream's work: the staged logits to their entries (host threads), the drawn ids to theirs.
  void finish_out(std::span<const BatchEntry> batch);
  // The slot's device counts made to mirror the entry's sampler (a new sequence in the slot, or a preempted one
  // back), synchronously.
  void sync_counts(const BatchEntry& b);

  CudaEngine& eng_;
  std::unique_ptr<EventProfiler> prof_; // profile_begin's, until profile_end
  std::vector<SeqStateDev> slots_;      // [max_seqs]
  std::vector<int> pos_;                // [max_seqs] tokens consumed
  float* logits_ = nullptr;             // device [max_seqs][vocab]
  float* staged_ = nullptr;             // pinned host [max_seqs][vocab]: one copy for the pass's logits
  int64_t kv_capacity_ = 0;             // KV tokens the free device memory held at construction (less a margin
                                        // and the snapshots' budget)
  std::shared_ptr<SnapshotPool> pool_;  // device memory of save_state (beyond its budget: host snapshots)
  int graph_rows_ = 0;                  // steps with at most this many one-token rows use the decode graphs
  std::vector<cudaGraphExec_t> graphs_; // [max_seqs] each slot's decode step (captured on first use)
  StepDev* step_host_ = nullptr;        // pinned [max_seqs]: the token and position each graph launch reads
  // device draws (kernels/sampling.h), per slot and per draw row of a step (<= max_seqs rows)
  int* counts_ = nullptr;               // device [max_seqs][vocab]: generated counts | kSampleInContext
  std::vector<uint64_t> counts_key_;    // [max_seqs] the sequence (BatchEntry::key) the counts mirror, 0: none
  void* sample_scratch_ = nullptr;      // device sampling_scratch_bytes(vocab), reused row after row
  // A pass's draws spread over kDrawStreams streams forked from the engine's after its lm_head and joined
  // before the ids are copied back (a draw is two short launches, one of them a single block, which one after
  // another leave most of the GPU idle); stream k draws with scratch k.
  static constexpr int kDrawStreams = 8;
  cudaStream_t draw_streams_[kDrawStreams] = {};
  cudaEvent_t fork_ev_ = nullptr;
  cudaEvent_t join_ev_[kDrawStreams] = {};
  uint8_t* draw_scratch_ = nullptr;     // device [kDrawStreams][sampling_scratch_bytes(vocab)]
  // the draws on the fast path (the chat defaults) all in one sample_rows instead (two launches a step)
  uint8_t* rows_scratch_ = nullptr;     // device [max_seqs][sample_rows_scratch_bytes(vocab)]
  std::vector<cuda::SampleRow> rows_;   // the pass's rows of it
  static constexpr int kMaxBias = 64;   // logit_bias entries a device draw takes (more: the host samples)
  struct DrawOut {                      // what a draw row returns (device, then pinned host)
    int token;
    float logprob;
    int top_ids[kMaxTopLogprobs];
    float top_logprobs[kMaxTopLogprobs];
  };
  DrawOut* out_dev_ = nullptr;          // [max_seqs]
  DrawOut* out_host_ = nullptr;         // pinned [max_seqs]
  struct DrawIn {                       // a draw row's inputs
    uint64_t rng[2];                    // {draw counter, seed}
    int n_bias;                         // logit_bias entries
    int bias_ids[kMaxBias];
    float bias_vals[kMaxBias];
  };
  DrawIn* in_dev_ = nullptr;            // device [max_seqs]
  DrawIn* in_host_ = nullptr;           // pinned [max_seqs]: the step's rows, one copy to in_dev_
  std::vector<int> bias_ids_host_;      // device_logit_bias's output for the row being enqueued
  std::vector<float> bias_vals_host_;
  std::vector<int> row_of_;             // [batch entries] draw row or staged_ row of the entry in this step, -1
  int n_draw_ = 0, n_staged_ = 0;       // rows used in this step
  std::vector<BatchEntry> open_;        // the step between step_begin and step_end
  bool is_open_ = false;
  int* ids_dev_ = nullptr;              // device [ids_cap_] token lists for sync_counts
  size_t ids_cap_ = 0;
};

}  // namespace lily::cuda
