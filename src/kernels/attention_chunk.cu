// Attention over a prompt chunk (docs/model.md §2.3): n consecutive tokens at positions pos0.., each attending
// causally to the cache [0, its position]. Two launches, the prep and one of the two attention kernels:
//   chunk_prep_kernel    grid (n, heads / 8), a warp per head: q/k RMSNorm + partial RoPE (kernels/qk_rope.cuh,
//                        the decode path's math); q pre-scaled by 1/sqrt(d) and log2(e) (softmax in base 2) and
//                        split into two bf16 terms (the second stored only for the two-term kernel); k and v
//                        appended to the paged cache as bf16
//   chunk_attn_kernel    grid (n_kv, token tiles of 16, the last tile first), 8 warps: a KV head's group of query
//                        heads for 16 tokens as 128 rows (token-major), flash attention over 32-key tiles of the
//                        cache on the tensor cores (mma.sync bf16, fp32 sums; q and p in two bf16 terms each, as
//                        the decode split kernel, or ONE: one term each, half the products: median 9e-5 against
//                        6e-5 for the bf16 cache alone in the emulation of bench/RESULTS.md), online softmax in
//                        registers, K/V tiles double-buffered through cp.async; every K/V row read once per 16
//                        tokens for all heads of the group. Then / l and the sigmoid gate.
//   chunk_attn_wg_kernel the one-term form at head_dim 256 (the model's) on warpgroup MMA: the same blocks as two
//                        warpgroups of 64 rows, 64-key tiles read by the tensor cores straight from shared memory
//                        (KernelOptions::prompt_attn_wgmma; the mma.sync kernel keeps the other forms and sizes).
// Deterministic (fixed summation order). Tested against the decode attention token by token in
// tests/gpu/test_mixer_kernels.cu.
#include <cuda_bf16.h>

#include <type_traits>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "kernels/mma.cuh"
#include "kernels/qk_rope.cuh"
#include "kernels/wgmma.cuh"

namespace lily::cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kQTok = 16;                 // tokens per block
constexpr int kRows = kQTok * 8;          // x 8 heads (a group has at most 8)
constexpr int kKeys = 32;                 // keys per tile
constexpr int kThreads = kRows / 16 * 32;  // a warp per 16 rows (2 tokens)

using mma::bf16_round;
using mma::pack_bf16x2;

template <int EPL>
__global__ void chunk_prep_kernel(AttnIn in, KvPages kv, int pos0, int n, int n_heads, uint16_t* qh, uint16_t* ql) {
  constexpr int D = EPL * 32;
  const int t = blockIdx.x, lane = threadIdx.x % 32;
  const int head = blockIdx.y * 8 + threadIdx.x / 32;
  if (head >= n_heads + kv.n_kv) return;
  const int pos = pos0 + t;
  const bool is_k = head >= n_heads;
  qk::LaneRope<EPL> r;
  qk::lane_rope_weights<EPL>(in, r, is_k);
  qk::lane_rope_angles<EPL>(in, pos, r);
  float x[EPL];
  if (!is_k) {
    qk::load_lane<EPL>(in.qg + ((size_t)t * n_heads + head) * 2 * D + lane * EPL, x);
    qk::norm_rope_lane<EPL>(x, r.wq, r, in.eps);
    const float qscale = rsqrtf((float)D) * kLog2e;
    const size_t o = ((size_t)t * n_heads + head) * D + lane * EPL;
#pragma unroll
    for (int e = 0; e < EPL; ++e) {
      const float v = x[e] * qscale, h = bf16_round(v);
      const __nv_bfloat16 hb = __float2bfloat16_rn(h), lb = __float2bfloat16_rn(v - h);
      qh[o + e] = *reinterpret_cast<const uint16_t*>(&hb);
      if (ql) ql[o + e] = *reinterpret_cast<const uint16_t*>(&lb);
    }
  } else {
    const int g = head - n_heads;
    qk::load_lane<EPL>(in.k + ((size_t)t * kv.n_kv + g) * D + lane * EPL, x);
    qk::norm_rope_lane<EPL>(x, r.wk, r, in.eps);
    float vx[EPL];
    qk::load_lane<EPL>(in.v + ((size_t)t * kv.n_kv + g) * D + lane * EPL, vx);
    uint16_t* page = kv.pages[pos / kv.page_tokens];
    const int slot = pos % kv.page_tokens;
    uint16_t* kr = page + ((size_t)g * kv.page_tokens + slot) * D + lane * EPL;
    uint16_t* vr = page + ((size_t)(kv.n_kv + g) * kv.page_tokens + slot) * D + lane * EPL;
#pragma unroll
    for (int e = 0; e < EPL; ++e) {
      const __nv_bfloat16 kb = __float2bfloat16_rn(x[e]), vb = __float2bfloat16_rn(vx[e]);
      kr[e] = *reinterpret_cast<const uint16_t*>(&kb);
      vr[e] = *reinterpret_cast<const uint16_t*>(&vb);
    }
  }
}

