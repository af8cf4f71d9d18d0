// Internals of the CUDA backend shared by cuda_engine.cu (the captured decode step), cuda_backend.cu (the Backend),
// cuda_weights.cu (upload from a checkpoint, synthetic full-size weights) and bench_cuda.cu (lily bench).
// Everything lives in an explicit CudaEngine context: stream, graph, device buffers — no globals.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/gdn_fused.h"
#include "kernels/mixers.h"
#include "kernels/qmat.h"
#include "model/config.h"
#include "model/weights.h"

namespace lily::cuda {

// cudaMalloc of n elements of T (at least one), checked; the caller cudaFrees it.
template <typename T>
T* device_alloc(size_t n) {
  T* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}

struct PrefillBuffers;  // model/prefill_cuda.cu
struct GemmX;           // kernels/batched.h
struct PrefillOut {     // one projection of the prompt path: y [n][ldy] = W x
  const QMat* W;
  float* y;
  int ldy;
};

// ---- weights on the device ----
struct AttnDev {                // self_attn.*
  QMat q, k, v;                 // [Hq*2d, H], [Hkv*d, H], [Hkv*d, H]
  QMat o;                       // [H, Hq*d]
  float* q_norm = nullptr;      // [d] effective (1 + w)
  float* k_norm = nullptr;      // [d]
};
struct LayerDev {
  float* input_norm = nullptr;  // [H] effective (1 + w)
  float* post_norm = nullptr;   // [H]
  GdnMixerDev gdn;              // linear-attention layers (linear_attn.*, kernels/gdn_fused.h)
  AttnDev attn;                 // full-attention layers
  MoeWeightsDev moe;
};
struct DeviceWeights {
  QMat embed;                   // [V, H]
  std::vector<LayerDev> layers; // [n_layers]
  float* norm = nullptr;        // [H] final norm (1 + w)
  QMat lm_head;                 // [V, H]
  std::vector<void*> allocations;  // every cudaMalloc made for these weights (freed by free_weights)
  double bytes = 0;             // device bytes held
};

// Uploads and repacks a loaded checkpoint (MLX affine words, or HF bf16 kept as bf16 / quantized to 4-bit).
DeviceWeights upload_weights(const Model& model, bool quantize_bf16, bool progress, cudaStream_t s);
// Bytes of the checkpoint's matrices (what upload_weights reads from the files; the progress bar's total).
uint64_t checkpoint_matrix_bytes(const Model& model);
// Random full-size weights in the MLX 4-bit layout (8-bit router / shared gate) generated on the GPU.
DeviceWeights synthetic_weights(const Config& c, uint64_t seed, cudaStream_t s);
void free_weights(DeviceWeights& w);

// Fills n bf16 values with random numbers in [-1, 1) (seeded), e.g. a benchmark's KV pages.
void fill_random_bf16(uint16_t* p, size_t n, uint64_t seed, cudaStream_t s);

// ---- the engine: one sequence's state and the captured decode step ----
struct StepDev {
  int token;                    // the token being consumed
  int pos;                      // its position (0-based)
  float logprob;                // device sampling with log-probabilities: that of the sampled token
};

// Optional per-kernel-family timing hook for an instrumented (non-graph) step: called before each family
// with its name; the last call is mark("end").
using FamilyMark = std::function<void(const char* family)>;

class CudaEngine {
 public:
  // fused = false: the multi-launch GDN mixer and MoE paths even where the persistent kernels apply (tests).
  CudaEngine(const Config& c, DeviceWeights w, int max_context, int device, bool fused = true);
  ~CudaEngine();
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  const Config& config() const { return cfg_; }
  int max_context() const { return max_context_; }
  cudaStream_t stream() const { return stream_; }
  const float* logits() const { return logits_; }       // [vocab] fp32, device
  float* logits() { return logits_; }                   // (device sampling adds the logit_bias in place)
  StepDev* step() const { return step_; }               // device
  const DeviceWeights& weights() const { return w_; }

  // Makes KV pages exist for tokens [0, n_tokens).
  void ensure_kv(int n_tokens);
  int page_tokens() const { return page_tokens_; }  // tokens per KV page
  // Device bytes of the KV pages not allocated yet, up to max_context() (what ensure_kv may still take).
  size_t kv_bytes_to_come() const;
  // Fills the KV pages for tokens [0, n_tokens) with random bf16 (benchmarks).
  void fill_kv_random(int n_tokens, uint64_t seed);
  // Zeroes the recurrent states (a new sequence).
  void reset_state();
  // Records one decode step (embedding -> 40 layers -> final norm -> lm_head) into the stream; reads the
  // token and position from step(). With `mark`, calls it before each kernel family.
  // head = false: without the final norm and lm_head (a prompt token whose logits nobody reads).
  void record_step(const FamilyMark* mark = nullptr, bool head = true);
  // Launches the captured graph of record_step() (head = false: the one without the lm_head).
  void launch_step(bool head = true);
  // The captured graph of record_step() followed by `tail` (e.g. greedy sampling + position advance).
  cudaGraphExec_t capture(const std::function<void()>& tail, bool head = true);

