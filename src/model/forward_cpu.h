// The CPU reference: the exact fp32 forward pass of docs/model.md §2 over the checkpoint's stored matrices (bf16 or MLX affine, dequantized a few rows at a time), multi-threaded over all cores.
// CpuBatchForward runs many sequences in one pass: all their tokens form one activation matrix, so every
// weight is read once per pass, while the recurrences (GDN state, attention KV) run per sequence over its own
// CpuSequenceState. A sequence's logits are bit-identical however it is grouped with others or split into
// pieces. CpuForward is the one-sequence form; runtime/cpu_backend.h and runtime/cpu_batch_backend.h adapt
// them to the runtime's backends.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/pass_profile.h"
#include "model/weights.h"
#include "util/thread_pool.h"

namespace lily {

// One layer's part of a sequence's state (attention layers use k/v, GDN layers conv/S).
struct CpuLayerState {
  std::vector<float> k, v;   // attention: [pos][n_kv_heads * head_dim], post-norm/RoPE keys, raw values
  std::vector<float> conv;   // GDN: [Kc-1][conv_dim] raw qkv of the last Kc-1 tokens (oldest first)
  std::vector<float> S;      // GDN: [Hv][Dk][Dv]
};

// One sequence's state: KV caches grow on demand; the GDN state has a fixed size.
struct CpuSequenceState {
  std::vector<CpuLayerState> layers;  // [n_layers]
  int position = 0;                   // tokens consumed
};

// One sequence's part of a batched forward pass.
struct CpuGroup {
  CpuSequenceState* state = nullptr;  // consumed at state->position .. position + n - 1
  std::span<const int32_t> tokens;    // [n] (n = 0: the group is skipped)
  float* logits = nullptr;            // [n][vocab] (all_logits) or [vocab] (the last token's), or null
  bool all_logits = false;
};

class CpuBatchForward {
 public:
  // A pass takes at most kPromptChunk tokens of one group, and stops adding tokens once kPassRows rows are
  // taken except that every group with tokens left gets at least one; longer inputs take several passes.
  static constexpr int kPromptChunk = 128;
  static constexpr int kPassRows = 512;

  // `model` must outlive this object. pool: null = the global pool, looked up at each forward().
  explicit CpuBatchForward(const Model& model, ThreadPool* pool = nullptr);

  const Config& config() const { return cfg_; }
  // An empty sequence at position 0 (reset() of an existing one keeps its KV capacity).
  CpuSequenceState new_state() const;
  void reset(CpuSequenceState& s) const;

  // Consumes every group's tokens. Token ids and distinct, non-null states are checked before any state
  // changes; the caller enforces its context limit.
  void forward(std::span<const CpuGroup> groups);

  // The recurrent state (for each GDN layer in order: conv [Kc-1][conv_dim] then S [Hv][Dk][Dv], fp32), and
  // its restoration at `position` <= s.position (KV entries [0, position) are kept).
  std::vector<uint8_t> save_state(const CpuSequenceState& s) const;
  void restore_state(CpuSequenceState& s, int position, std::span<const uint8_t> bytes) const;
  // dst's KV entries become src's first n (n <= src.position) and dst.position = n; dst's GDN state is left as
  // it was (the caller restores a snapshot taken at n, or resets).
  void copy_prefix(CpuSequenceState& dst, const CpuSequenceState& src, int n) const;
  // Marks each kernel family of the passes that follow (null: none); `lily bench --prompts`.
  void set_profiler(PassProfiler* p) { prof_ = p; }

 private:
  struct Segment;  // one group's rows in one pass
  struct Pass;     // the segments of one pass and the row -> segment map

  void run_pass(const Pass& p);
  void embed(const Pass& p, float* x);
  void gdn(int layer, const float* x, const Pass& p, float* out);
  void attention(int layer, const float* x, const Pass& p, float* out);
  void moe(int layer, const float* x, int n, float* out);
  void norm_rows(const float* x, const std::vector<float>& w, int n, float* y);
  void head(const float* x, const Pass& p);

  const Model& model_;
  const Config& cfg_;
  ThreadPool* own_pool_ = nullptr;  // the caller's pool, or null for the global one
  ThreadPool* pool_ = nullptr;      // the pool of the forward() in progress
  PassProfiler* prof_ = nullptr;    // set_profiler's, or null
  FamilyFlops flops_;               // what each family's mark counts
  void mark(const char* family, double flops = 0) {
    if (prof_) prof_->mark(family, flops);
  }
};

// One sequence: a CpuBatchForward over a single CpuSequenceState, with a context limit.
class CpuForward {
 public:
  static constexpr int kPromptChunk = CpuBatchForward::kPromptChunk;

  // `model` must outlive this object. max_context <= 0: config.max_position_embeddings. pool: null = the
  // global pool, looked up at each forward() (so ThreadPool::set_global_threads between calls is safe).
  explicit CpuForward(const Model& model, int max_context = 0, ThreadPool* pool = nullptr);

  const Config& config() const { return f_.config(); }
  int max_context() const { return max_context_; }
  int position() const { return state_.position; }
  void reset() { f_.reset(state_); }
  void forward(std::span<const int32_t> tokens, float* logits, bool all_logits);
  std::vector<uint8_t> save_state() const { return f_.save_state(state_); }
  void restore_state(int position, std::span<const uint8_t> bytes) { f_.restore_state(state_, position, bytes); }
  void set_profiler(PassProfiler* p) { f_.set_profiler(p); }

 private:
  CpuBatchForward f_;
  int max_context_ = 0;
  CpuSequenceState state_;
};

}  // namespace lily
