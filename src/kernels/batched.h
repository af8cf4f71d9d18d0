// Launchers for a prompt's tokens processed together (the CUDA backend's prefill, model/prefill_cuda.cu): a
// tensor-core GEMM over the weight layout of kernels/qmat.h (dense, or grouped by expert for the MoE), and the
// small per-row kernels around it (RMSNorm + the GEMM's input split, the MoE's selection and grouping, SwiGLU,
// the expert outputs' sum). Raw pointers and a stream, no engine types; never synchronise, so they can be
// captured. Kernels: kernels/gemm.cu, kernels/batched.cu. Tested by tests/gpu/test_batched.cu.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/mixers.h"
#include "kernels/qmat.h"

namespace lily::cuda {

// The GEMM's input: rows of x [K] fp32 split as x = hi + lo (both bf16, |x - hi - lo| <= 2^-16 |x|), and
// the sum of x over each 64-element group (the 4/8-bit weights' bias multiplies it). The weights enter the
// tensor cores as their integer codes q (exact in bf16), scale and bias apply per group in fp32.
// Within each 64-element group the rows of hi and lo are stored in the order the GEMM's tensor-core fragments
// take the weights' 4-bit codes out of 32-bit words: position p holds column gemm_x_col(p) of the group.
__host__ __device__ constexpr int gemm_x_col(int p) {
  const int ks = p >> 4, s = p & 15, tq = (s & 7) >> 1, h = s >> 3, e = s & 1, j = 2 * ks + h;
  return 8 * (2 * tq + (j >> 2)) + (j & 3) + 4 * e;
}
// The fp16 form (where allocated: gemm_x_alloc's f16), which the 4-bit launches then take (kernels/gemm_q4f16.cu):
// each row scaled by a power of two 2^e (its largest |x| into [2^14, 2^15)) and split into two fp16 terms, hi +
// lo = x 2^e to ~2^-21 (lo may be subnormal), at hi and lo's positions (gemm_x_col); inv = 2^-e per row.
// x's rows times K stay below 2^31 (32-bit element offsets; checked for dense launches, where the rows are the
// tokens; a grouped launch's x_row values must keep to it).
struct GemmX {
  const uint16_t* hi = nullptr;  // [n][K] bf16 bits
  const uint16_t* lo = nullptr;  // [n][K]
  const float* gsum = nullptr;   // [n][K / 64]
  int K = 0;                     // multiple of 64
  // Dense launches of <= 64 tokens and at most kRowsMaxWeights weights take kernels/gemm_rows.cu
  // (KernelOptions::gemm_rows); few_all: every dense launch it can take, large ones too (its tests).
  bool few = false;
  bool few_all = false;
  const uint16_t* f16hi = nullptr;  // [n][K] the fp16 form's terms (null: none)
  const uint16_t* f16lo = nullptr;  // [n][K]
  const float* f16inv = nullptr;    // [n] its 2^-e
  // q4 launches on the fp16 form take the warp-specialised tile (kernels/gemm_q4ws.cu; KernelOptions::
  // prompt_gemm_ws); grouped ones then need a work list of kGemmWsTok-slot tiles (gemm_grouped_tiles).
  bool ws = false;
};
// Whether launches of this format on x take the warp-specialised tile (x.ws honoured).
inline bool gemm_takes_ws(QFormat f, const GemmX& x) { return x.ws && f == QFormat::q4 && x.f16hi; }
// Where the few-token kernel wins: dense matrices of at most ~4M weights (the router, the shared expert, k / v),
// whose launches are latency-bound; larger ones and the grouped experts stream faster through the 64- / 16-token
// tiles, which keep more of the weights in flight (bench_prefill rows; bench/RESULTS.md).
inline constexpr long long kRowsMaxWeights = 1LL << 22;
// Device buffers behind a GemmX for up to n rows of width K (gemm_x_alloc / gemm_x_free).
struct GemmXBuf {
  uint16_t* hi = nullptr;
  uint16_t* lo = nullptr;
  float* gsum = nullptr;
  int K = 0;
  bool few = false;
  bool few_all = false;
  uint16_t* f16hi = nullptr;
  uint16_t* f16lo = nullptr;
  float* f16inv = nullptr;
  bool use_f16 = true;  // whether view() hands the fp16 form to the GEMMs (the prep writes it wherever allocated)
  GemmX view() const {
    GemmX x{hi, lo, gsum, K, few, few_all};
    if (use_f16) x.f16hi = f16hi, x.f16lo = f16lo, x.f16inv = f16inv;
    return x;
  }
};
// f16: also the fp16 form.
GemmXBuf gemm_x_alloc(int n, int K, bool f16 = false);
void gemm_x_free(GemmXBuf& b);

// out row t = split of x[t] (norm_w null), or of RMSNorm(x[t]) * norm_w (docs/model.md §2.1; norm_w the effective
// multiplier 1 + w), for t < n; x [n][ldx] fp32 (K <= kXPrepMaxK; ldx a multiple of 4; x, norm_w and x_out 16-byte
// aligned). With x_out, the (normed) fp32 row is also stored there [n][K]. Where out has the fp16 form, that too
// (out.f16lo null: its first term alone); out.hi null: not the two bf16 terms (for launches that all take the fp16
// form).
inline constexpr int kXPrepMaxK = 4096;
void gemm_x_prep(const float* x, int ldx, int n, const float* norm_w, float eps, const GemmXBuf& out, float* x_out,
                 cudaStream_t s);

// Dense: y[t][r] (= or +=) sum_k W_mat[r][k] x[t][k] for t < n, r < W.rows; y row stride ldy (floats).
// W q4 / q8 / bf16, W.cols == x.K.
void gemm(const QMat& W, int mat, const GemmX& x, int n, float* y, int ldy, bool accumulate, cudaStream_t s);

// Up to kMaxGemmParts matrices of one format and width sharing x, in one launch (e.g. GDN in_proj_qkv, _z, _b,
// _a): y[i] (= or +=) W[i] x over tokens [0, n), row stride ldy[i].
inline constexpr int kMaxGemmParts = 4;
struct GemmBatch {
  int n = 0;
  QMat W[kMaxGemmParts];
  float* y[kMaxGemmParts] = {};
  int ldy[kMaxGemmParts] = {};
};
void gemm_multi(const GemmBatch& b, const GemmX& x, int n, bool accumulate, cudaStream_t s);

// Grouped by matrix (the MoE experts): slots [offsets[e], offsets[e+1]) use matrix e (e < W.n_mats); slot a
// reads x row x_row[a] (x_row null: row a) and writes y row a: y[a][r] = sum_k W_e[r][k] x[x_row[a]][k].
// offsets [W.n_mats + 1] and the launch's tiles (gemm_grouped_tiles over the same offsets) on the device;
// max_tiles = gemm_grouped_max_tiles(slots, W.n_mats) for the slots' count (or any larger bound).
// max_per_mat: no matrix gets more slots than this (the MoE: the tokens, each picks an expert once), 0: unknown;
// at most 16 takes the 4-bit kernel's 16-token shape (deeper pipeline, the same bits).
void gemm_grouped(const QMat& W, const GemmX& x, const int* x_row, const int* offsets, const int* tiles,
                  int max_tiles, float* y, int ldy, cudaStream_t s, int max_per_mat = 0);
// The grouped GEMM's work list: tiles[0] = the count, then (matrix << 16 | tile) for each tile of tile_tokens
// slots (64; kGemmWsTok for GemmX::ws launches) of each matrix's slots, matrices in order.
// tiles: [1 + gemm_grouped_max_tiles(slots, n_mats)] ints; n_mats <= 32767.
// The bound: one tile per matrix that holds a slot (at most min(slots, n_mats)) plus one per full 64 slots; it is
// the launches' grid, so a few slots (a decode pass) launch few blocks that find no tile.
inline int gemm_grouped_max_tiles(int slots, int n_mats) { return slots / 64 + (slots < n_mats ? slots : n_mats); }
// last_first: the last matrix's tiles first (the shared expert's, MoeRowsShared: every token's slot is in them).
void gemm_grouped_tiles(const int* offsets, int n_mats, int* tiles, cudaStream_t s, int tile_tokens = 64,
                        bool last_first = false);
inline constexpr int kGemmWsTok = 128;  // GemmX::ws's tile

// SwiGLU of two projections of one shape sharing x (gate, up: the MoE's experts), in one launch:
// act[t][r] = scale * silu(gate x[t])[r] * (up x[t])[r], row stride ldact. Dense over tokens [0, n) (scale 1),
// or grouped as gemm_grouped (scale[a] per slot, null: 1).
void gemm_swiglu(const QMat& gate, const QMat& up, const GemmX& x, int n, float* act, int ldact, cudaStream_t s);
void gemm_grouped_swiglu(const QMat& gate, const QMat& up, const GemmX& x, const int* x_row, const int* offsets,
                         const int* tiles, int max_tiles, const float* scale, float* act, int ldact, cudaStream_t s,
                         int max_per_mat = 0);

// ---- MoE for n tokens (docs/model.md §2.4) ----
// logits [n][ld]: the router's E logits then the shared expert gate's. Per token: softmax over E in fp32, the
// top_k most probable (ties: lower id) renormalised -> idx / w [n][top_k]; sh_scale[t] = sigmoid(gate logit).
// (Computed as the decode path does: chosen by logit, weights from the chosen logits alone.)
void moe_select_rows(const float* logits, int ld, int n, int E, int top_k, int* idx, float* w, float* sh_scale,
                     cudaStream_t s);
inline constexpr int kMoeGroupMaxPairs = 32768;  // (a prompt chunk of 4,096 tokens x 8 experts)
// Groups the n * top_k (token, choice) pairs by expert (in no fixed order within an expert): offsets [E + 1],
// x_row[a] = token of slot a, w_slot[a] = its routing weight, slot_of [n][top_k] = the slot of each pair. One
// block; n * top_k <= kMoeGroupMaxPairs. n_shared > 0: also the shared expert's slots as matrix E (MoeRowsShared),
// slot n * top_k + t token t's with weight 1 (offsets then [E + 2]).
void moe_group(const int* idx, const float* w, int n, int top_k, int E, int* offsets, int* x_row, float* w_slot,
               int* slot_of, cudaStream_t s, int n_shared = 0);
// moe_select_rows, moe_group and gemm_grouped_tiles (tiles of tile_tokens slots) in one launch of one block, for
// a decode pass's few rows: the same idx, w, sh_scale, offsets and tiles, slots in no fixed order within an
// expert as moe_group's. n <= kMoeRouteMaxRows (a warp a row; more rows than that keep the three launches, whose
// selection spreads over several SMs: on one SM it is bound by the SM's issue rate, 19 vs 10 us at 64 rows on
// the H100), E <= 512. n_shared: as moe_group's, the shared expert's tiles first in the list.
inline constexpr int kMoeRouteMaxRows = 16;
inline constexpr int kMoeRouteMaxPairs = 1024;  // (its shared memory)
void moe_route_rows(const float* logits, int ld, int n, int E, int top_k, int* idx, float* w, float* sh_scale,
                    int* offsets, int* x_row, float* w_slot, int* slot_of, int* tiles, int tile_tokens,
                    cudaStream_t s, int n_shared = 0);
// act[a][f] = scale[a] * silu(g[a][f]) * u[a][f] for a < n (scale null: 1); g, u, act [n][F].
#ifdef __CUDACC__
// scale * silu(g) * u in fp32, as swiglu_rows and the paired GEMMs compute it (test_batched: bit for bit).
__device__ __forceinline__ float swiglu_value(float scale, float g, float u) {
  return scale * (g / (1.f + expf(-g))) * u;
}
#endif
void swiglu_rows(const float* g, const float* u, const float* scale, int n, int F, float* act, cudaStream_t s);
// h[t][i] += sum_j y[slot_of[t][j]][i] + sh_scale[t] * ysh[t][i]   (t < n, i < H; j in order).
void moe_combine(const float* y, const int* slot_of, int top_k, const float* ysh, const float* sh_scale, int n,
                 int H, float* h, cudaStream_t s);

// ---- one weight row over many tokens (kernels/gemm_one_row.cu) ----
// y[t * ldy] = W x[t] for t < n, W a single q4 / q8 row (rows 1, one matrix, width <= 4096) on the split input
// (scale * q against x~ = hi + lo, bias against the group sums), fp32 per group: the prompt path's shared expert
// gate, which as a third row tile of the router's launch doubled its time. A token's bits do not depend on n.
bool gemm_one_row_supported(const QMat& W);
void gemm_one_row(const QMat& W, const GemmX& x, int n, float* y, int ldy, cudaStream_t s);

// ---- dense projections of a decode pass on the int8 tensor cores (kernels/gemm_i8.cu) ----
// For passes of at most kI8MaxTokens one-token rows, where the tensor-core tiles spend their time on x (two bf16
// terms per token, re-read by every block): x per 64-element group in 16-bit fixed point (int8 hi and lo), the
// weights' 4-bit codes as int8, exact integer sums, scale and bias per group in fp32; x staged once per block, a
// block per 16 tokens and 8 / ks row tiles at a time (ks warps split a tile's K: matrices of few rows still fill
// the SMs).
inline constexpr int kI8MaxTokens = 64;
inline constexpr int kI8MaxK = 4096;
inline constexpr int kI8RouterMaxTokens = 8;  // gemm_i8 with router sums: its instance of one 8-token group
size_t i8x_row_bytes(int K);
// x [n][ldx] fp32 (ldx a multiple of 4), or RMSNorm(x) * norm_w where norm_w is set, staged row by row into out
// [n][i8x_row_bytes(K)].
void i8x_prep(const float* x, int ldx, int n, int K, const float* norm_w, float eps, void* out, cudaStream_t s);
// y[i] row t (= or +=) W[i] x[t] for the matrices of b (4-bit, one width K: a multiple of 512 up to kI8MaxK) over
// n <= kI8MaxTokens tokens staged by i8x_prep. ks: warps a tile (1, 2, 4, 8; K / ks a multiple of 512); 0 chooses.
// A token's bits depend on ks, never on the other tokens.
// router (acc set): also adds the next MoE block's router sums of every written row (kernels/router_partial.cuh),
// token t's at router->acc + t * kRouterCopies * (E + 1), as moe_router_sums_rows would; needs gemm_i8_router_ok
// (the MoE block's input, h += W x, W [kHidden][kI8MaxK]) and n <= kI8RouterMaxTokens, and takes ks = 8.
void gemm_i8(const GemmBatch& b, const void* x, int n, bool accumulate, cudaStream_t s, int ks = 0,
             const RouterSums* router = nullptr);
bool gemm_i8_router_ok(const GemmBatch& b, const RouterSums& r);

// ---- the routed experts of a decode pass, streamed (kernels/moe_rows.cu) ----
// For passes of one-token rows (4 to 64 rows give each used expert one to three slots), where the tensor-core
// tiles would leave most of their token columns empty: the decode kernels' arithmetic (x per 32-element chunk in
// 16-bit fixed point, integer dot products; kernels/gemv_stream.cuh), each used expert's weights read once.
// 4-bit stacks of the real shapes only (H 2048, F 512).
bool moe_rows_supported(const QMat& gate, const QMat& up, const QMat& down);
// Bytes of one staged row of width K (2048 or 512); x [n][ldx] fp32 staged row by row into out [n] such rows.
size_t stream_row_bytes(int K);
void stream_rows_prep(const float* x, int ldx, int n, int K, void* out, cudaStream_t s);
// The shared expert in the same two launches as the routed ones: the work list's matrix e (the routing's n_shared
// slots after the routed ones, moe_route_rows / moe_group; its tiles first in the list) takes these weights, of the
// routed experts' shape.
struct MoeRowsShared {
  int e = -1;
  const QMat* gate = nullptr;
  const QMat* up = nullptr;
  const QMat* down = nullptr;
};
bool moe_rows_shared_ok(const QMat& gate, const MoeRowsShared& sh);
// gemm_grouped_swiglu's contract (offsets, tiles over them, max_tiles, x_row, scale, act) with x staged at width 2048.
void moe_rows_swiglu(const QMat& gate, const QMat& up, const void* x, const int* x_row, const int* offsets,
                     const int* tiles, int max_tiles, const float* scale, float* act, int ldact, cudaStream_t s,
                     const MoeRowsShared* shared = nullptr);
// gemm_grouped's contract (x_row null: slot a reads staged row a) over act staged at width 512.
void moe_rows_down(const QMat& down, const void* act, const int* offsets, const int* tiles, int max_tiles, float* y,
                   int ldy, cudaStream_t s, const MoeRowsShared* shared = nullptr);

// ---- the MoE block of a decode pass of a few one-token rows in one launch (kernels/moe_fused_rows.cu) ----
// For every row r < n: h[r] += MoE(RMSNorm(h[r]) * norm_w), each row's bits those of moe_block's one-launch kernel
// run on that row alone (so a row's bits differ between passes of up to KernelOptions::moe_fused_rows rows and
// larger ones, which take the streamed experts). The real shapes (q8 router with router_slices built, q4 experts,
// H 2048, F 512, top-8) on a GPU of >= 128 SMs.
inline constexpr int kMoeFusedMaxRows = 8;
struct MoeRowsScratch {
  float* act = nullptr;                      // [kMoeFusedMaxRows][(top_k + 1) * F]
  void* act_q = nullptr;                     // [kMoeFusedMaxRows] staged act
  unsigned long long* router_acc = nullptr;  // [kMoeFusedMaxRows][copies][E + 1], zero between launches
  unsigned* barrier = nullptr;               // [kGridBarrierWords], zeroed once
  int n_router = 0;                          // E + 1
};
bool moe_fused_rows_supported(const MoeWeightsDev& m, int top_k);
MoeRowsScratch moe_fused_rows_alloc(int n_experts);
void moe_fused_rows_free(MoeRowsScratch& s);
// The router sums every row needs at entry (moe_fused_rows reads them, then zeroes them for the next layer).
RouterSums moe_fused_rows_sums(const MoeWeightsDev& m, const float* norm_w, const MoeRowsScratch& s);
// h [n][H], 1 <= n <= kMoeFusedMaxRows, its rows' router sums added (moe_fused_rows_sums: by the launch that
// wrote h, gemm_i8 with router, or moe_router_sums_rows). trace: phase stamps (kernels/trace.h; bench_kernels)
// or null.
void moe_fused_rows(const MoeWeightsDev& m, float* h, int n, const float* norm_w, float eps, const MoeRowsScratch& s,
                    cudaStream_t stream, unsigned long long* trace = nullptr);

// ---- Gated DeltaNet over a chunk (kernels/gdn_chunk.cu) ----
// launch_gdn_step (kernels/mixers.h) for the n consecutive tokens at positions pos0.. in four launches (what
// does not depend on the state, for every token at once; the recurrence over the chunk; the gated output norm;
// the conv ring brought up to date): qkv [n][conv_dim], z [n][Hv*Dv], a, b [n][Hv], out [n][Hv*Dv]; the ring and
// state as there, updated in place. scratch: device, gdn_chunk_scratch_bytes (with the same wy).
// wy: the recurrence in the chunked form (kernels/gdn_wy.cu) where gdn_wy_supported(dims), else token by token.
size_t gdn_chunk_scratch_bytes(int n, GdnDims dims, bool wy);
void launch_gdn_chunk(const float* qkv, const float* z, const float* a, const float* b, const float* conv_w,
                      const float* a_log, const float* dt_bias, const float* norm_w, float* conv_ring, float* state,
                      float* out, void* scratch, int pos0, int n, GdnDims dims, float eps, bool wy, cudaStream_t s);

// ---- the Gated DeltaNet recurrence in the chunked (WY) form (kernels/gdn_wy.cu) ----
// Over the prep rows of gdn_chunk.cu (prep [n][PrepRow width]) and a [n][Hv] (the decays' inputs): the ungated
// outputs into out [n][Hv*Dv], the state updated in place. Pieces of gdn_wy_grid() tokens at absolute multiples of
// it; work: device, gdn_wy_work_bytes(dims), 16-byte aligned. Dk = 128 and Dv a multiple of 32 up to 128 only.
bool gdn_wy_supported(GdnDims dims);
size_t gdn_wy_work_bytes(GdnDims dims);
int gdn_wy_grid();
// parts (benchmarks): 1 the piece kernels only, 2 the chain kernels only, 3 both.
void launch_gdn_wy(const float* prep, const float* a, const float* a_log, const float* dt_bias, float* state,
                   float* out, void* work, int pos0, int n, GdnDims dims, cudaStream_t s, int parts = 3);

// ---- attention over a chunk (kernels/attention_chunk.cu) ----
// launch_attention_decode (kernels/mixers.h) for the n consecutive tokens at positions pos0.. : in.qg [n][n_heads
// * 2d], in.k / in.v [n][n_kv * d] (the projections' rows); every token's k and v appended to the cache, then
// out [n][n_heads * d] = each token's gated attention over the cache [0, its position]. head_dim 256 / 128 / 64 /
// 32, groups of at most 8 heads, pages a multiple of 32 tokens (allocated up to pos0 + n). q_scratch: device,
// attention_chunk_scratch_bytes. one_term: q and p enter the tensor cores as one bf16 term each instead of two
// (KernelOptions::prompt_attn_one_term). wgmma: with one term, head_dim 256 and pages a multiple of 64 tokens, the
// warpgroup-MMA kernel (KernelOptions::prompt_attn_wgmma).
size_t attention_chunk_scratch_bytes(int n, int n_heads, int head_dim);
void launch_attention_chunk(const AttnIn& in, KvPages kv, int pos0, int n, int n_heads, void* q_scratch, float* out,
                            cudaStream_t s, bool one_term = false, bool wgmma = false);

}  // namespace lily::cuda
