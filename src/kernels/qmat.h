// Weight matrices on the GPU in the layout of lily's weight-streaming kernels, and the launchers that stream
// them: upload/repack from the MLX checkpoint layout, quantize-on-GPU from bf16, GEMV (4-bit, 8-bit, bf16
// weights; fp32 or bf16 x; fp32 y; plain, accumulate, fused gate+up SwiGLU, up to 4 matrices sharing one x in
// one launch), the MoE block (router + softmax + top-k, experts gate/up, experts down + shared gate + residual)
// and the embedding row gather. Sampling is in kernels/sampling.h.
// All launchers take raw device pointers and a stream, never synchronise and never read device memory on the
// host, so they can be captured into a CUDA graph. Kernels: kernels/gemv.cu, moe.cu, moe_fused.cu (the MoE
// block in one persistent launch), embed.cu, repack.cu. x / y / act pointers must be 16-byte aligned.
//
// Layout (chosen for 16-byte coalesced loads with the dequantisation in registers):
//   w  : the packed weights, row-major, one row after the other, rows 16-byte aligned (cols % 64 == 0):
//        q4   : [n_mats][rows][cols/2] bytes; byte j of a row holds element 2j in its low nibble, 2j+1 in
//               its high nibble (the MLX uint32 words, byte for byte, little-endian);
//        q8   : [n_mats][rows][cols]   bytes, one uint8 per element (the MLX words byte for byte);
//        bf16 : [n_mats][rows][cols]   uint16 (bf16 bits).
//   sb : q4/q8 only: [n_mats][rows][cols/64] uint32; low 16 bits = bf16 scale, high 16 bits = bf16 bias of
//        group g = col/64. w[r][c] = scale * q + bias (fp32 math; scales may be negative).
// Stacked experts (n_mats > 1): matrix e starts at w + e * mat_w_bytes(), sb + e * mat_groups().
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/trace.h"

namespace lily::cuda {

enum class QFormat : int { q4 = 4, q8 = 8, bf16 = 16 };  // value = bits per weight

inline constexpr int kGroupSize = 64;  // elements per scale/bias group (MLX group_size; the only one supported)

// Real-model shapes (docs/model.md §1.2) the fast paths are built for.
inline constexpr int kHidden = 2048;      // H
inline constexpr int kExperts = 256;      // E
inline constexpr int kTopK = 8;           // experts per token
inline constexpr int kMoeFfn = 512;       // F (routed and shared expert)
inline constexpr int kVocab = 248320;     // V (rows of lm_head / embed_tokens)
inline constexpr int kVocabReal = 248077; // ids >= this are padding and are masked before sampling
inline constexpr int kGridBarrierWords = 4;  // grid barrier state of a persistent kernel (kernels/grid_barrier.cuh)

struct QMat {
  QFormat format = QFormat::q4;
  int rows = 0;                  // output features (per matrix)
  int cols = 0;                  // input features; multiple of kGroupSize
  int n_mats = 1;                // stacked matrices (experts); 1 for plain linears
  uint8_t* w = nullptr;          // device: see layout above
  uint32_t* sb = nullptr;        // device: [n_mats][rows][cols/64] scale|bias<<16; null for bf16

