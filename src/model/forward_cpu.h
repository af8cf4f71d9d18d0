// The CPU reference: the exact fp32 forward pass of docs/model.md §2 over the checkpoint's stored matrices (bf16 or MLX affine, dequantized a few rows at a time), multi-threaded over all cores.
// Holds one sequence's state: per attention layer a KV cache (fp32, grown on demand), per GDN layer the
// conv state (last Kc-1 raw qkv rows) and the recurrent state S [Hv][Dk][Dv] (fp32).
// A prompt is processed in chunks of up to kPromptChunk tokens so each weight row is read once per chunk;
// the result is bit-identical to feeding the same tokens one at a time. runtime/cpu_backend.h adapts it to the
// runtime's Backend.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/weights.h"
#include "util/thread_pool.h"

namespace lily {

class CpuForward {
 public:
  static constexpr int kPromptChunk = 128;

  // `model` must outlive this object. max_context <= 0: config.max_position_embeddings. pool: null = the
  // global pool, looked up at each forward() (so ThreadPool::set_global_threads between calls is safe).
  explicit CpuForward(const Model& model, int max_context = 0, ThreadPool* pool = nullptr);

  const Config& config() const { return cfg_; }
  int max_context() const { return max_context_; }
  int position() const { return pos_; }
  void reset();
  void forward(std::span<const int32_t> tokens, float* logits, bool all_logits);
  // The recurrent state (for each GDN layer in order: conv [Kc-1][conv_dim] then S [Hv][Dk][Dv], fp32), and
  // its restoration at `position` <= position() (KV entries [0, position) are kept).
  std::vector<uint8_t> save_state() const;
  void restore_state(int position, std::span<const uint8_t> bytes);

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
