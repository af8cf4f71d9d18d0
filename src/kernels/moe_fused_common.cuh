// What the one-launch MoE kernels (moe_fused.cu, moe_fused_rows.cu) request alike: a warp's two (gate, up) row
// pairs of phase A, and its output row of the 9 down projections in phase C.
#pragma once
#include "kernels/gemv_impl.cuh"
#include "kernels/gemv_stream.cuh"

namespace lily::cuda::detail {

// Phase A: the gate and up rows of tasks 2 gb and 2 gb + 1 (expert j = task / F of p.idx, row task % F), q4 [F][H].
__device__ __forceinline__ void load_pair_rows(const PairArgs& p, int gb, uint4 (&wv)[4][kHidden / 1024],
                                               uint32_t (&sv)[4][kHidden / 1024]) {
  const uint8_t* w[4];
  const uint32_t* sb[4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const PairRow pr = resolve_pair<true>(p, 2 * gb + r, kHidden / 2, kHidden / kGroupSize);
    w[2 * r] = pr.gw, sb[2 * r] = pr.gsb, w[2 * r + 1] = pr.uw, sb[2 * r + 1] = pr.usb;
  }
  stream_load_rows<kHidden, 4>(w, sb, wv, sv);
}

// Phase C: output row i of the 9 down projections (the top-8 experts' and the shared expert's, q4 [H][F] each),
// requested as one flat list of 16-byte chunks: chunk t = j * 16 + c (matrix j < 9, chunk c of the 256-byte row),
// lane l holding t = l + 32 u.
constexpr int kDownChunks = (kTopK + 1) * kMoeFfn / 32;  // 144 chunks of 32 elements in one output row
constexpr int kDownPerLane = (kDownChunks + 31) / 32;    // 5

struct DownRow {
  uint4 w[kDownPerLane];
  uint32_t sb[kDownPerLane];
};

// A: the kernel's arguments with the routed down stack (dw, dsb; d_mat_w_bytes, d_mat_groups between experts) and
// the shared down matrix (sdw, sdsb); idx: the row's top-8 experts.
template <typename A>
__device__ __forceinline__ void load_down_row(const A& a, const int* idx, int i, DownRow& d) {
  constexpr int kF = kMoeFfn;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int u = 0; u < kDownPerLane; ++u) {
    const int t = lane + 32 * u;
    if (t >= kDownChunks) break;
    const int j = t / 16, c = t % 16;
    const bool sh = j == kTopK;
    const size_t e = sh ? 0 : static_cast<size_t>(idx[j]);
    const uint8_t* w = (sh ? a.sdw : a.dw + e * a.d_mat_w_bytes) + static_cast<size_t>(i) * (kF / 2);
    const uint32_t* sb = (sh ? a.sdsb : a.dsb + e * a.d_mat_groups) + static_cast<size_t>(i) * (kF / kGroupSize);
    d.w[u] = ld_stream(w + c * 16);
    d.sb[u] = ld_stream_u32(sb + c / 2);
  }
}

}  // namespace lily::cuda::detail
