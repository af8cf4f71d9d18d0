// The CUDA path's options: one plain struct, read from the environment once at start-up
// (model/kernel_options.cpp, kernel_options_from_env) and passed down by the engine. Defaults are the
// production settings; the switches exist for benchmarks, A/Bs and debugging. docs/kernel-options.md has the table.
// Nothing under src/kernels reads the environment.
#pragma once
#include <string>

namespace lily::cuda {

struct KernelOptions {
  // LILY_GDN_FUSED=0: the linear-attention mixer as three launches (in_proj, GDN step, out_proj) even where the
  // one-launch persistent kernel applies (kernels/gdn_fused.cu). For A/Bs and the per-family breakdown.
  bool gdn_fused = true;
  // LILY_MOE_FUSED=0: the MoE block as router + gate/up + down launches even where the one-launch persistent
  // kernel applies (kernels/moe_fused.cu).
  bool moe_fused = true;
  // LILY_ATTN_SPLITS=n: decode attention split blocks per KV head (1..kAttnMaxSplits); 0 = SMs / KV heads
  // (one block per SM).
  int attn_splits = 0;
  // LILY_PREFILL=0: prompts token by token through the decode step instead of the chunked prompt path.
  bool prefill = true;
  // LILY_PREFILL_CHUNK=n: tokens per chunk of the prompt path (16..4096); 0 = 4096 (CudaEngine::kPrefillChunk).
  int prefill_chunk = 0;
  // LILY_PREFILL_MIN=n: prompts of at least n tokens take the chunked path; 0 = the backend's default (16).
  int prefill_min = 0;
  // LILY_BATCH_GRAPH_ROWS=n: a batched step (runtime/cuda_batch_backend) with at most n one-token rows runs each
  // of them through the captured decode step of its slot (the batch-1 kernels, one after another) instead of one
  // pass of the prompt path over all of them; 0 = always the pass.
  int batch_graph_rows = 2;
  // LILY_PROMPT_ATTN_1TERM=0: the prompt path's attention takes q and the probabilities as two bf16 terms each
  // instead of one (kernels/attention_chunk.cu; one term: half the tensor-core products, within issue 28's bound).
  bool prompt_attn_one_term = true;
  // LILY_PROMPT_ATTN_WG=0: with one term and head_dim 256, the mma.sync kernel instead of the warpgroup-MMA one
  // (kernels/attention_chunk.cu: two warpgroups of 64 rows, 64-key tiles, K and V read by the tensor cores from
  // shared memory once per warpgroup).
  bool prompt_attn_wgmma = true;
  // LILY_GDN_WY=0: the prompt path's Gated DeltaNet recurrence token by token (kernels/gdn_chunk.cu) instead of in
  // the chunked (WY) form on the tensor cores (kernels/gdn_wy.cu: pieces of 64 tokens at absolute multiples of 64,
  // which become the prompt grid; models of other GDN shapes take the token-by-token kernel anyway).
  bool gdn_wy = true;
  // LILY_PROMPT_GEMM_F16=0: the prompt path's 4-bit GEMMs take x as two bf16 terms with per-group sums
  // (kernels/gemm.cu) instead of its fp16 form (two fp16 terms of the row scaled by a power of two) against the
  // weights as fp16 (scale q + bias), all of K summed by the tensor cores (kernels/gemm_q4f16.cu); decode passes
  // of one-token rows keep the bf16 terms either way.
  bool prompt_gemm_f16 = true;
  // LILY_PROMPT_X1=fam1,fam2 (empty: none): with prompt_gemm_f16, those families' 4-bit prompt GEMMs take x's
  // first fp16 term alone (half the products). Families: gdn_in, gdn_out, attn_in, attn_out, shared,
  // experts_gate_up, experts_down, lm_head. The default: the families whose one term keeps the prompt path within
  // issue 28's bound (tests/gpu/prompt_bound.h) and a decode row in a pass with prompt rows within 1e-3 of the
  // same row alone (tests/gpu/test_cuda_batch.cpp), which the experts' one term leaves (their rows share its
  // launches); each family's figures in docs/kernel-options.md.
  std::string prompt_x_one_term = "attn_in";
  // LILY_PROMPT_GEMM_WS=fam1,fam2 (empty: none): with prompt_gemm_f16, those families' 4-bit prompt GEMMs take the
  // warp-specialised tile of 128 tokens (kernels/gemm_q4ws.cu: a copying warpgroup, mbarrier stages, the same
  // bits) instead of gemm_q4f16.cu's. Families as prompt_x_one_term's; the routed experts' two take it together
  // (one work list): both named. The default: the dense families (the experts' tiles of a few dozen gathered
  // tokens are slower on it).
  std::string prompt_gemm_ws = "gdn_in,gdn_out,attn_in,attn_out,shared,lm_head";
  // LILY_GEMM_ROWS=0: a decode pass's dense GEMMs of at most kRowsMaxWeights weights (kernels/batched.h; at most 64
  // one-token rows) keep the 64- / 16-token tiles of kernels/gemm.cu instead of kernels/gemm_rows.cu (weights
  // straight into registers, K split between a block's warps). Same arithmetic per column, other bits.
  bool gemm_rows = true;
  // LILY_GEMM_I8=0: a decode pass of one-token rows keeps the tensor-core tiles for its dense projections instead of
  // the int8 tensor-core GEMM (kernels/gemm_i8.cu: x staged once per block as 16-bit fixed point, the weights read
  // once): the input projections and lm_head for passes of at most gemm_i8_in_rows rows (LILY_GEMM_I8_IN_ROWS),
  // the GDN out_proj and attention o_proj for at most gemm_i8_out_rows (LILY_GEMM_I8_OUT_ROWS; both at most
  // kI8MaxTokens). Beyond 16 rows the int8 kernel's per-group arithmetic outweighs the tiles' on the large matrices.
  bool gemm_i8 = true;
  int gemm_i8_in_rows = 16;
  int gemm_i8_out_rows = 64;
  // LILY_MOE_ROWS=0: a decode pass of at most kMoeRowsMaxTokens one-token rows keeps the grouped tensor-core GEMMs
  // for its routed experts instead of streaming each used expert's weights once with the decode kernels'
  // arithmetic (kernels/moe_rows.cu).
  bool moe_rows = true;
  // LILY_MOE_FUSED_ROWS=n: a decode pass of at most n one-token rows (up to kMoeFusedMaxRows) runs each MoE block as
  // one persistent launch with the decode step's per-row arithmetic (kernels/moe_fused_rows.cu) instead of 13
  // launches; 0 = never.
  int moe_fused_rows = 8;
  // LILY_MOE_FOLD_ROWS=n: a decode pass of at most n rows that streams its routed experts takes the shared expert
  // as one more expert of those launches (kernels/moe_rows.cu, MoeRowsShared); larger ones run it on a side stream
  // (beyond 16 rows its one tile of every row's slot becomes the launches' tail).
  int moe_fold_rows = 16;
  // LILY_BATCH_PASS_GRAPHS=0: a pass of one-token rows only launches its kernels one by one instead of replaying
  // the graph captured for its row count and attention splits (model/prefill_cuda.cu).
  bool batch_pass_graphs = true;
  // LILY_DEVICE_MASKS=0: structured output samples on the host (the logits copied per token) instead of on the
  // device with the host's token masks applied inside the decode graph (runtime/device_sampler.cu).
  bool device_masks = true;
  // LILY_CUDA_SYNC=1: synchronise after every launch so a failing kernel is named at once (slow; debugging);
  // not inside graph captures (kernels/common.cuh CUDA_CHECK_LAUNCH).
  bool debug_sync = false;
  // LILY_TRACE=1 (`lily bench`): the persistent, attention split and combine launches stamp their blocks' phase
  // times; bench prints them per context.
  bool trace = false;
  // LILY_SKIP=fam1,fam2 (`lily bench`): kernel families left out of the benchmarked decode step (it then computes
  // garbage; the time without a family is its marginal cost). Families: embed, gdn, gdn_in_proj, gdn_core,
  // gdn_out_proj, attn_in_proj, attn_core, attn_out_proj, moe, lm_head; gdn_core and attn_core also leave the
  // prompt path's mixer cores out.
  std::string skip;
};

}  // namespace lily::cuda