// Causal mask and online softmax (base 2) over one tile of NJ 8-key n-tiles of a thread's two rows: element
// 4 j + e of s is row (e < 2 ? 0 : 1), key key0 + 8 j + 2 tq + e % 2. s becomes p; m and l are the rows' running
// maximum and this thread's share of the sum (the quad's at the end); corr rescales O.
template <int NJ>
__device__ __forceinline__ void softmax_tile(float (&s)[4 * NJ], int key0, const int (&row_pos)[2], int tq,
                                             float (&m)[2], float (&l)[2], float (&corr)[2]) {
  float mx[2] = {m[0], m[1]}, rs[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 4 * NJ; ++i) {
    const int key = key0 + (i >> 2) * 8 + tq * 2 + (i & 1);
    if (key > row_pos[(i >> 1) & 1]) s[i] = -INFINITY;
    mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    corr[h] = exp2f(m[h] - mx[h]);  // m = -inf at the first tile: 0
    m[h] = mx[h];
  }
#pragma unroll
  for (int i = 0; i < 4 * NJ; ++i) {
    s[i] = exp2f(s[i] - m[(i >> 1) & 1]);
    rs[(i >> 1) & 1] += s[i];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = l[h] * corr[h] + rs[h];
}

// out = o / l * sigmoid(gate) for a thread's two rows (tokens row_tok, head gq of the group), after the row sums
// over the quad. o: element 4 i + e is row (e < 2 ? 0 : 1), dim 8 i + 2 tq + e % 2.
template <int D>
__device__ __forceinline__ void store_rows(const float (&o)[D / 2], float (&l)[2], const AttnIn& in, float* out,
                                           int n, int n_heads, int g, int group, const int (&row_tok)[2], int gq,
                                           int tq) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  if (gq >= group) return;  // rows gq and gq + 8 are head gq of two tokens
  const int head = g * group + gq;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int t = row_tok[h];
    if (t >= n) continue;
    const float inv = 1.f / l[h];
    const float* gate = in.qg + ((size_t)t * n_heads + head) * 2 * D + D;
    float* dst = out + ((size_t)t * n_heads + head) * D;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int d0 = i * 8 + tq * 2;
      const float2 gt = *reinterpret_cast<const float2*>(gate + d0);
      float2 r;
      r.x = o[4 * i + 2 * h] * inv / (1.f + __expf(-gt.x));
      r.y = o[4 * i + 2 * h + 1] * inv / (1.f + __expf(-gt.y));
      *reinterpret_cast<float2*>(dst + d0) = r;
    }
  }
}

template <int D>
struct ChunkSmem {
  static constexpr int kStride = D + 8;  // bf16 per staged row: 16 bytes of padding, conflict-free ldmatrix
  static constexpr int kQ = kRows * kStride;    // elements of one q term
  static constexpr int kKV = kKeys * kStride;   // elements of one K or V tile
  static constexpr size_t kBytes = (2 * kQ + 2 * 2 * kKV) * sizeof(uint16_t);
};

