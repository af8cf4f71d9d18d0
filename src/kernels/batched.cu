// The small per-row kernels of the prompt path (kernels/batched.h): the GEMM's input split (with the RMSNorm
// fused), the MoE's selection, grouping by expert (both with the grouped GEMMs' work list in one launch for a
// decode pass), SwiGLU and the sum of the expert outputs.
// All arithmetic fp32. Tested by tests/gpu/test_batched.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cub/block/block_scan.cuh>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/gemv_impl.cuh"
#include "kernels/launch.cuh"
#include "kernels/qdot.cuh"

namespace lily::cuda {
namespace detail {

__device__ __forceinline__ uint16_t bf16_bits(float f) {
  const __nv_bfloat16 b = __float2bfloat16_rn(f);
  return *reinterpret_cast<const uint16_t*>(&b);
}

// One block (256 threads) per row: the row's words read once (load_row_words: thread i holds words i, i + 256, a
// group being 8 consecutive lanes; normed where norm_w is given), then each word's hi / lo halves stored at their
// gemm_x_col positions (elements i and i + 4 of a word are neighbours: one 32-bit store per pair) and each group's
// sum over its 8 lanes. Every thread runs the same number of words (the shuffles), storing only valid ones.
constexpr int kXPrepWords = kXPrepMaxK / 2048;
constexpr bool x_prep_positions_follow_gemm_x_col() {
  for (int W = 0; W < 8; ++W)
    for (int i = 0; i < 4; ++i) {
      const int j = 4 * (W & 1) + i, p = 16 * (j >> 1) + 8 * (j & 1) + 2 * (W >> 1);
      if (gemm_x_col(p) != 8 * W + i || gemm_x_col(p + 1) != 8 * W + i + 4) return false;
    }
  return true;
}
static_assert(x_prep_positions_follow_gemm_x_col(), "x_prep_kernel stores word W's element i at position p");
// The fp16 form (batched.h), where f16hi is set: the row's largest |x| over the block (a warp maximum, then the
// warps' through shared memory), its power of two, and each element's two terms at the bf16 terms' positions.
__global__ void __launch_bounds__(256) x_prep_kernel(const float* x, int ldx, const float* norm_w, float eps, int K,
                                                     uint16_t* hi, uint16_t* lo, float* gsum, float* x_out,
                                                     uint16_t* f16hi, uint16_t* f16lo, float* f16inv) {
  dep_chain();
  const int t = blockIdx.x;
  const size_t o = static_cast<size_t>(t) * K;
  float v[kXPrepWords][8];
  load_row_words(x + static_cast<size_t>(t) * ldx, norm_w, eps, K, v);
  float f16_scale = 1.f;  // 2^e
  if (f16hi) {
    __shared__ float wmax[8];
    float m = 0.f;
#pragma unroll
    for (int q = 0; q < kXPrepWords; ++q)
      if (8 * (threadIdx.x + 256 * q) < K)
#pragma unroll
        for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(v[q][k]));
#pragma unroll
    for (int sh = 16; sh > 0; sh >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, sh));
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = m;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < 8; ++w) m = fmaxf(m, wmax[w]);
    int k = 0;
    frexpf(m, &k);  // m = f 2^k, f in [0.5, 1): m 2^(15 - k) in [2^14, 2^15)
    const int e = m > 0.f && isfinite(m) ? min(127, 15 - k) : 0;
    f16_scale = ldexpf(1.f, e);
    if (threadIdx.x == 0) f16inv[t] = ldexpf(1.f, -e);
  }
