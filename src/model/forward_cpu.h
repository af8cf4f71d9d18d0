// The CPU reference backend: the exact fp32 forward pass of shared/spec/model.md §2 over the checkpoint's
// stored matrices (bf16 or MLX affine, dequantized a few rows at a time), multi-threaded over all cores.
// Holds one sequence's state: per attention layer a KV cache (fp32, grown on demand), per GDN layer the
// conv state (last Kc-1 raw qkv rows) and the recurrent state S [Hv][Dk][Dv] (fp32).
// A prompt is processed in chunks of up to kPromptChunk tokens so each weight row is read once per chunk;
// the result is bit-identical to feeding the same tokens one at a time.
#pragma once
#include <span>
#include <vector>

#include "model/weights.h"
#include "runtime/backend.h"
#include "util/thread_pool.h"

namespace lily {

class CpuBackend : public Backend {
 public:
  static constexpr int kPromptChunk = 128;

  // `model` must outlive the backend. max_context <= 0: config.max_position_embeddings. pool: null = the
  // global pool, looked up at each forward() (so ThreadPool::set_global_threads between calls is safe).
  explicit CpuBackend(const Model& model, int max_context = 0, ThreadPool* pool = nullptr);

  const Config& config() const override { return cfg_; }
  std::string name() const override { return "cpu"; }
  int max_context() const override { return max_context_; }
  int position() const override { return pos_; }
  void reset() override;
  void forward(std::span<const int32_t> tokens, float* logits, bool all_logits) override;
  StateSnapshot save_state() const override;
  void restore_state(const StateSnapshot& s) override;

 private:
  struct LayerState {
    std::vector<float> k, v;   // attention: [pos][n_kv_heads * head_dim], post-norm/RoPE keys, raw values
    std::vector<float> conv;   // GDN: [Kc-1][conv_dim] raw qkv of the last Kc-1 tokens (oldest first)
    std::vector<float> S;      // GDN: [Hv][Dk][Dv]
  };

  // Consumes n <= kPromptChunk tokens; logits: [n, vocab] (all) or [vocab] (last only) or null.
  void forward_chunk(const int32_t* tokens, int n, float* logits, bool all_logits);
  void embed(const int32_t* tokens, int n, float* x);
  void gdn(int layer, const float* x, int n, float* out);
  void attention(int layer, const float* x, int n, float* out);
  void moe(int layer, const float* x, int n, float* out);
  void norm_rows(const float* x, const std::vector<float>& w, int n, float* y);
  void head(const float* x, int n, float* logits);

  const Model& model_;
  const Config& cfg_;
  ThreadPool* own_pool_ = nullptr;  // the caller's pool, or null for the global one
  ThreadPool* pool_ = nullptr;      // the pool of the forward() in progress
  int max_context_ = 0;
  int pos_ = 0;
  std::vector<LayerState> state_;  // [n_layers]
};

}  // namespace lily