template <int D, bool ONE>
__global__ void __launch_bounds__(kThreads) chunk_attn_kernel(AttnIn in, KvPages kv, int pos0, int n, int n_heads,
                                                             const uint16_t* qh, const uint16_t* ql, float* out) {
  using SM = ChunkSmem<D>;
  constexpr int S = SM::kStride;
  extern __shared__ __align__(16) uint16_t sm[];
  uint16_t* sq = sm;                 // [2][kRows][S] q hi, q lo
  uint16_t* skv = sm + 2 * SM::kQ;   // [2 stages][K, V][kKeys][S]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gq = lane >> 2, tq = lane & 3;
  // blocks in order of decreasing work: the token tiles from the chunk's end (the most keys) to its start, the KV
  // heads side by side; blocks start in that order and the shortest fill the SMs that free up first (longest
  // first scheduling; in tile order an SM that ran a short tile was then handed a long one)
  const int g = blockIdx.x, group = n_heads / kv.n_kv;
  const int t0 = (gridDim.y - 1 - blockIdx.y) * kQTok;
  const int t_last = min(n, t0 + kQTok) - 1;
  const int n_keys = pos0 + t_last + 1;  // keys [0, n_keys) are needed by some row of this block
  const int n_tiles = (n_keys + kKeys - 1) / kKeys;

  // q rows: row r = token t0 + r / 8, head g * group + r % 8 (rows past the group or the chunk are 0)
  for (int c = tid; c < (ONE ? 1 : 2) * kRows * (D / 8); c += kThreads) {
    const int term = c / (kRows * (D / 8)), rem = c % (kRows * (D / 8));
    const int r = rem / (D / 8), part = rem % (D / 8);
    const int t = t0 + r / 8, j = r % 8;
    uint16_t* dst = sq + term * SM::kQ + r * S + part * 8;
    if (t < n && j < group) {
      const uint16_t* src = (term ? ql : qh) + ((size_t)t * n_heads + g * group + j) * D + part * 8;
      mma::cp16(dst, src);
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }
  // a tile's keys lie in one page (page_tokens is a multiple of kKeys): its page and first rows once per tile, the
  // rest by constant shifts (a division by page_tokens and a page-table load per 16 bytes: ncu had the integer
  // instructions at ~30 % of the kernel's)
  auto stage = [&](int tile, int buf) {
    const int key0 = tile * kKeys, last = n_keys - 1 - key0;  // rows past the end: the last key (masked below)
    const uint16_t* page = kv.pages[key0 / kv.page_tokens];
    const int row_k = g * kv.page_tokens + key0 % kv.page_tokens, row_v = row_k + kv.n_kv * kv.page_tokens;
#pragma unroll 1
    for (int c = tid; c < 2 * kKeys * (D / 8); c += kThreads) {
      const int which = c / (kKeys * (D / 8)), rem = c % (kKeys * (D / 8));
      const int r = rem / (D / 8), part = rem % (D / 8);
      const uint16_t* src = page + (size_t)((which ? row_v : row_k) + min(r, last)) * D + part * 8;
      mma::cp16(skv + ((size_t)(buf * 2 + which) * kKeys + r) * S + part * 8, src);
    }
    mma::commit();
  };
  stage(0, 0);  // (the q copies are in this first group)

  // this thread's rows: warp * 16 + gq and + 8 -> tokens t0 + warp * 2 (+ 1), the same head
  const int row_tok[2] = {t0 + warp * 2, t0 + warp * 2 + 1};
  const int row_pos[2] = {pos0 + min(row_tok[0], n - 1), pos0 + min(row_tok[1], n - 1)};
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  for (int tile = 0; tile < n_tiles; ++tile) {
    if (tile + 1 < n_tiles) {
      stage(tile + 1, (tile + 1) & 1);
      mma::wait<1>();
    } else {
      mma::wait<0>();
    }
    __syncthreads();
    const uint16_t* sk = skv + (size_t)((tile & 1) * 2) * kKeys * S;
    const uint16_t* sv = sk + kKeys * S;
    // scores: 16 rows x 32 keys per warp, q in two terms
    float sc[kKeys / 8][4];
#pragma unroll
    for (int i = 0; i < kKeys / 8; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t ah[4], al[4];
      const int ar = warp * 16 + (lane & 15), ac = ks * 16 + (lane >> 4) * 8;
      mma::ldsm_x4(ah, sq + ar * S + ac);
      if constexpr (!ONE) mma::ldsm_x4(al, sq + SM::kQ + ar * S + ac);
#pragma unroll
      for (int p = 0; p < kKeys / 16; ++p) {
        uint32_t b[4];
        const int br = p * 16 + (lane >> 4) * 8 + (lane & 7), bc = ks * 16 + ((lane >> 3) & 1) * 8;
        mma::ldsm_x4(b, sk + br * S + bc);
        mma::bf16_16816(sc[2 * p], ah, b[0], b[1]);
        if constexpr (!ONE) mma::bf16_16816(sc[2 * p], al, b[0], b[1]);
        mma::bf16_16816(sc[2 * p + 1], ah, b[2], b[3]);
        if constexpr (!ONE) mma::bf16_16816(sc[2 * p + 1], al, b[2], b[3]);
      }
    }
    // causal mask and online softmax: n-tile i's element e is element 4 i + e of the flat tile
    float corr[2];
    softmax_tile<kKeys / 8>(reinterpret_cast<float(&)[kKeys / 2]>(sc), tile * kKeys, row_pos, tq, m, l, corr);
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] *= corr[0], o[i][1] *= corr[0], o[i][2] *= corr[1], o[i][3] *= corr[1];
    // o += p V, p in two bf16 terms (the score fragments are the A fragments of the 16-key slices)
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t ph[4], pl[4];
      const float* s0 = sc[2 * kk];
      const float* s1 = sc[2 * kk + 1];
      const float h00 = bf16_round(s0[0]), h01 = bf16_round(s0[1]);
      const float h02 = bf16_round(s0[2]), h03 = bf16_round(s0[3]);
      const float h10 = bf16_round(s1[0]), h11 = bf16_round(s1[1]);
      const float h12 = bf16_round(s1[2]), h13 = bf16_round(s1[3]);
      ph[0] = pack_bf16x2(h00, h01), ph[1] = pack_bf16x2(h02, h03);
      ph[2] = pack_bf16x2(h10, h11), ph[3] = pack_bf16x2(h12, h13);
      pl[0] = pack_bf16x2(s0[0] - h00, s0[1] - h01), pl[1] = pack_bf16x2(s0[2] - h02, s0[3] - h03);
      pl[2] = pack_bf16x2(s1[0] - h10, s1[1] - h11), pl[3] = pack_bf16x2(s1[2] - h12, s1[3] - h13);
      const int vr = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int dn = 0; dn < D / 8; dn += 2) {
        uint32_t b[4];
        mma::ldsm_x4_trans(b, sv + vr * S + dn * 8 + (lane >> 4) * 8);
        mma::bf16_16816(o[dn], ph, b[0], b[1]);
        if constexpr (!ONE) mma::bf16_16816(o[dn], pl, b[0], b[1]);
        mma::bf16_16816(o[dn + 1], ph, b[2], b[3]);
        if constexpr (!ONE) mma::bf16_16816(o[dn + 1], pl, b[2], b[3]);
      }
    }
    __syncthreads();  // this stage's buffers are refilled two tiles on
  }
  store_rows<D>(reinterpret_cast<const float(&)[D / 2]>(o), l, in, out, n, n_heads, g, group, row_tok, gq, tq);
}