#pragma unroll
  for (int q = 0; q < kXPrepWords; ++q) {
    const int wi = threadIdx.x + 256 * q, c = 8 * wi, g = wi / 8, W = wi % 8;
    if (8 * 256 * q >= K) break;  // (block-uniform)
    const bool valid = c < K;
    const float(&u)[8] = v[q];
    const float s = group_word_sum(u);
    if (!valid) continue;
    if (x_out) {
      *reinterpret_cast<float4*>(x_out + o + c) = make_float4(u[0], u[1], u[2], u[3]);
      *reinterpret_cast<float4*>(x_out + o + c + 4) = make_float4(u[4], u[5], u[6], u[7]);
    }
#pragma unroll
    for (int i = 0; i < 4 && hi; ++i) {  // elements i, i + 4 at positions p, p + 1 (gemm_x_col(p) = 8 W + i)
      const int j = 4 * (W & 1) + i, p = 16 * (j >> 1) + 8 * (j & 1) + 2 * (W >> 1);
      const uint16_t h0 = bf16_bits(u[i]), h1 = bf16_bits(u[i + 4]);
      const uint16_t l0 = bf16_bits(u[i] - bf16_lo(h0)), l1 = bf16_bits(u[i + 4] - bf16_lo(h1));
      const size_t at = o + static_cast<size_t>(g) * 64 + p;
      *reinterpret_cast<uint32_t*>(hi + at) = h0 | static_cast<uint32_t>(h1) << 16;
      *reinterpret_cast<uint32_t*>(lo + at) = l0 | static_cast<uint32_t>(l1) << 16;
    }
#pragma unroll
    for (int i = 0; i < 4 && f16hi; ++i) {  // the fp16 form at the same positions
      const int j = 4 * (W & 1) + i, p = 16 * (j >> 1) + 8 * (j & 1) + 2 * (W >> 1);
      const float a0 = u[i] * f16_scale, a1 = u[i + 4] * f16_scale;
      const __half2 h = __floats2half2_rn(a0, a1);
      const size_t at = o + static_cast<size_t>(g) * 64 + p;
      *reinterpret_cast<__half2*>(f16hi + at) = h;
      if (f16lo)
        *reinterpret_cast<__half2*>(f16lo + at) = __floats2half2_rn(a0 - __low2float(h), a1 - __high2float(h));
    }
    if (W == 0) gsum[static_cast<size_t>(t) * (K / 64) + g] = s;
  }
}

// One warp per token, the decode path's routing (kernels/gemv_impl.cuh warp_topk: the same experts and weights as
// route_topk): the softmax is monotonic and its denominator cancels in the renormalisation, so the top_k are chosen
// by logit (ties: lower id) and weighted exp(l - l_max) / sum over the chosen of exp(l' - l_max); the shared
// expert's gate through a sigmoid.
constexpr int kSelMaxK = 16;
// The calling warp: row t's experts and weights into idx / w [t][top_k] (and into pair_e / pair_w when given), its
// shared gate into sh_scale[t].
template <int NE>
__device__ __forceinline__ void select_row(const float* logits, int ld, int t, int E, int top_k, int* idx, float* w,
                                           float* sh_scale, int* pair_e = nullptr, float* pair_w = nullptr) {
  const float* l = logits + static_cast<size_t>(t) * ld;
  int chosen[kSelMaxK];
  float p[kSelMaxK];
  warp_topk<NE>(l, E, top_k, chosen, p);
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int j = 0; j < kSelMaxK; ++j) {
      if (j >= top_k) break;
      const size_t q = static_cast<size_t>(t) * top_k + j;
      idx[q] = chosen[j];
      w[q] = p[j];
      if (pair_e) pair_e[q] = chosen[j], pair_w[q] = p[j];
    }
    sh_scale[t] = 1.f / (1.f + expf(-l[E]));
  }
}
template <int NE>
__global__ void select_kernel(const float* logits, int ld, int n, int E, int top_k, int* idx, float* w,
                              float* sh_scale) {
  dep_chain();
  const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= n) return;
  select_row<NE>(logits, ld, t, E, top_k, idx, w, sh_scale);
}

// One block: counts per expert, exclusive prefix, then each pair takes the next free slot of its expert. The
// order of the slots within an expert varies from run to run, but every slot's output depends only on its own
// input row, and moe_combine sums a token's outputs in choice order: the results do not.
constexpr int kGroupThreads = 1024;
__global__ void __launch_bounds__(kGroupThreads) group_kernel(const int* idx, const float* w, int pairs, int top_k,
                                                              int E, int* offsets, int* x_row, float* w_slot,
                                                              int* slot_of, int n_shared) {
  dep_chain();
  for (int t = threadIdx.x; t < n_shared; t += blockDim.x) x_row[pairs + t] = t, w_slot[pairs + t] = 1.f;
  extern __shared__ int cnt[];  // [E]
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&cnt[idx[p]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int e = 0; e < E; ++e) {
      const int c = cnt[e];
      cnt[e] = run;
      offsets[e] = run;
      run += c;
    }
    offsets[E] = run;
    if (n_shared > 0) offsets[E + 1] = run + n_shared;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int a = atomicAdd(&cnt[idx[p]], 1);
    x_row[a] = p / top_k;
    w_slot[a] = w[p];
    slot_of[p] = a;
  }
}

