// Selection in the sampler's order (kernels/sampling.cu): order-preserving uint32 keys of z, larger key first,
// among equal keys the lower id. Two ways to find the best elements of a set:
//   block_select        a block-wide radix select (4 passes of 8-bit digits): any n, by count or by mass
//   owned_best_sorted / group_best_sorted   the k best, sorted, when the elements have few owners: each of NT
//                       threads owns up to E elements (a prep block's 1,024 logits), or each group of G elements
//                       is sorted (the prep blocks' candidates, owned by their groups). The k-th best of the
//                       owners' bests is a bound T: k owners hold an element at or before T, so the top k all rank
//                       at or before T, and only the owners whose best ranks among the first k hold any of them.
//                       Those owners' elements at or before T (at most k * E) are ranked against each other by
//                       counting; T itself comes from ranking the owners' bests that are among the k best of
//                       their warp (block_rank_top). A few barriers.
#pragma once
#include <climits>
#include <cstdint>

namespace lily::cuda::detail {

__device__ __forceinline__ uint32_t key_of(float z) {
  const uint32_t u = __float_as_uint(z);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
// The selection order: larger key first, among equal keys the lower id.
__device__ __forceinline__ bool ranks_before(uint32_t k2, int i2, uint32_t k, int i) {
  return k2 > k || (k2 == k && i2 < i);
}
__device__ __forceinline__ float z_of(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

template <int NT>
__device__ float block_reduce(float v, bool is_max) {
  __shared__ float s[NT / 32];
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s[threadIdx.x / 32] = v;
  __syncthreads();
  float t = s[0];
  for (int i = 1; i < NT / 32; ++i) t = is_max ? fmaxf(t, s[i]) : t + s[i];
  return t;
}

// Result of a prefix cut in the order (key desc, id asc): all keys > key, plus the first n_tie ids with
// key == key (n_tie == INT_MAX: all of them).
struct Cut {
  uint32_t key;
  int n_tie;
  int count_above;    // elements with key > cut key
  float mass_above;   // their sum exp(z - zmax) (mass mode only)
  int n_at;           // elements with key == cut key
};

// Block-wide radix select over n elements given by key(i): the shortest prefix with count >= target (by
// count) or mass sum exp(z - zmax) >= target (by mass). Every thread of the block gets the result.
// The mass histogram has one copy per group of 4 warps (summed in a fixed order after each pass): float
// atomics of a whole block on the few bins of a pass's leading digits serialised (2.4 ms over a 248K vocabulary).
// sm: one per kernel, shared by its calls (each instantiation's own static arrays did not fit); a call ends with
// a block barrier after its last read of sm.
template <int NT>
struct SelectSmem {
  static constexpr int kCopies = NT / 128;
  float hist_c[256], hist_m[256], hist_mw[kCopies][256];
  uint32_t prefix;
  int count_above, at;
  float mass_above;
};
template <int NT, typename KeyFn>
__device__ Cut block_select(SelectSmem<NT>& sm, KeyFn key, int n, bool by_mass, float target, float zmax) {
  constexpr int kCopies = SelectSmem<NT>::kCopies;
  float (&hist_c)[256] = sm.hist_c;
  float (&hist_m)[256] = sm.hist_m;
  float (&hist_mw)[kCopies][256] = sm.hist_mw;
  uint32_t& s_prefix = sm.prefix;
  int &s_count_above = sm.count_above, &s_at = sm.at;
  float& s_mass_above = sm.mass_above;
  if (threadIdx.x == 0) { s_prefix = 0; s_count_above = 0; s_mass_above = 0.f; s_at = 0; }
  float* my_m = hist_mw[threadIdx.x / 128];
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    const uint32_t hi_mask = pass == 0 ? 0u : (0xffffffffu << (32 - 8 * pass));
    for (int d = threadIdx.x; d < 256; d += NT) hist_c[d] = hist_m[d] = 0.f;
    if (by_mass)
      for (int d = threadIdx.x; d < kCopies * 256; d += NT) hist_mw[d / 256][d % 256] = 0.f;
    __syncthreads();
    const uint32_t prefix = s_prefix;
    for (int i0 = 0; i0 < n; i0 += NT) {  // warp-uniform trip count (for __match_any_sync)
      const int i = i0 + threadIdx.x;
      const uint32_t k = i < n ? key(i) : 0u;
      const int d = (i < n && (k & hi_mask) == prefix) ? static_cast<int>((k >> shift) & 255) : -1;
      const unsigned same = __match_any_sync(0xffffffffu, d);  // lanes with the same digit add once
      if (d >= 0) {
        if ((threadIdx.x & 31) == __ffs(same) - 1) atomicAdd(&hist_c[d], static_cast<float>(__popc(same)));
        if (by_mass && k != 0u) atomicAdd(&my_m[d], expf(z_of(k) - zmax));  // key 0: padding (prep)
      }
    }
    __syncthreads();
    if (by_mass) {  // block-uniform
      for (int d = threadIdx.x; d < 256; d += NT) {
        float m = 0.f;
#pragma unroll
        for (int c = 0; c < kCopies; ++c) m += hist_mw[c][d];
        hist_m[d] = m;
      }
      __syncthreads();
    }
    if (threadIdx.x < 32) {
      const int l = threadIdx.x;
      float sc = 0.f, sm = 0.f;
      for (int q = 0; q < 8; ++q) { sc += hist_c[255 - 8 * l - q]; sm += hist_m[255 - 8 * l - q]; }
      float pc = sc, pm = sm;  // inclusive prefix over lanes (top digits first)
      for (int o = 1; o < 32; o *= 2) {
        const float c2 = __shfl_up_sync(0xffffffffu, pc, o), m2 = __shfl_up_sync(0xffffffffu, pm, o);
        if (l >= o) { pc += c2; pm += m2; }
      }
      const float need = by_mass ? target - s_mass_above : target - static_cast<float>(s_count_above);
      const unsigned hit = __ballot_sync(0xffffffffu, (by_mass ? pm : pc) >= need);
      const int owner = hit ? __ffs(hit) - 1 : 31;
      if (l == owner) {
        float cc = pc - sc, cm = pm - sm;  // sums of the digits above this lane's first one
        int digit = 255 - 8 * l - 7;
        for (int q = 0; q < 8; ++q) {
          const int d = 255 - 8 * l - q;
          const float vc = hist_c[d], vm = hist_m[d];
          if ((by_mass ? cm + vm : cc + vc) >= need || q == 7) { digit = d; break; }
          cc += vc;
          cm += vm;
        }
        s_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
        s_count_above += static_cast<int>(cc);
        s_mass_above += cm;
        s_at = static_cast<int>(hist_c[digit]);
      }
    }
    __syncthreads();
  }
  Cut c;
  c.key = s_prefix;
  c.count_above = s_count_above;
  c.mass_above = s_mass_above;
  c.n_at = s_at;
  if (by_mass) {
    const float e = expf(z_of(c.key) - zmax);
    const float rem = target - c.mass_above;
    int t = e > 0.f ? static_cast<int>(ceilf(rem / e)) : c.n_at;
    c.n_tie = t < 1 ? 1 : (t > c.n_at ? c.n_at : t);
  } else {
    const int t = static_cast<int>(target) - c.count_above;
    c.n_tie = t < 1 ? 1 : (t > c.n_at ? c.n_at : t);
  }
  __syncthreads();
  return c;
}

// The survivors' ranks among themselves (distinct elements): the one of rank r < k is stored at [r].
template <int NT>
__device__ __forceinline__ void rank_survivors(const uint32_t* sk, const int* si, int ns, int k, uint32_t* out_key,
                                               int* out_id) {
  for (int s = threadIdx.x; s < ns; s += NT) {
    const uint32_t key = sk[s];
    const int id = si[s];
    int r = 0;
#pragma unroll 8
    for (int u = 0; u < ns; ++u) r += ranks_before(sk[u], si[u], key, id);
    if (r < k) {
      out_key[r] = key;
      out_id[r] = id;
    }
  }
}

template <int NT, int MAXS>
struct BestSmem {
  uint32_t bk[NT];  // contenders: owners' bests in the top k of their warp
  int bi[NT];
  uint32_t sk[MAXS];  // survivors
  int si[MAXS];
  int grp[NT];        // group_best_sorted: the owner of rank r < k
  int nc, ns;
  uint32_t tk;        // the bound T
  int ti;
};

// Every thread holds one element (key, id; id INT_MAX: none, ranking after every element); returns its rank
// among the block's elements where that is < k, else k (k <= NT). An element ranked k or later within its
// warp (by shuffles) cannot be in the top k; the others (at most min(k, 32) per warp) are ranked against each
// other in shared memory, and no other element ranks before one of the top k. sm.nc must be 0 (after a
// barrier); ends with a barrier-free read of the list, so callers barrier before reusing it.
template <int NT, int MAXS>
__device__ int block_rank_top(BestSmem<NT, MAXS>& sm, uint32_t key, int id, int k) {
  const int lane = threadIdx.x & 31;
  int rw = k;
  if (__any_sync(0xffffffffu, id != INT_MAX)) {  // (the finish block: 8 of its 32 warps hold the 243 heads)
    rw = 0;
#pragma unroll
    for (int d = 1; d < 32; ++d) {
      const int src = (lane + d) & 31;
      rw += ranks_before(__shfl_sync(0xffffffffu, key, src), __shfl_sync(0xffffffffu, id, src), key, id);
    }
  }
  const bool cont = id != INT_MAX && rw < k;
  const unsigned b = __ballot_sync(0xffffffffu, cont);
  int base = 0;
  if (lane == 0 && b) base = atomicAdd(&sm.nc, __popc(b));
  base = __shfl_sync(0xffffffffu, base, 0);
  if (cont) {
    const int slot = base + __popc(b & ((1u << lane) - 1u));
    sm.bk[slot] = key;
    sm.bi[slot] = id;
  }
  __syncthreads();
  if (!cont) return k;
  const int m = sm.nc;
  int r = 0;
#pragma unroll 4
  for (int u = 0; u < m; ++u) r += ranks_before(sm.bk[u], sm.bi[u], key, id);
  return r < k ? r : k;
}

// The k best of n elements keys[j] (shared memory; ids base + j), thread t owning j = t, t + NT, ...
// (E = ceil(n / NT) <= EMAX), sorted into out_key / out_id. Needs n > k, k <= NT and k * EMAX <= MAXS (the
// survivors); every thread calls; ends with a barrier.
template <int NT, int EMAX, int MAXS>
__device__ void owned_best_sorted(BestSmem<NT, MAXS>& sm, const uint32_t* keys, int base, int n, int k,
                                  uint32_t* out_key, int* out_id) {
  const int t = threadIdx.x;
  uint32_t bk = 0u;
  int bi = INT_MAX;
#pragma unroll
  for (int e = 0; e < EMAX; ++e) {
    const int j = t + e * NT;
    if (j < n && ranks_before(keys[j], base + j, bk, bi)) bk = keys[j], bi = base + j;
  }
  if (t == 0) sm.nc = 0, sm.ns = 0;
  __syncthreads();
  const int r = block_rank_top(sm, bk, bi, k);  // min(n, NT) > k owners hold elements
  if (r == k - 1) sm.tk = bk, sm.ti = bi;
  __syncthreads();
  const uint32_t tk = sm.tk;
  const int ti = sm.ti;
  if (r < k) {
#pragma unroll
    for (int e = 0; e < EMAX; ++e) {
      const int j = t + e * NT;
      if (j < n && !ranks_before(tk, ti, keys[j], base + j)) {
        const int s = atomicAdd(&sm.ns, 1);
        sm.sk[s] = keys[j];
        sm.si[s] = base + j;
      }
    }
  }
  __syncthreads();
  rank_survivors<NT>(sm.sk, sm.si, sm.ns, k, out_key, out_id);
  __syncthreads();
}

// The k best of n_groups sorted groups of G elements (ck / ci [n_groups][G], key desc, id asc; padding: id
// INT_MAX at the end), sorted into out_key / out_id. Returns k, or -1 (block-uniform) where it does not apply:
// more than NT groups, fewer than k groups with an element, or more than MAXS survivors. Every thread calls;
// ends with a barrier.
template <int NT, int MAXS>
__device__ int group_best_sorted(BestSmem<NT, MAXS>& sm, const uint32_t* ck, const int* ci, int n_groups, int G,
                                 int k, uint32_t* out_key, int* out_id) {
  static_assert(MAXS >= NT / 32, "the warps' bests of the k = 1 path");
  if (n_groups > NT) return -1;
  const int t = threadIdx.x;
  uint32_t bk = 0u;
  int bi = INT_MAX;
  if (t < n_groups) bk = ck[static_cast<size_t>(t) * G], bi = ci[static_cast<size_t>(t) * G];
  if (bi == INT_MAX) bk = 0u;  // padding
  if (t == 0) sm.nc = 0, sm.ns = 0;
  if (__syncthreads_count(bi != INT_MAX) < k) return -1;
  if (k == 1) {  // greedy: the best head, by a block reduction
    uint32_t wk = bk;
    int wi = bi;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      const uint32_t k2 = __shfl_xor_sync(0xffffffffu, wk, o);
      const int i2 = __shfl_xor_sync(0xffffffffu, wi, o);
      if (ranks_before(k2, i2, wk, wi)) wk = k2, wi = i2;
    }
    if ((t & 31) == 0) sm.sk[t / 32] = wk, sm.si[t / 32] = wi;
    __syncthreads();
    if (t == 0) {
      for (int w = 1; w < NT / 32; ++w)
        if (ranks_before(sm.sk[w], sm.si[w], wk, wi)) wk = sm.sk[w], wi = sm.si[w];
      out_key[0] = wk;
      out_id[0] = wi;
    }
    __syncthreads();
    return 1;
  }
  const int r = block_rank_top(sm, bk, bi, k);
  if (r < k) {
    sm.grp[r] = t;
    if (r == k - 1) sm.tk = bk, sm.ti = bi;
  }
  __syncthreads();
  const uint32_t tk = sm.tk;
  const int ti = sm.ti;
  for (int x = t; x < k * G; x += NT) {
    const size_t at = static_cast<size_t>(sm.grp[x / G]) * G + x % G;
    const uint32_t key = ck[at];
    const int id = ci[at];
    if (id != INT_MAX && !ranks_before(tk, ti, key, id)) {
      const int s = atomicAdd(&sm.ns, 1);
      if (s < MAXS) sm.sk[s] = key, sm.si[s] = id;
    }
  }
  __syncthreads();
  const int ns = sm.ns;
  if (ns > MAXS) return -1;
  rank_survivors<NT>(sm.sk, sm.si, ns, k, out_key, out_id);
  __syncthreads();
  return k;
}

}  // namespace lily::cuda::detail