// The one-term form for head_dim 256 on warpgroup MMA (kernels/wgmma.cuh): the same block of 128 rows (16 tokens x
// a group's 8 heads) as two warpgroups of 64 rows (8 tokens each), 64-key tiles. S = q K^T with both operands
// in shared memory (m64n64k16 over 16 k-steps), p in one bf16 term from S's accumulators as the A registers of
// O += p V (m64n256k16, V read N-major: the cache's rows as they are), O in 128 fp32 registers a thread. q, K and
// V are staged in the 128-byte swizzle: each 64-dim column block of rows of 128 bytes. The tensor cores read
// every staged K / V byte once per warpgroup instead of once per warp (the mma.sync kernel's ldmatrix).
namespace wg {
constexpr int kD = 256;
constexpr int kKeys = 64;                      // keys per tile
constexpr int kThreads = 256;                  // two warpgroups
constexpr int kQBytes = kD / 64 * kRows * 128;  // q: 4 column blocks of 128 rows x 128 bytes
constexpr int kKVBytes = kD / 64 * kKeys * 128;  // a K or V tile: 4 column blocks of 64 keys x 128 bytes
constexpr int kSmem = kQBytes + 2 * 2 * kKVBytes + 32 + 1024;  // two stages of K and V, 4 mbarriers, + slack to
                                                                // align to 1 KB
static_assert(kSmem <= 227 * 1024, "attention chunk (wgmma): shared memory");

// Byte offset of 16-byte chunk c (< kD / 8) of row r in a staged tile of `rows` rows.
__device__ __forceinline__ uint32_t chunk_at(int rows, int r, int c) {
  return (c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}
}  // namespace wg

__global__ void __launch_bounds__(wg::kThreads, 1)
    chunk_attn_wg_kernel(AttnIn in, KvPages kv, int pos0, int n, int n_heads, const uint16_t* qh, float* out) {
  using wg::chunk_at, wg::kKVBytes, wg::kQBytes;
  constexpr int kKeys = wg::kKeys, kThreads = wg::kThreads;
  constexpr int D = wg::kD;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t pad = (1024 - (raw & 1023)) & 1023;
  uint8_t* smem = smem_raw + pad;
  const uint32_t sq = raw + pad, skv = sq + kQBytes;  // shared addresses
  const int tid = threadIdx.x, wgi = tid / 128, warp = tid / 32, lane = tid % 32, gq = lane >> 2, tq = lane & 3;
  // blocks in order of decreasing work, as chunk_attn_kernel
  const int g = blockIdx.x, group = n_heads / kv.n_kv;
  const int t0 = (gridDim.y - 1 - blockIdx.y) * kQTok;
  const int t_last = min(n, t0 + kQTok) - 1;
  const int n_keys = pos0 + t_last + 1;
  const int n_tiles = (n_keys + kKeys - 1) / kKeys;

  if (tid == 0)
    for (int i = 0; i < 4; ++i) mma::mbar_init(skv + 4 * kKVBytes + 8 * i, kThreads);  // full[2], empty[2] below
  __syncthreads();
  // q rows: row r = token t0 + r / 8, head g * group + r % 8 (rows past the group or the chunk are 0)
  for (int c = tid; c < kRows * (D / 8); c += kThreads) {
    const int r = c / (D / 8), part = c % (D / 8);
    const int t = t0 + r / 8, j = r % 8;
    const uint32_t at = chunk_at(kRows, r, part);
    if (t < n && j < group) mma::cp16s(sq + at, qh + ((size_t)t * n_heads + g * group + j) * D + part * 8);
    else *reinterpret_cast<uint4*>(smem + at) = make_uint4(0, 0, 0, 0);
  }
  // K of tile t and V of tile t in buffers t % 2 of their own. K runs a tile ahead of V: S of tile t + 1 is issued
  // with p V of tile t, so K_{t+1} and V_t are needed together. The two warpgroups are held together only by the
  // buffers, through mbarriers, so one's softmax can overlap the other's products: full[t % 2] completes when every
  // thread's copies of {V_t, K_{t+1}} have landed, empty[t % 2] when every thread is done with tile t's products
  // (which free V_t's and K_{t+1}'s buffers). While its products of tile t run, each thread copies its share of
  // {V_{t+1}, K_{t+2}} into the buffers freed at tile t - 1, once both warpgroups are past it.
  auto copy_rows = [&](int tile, uint32_t dst, bool is_v) {  // as chunk_attn_kernel's: one page per tile
    const int key0 = tile * kKeys, last = n_keys - 1 - key0;
    const uint16_t* page = kv.pages[key0 / kv.page_tokens];
    const int row = g * kv.page_tokens + key0 % kv.page_tokens + (is_v ? kv.n_kv * kv.page_tokens : 0);
#pragma unroll 4
    for (int c = tid; c < kKeys * (D / 8); c += kThreads) {
      const int r = c / (D / 8), part = c % (D / 8);
      mma::cp16s(dst + chunk_at(kKeys, r, part), page + (size_t)(row + min(r, last)) * D + part * 8);
    }
  };
  auto k_buf = [&](int tile) { return skv + (tile & 1) * kKVBytes; };
  auto v_buf = [&](int tile) { return skv + (2 + (tile & 1)) * kKVBytes; };
  const uint32_t bars = skv + 4 * kKVBytes;
  auto full = [&](int tile) { return bars + 8 * (tile & 1); };
  auto empty = [&](int tile) { return bars + 16 + 8 * (tile & 1); };

  // this thread's rows 16 warp + gq and + 8 -> tokens t0 + 2 warp (+ 1), head gq of the group
  const int row_tok[2] = {t0 + warp * 2, t0 + warp * 2 + 1};
  const int row_pos[2] = {pos0 + min(row_tok[0], n - 1), pos0 + min(row_tok[1], n - 1)};
  float o[128];  // O: element 4 j + e is row (e < 2 ? 0 : 1), dim 8 j + 2 tq + e % 2
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const uint32_t q_lo = wgmma::b_desc_lo(sq + wgi * 64 * 128);  // this warpgroup's 64 rows
  float s[32];  // S: element 4 j + e is row (e < 2 ? 0 : 1), key 8 j + 2 tq + e % 2
  auto issue_s = [&](int tile) {  // S = q K^T: k-step ks in column block ks / 4, 32 bytes a step within it
    const uint32_t k_lo = wgmma::b_desc_lo(k_buf(tile));
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const uint32_t off = (ks >> 2), step = 2 * (ks & 3);
      wgmma::m64n64k16_ss(s, wgmma::b_desc_from(q_lo + off * (kRows * 128 >> 4) + step),
                          wgmma::b_desc_from(k_lo + off * (kKeys * 128 >> 4) + step), ks > 0);
    }
  };

