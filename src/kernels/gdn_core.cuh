// The Gated DeltaNet decode step of one (value head, 32-column tile) for 256 threads, shared by the standalone
// kernel (kernels/gdn.cu: one block per tile, the output norm over a cluster) and the fused mixer kernel
// (kernels/gdn_fused.cu: half of a persistent block, the output norm in the out_proj phase). docs/model.md §2.2:
//   conv_silu   causal depthwise conv (4 taps) over raw qkv held in a 4-slot ring + SiLU (taps and earlier
//               values requested ahead by prefetch_inputs)
//   l2norm_qk   L2 norms of the key head's q and k (q additionally * 1/sqrt(Dk))
//   gates       beta = sigmoid(b), decay = exp(-exp(A_log) * softplus(a + dt_bias))
//   delta_rule  S = decay*S; mem = Sᵀk; S += k ⊗ beta(v - mem); o = Sᵀq   (state read once, written once;
//               o from the decayed state as Sᵀq + (k·q) beta(v - mem), so one column reduction serves both)
// Thread t holds rows rg + 32r (r < 4) x columns c4*4..+3 of the tile (c4 = t % 8, rg = t / 8). The caller's
// Sync functor is the barrier of the 256 participating threads. Inputs produced by the in_proj (qkv, a, b) are
// read through L2 (__ldcg): in the fused kernel other blocks wrote them in the same launch.
#pragma once
#include "kernels/mixers.h"

namespace lily::cuda::gdn {

inline constexpr int kThreads = 256;  // 8 column quads x 32 row groups
inline constexpr int kCols = 32;      // value columns per tile
inline constexpr int kMaxDk = 128;    // 32 row groups x 4 rows per thread
inline constexpr int kRowsPerThread = kMaxDk / 32;

struct Shared {
  float qn[kMaxDk];
  float kn[kMaxDk];
  float v[kCols];
  float red[(kThreads / 32 + 1) * 8 * 9];  // column_sums: per warp and column quad up to 9 partial sums, the totals
  float o[kCols];
  float warp_ss[kThreads / 32];
  float head_ss;                    // this tile's share of Σ o²
  // prefetch_inputs: per conv channel, taps 0..3 at [0..3] and the raw values of tokens pos-3..pos-1 at [4..6]
  float conv_qk[kThreads][8];       // thread t's q (t < 128) or k channel
  float conv_v[kCols][8];           // thread t < kCols: its v column
  float gate_in[2];                 // prefetch_inputs: A_log[h], dt_bias[h]
  float norm_w[kCols];              // prefetch_inputs: thread t < kCols: the output norm weight of its column
};

struct StepArgs {
  const float* qkv; const float* a_in; const float* b_in;
  const float* conv_w; const float* a_log; const float* dt_bias;
  float* ring; float* state;
  GdnDims dims;
};

__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(__expf(x)); }
__device__ __forceinline__ float4 fma4(float4 a, float s, float4 b) {
  return make_float4(fmaf(a.x, s, b.x), fmaf(a.y, s, b.y), fmaf(a.z, s, b.z), fmaf(a.w, s, b.w));
}

// Causal depthwise conv of one channel at position pos from its prefetched taps and earlier raw values (see
// Shared::conv_qk) and the current value, then SiLU. Taps before the sequence start read as 0.
__device__ __forceinline__ float conv_silu(const float* cv, float x_cur, int pos) {
  float acc = cv[3] * x_cur;
#pragma unroll
  for (int back = 1; back <= 3; ++back)
    if (pos - back >= 0) acc += cv[3 - back] * cv[7 - back];
  return silu(acc);
}

__device__ __forceinline__ void cp_async4(float* dst, const float* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
}

// Requests (cp.async into sh) the inputs of step() that no kernel of the step writes: each channel's 4 conv taps
// and its raw values of the three earlier tokens (ring slots (pos-3..pos-1) % 4; slots before the sequence start
// are not read), the head's A_log and dt_bias, and the output norm weights of the tile's columns (sh.norm_w,
// thread t < kCols its own column; read by the caller after step()). Issued at kernel entry, they arrive while
// the in_proj runs, so the step after its barrier waits only for the L2 round trip of the projections.
__device__ __forceinline__ void prefetch_inputs(const StepArgs& a, const float* norm_w, int h, int col0, int pos,
                                                int tid, Shared& sh) {
  const GdnDims& d = a.dims;
  const int kh = h / (d.n_v_heads / d.n_k_heads);
  const int Dk = d.k_dim, Dv = d.v_dim, key_dim = d.n_k_heads * Dk;
  const int conv_dim = 2 * key_dim + d.n_v_heads * Dv;
  auto issue = [&](float* dst, int c) {
#pragma unroll
    for (int t = 0; t < 4; ++t) cp_async4(dst + t, a.conv_w + (size_t)c * 4 + t);
#pragma unroll
    for (int back = 1; back <= 3; ++back)
      if (pos - back >= 0) cp_async4(dst + 7 - back, a.ring + (size_t)((pos - back) & 3) * conv_dim + c);
  };
  const int i_qk = tid % kMaxDk;
  if (i_qk < Dk) issue(sh.conv_qk[tid], (tid >= kMaxDk ? key_dim : 0) + kh * Dk + i_qk);
  if (tid < kCols && col0 + tid < Dv) {
    issue(sh.conv_v[tid], 2 * key_dim + h * Dv + col0 + tid);
    cp_async4(&sh.norm_w[tid], norm_w + col0 + tid);
  }
  if (tid == 0) {
    cp_async4(&sh.gate_in[0], a.a_log + h);
    cp_async4(&sh.gate_in[1], a.dt_bias + h);
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Sum over the 4 row groups of a warp that share a column quad (lanes c4, c4+8, c4+16, c4+24), then over the
// 8 warps through shared memory, of N values per thread; every thread of quad c4 gets the N totals. The warps'
// partials are summed once per (quad, value) by threads < 8 N, in warp order, and every thread then reads its
// quad's N totals (every thread summing all 8 N partials itself took 8 times the shared-memory reads).
template <int N, typename Sync>
__device__ __forceinline__ void column_sums(float (&p)[N], float* red, int tid, Sync sync) {
  static_assert(8 * N <= kThreads && N <= 9, "one thread per (quad, value); Shared::red holds 9 sums per quad");
#pragma unroll
  for (int o = 8; o <= 16; o <<= 1)
#pragma unroll
    for (int n = 0; n < N; ++n) p[n] += __shfl_xor_sync(0xffffffffu, p[n], o);
  const int lane = tid % 32, warp = tid / 32, c4 = tid % 8;
  float* tot = red + (kThreads / 32) * 8 * N;  // [8][N] after the partials [warp][8][N]
  sync();  // red may still be read by a previous call (the step makes one; kept for reuse)
  if (lane < 8)
#pragma unroll
    for (int n = 0; n < N; ++n) red[(warp * 8 + c4) * N + n] = p[n];
  sync();
  if (tid < 8 * N) {
    const int q = tid / N, n = tid % N;
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) t += red[(w * 8 + q) * N + n];
    tot[q * N + n] = t;
  }
  sync();
#pragma unroll
  for (int n = 0; n < N; ++n) p[n] = tot[c4 * N + n];
}

// This thread's 4 rows x 4 columns of the state of head h (no earlier kernel of the step writes it, so callers
// issue this before waiting for the in_proj results).
__device__ __forceinline__ void load_state(const StepArgs& a, int h, int col0, int tid, float4 (&s)[kRowsPerThread]) {
  const int Dk = a.dims.k_dim, Dv = a.dims.v_dim;
  const int c4 = tid % 8, rg = tid / 8, col = col0 + c4 * 4;
  const float* S = a.state + (size_t)h * Dk * Dv;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int i = rg + 32 * r;
    s[r] = col < Dv && i < Dk ? *reinterpret_cast<const float4*>(S + (size_t)i * Dv + col)
                              : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// This thread's 4 rows x 4 columns of the state of head h back to memory (after step()).
__device__ __forceinline__ void store_state(const StepArgs& a, int h, int col0, int tid,
                                            const float4 (&s)[kRowsPerThread]) {
  const int Dk = a.dims.k_dim, Dv = a.dims.v_dim;
  const int c4 = tid % 8, rg = tid / 8, col = col0 + c4 * 4;
  float* S = a.state + (size_t)h * Dk * Dv;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int i = rg + 32 * r;
    if (col < Dv && i < Dk) *reinterpret_cast<float4*>(S + (size_t)i * Dv + col) = s[r];
  }
}

// The step for head h, columns [col0, col0 + 32) at position pos, with the state already in s and the conv
// inputs requested (prefetch_inputs, same pos): updates the ring and the state in s (store_state writes it
// back), returns the 4 output columns of this thread's quad (every thread of the quad holds them).
// writes_qk: this tile writes the key head's q/k channels into the ring (one tile per key head does).
template <typename Sync>
__device__ __forceinline__ float4 step(const StepArgs& a, int h, int col0, int pos, bool writes_qk, int tid,
                                       float4 (&s)[kRowsPerThread], Shared& sh, Sync sync) {
  const int lane = tid % 32, warp = tid / 32;
  const GdnDims& d = a.dims;
  const int kh = h / (d.n_v_heads / d.n_k_heads);
  const int Dk = d.k_dim, Dv = d.v_dim, key_dim = d.n_k_heads * Dk;
  const int conv_dim = 2 * key_dim + d.n_v_heads * Dv;
  const size_t slot = (size_t)(pos & 3) * conv_dim;
  const int c4 = tid % 8, rg = tid / 8, col = col0 + c4 * 4;
  const bool col_ok = col < Dv;
  // the gate inputs now, with the conv inputs: after the first barrier they would cost an L2 round trip more
  const float b_raw = __ldcg(a.b_in + h), a_raw = __ldcg(a.a_in + h);

  // conv + SiLU: threads [0,128) q channel tid, [128,256) k channel tid-128; threads [0,32) also one v column
  // (each thread reads only the conv inputs it requested itself)
  const int i_qk = tid % kMaxDk;
  const bool is_k = tid >= kMaxDk;
  float u = 0.f;
  const bool has_v = tid < kCols && col0 + tid < Dv;
  const int c_qk = (is_k ? key_dim : 0) + kh * Dk + i_qk, c_v = 2 * key_dim + h * Dv + col0 + tid;
  const float x_qk = i_qk < Dk ? __ldcg(a.qkv + c_qk) : 0.f;
  const float x_v = has_v ? __ldcg(a.qkv + c_v) : 0.f;
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  if (i_qk < Dk) {
    u = conv_silu(sh.conv_qk[tid], x_qk, pos);
    if (writes_qk) a.ring[slot + c_qk] = x_qk;
  }
  if (has_v) {
    sh.v[tid] = conv_silu(sh.conv_v[tid], x_v, pos);
    a.ring[slot + c_v] = x_v;
  }

  // L2 norms: warps 0-3 hold q, warps 4-7 hold k.
  float ss = u * u;
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) sh.warp_ss[warp] = ss;
  sync();
  const int half = kThreads / 64;
  float part = 0.f;
  for (int w = 0; w < half; ++w) part += sh.warp_ss[(is_k ? half : 0) + w];
  if (i_qk < Dk) {
    const float scale = is_k ? 1.f : rsqrtf((float)Dk);
    (is_k ? sh.kn : sh.qn)[i_qk] = u * rsqrtf(part + 1e-6f) * scale;
  }

  // gates (every thread computes the two scalars of head h; sh.gate_in landed before the sync above)
  const float beta = sigmoid(b_raw);
  const float decay = __expf(-__expf(sh.gate_in[0]) * softplus(a_raw + sh.gate_in[1]));
  sync();

  // delta rule on this thread's 4 rows x 4 columns, with one column reduction: S' = decay S + k ⊗ dlt, so
  // mem = (decay S)ᵀk, dlt = beta (v - mem) and o = S'ᵀq = (decay S)ᵀq + (k·q) dlt; the reduction carries the
  // 4 columns of (decay S)ᵀk, the 4 of (decay S)ᵀq and this thread's rows' share of k·q.
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
  column_sums(cs, sh.red, tid, sync);
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
  return make_float4(fmaf(kq, dlt.x, cs[4]), fmaf(kq, dlt.y, cs[5]), fmaf(kq, dlt.z, cs[6]), fmaf(kq, dlt.w, cs[7]));
}

// The tile's outputs into sh.o and its Σ o² into sh.head_ss (threads < 8 and warp 0 work; ends with a sync).
template <typename Sync>
__device__ __forceinline__ void tile_sum_squares(float4 o, int col0, int Dv, int tid, Shared& sh, Sync sync) {
  const int c4 = tid % 8, lane = tid % 32;
  if (tid < 8) {
    sh.o[c4 * 4 + 0] = o.x;
    sh.o[c4 * 4 + 1] = o.y;
    sh.o[c4 * 4 + 2] = o.z;
    sh.o[c4 * 4 + 3] = o.w;
  }
  sync();
  if (tid < 32) {
    const float x = col0 + lane < Dv ? sh.o[lane] : 0.f;
    float t = x * x;
    for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
    if (lane == 0) sh.head_ss = t;
  }
  sync();
}

}  // namespace lily::cuda::gdn
