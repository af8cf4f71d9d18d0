// The Gated DeltaNet over a prompt chunk (model.md §2.2): the decode step's math (kernels/gdn_core.cuh) for n
// consecutive tokens in one launch. Each block keeps its (value head, 32-column) tile of the recurrent state in
// registers for the whole chunk (read once, written once), holds its channels' last three raw conv inputs in
// registers, and requests the next token's inputs while it computes this one. The output norm needs the whole
// head: the head's column tiles form a thread-block cluster and exchange their sums of squares through
// distributed shared memory, double-buffered so one cluster barrier per token suffices.
// The conv ring is read at entry (the tokens before the chunk) and brought up to date by a second small launch
// once every block is done with it. Tested against the per-token launches in tests/gpu/test_mixer_kernels.cu.
#include <cooperative_groups.h>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/gdn_core.cuh"
#include "kernels/launch.cuh"

namespace lily::cuda {

namespace {

namespace cg = cooperative_groups;
using gdn::kCols;
using gdn::kMaxDk;
using gdn::kRowsPerThread;
using gdn::kThreads;

struct ChunkShared {
  float qn[kMaxDk];
  float kn[kMaxDk];
  float v[kCols];
  float red[(kThreads / 32 + 1) * 8 * 9];  // gdn::column_sums
  float warp_ss[kThreads / 32];
  float o[2][kCols];                       // this tile's outputs, by token parity
  float head_ss[2];                        // this tile's share of the head's sum of squares, by token parity
};

__global__ void __launch_bounds__(kThreads) gdn_chunk_kernel(
    const float* __restrict__ qkv, const float* __restrict__ z, const float* __restrict__ a_in,
    const float* __restrict__ b_in, const float* __restrict__ conv_w, const float* __restrict__ a_log,
    const float* __restrict__ dt_bias, const float* __restrict__ norm_w, const float* __restrict__ ring,
    float* __restrict__ state, float* __restrict__ out, int pos0, int n, GdnDims dims, float eps) {
  __shared__ ChunkShared sh;
  cg::cluster_group cluster = cg::this_cluster();
  dep_wait();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int h = blockIdx.y, Dk = dims.k_dim, Dv = dims.v_dim, Hv = dims.n_v_heads;
  const int kh = h / (Hv / dims.n_k_heads), key_dim = dims.n_k_heads * Dk, vd = Hv * Dv;
  const int conv_dim = 2 * key_dim + vd;
  const int col0 = blockIdx.x * kCols;
  const int c4 = tid % 8, rg = tid / 8, col = col0 + c4 * 4;
  const bool col_ok = col < Dv;
  const gdn::StepArgs sa{qkv, a_in, b_in, conv_w, a_log, dt_bias, nullptr, state, dims};
  float4 s[kRowsPerThread];
  gdn::load_state(sa, h, col0, tid, s);

  // this thread's conv channels: q (threads < 128) or k channel tid % 128 of key head kh; threads < 32 one v column
  const int i_qk = tid % kMaxDk;
  const bool is_k = tid >= kMaxDk, has_qk = i_qk < Dk;
  const bool has_v = tid < kCols && col0 + tid < Dv;
  const int c_qk = (is_k ? key_dim : 0) + kh * Dk + i_qk, c_v = 2 * key_dim + h * Dv + col0 + tid;
  float wq[4] = {}, wv[4] = {}, xq[3] = {}, xv[3] = {};  // taps; raw values at p-1, p-2, p-3 (0 before the start)
  for (int j = 0; j < 4; ++j) {
    if (has_qk) wq[j] = conv_w[(size_t)c_qk * 4 + j];
    if (has_v) wv[j] = conv_w[(size_t)c_v * 4 + j];
  }
  for (int back = 1; back <= 3; ++back) {
    const int p = pos0 - back;
    if (p < 0) continue;
    if (has_qk) xq[back - 1] = ring[(size_t)(p & 3) * conv_dim + c_qk];
    if (has_v) xv[back - 1] = ring[(size_t)(p & 3) * conv_dim + c_v];
  }
  const bool out_lane = warp == 0 && col0 + lane < Dv;
  const float nw = out_lane ? norm_w[col0 + lane] : 0.f;
  const float A = __expf(a_log[h]), dtb = dt_bias[h];
  const float scale_q = rsqrtf((float)Dk);

  // token 0's inputs; in the loop, token t + 1's are requested before token t's work
  float cur_q = has_qk ? qkv[c_qk] : 0.f, cur_v = has_v ? qkv[c_v] : 0.f;
  float cur_b = b_in[h], cur_a = a_in[h], cur_z = out_lane ? z[(size_t)h * Dv + col0 + lane] : 0.f;
  for (int t = 0; t < n; ++t) {
    float nq = 0.f, nv = 0.f, nb = 0.f, na = 0.f, nz = 0.f;
    if (t + 1 < n) {
      const size_t r = (size_t)(t + 1);
      if (has_qk) nq = qkv[r * conv_dim + c_qk];
      if (has_v) nv = qkv[r * conv_dim + c_v];
      nb = b_in[r * Hv + h];
      na = a_in[r * Hv + h];
      if (out_lane) nz = z[r * vd + (size_t)h * Dv + col0 + lane];
    }
    // conv + SiLU (the decode step's order: the current tap, then the earlier ones)
    float u = 0.f;
    if (has_qk) {
      float acc = wq[3] * cur_q;
      acc += wq[2] * xq[0];
      acc += wq[1] * xq[1];
      acc += wq[0] * xq[2];
      u = gdn::silu(acc);
      xq[2] = xq[1], xq[1] = xq[0], xq[0] = cur_q;
    }
    if (has_v) {
      float acc = wv[3] * cur_v;
      acc += wv[2] * xv[0];
      acc += wv[1] * xv[1];
      acc += wv[0] * xv[2];
      sh.v[tid] = gdn::silu(acc);
      xv[2] = xv[1], xv[1] = xv[0], xv[0] = cur_v;
    }
    // L2 norms: warps 0-3 hold q, warps 4-7 hold k
    float ss = u * u;
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) sh.warp_ss[warp] = ss;
    __syncthreads();
    const int half = kThreads / 64;
    float part = 0.f;
    for (int w = 0; w < half; ++w) part += sh.warp_ss[(is_k ? half : 0) + w];
    if (has_qk) (is_k ? sh.kn : sh.qn)[i_qk] = u * rsqrtf(part + 1e-6f) * (is_k ? 1.f : scale_q);
    const float beta = gdn::sigmoid(cur_b);
    const float decay = __expf(-A * gdn::softplus(cur_a + dtb));
    __syncthreads();

    // delta rule on this thread's 4 rows x 4 columns (as gdn::step, the state staying in registers)
    float cs[9] = {};
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int i = rg + 32 * r;
      s[r] = make_float4(s[r].x * decay, s[r].y * decay, s[r].z * decay, s[r].w * decay);
      if (i < Dk) {
        const float kn = sh.kn[i], qn = sh.qn[i];
        cs[0] = fmaf(s[r].x, kn, cs[0]), cs[1] = fmaf(s[r].y, kn, cs[1]);
        cs[2] = fmaf(s[r].z, kn, cs[2]), cs[3] = fmaf(s[r].w, kn, cs[3]);
        cs[4] = fmaf(s[r].x, qn, cs[4]), cs[5] = fmaf(s[r].y, qn, cs[5]);
        cs[6] = fmaf(s[r].z, qn, cs[6]), cs[7] = fmaf(s[r].w, qn, cs[7]);
        cs[8] = fmaf(kn, qn, cs[8]);
      }
    }
    gdn::column_sums(cs, sh.red, tid, [] { __syncthreads(); });
    float4 dlt = make_float4(0.f, 0.f, 0.f, 0.f);
    if (col_ok) {
      const float* v = sh.v + c4 * 4;
      dlt = make_float4(beta * (v[0] - cs[0]), beta * (v[1] - cs[1]), beta * (v[2] - cs[2]), beta * (v[3] - cs[3]));
    }
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int i = rg + 32 * r;
      if (col_ok && i < Dk) {
        const float kn = sh.kn[i];
        s[r] = make_float4(fmaf(kn, dlt.x, s[r].x), fmaf(kn, dlt.y, s[r].y), fmaf(kn, dlt.z, s[r].z),
                           fmaf(kn, dlt.w, s[r].w));
      }
    }
    const float kq = cs[8];
    const int par = t & 1;
    if (tid < 8) {
      sh.o[par][c4 * 4 + 0] = fmaf(kq, dlt.x, cs[4]);
      sh.o[par][c4 * 4 + 1] = fmaf(kq, dlt.y, cs[5]);
      sh.o[par][c4 * 4 + 2] = fmaf(kq, dlt.z, cs[6]);
      sh.o[par][c4 * 4 + 3] = fmaf(kq, dlt.w, cs[7]);
    }
    __syncthreads();
    if (warp == 0) {
      const float x = col0 + lane < Dv ? sh.o[par][lane] : 0.f;
      float tt = x * x;
      for (int off = 16; off > 0; off >>= 1) tt += __shfl_xor_sync(0xffffffffu, tt, off);
      if (lane == 0) sh.head_ss[par] = tt;
    }
    // the head's sum of squares from every tile; the buffers of this parity are written again two tokens on,
    // after the next barrier, which every block passes only once it has read them
    cluster.sync();
    if (warp == 0) {
      float total = 0.f;
      for (unsigned r = 0; r < cluster.num_blocks(); ++r) total += *cluster.map_shared_rank(&sh.head_ss[par], r);
      if (out_lane) {
        const float nrm = sh.o[par][lane] * rsqrtf(total / Dv + eps);
        out[(size_t)t * vd + (size_t)h * Dv + col0 + lane] = nrm * nw * gdn::silu(cur_z);
      }
    }
    cur_q = nq, cur_v = nv, cur_b = nb, cur_a = na, cur_z = nz;
  }
  float* S = state + (size_t)h * Dk * Dv;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int i = rg + 32 * r;
    if (col_ok && i < Dk) *reinterpret_cast<float4*>(S + (size_t)i * Dv + col) = s[r];
  }
  cluster.sync();  // keep this block's shared memory alive until every block of the cluster has read it
}