  // The prompt path (model/prefill_cuda.cu): consumes tokens[0, n) at positions pos0.. (n <= kPrefillChunk)
  // through every layer together (GEMMs over the chunk, the mixers over it in a few launches); the residual stream of
  // token t is then at prefill_h(t) (device, [H], valid until the next prefill), for the final norm + lm_head.
  // Enqueued on stream(); returns once the tokens are staged (the call before it has finished).
  static constexpr int kPrefillChunk = 2048;
  // Tokens per chunk the backend uses: kPrefillChunk, or LILY_PREFILL_CHUNK (benchmarks) up to it.
  static int prefill_chunk();
  // logits() = lm_head(RMSNorm(h) * norm) for h [H] on the device (e.g. prefill_h(t)); enqueued on stream().
  void lm_head(const float* h);
  void prefill(const int32_t* tokens, int pos0, int n);
  void prefill_alloc();  // the prompt path's buffers (~0.5 GB for the real model; prefill allocates them if needed)
  bool prefill_supported() const;  // the prompt path's kernels take this model's shapes
  const float* prefill_h(int t) const;

  // GDN conv rings + recurrent states of all linear-attention layers, one contiguous device buffer.
  void* gdn_state() const { return gdn_state_; }
  size_t gdn_state_bytes() const { return gdn_state_bytes_; }

 private:
  // h += out_proj(gdn(rmsnorm(h) * norm_w)); true when the one-launch mixer also added the next MoE block's
  // router sums (next: moe_router_sums, acc null for none)
  bool gdn(int layer, const float* norm_w, const RouterSums& next);
  // attention(rmsnorm(h) * norm_w) into mix_; o_proj (h += o_proj(mix_)) is left to the MoE launch
  void attention(int layer, const float* norm_w, ResidualProj& o_proj);
  void project(const GemvBatch& b, const float* norm_w, bool& normed);
  void project(std::initializer_list<PrefillOut> outs, const GemmX& x, int n);
  void prefill_free();
  void prefill_gdn(int layer, int pos0, int n);
  void prefill_attention(int layer, int pos0, int n);
  void prefill_moe(int layer, int n);
  void add_page(int page);

  Config cfg_;
  DeviceWeights w_;
  const FamilyMark* mark_ = nullptr;  // set during an instrumented record_step
  std::string skip_;                  // LILY_SKIP: kernel families left out of the step (benchmarks only)
  bool fused_ = true;                 // persistent GDN mixer and MoE block where they apply (off: constructor;
                                      // LILY_GDN_FUSED=0 / LILY_MOE_FUSED=0 in the kernels' checks)
  float* gdn_scratch_ = nullptr;      // [gdn_mixer_scratch_floats()] fused GDN mixer: staged outputs, tile sums
  unsigned* gdn_barrier_ = nullptr;   // [kGridBarrierWords] its grid barrier
  bool family(const char* name);      // marks `name`; false when it is skipped
  bool runs(const char* name) const;  // false when `name` is skipped (no mark)
  int max_context_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaGraphExec_t graph_ = nullptr;
  cudaGraphExec_t graph_nohead_ = nullptr;  // the step without lm_head (prompt tokens before the last)
  StepDev* step_ = nullptr;      // device [1]
  float* h_ = nullptr;           // [H] residual stream
  float* x_ = nullptr;           // [H] normed input of a block
  float* proj_ = nullptr;        // [conv_dim + Hv*Dv + 2*Hv] GDN projections, or [Hq*2d + 2*Hkv*d] q|k|v
  float* mix_ = nullptr;         // [max(Hv*Dv, Hq*d)] mixer output before its out projection
  float* logits_ = nullptr;      // [V]
  MoeScratch moe_;
  AttnScratch attn_;
  int attn_splits_ = 0;
  // GDN state: per GDN layer [4][conv_dim] ring then [Hv][Dk][Dv] S
  void* gdn_state_ = nullptr;
  size_t gdn_state_bytes_ = 0;
  std::vector<float*> ring_, S_;  // [n_layers] (null for attention layers)
  // KV cache
  int page_tokens_ = 0;
  std::vector<int> attn_index_;               // [n_layers] -> attention layer index or -1
  std::vector<uint16_t**> page_table_;        // [n_attn] device [max_pages]
  std::vector<void*> page_blocks_;            // one allocation per page index (all attention layers)
  int pages_ = 0;
  PrefillBuffers* pf_ = nullptr;  // the prompt path's buffers (prefill_alloc on first use, prefill_free)
};

}  // namespace lily::cuda