  // q (copied above) and K_0 as a cp.async group; {V_0, K_1} to full[0]; S_0; then empty[1] as for a tile -1
  copy_rows(0, k_buf(0), false);
  mma::commit();
  copy_rows(0, v_buf(0), true);
  if (1 < n_tiles) copy_rows(1, k_buf(1), false);
  mma::mbar_arrive_copies(full(0));
  mma::commit();
  mma::wait<1>();
  wgmma::fence_proxy_shared();  // this thread's copies, seen by the tensor cores
  __syncthreads();
  wgmma::fence();
  issue_s(0);
  wgmma::commit();
  wgmma::wait<0>();
  mma::mbar_arrive(empty(1));

  for (int tile = 0; tile < n_tiles; ++tile) {
    float corr[2];
    softmax_tile<kKeys / 8>(s, tile * kKeys, row_pos, tq, m, l, corr);
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= corr[(i >> 1) & 1];
    // p's A registers of the 16-key slice kk are S's n-tiles 2 kk and 2 kk + 1
    uint32_t p[kKeys / 16][4];
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const float* s0 = s + 8 * kk;
      p[kk][0] = pack_bf16x2(s0[0], s0[1]), p[kk][1] = pack_bf16x2(s0[2], s0[3]);
      p[kk][2] = pack_bf16x2(s0[4], s0[5]), p[kk][3] = pack_bf16x2(s0[6], s0[7]);
    }
    mma::mbar_wait(full(tile), (tile >> 1) & 1);  // V_tile and K_{tile+1} have landed
    wgmma::fence_proxy_shared();
    wgmma::fence();
    // O += p V (16 keys: two 1 KB atoms; the dims' column blocks kKeys * 128 apart), then S of the next tile
    const uint32_t vb = v_buf(tile);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma::m64n256k16_tb(o, p[kk], wgmma::mn_desc(vb + kk * 16 * 128, kKeys * 128));
    if (tile + 1 < n_tiles) issue_s(tile + 1);
    wgmma::commit();
    if (tile + 1 < n_tiles) {  // {V_{tile+1}, K_{tile+2}} into the buffers freed by tile - 1
      mma::mbar_wait(empty(tile - 1), (tile >> 1) & 1);
      copy_rows(tile + 1, v_buf(tile + 1), true);
      if (tile + 2 < n_tiles) copy_rows(tile + 2, k_buf(tile + 2), false);
      mma::mbar_arrive_copies(full(tile + 1));
    }
    wgmma::wait<0>();
    mma::mbar_arrive(empty(tile));
  }
  store_rows<D>(o, l, in, out, n, n_heads, g, group, row_tok, gq, tq);
}