// The ring after the chunk: the raw qkv of its last (up to) 4 tokens in their slots (position % 4).
__global__ void ring_update_kernel(const float* qkv, float* ring, int pos0, int n, int conv_dim) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int t = n - 1 - blockIdx.y;
  if (c >= conv_dim || t < 0) return;
  ring[(size_t)((pos0 + t) & 3) * conv_dim + c] = qkv[(size_t)t * conv_dim + c];
}

}  // namespace

void launch_gdn_chunk(const float* qkv, const float* z, const float* a, const float* b, const float* conv_w,
                      const float* a_log, const float* dt_bias, const float* norm_w, float* conv_ring, float* state,
                      float* out, int pos0, int n, GdnDims dims, float eps, cudaStream_t s) {
  LILY_CHECK(dims.k_dim >= 1 && dims.k_dim <= kMaxDk && dims.v_dim % 4 == 0 && dims.v_dim <= 8 * kCols &&
                 dims.n_k_heads > 0 && dims.n_v_heads % dims.n_k_heads == 0 && pos0 >= 0,
             "gdn_chunk: unsupported dims Dk=", dims.k_dim, " Dv=", dims.v_dim, " Hk=", dims.n_k_heads,
             " Hv=", dims.n_v_heads);
  if (n <= 0) return;
  const int tiles = (dims.v_dim + kCols - 1) / kCols;
  launch_ex(gdn_chunk_kernel, dim3(tiles, dims.n_v_heads), dim3(kThreads), 0, s, LaunchOpts{false, tiles, false}, qkv,
            z, a, b, conv_w, a_log, dt_bias, norm_w, conv_ring, state, out, pos0, n, dims, eps);
  const int conv_dim = dims.conv_dim();
  ring_update_kernel<<<dim3((conv_dim + 255) / 256, 4), 256, 0, s>>>(qkv, conv_ring, pos0, n, conv_dim);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda
