// The Gated DeltaNet decode step (docs/model.md §2.2) as one launch per linear-attention layer: the per-tile step of
// kernels/gdn_core.cuh, then the gated RMSNorm y = RMSNorm(o) * w * silu(z) over the whole head, with the
// head's sum of squares shared over a thread-block cluster (one barrier phase, see step_tile).
// Grid: (column tiles of 32 value columns, Hv value heads), one cluster per value head. The columns of a
// head's state are independent in the delta rule, so splitting them over 4 blocks gives 128 blocks for the
// real model; only the output norm needs the whole head, exchanged through distributed shared memory.
// (The fused mixer kernel, kernels/gdn_fused.cu, runs the same step inside one persistent launch.)
// Tested against a CPU reference in tests/gpu/test_mixer_kernels.cu.
#include <cooperative_groups.h>

#include "kernels/common.cuh"
#include "kernels/gdn_core.cuh"
#include "kernels/launch.cuh"
#include "kernels/mixers.h"

namespace lily::cuda {

namespace {

namespace cg = cooperative_groups;
using gdn::kCols;
using gdn::kMaxDk;
using gdn::kThreads;

constexpr int kMaxTiles = 8;  // a portable cluster: Dv <= 8 * kCols

// The split cluster barrier: arrive without ordering memory (what must be seen is fenced explicitly), then wait
// (acquire). All threads of every block take part.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }

// One (column tile, value head) of one sequence's step; the caller has offset the pointers to the sequence.
// The head's Σ o² is exchanged with one barrier phase that orders only the pushed shares: every block writes
// its tile's share into each peer's peer_ss (after a phase that says all peers have started), fences that,
// arrives, stores its state (not ordered by the barrier, so no block waits for its state stores to land), and
// waits. Nobody reads a peer's shared memory afterwards, so no closing barrier is needed.
__device__ __forceinline__ void step_tile(const gdn::StepArgs& a, const float* __restrict__ z,
                                          const float* __restrict__ norm_w, float* __restrict__ out,
                                          const int* __restrict__ pos_ptr, float eps) {
  __shared__ gdn::Shared sh;
  __shared__ float peer_ss[kMaxTiles];  // [cluster rank] that tile's share of the head's Σ o²
  cg::cluster_group cluster = cg::this_cluster();
  cluster_arrive_relaxed();  // phase 1: this block has started (its shared memory may be written)
  dep_trigger();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const GdnDims dims = a.dims;
  const int h = blockIdx.y, Dv = dims.v_dim;
  const int col0 = blockIdx.x * kCols;
  const int n_tiles = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  const bool writes_qk = blockIdx.x == 0 && h % (dims.n_v_heads / dims.n_k_heads) == 0;
  auto sync = [] { __syncthreads(); };
  float4 s[gdn::kRowsPerThread];
  gdn::load_state(a, h, col0, tid, s);  // before waiting: no earlier kernel of the step writes the state
  dep_wait();
  const int pos = *pos_ptr;
  gdn::prefetch_inputs(a, norm_w, h, col0, pos, tid, sh);
  const float4 o = gdn::step(a, h, col0, pos, writes_qk, tid, s, sh, sync);
  gdn::tile_sum_squares(o, col0, Dv, tid, sh, sync);
  cluster_wait();  // every peer has started
  if (tid < n_tiles) {
    *cluster.map_shared_rank(&peer_ss[rank], tid) = sh.head_ss;
    asm volatile("fence.acq_rel.cluster;" ::: "memory");
  }
  cluster_arrive_relaxed();  // phase 2: this block's share is in every peer
  gdn::store_state(a, h, col0, tid, s);
  cluster_wait();
  if (warp == 0) {
    float total = 0.f;
    for (int r = 0; r < n_tiles; ++r) total += peer_ss[r];
    const int j = col0 + lane;
    if (j < Dv) {
      const float n = sh.o[lane] * rsqrtf(total / Dv + eps);
      out[(size_t)h * Dv + j] = n * sh.norm_w[lane] * gdn::silu(z[(size_t)h * Dv + j]);
    }
  }
}

__global__ void __launch_bounds__(kThreads) gdn_step_kernel(
    const float* __restrict__ qkv, const float* __restrict__ z, const float* __restrict__ a_in,
    const float* __restrict__ b_in, const float* __restrict__ conv_w, const float* __restrict__ a_log,
    const float* __restrict__ dt_bias, const float* __restrict__ norm_w, float* __restrict__ ring,
    float* __restrict__ state, float* __restrict__ out, const int* __restrict__ pos_ptr, GdnDims dims, float eps) {
  step_tile({qkv, a_in, b_in, conv_w, a_log, dt_bias, ring, state, dims}, z, norm_w, out, pos_ptr, eps);
}

// blockIdx.z: one of several sequences' one-token steps, each on its own ring and state (GdnStepRows).
__global__ void __launch_bounds__(kThreads) gdn_step_rows_kernel(
    const float* __restrict__ qkv, const float* __restrict__ z, const float* __restrict__ a_in,
    const float* __restrict__ b_in, const float* __restrict__ conv_w, const float* __restrict__ a_log,
    const float* __restrict__ dt_bias, const float* __restrict__ norm_w, GdnStepRows rows, float* __restrict__ out,
    GdnDims dims, float eps) {
  const int q = blockIdx.z;
  const size_t r = (size_t)rows.row[q];
  const int cd = 2 * dims.n_k_heads * dims.k_dim + dims.n_v_heads * dims.v_dim, vd = dims.n_v_heads * dims.v_dim;
  step_tile({qkv + r * cd, a_in + r * dims.n_v_heads, b_in + r * dims.n_v_heads, conv_w, a_log, dt_bias,
             rows.ring[q], rows.state[q], dims},
            z + r * vd, norm_w, out + r * vd, rows.pos + q, eps);
}

void check_dims(const GdnDims& dims) {
  LILY_CHECK(dims.k_dim >= 1 && dims.k_dim <= kMaxDk && dims.v_dim % 4 == 0 && dims.v_dim <= kMaxTiles * kCols &&
                 dims.n_k_heads > 0 && dims.n_v_heads % dims.n_k_heads == 0,
             "gdn_step: unsupported dims Dk=", dims.k_dim, " Dv=", dims.v_dim, " Hk=", dims.n_k_heads,
             " Hv=", dims.n_v_heads);
}

}  // namespace

void launch_gdn_step(const float* qkv, const float* z, const float* a, const float* b, const float* conv_w,
                     const float* a_log, const float* dt_bias, const float* norm_w, float* conv_ring,
                     float* state, float* out, const int* pos, GdnDims dims, float eps, cudaStream_t s) {
  check_dims(dims);
  const int tiles = (dims.v_dim + kCols - 1) / kCols;
  // cluster = the column tiles of one value head (the output norm needs the whole head)
  launch_mixer(gdn_step_kernel, dim3(tiles, dims.n_v_heads), dim3(kThreads), 0, s, tiles, qkv, z, a, b, conv_w, a_log,
               dt_bias, norm_w, conv_ring, state, out, pos, dims, eps);
}

void launch_gdn_step_rows(const float* qkv, const float* z, const float* a, const float* b, const float* conv_w,
                          const float* a_log, const float* dt_bias, const float* norm_w, GdnStepRows rows, int n_rows,
                          float* out, GdnDims dims, float eps, cudaStream_t s) {
  check_dims(dims);
  LILY_CHECK(n_rows >= 1 && n_rows <= 65535, "gdn_step_rows: ", n_rows, " rows (1..65535)");
  const int tiles = (dims.v_dim + kCols - 1) / kCols;
  // in the pass's PDL chain (every launch of a decode pass has it): the state, which no kernel of the pass writes
  // before this one, is read while the in_proj finishes
  launch_ex(gdn_step_rows_kernel, dim3(tiles, dims.n_v_heads, n_rows), dim3(kThreads), 0, s,
            LaunchOpts{true, tiles, false}, qkv, z, a, b, conv_w, a_log, dt_bias, norm_w, rows, out, dims, eps);
}

}  // namespace lily::cuda
