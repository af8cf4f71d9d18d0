// Internals of the CUDA backend shared by cuda_engine.cu (the captured decode step), cuda_backend.cu (the
// Backend), cuda_weights.cu (upload from a checkpoint, synthetic full-size weights) and bench_cuda.cu (lily bench).
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
#include "kernels/options.h"
#include "kernels/qmat.h"
#include "kernels/trace.h"
#include "model/config.h"
#include "model/decode_plan.h"
#include "model/kernel_options.h"
#include "model/pass_profile.h"
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
struct GemmXBuf;
struct PrefillOut {     // one projection of the prompt path: y [n][ldy] = W x
  const QMat* W;
  float* y;
  int ldy;
};

// ---- weights on the device (field names as the CPU's, model/weights.h: the checkpoint's) ----
struct AttnDev {                // self_attn.*
  QMat q_proj;                  // [Hq*2d, H] per head [query d | gate d]
  QMat k_proj, v_proj;          // [Hkv*d, H] each
  QMat o_proj;                  // [H, Hq*d]
  float* q_norm = nullptr;      // [d] effective (1 + w)
  float* k_norm = nullptr;      // [d]
};
struct LayerDev {
  float* input_layernorm = nullptr;           // [H] effective (1 + w)
  float* post_attention_layernorm = nullptr;  // [H] effective (1 + w): the MoE block's input norm
  GdnMixerDev gdn;              // linear-attention layers (linear_attn.*, kernels/gdn_fused.h)
  AttnDev attn;                 // full-attention layers
  MoeWeightsDev moe;            // mlp.*
};
struct DeviceWeights {
  QMat embed_tokens;            // [V, H]
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

// One sequence's device state (the engine's own; the batch backend's slots, runtime/cuda_batch_backend.cu): the
// GDN conv rings and recurrent states of every linear-attention layer (one buffer: CudaEngine::gdn_state's layout)
// and KV pages.
struct SeqStateDev {
  void* gdn = nullptr;                   // [gdn_state_bytes]
  std::vector<float*> ring, S;           // [n_layers] into gdn (null for attention layers)
  std::vector<uint16_t**> page_table;    // [n_attn] device [max_pages]
  std::vector<void*> page_blocks;        // one allocation per page index (all attention layers)
  int pages = 0;
};

// A sequence's rows in a pass of the prompt path over several sequences: rows [row0, row0 + n) of the pass are
// its tokens at positions pos0 .. pos0 + n - 1, with its own state (the engine's own, or a SeqStateDev's).
struct SeqRows {
  int row0 = 0, n = 0, pos0 = 0;
  const std::vector<float*>* ring = nullptr;            // [n_layers]
  const std::vector<float*>* S = nullptr;               // [n_layers]
  const std::vector<uint16_t**>* page_table = nullptr;  // [n_attn]
};

// ---- the engine: one sequence's state and the captured decode step ----
struct StepDev {
  int token;                    // the token being consumed
  int pos;                      // its position (0-based)
  float logprob;                // device sampling with log-probabilities: that of the sampled token
};

// What a benchmark hooks into a recording of the decode step (record_step, capture). Families name groups of
// launches: embed, gdn, gdn_in_proj, gdn_core, gdn_out_proj, attn_in_proj, attn_core, attn_out_proj, moe,
// lm_head. The base class runs every launch and marks nothing (what the engine uses by itself).
class StepRecorder {
 public:
  virtual ~StepRecorder() = default;
  virtual void begin_step() {}                               // before the step's first launch
  virtual bool skips(const char* /*family*/) { return false; }  // leave the family's launches out
  virtual void mark(const char* /*family*/) {}               // before each family's launches; "end" last
  virtual StepTrace* trace() { return nullptr; }             // phase stamps of the traced launches, or null
};

class CudaEngine {
 public:
  // fused = false: the split GDN mixer and MoE paths even where the persistent kernels apply (tests).
  // opts: the kernel options (model/kernel_options.h), by default those of the environment.
  CudaEngine(const Config& c, DeviceWeights w, int max_context, int device, bool fused = true,
             const KernelOptions& opts = kernel_options_from_env());
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
  const DecodePlan& plan() const { return plan_; }

  // Makes KV pages exist for tokens [0, n_tokens).
  void ensure_kv(int n_tokens);
  int page_tokens() const { return page_tokens_; }  // tokens per KV page
  // Device bytes of the KV pages not allocated yet, up to max_context() (what ensure_kv may still take).
  size_t kv_bytes_to_come() const;
  // Fills the KV pages for tokens [0, n_tokens) with random bf16 (benchmarks).
  void fill_kv_random(int n_tokens, uint64_t seed);
  // Zeroes the recurrent states (a new sequence).
  void reset_state();
  // Records one decode step (embedding -> layers -> final norm -> lm_head) into the stream as plan() says; reads
  // the token and position from step(). rec: a benchmark's hooks (null: every launch, no marks).
  // head = false: without the final norm and lm_head (a prompt token whose logits nobody reads).
  void record_step(StepRecorder* rec = nullptr, bool head = true);
  // Launches the captured graph of record_step() (head = false: the one without the lm_head).
  void launch_step(bool head = true);
  // The captured graph of record_step(rec, head) followed by `tail` (e.g. greedy sampling + position advance).
  cudaGraphExec_t capture(const std::function<void()>& tail, bool head = true, StepRecorder* rec = nullptr);
  // The decode step (with the lm_head) over another sequence's state, e.g. a batch backend's slot: a graph that
  // reads the token and position from step() and leaves the logits in logits(); st must outlive it.
  cudaGraphExec_t capture_for(const SeqStateDev& st);
  const KernelOptions& options() const { return opts_; }

  // The prompt path (model/prefill_cuda.cu): consumes tokens[0, n) at positions pos0.. (n <= kPrefillChunk)
  // through every layer together (GEMMs over the chunk, the mixers over it in a few launches); the residual stream of
  // token t is then at prefill_h(t) (device, [H], valid until the next prefill), for the final norm + lm_head.
  // Enqueued on stream(); returns once the tokens are staged (the call before it has finished).
  static constexpr int kPrefillChunk = 4096;
  // Tokens per chunk the backend uses: kPrefillChunk, or KernelOptions::prefill_chunk (benchmarks) up to it.
  int prefill_chunk() const;
  // Prompt pieces split at multiples of it give the whole prompt's bits (the chunked GDN's pieces; else 1).
  int prompt_grid() const;
  // logits() = lm_head(RMSNorm(h) * norm) for h [H] on the device (e.g. prefill_h(t)); enqueued on stream().
  void lm_head(const float* h);
  // stop (may be null): asked every kStopLayers layers once the group before has run (the GPU keeps one group
  // queued meanwhile); when it returns true the pass is abandoned: false, and the sequence's state is undefined
  // (the caller resets it). A cancelled request then stops within about two groups, a tenth of a chunk's time.
  static constexpr int kStopLayers = 2;
  bool prefill(const int32_t* tokens, int pos0, int n, const std::function<bool()>* stop = nullptr);
  void prefill_alloc();  // the prompt path's buffers (~0.8 GB for the real model; prefill allocates them if needed)
  bool prefill_supported() const;  // the prompt path's kernels take this model's shapes
  const float* prefill_h(int t) const;
  // The prompt path over several sequences at once (the batched step): rows_tokens [n_rows] (host), each
  // sequence's rows and state in `seqs` (their KV pages allocated up to pos0 + n); n_rows <= kPrefillChunk.
  // Every weight product runs once over all rows; GDN and attention per sequence on its own state.
  // False only when prefill's stop ended the pass.
  bool prefill_rows(const int32_t* rows_tokens, int n_rows, const SeqRows* seqs, int n_seqs);
  // logits [n][vocab] (device) = lm_head(RMSNorm(h) * norm) of the last pass's rows `rows` [n] (host), n <=
  // kPrefillChunk, as one GEMM (the lm_head read once for all of them). Enqueued on stream().
  void head_rows(const int* rows, int n, float* logits);
  // Marks the prompt path's kernel families on `p` (model/pass_profile.h) from the next pass on; null: none.
  void set_profiler(PassProfiler* p) { prof_ = p; }
  // A sequence's state: allocated zeroed, KV pages on demand (seq_ensure_kv).
  SeqStateDev seq_alloc();
  void seq_free(SeqStateDev& st);
  void seq_ensure_kv(SeqStateDev& st, int n_tokens);
  void seq_shrink_kv(SeqStateDev& st, int n_tokens);  // frees the pages beyond those holding [0, n_tokens)
  size_t kv_page_bytes() const;  // one page index over all attention layers

  // GDN conv rings + recurrent states of all linear-attention layers, one contiguous device buffer.
  void* gdn_state() const { return own_.gdn; }
  size_t gdn_state_bytes() const { return gdn_state_bytes_; }

 private:
  // h += out_proj(gdn(rmsnorm(h) * norm_w)); returns true when the launch also added the layer's MoE router sums
  bool gdn(int layer, const float* norm_w);
  // attention(rmsnorm(h) * norm_w) into mix_ (o_proj is left to the caller)
  void attention(int layer, const float* norm_w);
  bool family(const char* name);      // marks `name` on the recorder; false when it skips it
  void project(const GemvBatch& b, const float* norm_w, bool& normed);
  void project(std::initializer_list<PrefillOut> outs, const GemmX& x, int n);
  // A decode pass's projections (= or +=) of x [n][K], or of RMSNorm(x) * norm_w, on the int8 tensor cores
  // (kernels/gemm_i8.cu), x staged once; false (nothing launched) where the pass or the matrices do not fit it:
  // the caller takes the GEMMs. moe_layer >= 0: the projection writes that layer's MoE input, and where the pass
  // takes the one-launch MoE block and gemm_i8 can, adds its router sums (PrefillBuffers::sums_added says whether).
  bool project_i8(std::initializer_list<PrefillOut> outs, const float* x, int K, const float* norm_w, int n,
                  bool accumulate, const char* family, double flops, int moe_layer = -1);
  void prefill_free();
  bool moe_rows_ok() const;  // KernelOptions::moe_rows and every layer's experts fit kernels/moe_rows.cu
  bool prefill_skips(const char* family) const;
  // b's view for a GEMM family of the prompt path: without x's second fp16 term where KernelOptions::
  // prompt_x_one_term names the family, on the warp-specialised tile where prompt_gemm_ws does.
  GemmX prompt_x(const GemmXBuf& b, const char* family) const;
  // The prep's buffer at width K for the matrices `readers`, all of one GEMM family, and the family's view of it
  // (model/prefill_cuda.cu).
  struct FamilyX;
  FamilyX family_x(int K, std::initializer_list<const QMat*> readers, const char* family) const;
  void prefill_gdn(int layer, const SeqRows* seqs, int n_seqs, int n);
  void prefill_attention(int layer, const SeqRows* seqs, int n_seqs, int n);
  void prefill_moe(int layer, int n);
  void shared_gate_up(int layer, const GemmXBuf& xh, int n, cudaStream_t s);
  void shared_down(int layer, int n, cudaStream_t s);
  // The kernels of a pass (after its inputs are staged): embedding, then every layer.
  // False: stopped by stop_ (prefill).
  bool prefill_layers(const SeqRows* seqs, int n_seqs, int n);
  // The graph of `fn`'s launches on stream_ (a launcher that throws ends the capture first).
  cudaGraphExec_t capture_fn(const std::function<void()>& fn);

  Config cfg_;
  FamilyFlops flops_;                 // what each prompt-path family's mark counts (profiling)
  DeviceWeights w_;
  bool fused_ = true;                 // constructor: false = the split paths everywhere (tests)
  KernelOptions opts_;                // as constructed (the plan's source; prefill_skips reads skip)
  const std::function<bool()>* stop_ = nullptr;  // the running prefill's stop (prefill_layers asks it)
  DecodePlan plan_;                   // made once the weights and scratch exist
  StepRecorder* rec_ = nullptr;       // during record_step: its recorder (never null there)
  float* gdn_scratch_ = nullptr;      // [gdn_mixer_scratch_floats()] fused GDN mixer: staged outputs, tile sums
  unsigned* gdn_barrier_ = nullptr;   // [kGridBarrierWords] its grid barrier
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
  // This sequence's state: per GDN layer [4][conv_dim] ring then [Hv][Dk][Dv] S; the KV pages
  SeqStateDev own_;
  const SeqStateDev* cur_ = nullptr;  // during capture_for: the state record_step reads instead of own_
  const SeqStateDev& seq() const { return cur_ ? *cur_ : own_; }
  size_t gdn_state_bytes_ = 0;
  // KV cache
  int page_tokens_ = 0;
  std::vector<int> attn_index_;               // [n_layers] -> attention layer index or -1
  PrefillBuffers* pf_ = nullptr;  // the prompt path's buffers (prefill_alloc on first use, prefill_free)
  PassProfiler* prof_ = nullptr;  // set_profiler's, or null
  void pmark(const char* family, double flops = 0) const {
    if (prof_) prof_->mark(family, flops);
  }
};

}  // namespace lily::cuda