// A decode pass's routing in one block (the three launches above in one): warp w selects rows w, w + 32, ... as
// select_kernel does (the same experts, weights and shared gate), the block groups the pairs by expert as
// group_kernel does (slots in no fixed order within an expert) and writes the grouped GEMMs' work list as
// tiles_kernel does (kernels/gemm.cu), for tiles of `tok` slots.
constexpr int kRouteThreads = 1024;
template <int NE>
__global__ void __launch_bounds__(kRouteThreads) route_rows_kernel(const float* logits, int ld, int n, int E,
                                                                   int top_k, int* idx, float* w, float* sh_scale,
                                                                   int* offsets, int* x_row, float* w_slot,
                                                                   int* slot_of, int* tiles, int tok,
                                                                   int n_shared) {
  using Scan = cub::BlockScan<int, kRouteThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int cnt[kRouteThreads];            // per expert: its pairs, then its next free slot
  __shared__ int pair_e[kMoeRouteMaxPairs];     // each pair's expert
  __shared__ float pair_w[kMoeRouteMaxPairs];   // and weight
  dep_chain();
  const int tid = threadIdx.x;
  cnt[tid] = 0;
  const int pairs = n * top_k, sh_tiles = (n_shared + tok - 1) / tok;  // the shared expert's tiles come first
  for (int t = tid; t < n_shared; t += kRouteThreads) x_row[pairs + t] = t, w_slot[pairs + t] = 1.f;
  for (int j = tid; j < sh_tiles; j += kRouteThreads) tiles[1 + j] = (E << 16) | j;
  for (int t = tid / 32; t < n; t += kRouteThreads / 32)
    select_row<NE>(logits, ld, t, E, top_k, idx, w, sh_scale, pair_e, pair_w);
  __syncthreads();
  for (int q = tid; q < pairs; q += kRouteThreads) atomicAdd(&cnt[pair_e[q]], 1);
  __syncthreads();
  const int c = cnt[tid];  // (0 past E)
  int first, total;
  Scan(tmp).ExclusiveSum(c, first, total);
  if (tid < E) offsets[tid] = first;
  if (tid == 0) offsets[E] = total;
  if (tid == 0 && n_shared > 0) offsets[E + 1] = total + n_shared;
  cnt[tid] = first;  // (each thread reads and writes only its own expert's entry until the barrier)
  __syncthreads();   // (tmp is reused; the slot bases are in place)
  const int nt = (c + tok - 1) / tok;
  int tile0, n_tiles;
  Scan(tmp).ExclusiveSum(nt, tile0, n_tiles);
  for (int j = 0; j < nt; ++j) tiles[1 + sh_tiles + tile0 + j] = (tid << 16) | j;
  if (tid == 0) tiles[0] = sh_tiles + n_tiles;
  for (int q = tid; q < pairs; q += kRouteThreads) {
    const int a = atomicAdd(&cnt[pair_e[q]], 1);
    x_row[a] = q / top_k;
    w_slot[a] = pair_w[q];
    slot_of[q] = a;
  }
}

__global__ void swiglu_kernel(const float* g, const float* u, const float* scale, int F, size_t total, float* act) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float gv = g[i];
    const float s = scale ? scale[i / F] : 1.f;
    act[i] = swiglu_value(s, gv, u[i]);
  }
}

__global__ void combine_kernel(const float* y, const int* slot_of, int top_k, const float* ysh,
                               const float* sh_scale, int H, float* h) {
  dep_chain();
  const int t = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= H) return;
  float s = 0.f;
  for (int j = 0; j < top_k; ++j) s += y[static_cast<size_t>(slot_of[t * top_k + j]) * H + i];
  s += sh_scale[t] * ysh[static_cast<size_t>(t) * H + i];
  h[static_cast<size_t>(t) * H + i] += s;
}

}  // namespace detail

GemmXBuf gemm_x_alloc(int n, int K, bool f16) {
  LILY_CHECK(K % 64 == 0 && K > 0 && n > 0, "gemm_x_alloc: ", n, " rows of width ", K,
             " (a positive multiple of 64)");
  GemmXBuf b;
  b.K = K;
  const size_t m = static_cast<size_t>(n) * K;
  CUDA_CHECK(cudaMalloc(&b.hi, sizeof(uint16_t) * m));
  CUDA_CHECK(cudaMalloc(&b.lo, sizeof(uint16_t) * m));
  CUDA_CHECK(cudaMalloc(&b.gsum, sizeof(float) * (m / 64)));
  if (f16) {  // (the rows at any width K' >= 64 number at most m / 64)
    CUDA_CHECK(cudaMalloc(&b.f16hi, sizeof(uint16_t) * m));
    CUDA_CHECK(cudaMalloc(&b.f16lo, sizeof(uint16_t) * m));
    CUDA_CHECK(cudaMalloc(&b.f16inv, sizeof(float) * (m / 64)));
  }
  return b;
}

