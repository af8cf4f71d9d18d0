// Launchers for the sequence-mixing and normalisation kernels of one decode step (batch 1):
//   norm.cu       residual add + RMSNorm
//   gdn.cu        fused Gated DeltaNet step (conv, L2 norms, gates, delta rule, gated RMSNorm)
//   attention.cu  decode attention over a paged bf16 KV cache (q/k norm + RoPE + KV append, GQA packing, split
//                 over SMs, then a combine)
// Every launcher takes raw device pointers, sizes and a stream, never engine types, so it can be tested and
// benchmarked alone (tests/gpu/test_mixer_kernels.cu). Per-step values (the position) are read from device
// memory so a captured CUDA graph replays unchanged. Math: docs/model.md §2.1-2.3; all arithmetic fp32.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/trace.h"


namespace lily::cuda {

// ---- paged KV cache -------------------------------------------------------------------------------
// One full-attention layer's cache: a table of fixed-size pages, each [2 (K, V)][n_kv][page_tokens][head_dim]
// bf16, so one KV head's keys (and values) for consecutive tokens are contiguous rows (coalesced reads).
// `pages` is a device array [max_pages] of device pointers; pages are allocated on demand by the owner.
struct KvPages {
  uint16_t* const* pages = nullptr;  // device [max_pages] -> bf16 page
  int page_tokens = 0;               // tokens per page; a multiple of 8 (attention's token step)
  int n_kv = 0;                      // KV heads (2)
  int head_dim = 0;                  // 256
};
size_t kv_page_elems(int page_tokens, int n_kv, int head_dim);  // bf16 elements of one page

// ---- norm.cu ----------------------------------------------------------------------------------------
// h[i] += d1[i] + d2[i] (either delta may be null), then out[i] = h[i] * rsqrt(mean(h²) + eps) * w[i]
// (w is the effective multiplier, 1 + w_hf). h, out [n] fp32; one block.
void launch_add_rmsnorm(float* h, const float* d1, const float* d2, const float* w, float* out, int n, float eps,
                        cudaStream_t s);

// ---- gdn.cu ----------------------------------------------------------------------------------------
struct GdnDims {
  int n_k_heads = 0;  // Hk = 16
  int n_v_heads = 0;  // Hv = 32 (a multiple of Hk; value head h reads key head h / (Hv / Hk))
  int k_dim = 0;      // Dk = 128 (<= 128)
  int v_dim = 0;      // Dv = 128 (a multiple of 4, <= 256)
  int conv_dim() const { return 2 * n_k_heads * k_dim + n_v_heads * v_dim; }
};

// One Gated DeltaNet decode step at position *pos (conv taps before the sequence start read as 0).
//   qkv     [conv_dim]            raw projection of the current token (pre-conv)
//   z       [Hv * Dv]             gate input of the output norm
//   a, b    [Hv]                  gate projections
//   conv_w  [conv_dim][4]         depthwise taps; tap 3 multiplies the current token
//   a_log, dt_bias [Hv], norm_w [Dv] (plain weight)
//   conv_ring [4][conv_dim] fp32  raw qkv of earlier tokens; token t lives in slot t % 4 (read t-3..t-1,
//                                 write t) — in place
//   state   [Hv][Dk][Dv] fp32     recurrent state, updated in place (each byte read once, written once)
//   out     [Hv * Dv]             gated RMSNorm output, head-major
void launch_gdn_step(const float* qkv, const float* z, const float* a, const float* b, const float* conv_w,
                     const float* a_log, const float* dt_bias, const float* norm_w, float* conv_ring,
                     float* state, float* out, const int* pos, GdnDims dims, float eps, cudaStream_t s);
// The same step for several sequences in one launch (the batched step's one-token rows): sequence q's inputs
// and output are row rows.row[q] of row-major [rows][width] buffers (qkv [conv_dim], z and out [Hv*Dv], a and b
// [Hv]); its position, conv ring and state are rows.pos[q], rows.ring[q], rows.state[q]. Device arrays [n_rows].
struct GdnStepRows {
  const int* row = nullptr;
  const int* pos = nullptr;
  float* const* ring = nullptr;
  float* const* state = nullptr;
};
void launch_gdn_step_rows(const float* qkv, const float* z, const float* a, const float* b, const float* conv_w,
                          const float* a_log, const float* dt_bias, const float* norm_w, GdnStepRows rows, int n_rows,
                          float* out, GdnDims dims, float eps, cudaStream_t s);

// ---- attention.cu -------------------------------------------------------------------------------------
// Scratch for the split-K combine: the partial result of every split block (written by the split kernel,
// read by the combine kernel of the same call).
struct AttnScratch {
  float* partial = nullptr;      // [n_kv][max_splits][group][head_dim + 2] (acc, m, l)
  int max_splits = 0;
  unsigned long long* trace_split = nullptr;  // set by launch_attention_decode: the launches' stamp slots
  unsigned long long* trace_comb = nullptr;   // (kernels/trace.h), or null
};
size_t attn_scratch_floats(int n_kv, int max_splits, int group, int head_dim);

// The current token's raw projections and the constants that turn them into the attention's inputs
// (docs/model.md §2.3): q = RoPE(RMSNorm(qg[h][0:d]; q_norm)), k = RoPE(RMSNorm(k; k_norm)), rotate-half RoPE on dims
// [0, rope_dim) with angle pos * inv_freq[i % (rope_dim / 2)].
inline constexpr int kAttnMaxRopeHalf = 128;
struct AttnIn {
  const float* qg = nullptr;      // [n_heads][2d] query | gate per head (the q|k|v projection's output)
  const float* k = nullptr;       // [n_kv][d]
  const float* v = nullptr;       // [n_kv][d]
  const float* q_norm = nullptr;  // [d] effective weight (1 + w)
  const float* k_norm = nullptr;  // [d]
  int rope_dim = 0;               // even, <= d; (rope_dim / 2) a multiple of d / 32
  float eps = 0.f;
  float inv_freq[kAttnMaxRopeHalf] = {};  // theta^(-2f / rope_dim) in double, rounded to fp32 (attn_in_rope)
};
// Fills in.rope_dim and in.inv_freq.
void attn_in_rope(AttnIn& in, int rope_dim, double theta);

// Decode attention for the token at *pos over cache tokens [0, *pos]: q and k from `in` (above); k and v are
// appended to the cache as bf16 at token *pos; then for each query head h (KV head h / group),
// softmax(q[h]·K / sqrt(d)) V, times sigmoid(gate[h]) (gate = qg[h][d:2d]) -> out [n_heads * d] fp32.
// head_dim 256 (also 128, 64, 32 for tests), group <= 8, page_tokens a multiple of 8. Two launches: `splits`
// blocks per KV head (<= scratch.max_splits, <= 128; one block per SM is the intended size, e.g. SMs / n_kv)
// each take an even share of the tokens (up to 64 each, at least 32 once the context passes 64, so short
// contexts use few of them) and normalise and rotate their KV head's queries themselves (the block holding
// token *pos also its key, and appends the row); then one combine kernel merges the partials per head.
inline constexpr int kAttnMaxSplits = 128;  // split blocks per KV head at most
// The split and combine kernels are launched with programmatic dependent launch (each can start while the kernel
// before it finishes; the split kernel copies the K/V rows of earlier tokens before it waits, and lets the
// combine in only when it ends). trace: phase stamps (benchmarks), or null.
void launch_attention_decode(const AttnIn& in, KvPages kv, const int* pos, float* out, AttnScratch scratch,
                             int splits, int n_heads, cudaStream_t s, StepTrace* trace = nullptr);
// The same for several sequences' one-token rows in one pair of launches (the batched step): sequence q's inputs
// and output are row row[q] of row-major buffers (in.qg [n_heads*2d], in.k and in.v [n_kv*d], out [n_heads*d], all
// given at row 0), over its own KV pages pages[q] at position pos[q]. Device arrays [n_rows]. Row q uses
// min(attention_row_splits(pos[q] + 1), splits) split blocks per KV head: its result depends on its own length
// only, never on the other rows. `splits` (<= kAttnRowMaxSplits): the largest of those over the rows (the grid);
// the scratch holds n_rows x attn_scratch_floats(n_kv, splits, group, head_dim); kv.pages is unused.
struct AttnRows {
  const int* row = nullptr;
  const int* pos = nullptr;
  uint16_t* const* const* pages = nullptr;
};
void launch_attention_decode_rows(const AttnIn& in, KvPages kv, AttnRows rows, int n_rows, float* out,
                                  AttnScratch scratch, int splits, int n_heads, cudaStream_t s);
// Split blocks per KV head of a one-token row over len cache tokens: one per 512 tokens, at most kAttnRowMaxSplits.
inline constexpr int kAttnRowMaxSplits = 32;
__host__ __device__ inline int attention_row_splits(int len) {
  const int s = (len + 511) / 512;
  return s < 1 ? 1 : (s > kAttnRowMaxSplits ? kAttnRowMaxSplits : s);
}

}  // namespace lily::cuda