  int bits() const { return static_cast<int>(format); }
  size_t row_bytes() const { return static_cast<size_t>(cols) * bits() / 8; }
  size_t mat_w_bytes() const { return row_bytes() * rows; }
  size_t mat_groups() const { return format == QFormat::bf16 ? 0 : static_cast<size_t>(rows) * (cols / kGroupSize); }
  size_t w_bytes() const { return mat_w_bytes() * n_mats; }                 // size of the `w` allocation
  size_t sb_bytes() const { return mat_groups() * n_mats * sizeof(uint32_t); }  // size of the `sb` allocation
  size_t bytes() const { return w_bytes() + sb_bytes(); }                   // bytes one full pass streams
};

// Allocates w and sb with cudaMalloc for the shape and format already set in m (cudaFree both to release).
void qmat_alloc(QMat& m);
void qmat_free(QMat& m);

// ---- upload / repack (on the GPU) ----
// From the MLX checkpoint layout already in DEVICE memory (a staging buffer): words uint32
// [n_mats][rows][cols*bits/32], scales/biases bf16 [n_mats][rows][cols/64]. Copies the words into m.w
// (skipped when words == m.w) and interleaves scales/biases into m.sb. m must be q4 or q8 and allocated.
void repack_mlx(const QMat& m, const uint32_t* words, const uint16_t* scales, const uint16_t* biases,
                cudaStream_t stream);
// Same from HOST pointers (e.g. the memory-mapped checkpoint): the words go straight into m.w, the scales
// and biases through `staging` (device, >= 2 * n_mats*rows*(cols/64) * 2 bytes), then repack on the GPU.
// Asynchronous: the host memory must stay valid until the stream reaches this point.
void upload_mlx(const QMat& m, const uint32_t* host_words, const uint16_t* host_scales,
                const uint16_t* host_biases, void* staging, cudaStream_t stream);
size_t upload_mlx_staging_bytes(const QMat& m);
// From bf16 [n_mats][rows][cols] in DEVICE memory: m.format bf16 -> copy; q4/q8 -> quantize on the GPU with
// the MLX affine rule (docs/model.md §4.2, round half to even), so HF bf16 checkpoints can run on
// the same 4/8-bit kernels.
void from_bf16(const QMat& m, const uint16_t* src, cudaStream_t stream);

// ---- GEMV: y = W x ----
// W one matrix (n_mats == 1, or `mat` selects one of a stack), x [cols] fp32 or bf16 on the device,
// y [rows] fp32. accumulate: y += W x (fused residual add), else y = W x. q4 with cols 2048 / 4096 (every q4
// projection of the model) takes x per 32-element chunk as 16-bit fixed point (|x - x~| <= max|x_chunk| / 65024, / 32512
// at exact ties; kernels/gemv_stream.cuh) and sums in integers; the other shapes and formats compute in fp32.
void gemv(const QMat& W, const float* x, float* y, bool accumulate, cudaStream_t stream);
bool gemv_streams(const QMat& W);  // this GEMV (and gemv_multi of its format and width) takes the 16-bit x path
void gemv(const QMat& W, const uint16_t* x_bf16, float* y, bool accumulate, cudaStream_t stream);

// Up to 4 matrices with the same cols and format sharing one x, in one launch (e.g. GDN in_proj_qkv, _z, _b,
// _a; attention q, k, v): y[i] = W[i] x (or += when accumulate).
inline constexpr int kMaxMulti = 4;
struct GemvBatch {
  int n = 0;
  QMat W[kMaxMulti];
  float* y[kMaxMulti] = {};
};
void gemv_multi(const GemvBatch& b, const float* x, bool accumulate, cudaStream_t stream);

// The same with the RMSNorm of the input fused in (docs/model.md §2.1): y[i] = W[i] x, x = h * rsqrt(mean(h²) + eps)
// * norm_w (effective weight), computed in every block's prologue for q4 K = 2048/4096 (no separate launch);
// x is also stored to x_out [cols] (always required: the other formats run the RMSNorm kernel into it).
void gemv_multi_rmsnorm(const GemvBatch& b, const float* h, const float* norm_w, float eps, float* x_out,
                        cudaStream_t stream);

// Fused gate+up with SwiGLU: out[r] = silu(gate[r] . x) * (up[r] . x), gate/up [F, cols], out [F] fp32.
void gemv_swiglu(const QMat& gate, const QMat& up, const float* x, float* out, cudaStream_t stream);

// ---- MoE block (docs/model.md §2.4) ----
struct MoeWeightsDev {       // mlp.* (field names as the CPU's MoeWeights, model/weights.h)
  QMat gate;                  // the router, mlp.gate [E, H] (q8 in MLX)
  QMat shared_expert_gate;    // [1, H] (q8 in MLX); same format and cols as gate
  QMat experts_gate;          // switch_mlp.gate_proj: n_mats = E, [F, H] each
  QMat experts_up;            // switch_mlp.up_proj: n_mats = E, [F, H] each
  QMat experts_down;          // switch_mlp.down_proj: n_mats = E, [H, F]
  QMat shared_gate;           // shared_expert.gate_proj [Fs, H]
  QMat shared_up;             // shared_expert.up_proj [Fs, H]
  QMat shared_down;           // shared_expert.down_proj [H, Fs]
  QMat router_slices;       // router rows then the shared_expert_gate row (q8, rows E + 1, cols H) in the layout
                            // of the fused kernel's router sums (kernels/router_partial.cuh), built by
                            // moe_build_router_slices; unset: moe_block takes the multi-launch path
};
// Allocates and fills m.router_slices from m.gate and m.shared_expert_gate (q8, E <= 256, H = 2048; other
// shapes: leaves it unset). Free it with the other matrices (qmat_free).
void moe_build_router_slices(MoeWeightsDev& m, cudaStream_t stream);
// Device scratch for one MoE call; allocate with moe_scratch_alloc.
struct MoeScratch {
  float* logits = nullptr;     // [E + 1]: router logits, then the shared-expert-gate logit
  int* topk_idx = nullptr;     // [top_k] selected experts, by decreasing probability (ties: lower id)
  float* topk_w = nullptr;     // [top_k] renormalised routing weights
  float* sh_scale = nullptr;   // [1] sigmoid(shared_expert_gate . x)
  float* act = nullptr;        // [top_k + 1][F] SwiGLU activations pre-multiplied by their weight (moe_block's
                               // fused kernel leaves row top_k unscaled and applies sh_scale when staging it)
  void* act_q = nullptr;       // fused kernel: the routed act staged for its down phase (gemv_stream.cuh
                               // StreamX<(top_k + 1) * F>; allocated as 4 (top_k * F) bytes, enough for it)
  unsigned* barrier = nullptr; // [kGridBarrierWords] grid barrier of the fused MoE kernel; zeroed once
  unsigned long long* router_acc = nullptr;  // [copies][E + 1] the fused kernel's router sums in 2^-32 units
                                             // (kernels/router_partial.cuh kRouterCopies); zero between MoE blocks
  int n_experts = 0, top_k = 0, ffn = 0;
};
// The next fused MoE block's router sums, added by the launch that writes the final h before it (the GDN
// mixer's; kernels/router_partial.cuh). acc null: moe_block will not take the fused kernel, nothing to add.
struct RouterSums {
  QMat slices;                        // MoeWeightsDev::router_slices
  const float* norm_w = nullptr;      // [H] the MoE block's input norm weight
  unsigned long long* acc = nullptr;  // MoeScratch::router_acc
};
RouterSums moe_router_sums(const MoeWeightsDev& m, const float* norm_w, const MoeScratch& s);
// Adds the sums from h [H] in one small launch (what the fused launches do from the rows they write); moe_block
// runs it when no launch before it added them.
void moe_router_sums_add(const RouterSums& r, const float* h, cudaStream_t stream);
// The same for n <= kMoeFusedMaxRows rows h [n][H] (a decode pass's MoE launch, kernels/moe_fused_rows.cu): row
// t's sums at r.acc + t * kRouterCopies * (E + 1).
void moe_router_sums_rows(const RouterSums& r, const float* h, int n, cudaStream_t stream);
MoeScratch moe_scratch_alloc(int n_experts, int top_k, int ffn);
void moe_scratch_free(MoeScratch& s);

// Launch 1: router logits (+ the shared-expert-gate logit) for x [H] into s.logits.
void moe_route(const MoeWeightsDev& m, const float* x, const MoeScratch& s, cudaStream_t stream);
// The same for x = RMSNorm(h) * norm_w (docs/model.md §2.1, fused into the routing kernel); x is stored to
// x_out [H] for moe_gate_up.
void moe_route_rmsnorm(const MoeWeightsDev& m, const float* h, const float* norm_w, float eps, float* x_out,
                       const MoeScratch& s, cudaStream_t stream);
// Launch 2: the selection from s.logits (fp32 softmax over all E, top_k by probability with ties to the lower
// id, renormalised; sh_scale = sigmoid(shared gate logit)) is written to topk_idx / topk_w / sh_scale, then
// act[j] = topk_w[j] * silu(G_e x) * (U_e x) for e = topk_idx[j], j < top_k, and
// act[top_k] = sh_scale * silu(Gs x) * (Us x).
void moe_gate_up(const MoeWeightsDev& m, const float* x, const MoeScratch& s, cudaStream_t stream);
// moe_gate_up takes the 16-bit x path of the streaming kernels (the one-launch moe_block always does)
bool moe_gate_up_streams(const MoeWeightsDev& m);
// Launch 3: h[i] += sum_j D_{e_j}[i] . act[j] + Ds[i] . act[top_k]   (residual add fused; h [H] fp32).
void moe_down(const MoeWeightsDev& m, const MoeScratch& s, float* h, cudaStream_t stream);
// All three: h += MoE(x).
void moe_forward(const MoeWeightsDev& m, const float* x, const MoeScratch& s, float* h, cudaStream_t stream);
// A projection added to h before the MoE block: h += W x (the attention layer's o_proj and its residual).
struct ResidualProj {
  QMat W;                    // [H, K]
  const float* x = nullptr;  // [K] fp32, device
};
// The MoE block of a decoder layer with its input norm: x = RMSNorm(h) * norm_w (stored to x_out), h += MoE(x);
// with pre, h += pre->W pre->x first. For the real model's shapes on a GPU with >= 128 SMs, with router_slices
// built, this is ONE persistent launch (kernels/moe_fused.cu: the pre projection (q4 K = 4096) and the router
// sums, the selection from the sums, gate/up, down, separated by grid barriers; the down weights requested
// during the gate/up work), after a small launch adding the router sums unless phase 0 takes pre or
// router_sums_added; otherwise, or with allow_fused false, gemv + moe_route_rmsnorm + moe_gate_up + moe_down.
// router_sums_added: the previous launch added this block's router sums (moe_router_sums); otherwise the fused
// path adds them itself (its o_proj phase, or a small launch before it). trace: phase stamps (benchmarks) or null.
void moe_block(const MoeWeightsDev& m, float* h, const float* norm_w, float eps, float* x_out, const MoeScratch& s,
               cudaStream_t stream, bool allow_fused = true, const ResidualProj* pre = nullptr,
               bool router_sums_added = false, StepTrace* trace = nullptr);
// moe_block takes the one-launch kernel (with this pre projection, or none)
bool moe_block_is_fused(const MoeWeightsDev& m, const MoeScratch& s, const ResidualProj* pre = nullptr);

// ---- embedding ----
// out[c] = E[token][c] dequantised (fp32 [cols]); token read from DEVICE memory (e.g. the sampler's output),
// so no host sync is needed. Out-of-range ids (< 0 or >= rows) write zeros.
void embed_row(const QMat& E, const int* token, float* out, cudaStream_t stream);
// Same, writing bf16 [cols].
void embed_row_bf16(const QMat& E, const int* token, uint16_t* out, cudaStream_t stream);
// n rows at once (the prompt path): out[t] = row tokens[t] ([n][cols] fp32), t < n.
void embed_rows(const QMat& E, const int* tokens, int n, float* out, cudaStream_t stream);

}  // namespace lily::cuda
