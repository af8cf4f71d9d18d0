// Launchers for the sequence-mixing and normalisation kernels of one decode step (batch 1):
//   norm_rope.cu  residual add + RMSNorm; attention q/k norm + partial NeoX RoPE + KV-cache append
//   gdn.cu        fused Gated DeltaNet step (conv, L2 norms, gates, delta rule, gated RMSNorm)
//   attention.cu  decode attention over a paged bf16 KV cache (GQA packing, split over SMs, then a combine)
// Every launcher takes raw device pointers, sizes and a stream, never engine types, so it can be tested and
// benchmarked alone (tests/gpu/test_mixer_kernels.cu). Per-step values (the position) are read from device
// memory so a captured CUDA graph replays unchanged. Math: shared/spec/model.md §2.1-2.3; all arithmetic fp32.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>


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

// ---- norm_rope.cu ----------------------------------------------------------------------------------
// h[i] += d1[i] + d2[i] (either delta may be null), then out[i] = h[i] * rsqrt(mean(h²) + eps) * w[i]
// (w is the effective multiplier, 1 + w_hf). h, out [n] fp32; one block.
void launch_add_rmsnorm(float* h, const float* d1, const float* d2, const float* w, float* out, int n, float eps,
                        cudaStream_t s);

// Attention pre-processing at position *pos: per query head, q = RMSNorm(qg[h][0:d]; q_norm) then RoPE on
// dims [0, rope_dim) -> q_out [n_heads][d]; per KV head, k = RoPE(RMSNorm(k; k_norm)) and raw v are written
// as bf16 into the cache at token *pos. qg [n_heads][2d] (query | gate per head); k, v [n_kv][d] fp32.
void launch_qk_norm_rope_append(const float* qg, const float* k, const float* v, const float* q_norm,
                                const float* k_norm, float* q_out, KvPages kv, const int* pos, int n_heads,
                                int head_dim, int rope_dim, float theta, float eps, cudaStream_t s);

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

// ---- attention.cu -------------------------------------------------------------------------------------
// Scratch for the split-K combine: the partial result of every split block (written by the split kernel,
// read by the combine kernel of the same call).
struct AttnScratch {
  float* partial = nullptr;      // [n_kv][max_splits][group][head_dim + 2] (acc, m, l)
  int max_splits = 0;
};
size_t attn_scratch_floats(int n_kv, int max_splits, int group, int head_dim);

// Decode attention for the token at *pos over cache tokens [0, *pos]: for each query head h (KV head
// h / group), softmax(q[h]·K / sqrt(d)) V, then times sigmoid(gate[h]) (gate = qg[h][d:2d]).
// q [n_heads][d] fp32; qg [n_heads][2d]; out [n_heads * d] fp32. head_dim 256 (also 128, 64, 32 for tests),
// group <= 8, page_tokens a multiple of 8. Two launches: `splits` blocks per KV head (<= scratch.max_splits,
// <= 128; one block per SM is the intended size, e.g. SMs / n_kv) each take an even share of the tokens (up to
// 64 each, at least 32 once the context passes 64, so short contexts use few of them), then one combine kernel
// merges the partials per head.
inline constexpr int kAttnMaxSplits = 128;  // split blocks per KV head at most
// The q/k norm + RoPE + append, split and combine kernels are launched with programmatic dependent launch (each
// can start while the kernel before it finishes; the split kernel copies the K/V rows of earlier tokens before it
// waits, and lets the combine in only when it ends), unless LILY_ATTN_PDL=0.
bool attention_pdl();
void launch_attention_decode(const float* q, const float* qg, KvPages kv, const int* pos, float* out,
                             AttnScratch scratch, int splits, int n_heads, cudaStream_t s);

}  // namespace lily::cuda