void gemm_x_free(GemmXBuf& b) {
  for (void* p : {(void*)b.hi, (void*)b.lo, (void*)b.gsum, (void*)b.f16hi, (void*)b.f16lo, (void*)b.f16inv})
    if (p) cudaFree(p);
  b = GemmXBuf{};
}

void gemm_x_prep(const float* x, int ldx, int n, const float* norm_w, float eps, const GemmXBuf& out, float* x_out,
                 cudaStream_t s) {
  LILY_CHECK(out.K <= kXPrepMaxK && ldx >= out.K && ldx % 4 == 0, "gemm_x_prep: width ", out.K, " (at most ",
             kXPrepMaxK, "), row stride ", ldx, " (at least the width, a multiple of 4)");
  if (n <= 0) return;
  launch_pdl(detail::x_prep_kernel, dim3(n), dim3(256), 0, s, x, ldx, norm_w, eps, out.K, out.hi, out.lo, out.gsum,
             x_out, out.f16hi, out.f16lo, out.f16inv);
}

void moe_select_rows(const float* logits, int ld, int n, int E, int top_k, int* idx, float* w, float* sh_scale,
                     cudaStream_t s) {
  LILY_CHECK(top_k >= 1 && top_k <= detail::kSelMaxK && top_k <= E && E <= 512 && ld > E, "moe_select_rows: top_k ",
             top_k, " of ", E, " experts (at most 512)");
  if (n <= 0) return;
  auto* k = E <= 256 ? detail::select_kernel<8> : detail::select_kernel<16>;
  launch_pdl(k, dim3((n + 7) / 8), dim3(256), 0, s, logits, ld, n, E, top_k, idx, w, sh_scale);
}

void moe_group(const int* idx, const float* w, int n, int top_k, int E, int* offsets, int* x_row, float* w_slot,
               int* slot_of, cudaStream_t s, int n_shared) {
  LILY_CHECK(n * top_k <= kMoeGroupMaxPairs && n_shared >= 0, "moe_group: ", n * top_k, " pairs (at most ",
             kMoeGroupMaxPairs, "), ", n_shared, " shared slots");
  launch_pdl(detail::group_kernel, dim3(1), dim3(detail::kGroupThreads), E * sizeof(int), s, idx, w, n * top_k, top_k,
             E, offsets, x_row, w_slot, slot_of, n_shared);
}

void moe_route_rows(const float* logits, int ld, int n, int E, int top_k, int* idx, float* w, float* sh_scale,
                    int* offsets, int* x_row, float* w_slot, int* slot_of, int* tiles, int tile_tokens,
                    cudaStream_t s, int n_shared) {
  LILY_CHECK(top_k >= 1 && top_k <= detail::kSelMaxK && top_k <= E && E <= 512 && ld > E && n >= 1 &&
                 n <= kMoeRouteMaxRows && n * top_k <= kMoeRouteMaxPairs && tile_tokens >= 1 && n_shared >= 0,
             "moe_route_rows: ", n, " rows (at most ", kMoeRouteMaxRows, "), top_k ", top_k, " of ", E,
             " experts (at most 512), tiles of ", tile_tokens);
  auto* k = E <= 256 ? detail::route_rows_kernel<8> : detail::route_rows_kernel<16>;
  launch_pdl(k, dim3(1), dim3(detail::kRouteThreads), 0, s, logits, ld, n, E, top_k, idx, w, sh_scale, offsets, x_row,
             w_slot, slot_of, tiles, tile_tokens, n_shared);
}

void swiglu_rows(const float* g, const float* u, const float* scale, int n, int F, float* act, cudaStream_t s) {
  const size_t total = static_cast<size_t>(n) * F;
  if (total == 0) return;
  const int blocks = static_cast<int>(std::min<size_t>((total + 255) / 256, 4096));
  detail::swiglu_kernel<<<blocks, 256, 0, s>>>(g, u, scale, F, total, act);
  CUDA_CHECK_LAUNCH(s);
}

void moe_combine(const float* y, const int* slot_of, int top_k, const float* ysh, const float* sh_scale, int n, int H,
                 float* h, cudaStream_t s) {
  if (n <= 0) return;
  launch_pdl(detail::combine_kernel, dim3((H + 255) / 256, n), dim3(256), 0, s, y, slot_of, top_k, ysh, sh_scale, H, h);
}

}  // namespace lily::cuda
