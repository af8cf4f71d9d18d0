// What the decode attention's two kernels share (kernels/attention.cu: the split kernel; kernels/attention_combine.cu:
// the combine): how the tokens are cut into steps and spread over the split blocks, the partials' layout, and the
// combine's launch. Included by those two files only.
#pragma once
#include "kernels/mixers.h"

namespace lily::cuda::attn {

inline constexpr int kWarps = 8;                     // warps of a split block
inline constexpr int kStep = 8;                      // tokens a warp scores at once (page_tokens is a multiple of it)
inline constexpr int kMaxSplits = kAttnMaxSplits;    // (combine: kMaxSplits / its warps per lane)

// Steps of the token range and how many split blocks get some: ceil(n_steps / kWarps), so each gets up to kWarps
// steps (64 tokens) and at least half that once n_steps >= kWarps: a short context uses few splits and the combine
// reads little; from ~4K tokens on every split block.
__device__ __forceinline__ int active_splits(int n_steps, int splits) {
  return max(1, min(splits, (n_steps + kWarps - 1) / kWarps));
}

// The combine after the split kernel (launched with PDL): out [n_heads][head_dim] = the active splits' partials
// (scratch.partial [n_kv][max_splits][group][head_dim + 2]: values, max, sum) merged per head, times sigmoid(gate)
// (qg's second half). n_rows > 0: that many one-token rows (AttnRows), each its own partials and split count.
void launch_combine(const float* qg, const int* pos, float* out, const AttnScratch& scratch, int splits, int group,
                    int head_dim, int n_heads, AttnRows rows, int n_rows, cudaStream_t s);

}  // namespace lily::cuda::attn