template <int D, bool ONE>
void launch_chunk(const AttnIn& in, KvPages kv, int pos0, int n, int n_heads, uint16_t* q_scratch, float* out,
                  cudaStream_t s, bool use_wg) {
  constexpr int EPL = D / 32;
  uint16_t* qh = q_scratch;
  uint16_t* ql = q_scratch + (size_t)n * n_heads * D;
  chunk_prep_kernel<EPL><<<dim3(n, (n_heads + kv.n_kv + 7) / 8), 256, 0, s>>>(in, kv, pos0, n, n_heads, qh,
                                                                                ONE ? nullptr : ql);
  CUDA_CHECK_LAUNCH(s);
  if constexpr (D == wg::kD && ONE) {
    if (use_wg) {
      CUDA_CHECK(cudaFuncSetAttribute(chunk_attn_wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, wg::kSmem));
      chunk_attn_wg_kernel<<<dim3(kv.n_kv, (n + kQTok - 1) / kQTok), wg::kThreads, wg::kSmem, s>>>(in, kv, pos0, n,
                                                                                            n_heads, qh, out);
      CUDA_CHECK_LAUNCH(s);
      return;
    }
  }
  constexpr size_t smem = ChunkSmem<D>::kBytes;
  CUDA_CHECK(cudaFuncSetAttribute(chunk_attn_kernel<D, ONE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  chunk_attn_kernel<D, ONE><<<dim3(kv.n_kv, (n + kQTok - 1) / kQTok), kThreads, smem, s>>>(in, kv, pos0, n, n_heads, qh,
                                                                                      ql, out);
  CUDA_CHECK_LAUNCH(s);
}

}  // namespace

size_t attention_chunk_scratch_bytes(int n, int n_heads, int head_dim) {
  return (size_t)2 * n * n_heads * head_dim * sizeof(uint16_t);
}

void launch_attention_chunk(const AttnIn& in, KvPages kv, int pos0, int n, int n_heads, void* q_scratch, float* out,
                            cudaStream_t s, bool one_term, bool wgmma) {
  LILY_CHECK(kv.n_kv > 0 && n_heads > 0, "attention_chunk: ", n_heads, " heads over ", kv.n_kv, " KV heads");
  const int group = n_heads / kv.n_kv;
  LILY_CHECK(n_heads % kv.n_kv == 0 && group >= 1 && group <= 8 && kv.page_tokens % kKeys == 0 && pos0 >= 0,
             "attention_chunk: ", n_heads, " heads over ", kv.n_kv, " KV heads (groups of at most 8), pages of ",
             kv.page_tokens, " tokens (a multiple of ", kKeys, ")");
  LILY_CHECK(in.rope_dim > 0 && in.rope_dim <= kv.head_dim && (in.rope_dim / 2) % std::max(kv.head_dim / 32, 1) == 0,
             "attention_chunk: rope_dim ", in.rope_dim, " with head_dim ", kv.head_dim);
  if (n <= 0) return;
  LILY_CHECK((n + kQTok - 1) / kQTok <= 65535, "attention_chunk: ", n, " tokens in one chunk (grid y)");
  uint16_t* q = static_cast<uint16_t*>(q_scratch);
  const bool use_wg = wgmma && kv.page_tokens % wg::kKeys == 0;  // (one term, head_dim 256)
  auto run = [&](auto one) {
    constexpr bool ONE = decltype(one)::value;
    switch (kv.head_dim) {
      case 256: launch_chunk<256, ONE>(in, kv, pos0, n, n_heads, q, out, s, use_wg); return;
      case 128: launch_chunk<128, ONE>(in, kv, pos0, n, n_heads, q, out, s, use_wg); return;
      case 64: launch_chunk<64, ONE>(in, kv, pos0, n, n_heads, q, out, s, use_wg); return;
      case 32: launch_chunk<32, ONE>(in, kv, pos0, n, n_heads, q, out, s, use_wg); return;
      default: ::lily::fail("attention_chunk: head_dim ", kv.head_dim, " not supported (256, 128, 64, 32)");
    }
  };
  if (one_term) run(std::true_type{});
  else run(std::false_type{});
}

}  // namespace lily::cuda
