// Token sampling on the GPU; the semantics are written out in kernels/sampling.h.
//   prep   (one block per 1024 logits): penalties, padding mask, temperature -> z; per-block max and
//          sum exp(z - max); on the fast path (top_k <= kSampleFastTopK, greedy = top_k 1; with top_logprobs
//          max(top_k, n)) the block's best candidates, sorted (owned_best_sorted, kernels/sample_select.cuh);
//          on the full path z is written to scratch.
//   fast path, finish (one block): global top_k from the sorted candidates (group_best_sorted: bounded by the
//          blocks' bests; the radix select as the fallback), the top log-probabilities from the same list, the
//          top-p / min-p cuts, the draw.
//   full path (kernels/sample_full.cuh): exact top-k / top-p / min-p cuts over the whole vocabulary by a radix
//          select over the order-preserving keys of z in many blocks, then the draw.
//   apply_token_mask (structured output; before the others): waits for the host's mask in mapped memory, then
//          -inf on the ids it forbids (every path above keeps -inf ids out of the draw, as the host Sampler).
// Keys: order-preserving uint32 of the float z; among equal keys the lower id comes first.
// Tested by tests/gpu/test_sampling.cu.
#include "kernels/common.cuh"
#include "kernels/sample_select.cuh"
#include "kernels/sampling.h"

#include <algorithm>
#include <atomic>
#include <cmath>

namespace lily::cuda {

__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__host__ __device__ inline float uniform_from(uint64_t seed, uint64_t counter) {
  const uint64_t r = splitmix64(seed ^ splitmix64(counter));
  return static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // 24 bits -> [0, 1)
}

float sample_uniform(uint64_t seed, uint64_t counter) { return uniform_from(seed, counter); }

namespace detail {

inline constexpr int kPrepThreads = 256;
inline constexpr int kPrepPerBlock = 1024;  // logits per prep block
inline constexpr int kFinishThreads = 1024;

// Stage: penalties, mask, temperature for one logit.
__device__ __forceinline__ float process_logit(const float* logits, const int* counts, const SamplingParams& p,
                                               int i) {
  if (p.n_valid > 0 && i >= p.n_valid) return -INFINITY;
  float z = logits[i];
  if (counts) {
    const int raw = counts[i], c = raw & kSampleCountMask;  // generated count; raw != 0: in the context
    if (raw != 0 && p.repetition != 1.0f) z = z > 0.f ? __fdiv_rn(z, p.repetition) : __fmul_rn(z, p.repetition);
    const float pen = __fadd_rn(__fmul_rn(p.frequency, static_cast<float>(c)), c > 0 ? p.presence : 0.f);
    z = __fsub_rn(z, pen);
  }
  if (p.temperature > 0.f) z = __fdiv_rn(z, p.temperature);
  return z;
}

struct Stats {  // per prep block
  float max, sum;  // max z (NaN z left out) and sum exp(z - max) (NaN if some z is)
  int nan;         // some z of the block is NaN
};

struct PrepArgs {
  const float* logits; const int* counts; int vocab; SamplingParams p;
  int cand;             // candidates per block (fast path), 0 on the full path
  uint32_t* cand_key; int* cand_id;  // [blocks][cand]
  float* z;             // [vocab] (full path)
  Stats* stats;         // [blocks]
};

// Prep block blk of one row (prep_kernel: blockIdx.x of one row; prep_rows_kernel: of row blockIdx.y).
__device__ __forceinline__ void prep_block(const PrepArgs& a, int blk) {
  __shared__ uint32_t keys[kPrepPerBlock];
  const int base = blk * kPrepPerBlock;
  const int n = min(kPrepPerBlock, a.vocab - base);
  float m = -INFINITY;
  bool nan = false;
  for (int j = threadIdx.x; j < n; j += kPrepThreads) {
    const float z = process_logit(a.logits, a.counts, a.p, base + j);
    keys[j] = key_of(z);
    m = fmaxf(m, z);
    nan |= z != z;
    if (a.z) a.z[base + j] = z;
  }
  const int any_nan = __syncthreads_or(nan);
  m = block_reduce<kPrepThreads>(m, true);
  float s = 0.f;
  if (m > -INFINITY)
    for (int j = threadIdx.x; j < n; j += kPrepThreads) s += expf(z_of(keys[j]) - m);
  s = block_reduce<kPrepThreads>(s, false);
  if (threadIdx.x == 0) a.stats[blk] = Stats{m, s, any_nan};
  if (a.cand == 0) return;
  uint32_t* ck = a.cand_key + static_cast<size_t>(blk) * a.cand;
  int* ci = a.cand_id + static_cast<size_t>(blk) * a.cand;
  // the block's candidates sorted (key desc, id asc): finish reads each block's best at its entry 0
  if (n <= a.cand) {  // the whole block is a candidate (padded with empty keys: id INT_MAX)
    for (int j = threadIdx.x; j < a.cand; j += kPrepThreads) {
      if (j >= n) {
        ck[j] = 0u;
        ci[j] = INT_MAX;
        continue;
      }
      int r = 0;
      for (int u = 0; u < n; ++u) r += ranks_before(keys[u], base + u, keys[j], base + j);
      ck[r] = keys[j];
      ci[r] = base + j;
    }
    return;
  }
  if (a.cand == 1) {  // greedy: block argmax (largest key, then lowest id)
    uint32_t bk = 0u;
    int bi = 0x7fffffff;
    for (int j = threadIdx.x; j < n; j += kPrepThreads)
      if (ranks_before(keys[j], base + j, bk, bi)) { bk = keys[j]; bi = base + j; }
    __shared__ uint32_t wk[kPrepThreads / 32];
    __shared__ int wi[kPrepThreads / 32];
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      const uint32_t k2 = __shfl_xor_sync(0xffffffffu, bk, o);
      const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ranks_before(k2, i2, bk, bi)) { bk = k2; bi = i2; }
    }
    if ((threadIdx.x & 31) == 0) { wk[threadIdx.x / 32] = bk; wi[threadIdx.x / 32] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kPrepThreads / 32; ++w)
        if (ranks_before(wk[w], wi[w], bk, bi)) { bk = wk[w]; bi = wi[w]; }
      ck[0] = bk;
      ci[0] = bi;
    }
    return;
  }
  constexpr int kOwned = kPrepPerBlock / kPrepThreads;  // 4 logits per thread
  static_assert(kSampleFastTopK * kOwned <= kPrepThreads, "the survivors of owned_best_sorted");
  __shared__ BestSmem<kPrepThreads, kPrepThreads> bsm;
  owned_best_sorted<kPrepThreads, kOwned>(bsm, keys, base, n, a.cand, ck, ci);
}

__global__ void __launch_bounds__(kPrepThreads) prep_kernel(PrepArgs a) { prep_block(a, blockIdx.x); }

// sample_rows: up to kSampleRowsPerLaunch rows' arguments, one row per blockIdx.y.
struct PrepRows {
  PrepArgs a[kSampleRowsPerLaunch];
};
__global__ void __launch_bounds__(kPrepThreads) prep_rows_kernel(const __grid_constant__ PrepRows r) {
  prep_block(r.a[blockIdx.y], blockIdx.x);
}

struct FinishArgs {
  int vocab, n_blocks, cand;
  SamplingParams p;
  const uint32_t* cand_key; const int* cand_id;
  const float* z;
  const Stats* stats;
  int* counts; uint64_t* rng; int* out_token;  // rng [2]: draw counter, seed
  float* out_logprob;  // null: not wanted
  int top_n;           // > 0: the top_n best (fast path) into top_ids / top_lps (top_logprobs_kernel's output)
  int top_valid;       // how many of them exist (min(top_n, n_valid or vocab))
  int* top_ids; float* top_lps;
  int* advance;        // null, or += 1 after the token is written (the decode step's position)
};

// Stage: global max and total mass from the per-block stats.
__device__ void global_stats(const Stats* stats, int n_blocks, float& zmax, float& total) {
  float m = -INFINITY;
  for (int b = threadIdx.x; b < n_blocks; b += kFinishThreads) m = fmaxf(m, stats[b].max);
  zmax = block_reduce<kFinishThreads>(m, true);
  float s = 0.f;
  for (int b = threadIdx.x; b < n_blocks; b += kFinishThreads)
    if (stats[b].sum > 0.f) s += stats[b].sum * expf(stats[b].max - zmax);
  total = block_reduce<kFinishThreads>(s, false);
}
__device__ void global_stats(const FinishArgs& a, float& zmax, float& total) {
  global_stats(a.stats, a.n_blocks, zmax, total);
}

// The k best of the prep blocks' candidates (n_blocks groups of `cand`, each sorted; key desc, id asc; ties at
// the cut to the lowest ids), sorted into sk / sid (shared, >= k entries); returns how many (< k only when the
// candidates are fewer). Every thread calls; ends with a barrier.
template <int KMAX>
__device__ int sorted_best_candidates(const uint32_t* cand_key, const int* cand_id, int n_blocks, int cand, int k,
                                      uint32_t* sk, int* sid) {
  {  // each prep block's candidates are sorted: the bound from the blocks' bests (sample_select.cuh)
    __shared__ BestSmem<kFinishThreads, kFinishThreads> bsm;
    const int n = group_best_sorted<kFinishThreads>(bsm, cand_key, cand_id, n_blocks, cand, k, sk, sid);
    if (n >= 0) return n;
  }
  const int nc = n_blocks * cand;  // the fallback: a radix select over all of them
  __shared__ uint32_t lk[KMAX];
  __shared__ int lid[KMAX];
  __shared__ int n_list;
  __shared__ SelectSmem<kFinishThreads> ssm;
  const Cut c =
      block_select<kFinishThreads>(ssm, [&](int i) { return cand_key[i]; }, nc, false, static_cast<float>(k), 0.f);
  if (threadIdx.x == 0) n_list = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < nc; i += kFinishThreads)
    if (cand_key[i] > c.key) {
      const int s = atomicAdd(&n_list, 1);
      lk[s] = cand_key[i];
      lid[s] = cand_id[i];
    }
  __syncthreads();
  // ties at the cut: repeatedly take the lowest remaining id (rare; at most k rounds)
  __shared__ int last_id;
  if (threadIdx.x == 0) last_id = -1;
  for (int t = 0; t < c.n_tie; ++t) {
    __syncthreads();
    int best = 0x7fffffff;
    for (int i = threadIdx.x; i < nc; i += kFinishThreads)
      if (cand_key[i] == c.key && cand_id[i] > last_id) best = min(best, cand_id[i]);
    best = static_cast<int>(-block_reduce<kFinishThreads>(-static_cast<float>(best), true));
    if (threadIdx.x == 0) {
      lk[n_list] = c.key;
      lid[n_list] = best;
      ++n_list;
      last_id = best;
    }
  }
  __syncthreads();
  const int n = n_list;
  if (threadIdx.x < n) {  // rank sort: key desc, id asc
    int r = 0;
    for (int j = 0; j < n; ++j) r += ranks_before(lk[j], lid[j], lk[threadIdx.x], lid[threadIdx.x]);
    sk[r] = lk[threadIdx.x];
    sid[r] = lid[threadIdx.x];
  }
  __syncthreads();
  return n;
}

// The top log-probabilities from a sorted list of n: entries [0, n_out), those past n as id -1 / -inf (the host
// Sampler's SampledToken::top after its filter).
__device__ void write_top(const uint32_t* sk, const int* sid, int n, int n_out, float zmax, float total, int* ids,
                          float* lps) {
  const int t = static_cast<int>(threadIdx.x);
  if (t >= n_out) return;
  ids[t] = t < n ? sid[t] : -1;
  lps[t] = t < n ? z_of(sk[t]) - zmax - logf(total) : -INFINITY;
}

// Stage: whether some prep block saw a NaN (every thread of the finish block calls it at entry; a block barrier).
__device__ bool any_nan(const FinishArgs& a) {
  bool nan = false;
  for (int b = threadIdx.x; b < a.n_blocks; b += kFinishThreads) nan |= a.stats[b].nan != 0;
  return __syncthreads_or(nan) != 0;
}

// logprob: z[token] - log(sum exp z) (the host Sampler's, before top-k / top-p / min-p), stored if wanted.
// A negative token (kSampleNanToken) updates no count.
__device__ void emit(const FinishArgs& a, int token, float logprob) {
  *a.out_token = token;
  if (a.out_logprob) *a.out_logprob = logprob;
  if (a.advance) *a.advance += 1;
  if (a.p.update_counts && a.counts && token >= 0 && token < a.vocab) a.counts[token] += 1;
  a.rng[0] += 1;
}

// Fast path: top_k candidates -> sorted list -> top-p / min-p -> draw (walk in ascending id order).
__device__ __forceinline__ void finish_fast(const FinishArgs& a) {
  __shared__ uint32_t sk[kSampleFastTopK];
  __shared__ int sid[kSampleFastTopK];
  __shared__ float se[kSampleFastTopK];                // exp(z - z0) of the sorted candidates
  __shared__ int oid[kSampleFastTopK];                 // the kept ones in ascending id order: id, exp, z
  __shared__ float oe[kSampleFastTopK], oz[kSampleFastTopK];
  __shared__ int s_keep;
  __shared__ float s_u;
  const int k = a.p.temperature <= 0.f ? 1 : a.p.top_k;
  if (any_nan(a)) {  // (block-uniform) no selection on NaN keys
    if (threadIdx.x == 0) emit(a, kSampleNanToken, NAN);
    return;
  }
  // the sampler's k best, and the top_valid best for the top log-probabilities: a prefix of the same order
  const int nb = sorted_best_candidates<kSampleFastTopK>(a.cand_key, a.cand_id, a.n_blocks, a.cand,
                                                         max(k, a.top_valid), sk, sid);
  const int n = min(nb, k);
  float zmax = 0.f, total_all = 1.f;  // over the whole vocabulary, for the log-probabilities
  if (a.out_logprob || a.top_n > 0) global_stats(a, zmax, total_all);
  write_top(sk, sid, min(nb, a.top_valid), a.top_n, zmax, total_all, a.top_ids, a.top_lps);
  const float z0 = z_of(sk[0]);
  if (threadIdx.x < n) se[threadIdx.x] = expf(z_of(sk[threadIdx.x]) - z0);  // the values the sums below add
  __syncthreads();
  if (threadIdx.x == 0) {  // the cuts: sums in rank order, one thread (the host Sampler's order)
    int m = n;  // masked ids (z = -inf, sorted last) are never kept: the host Sampler keeps z > -inf only
    while (m > 1 && sk[m - 1] <= key_of(-INFINITY)) --m;
    float zk = 0.f;
    for (int j = 0; j < m; ++j) zk += se[j];
    int keep = m;
    if (a.p.top_p < 1.f) {
      float cum = 0.f;
      for (int j = 0; j < m; ++j) {
        cum += se[j];
        if (cum >= a.p.top_p * zk) { keep = j + 1; break; }
      }
    }
    if (a.p.min_p > 0.f) {
      int j = 1;
      while (j < keep && se[j] >= a.p.min_p) ++j;
      keep = j;
    }
    float total = 0.f;
    for (int j = 0; j < keep; ++j) total += se[j];
    s_keep = keep;
    s_u = uniform_from(a.rng[1], a.rng[0]) * total;
  }
  __syncthreads();
  const int keep = s_keep;
  if (threadIdx.x < keep) {  // the kept candidates sorted by id (distinct)
    int r = 0;
    for (int i = 0; i < keep; ++i) r += sid[i] < sid[threadIdx.x];
    oid[r] = sid[threadIdx.x];
    oe[r] = se[threadIdx.x];
    oz[r] = z_of(sk[threadIdx.x]);
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  // draw: the kept entries in ascending id order, the first whose running sum exceeds u
  const float u = s_u;
  int token = sid[0];
  float cum = 0.f, zt = z0;
  for (int j = 0; j < keep; ++j) {
    cum += oe[j];
    token = oid[j];
    zt = oz[j];
    if (cum > u) break;
  }
  emit(a, token, zt - zmax - logf(total_all));
}

__global__ void __launch_bounds__(kFinishThreads) finish_fast_kernel(FinishArgs a) { finish_fast(a); }

struct FinishRows {
  FinishArgs a[kSampleRowsPerLaunch];
};
__global__ void __launch_bounds__(kFinishThreads) finish_fast_rows_kernel(const __grid_constant__ FinishRows r) {
  finish_fast(r.a[blockIdx.x]);
}

}  // namespace detail
}  // namespace lily::cuda

#include "kernels/sample_full.cuh"  // the full path (its kernels use the helpers above)

namespace lily::cuda {
namespace detail {

struct TopArgs {
  int n_blocks, cand, n_out;
  const uint32_t* cand_key; const int* cand_id;
  const Stats* stats;
  int* out_ids; float* out_logprobs;
};

// The n_out best of the prep blocks' candidates (each block's `cand` best) with their log-probabilities.
__global__ void __launch_bounds__(kFinishThreads) top_logprobs_kernel(TopArgs a) {
  __shared__ uint32_t sk[kMaxTopLogprobs];
  __shared__ int sid[kMaxTopLogprobs];
  const int n = sorted_best_candidates<kMaxTopLogprobs>(a.cand_key, a.cand_id, a.n_blocks, a.cand, a.n_out, sk, sid);
  float zmax, total;
  global_stats(a.stats, a.n_blocks, zmax, total);
  write_top(sk, sid, n, a.n_out, zmax, total, a.out_ids, a.out_logprobs);
}

struct ScratchLayout {
  int n_blocks;
  size_t stats, cand_key, cand_id, z, full, hcount, hmass, arrived, bmass, bties, total;
};
ScratchLayout layout(int vocab) {
  ScratchLayout l;
  l.n_blocks = (vocab + kPrepPerBlock - 1) / kPrepPerBlock;
  auto al = [](size_t x) { return (x + 255) & ~size_t{255}; };
  l.stats = 0;
  l.cand_key = al(l.stats + sizeof(Stats) * l.n_blocks);
  l.cand_id = al(l.cand_key + sizeof(uint32_t) * l.n_blocks * kSampleFastTopK);
  l.z = al(l.cand_id + sizeof(int) * l.n_blocks * kSampleFastTopK);
  l.full = al(l.z + sizeof(float) * vocab);
  l.hcount = al(l.full + sizeof(FullState));
  l.hmass = al(l.hcount + sizeof(unsigned) * 256);
  l.arrived = al(l.hmass + sizeof(unsigned long long) * 256);
  l.bmass = al(l.arrived + sizeof(unsigned));
  l.bties = al(l.bmass + sizeof(unsigned long long) * l.n_blocks);
  l.total = al(l.bties + sizeof(int) * l.n_blocks);
  return l;
}

// counts[tokens[i]] += 1 (count) or |= kSampleInContext (flag) for the ids in [0, vocab).
__global__ void count_tokens_kernel(int* counts, int vocab, const int* tokens, int n, bool flag) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int t = tokens[i];
    if (t < 0 || t >= vocab) continue;
    if (flag) atomicOr(counts + t, kSampleInContext);
    else atomicAdd(counts + t, 1);
  }
}

// apply_token_mask: 2,048 ids (64 mask words) per block; thread 0 of every block waits for the slot.
inline constexpr int kMaskThreads = 256;
inline constexpr int kMaskPerBlock = 8 * kMaskThreads;

// Mapped host memory written by a host thread: system-scope loads (the acquire orders the block's later loads
// of the bits after the sequence word, through the barrier that follows it).
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t load_relaxed_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(kMaskThreads) apply_token_mask_kernel(float* logits, int vocab, uint32_t* slots,
                                                                        int slot_words, const uint64_t* counter,
                                                                        long long timeout_ns) {
  __shared__ uint32_t s_word;  // the slot's sequence word once it is this ticket's; 0 after a timeout
  __shared__ uint32_t bits[kMaskPerBlock / 32];
  const uint64_t ticket = *counter;
  uint32_t* slot = slots + (ticket & 1) * static_cast<size_t>(slot_words);
  if (threadIdx.x == 0) {
    const uint32_t want = token_mask_word(ticket, false) >> 1;
    const uint64_t t0 = global_ns();
    unsigned pause = 64;
    uint32_t w = load_acquire_sys(slot);
    while ((w >> 1) != want) {
      if (static_cast<long long>(global_ns() - t0) > timeout_ns) {  // the host never published: all allowed
        w = 0u;
        asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(slot + 2), "r"(want) : "memory");
        break;
      }
      __nanosleep(pause);
      pause = min(2 * pause, 2048u);
      w = load_acquire_sys(slot);
    }
    s_word = w;
  }
  __syncthreads();
  if (!(s_word & 1u)) return;  // every id allowed
  const int base = blockIdx.x * kMaskPerBlock;  // a multiple of 32: bit (i & 31) of word i / 32
  const int n = min(kMaskPerBlock, vocab - base);
  if (static_cast<int>(threadIdx.x) < (n + 31) / 32)
    bits[threadIdx.x] = load_relaxed_sys(slot + kTokenMaskHeader + base / 32 + threadIdx.x);
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += kMaskThreads)
    if (!((bits[j >> 5] >> (j & 31)) & 1u)) logits[base + j] = -INFINITY;
}

__global__ void add_logit_bias_kernel(float* logits, int vocab, const int* ids, const float* bias, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int t = ids[i];
    if (t >= 0 && t < vocab) logits[t] += bias[i];
  }
}

}  // namespace detail

size_t sampling_scratch_bytes(int vocab) {
  LILY_CHECK(vocab > 0 && vocab <= kSampleMaxVocab, "sampling: vocabulary of ", vocab,
             " ids is above the GPU sampler's ", kSampleMaxVocab, " (its fixed-point mass sums)");
  return detail::layout(vocab).total;
}

namespace detail {
// The prep launch's arguments over the scratch layout l (shared by sample() and top_logprobs()): counts only
// where a penalty reads them, z kept only for the full path.
PrepArgs prep_args(const float* logits, int vocab, const SamplingParams& p, const int* counts, char* scratch,
                   const ScratchLayout& l, int cand, bool keep_z) {
  LILY_CHECK(counts || !has_penalties(p), "sampling: presence/frequency/repetition penalties need a counts buffer");
  PrepArgs pa{};
  pa.logits = logits;
  pa.counts = has_penalties(p) ? counts : nullptr;
  pa.vocab = vocab;
  pa.p = p;
  pa.cand = cand;
  pa.cand_key = reinterpret_cast<uint32_t*>(scratch + l.cand_key);
  pa.cand_id = reinterpret_cast<int*>(scratch + l.cand_id);
  pa.z = keep_z ? reinterpret_cast<float*>(scratch + l.z) : nullptr;
  pa.stats = reinterpret_cast<Stats*>(scratch + l.stats);
  return pa;
}
// The full path's launches (kernels/sample_full.cuh): begin, the top-k and top-p selections' 4 digit passes
// each (a selection that is not needed is not launched; one the begin kernel settled returns at once), draw1,
// draw2.
void launch_full(const FinishArgs& fa, char* scratch, const ScratchLayout& l, cudaStream_t stream) {
  static_assert(kSampleMaxVocab <= (1 << (63 - kMassShift)) && kSampleMaxVocab / kPrepPerBlock <= kFinishThreads,
                "the full path's mass sums fit 64 bits and draw2 holds a thread per block");
  FullArgs x;  // (the vocabulary's limit: checked by sampling_scratch_bytes, which sized the scratch)
  x.f = fa;
  x.top_k = fa.p.top_k > 0 && fa.p.top_k < fa.vocab;
  x.top_p = fa.p.top_p < 1.f;
  x.st = reinterpret_cast<FullState*>(scratch + l.full);
  x.hcount = reinterpret_cast<unsigned*>(scratch + l.hcount);
  x.hmass = reinterpret_cast<unsigned long long*>(scratch + l.hmass);
  x.arrived = reinterpret_cast<unsigned*>(scratch + l.arrived);
  x.bmass = reinterpret_cast<unsigned long long*>(scratch + l.bmass);
  x.bties = reinterpret_cast<int*>(scratch + l.bties);
  full_begin_kernel<<<1, kFinishThreads, 0, stream>>>(x);
  CUDA_CHECK_LAUNCH(stream);
  const bool sel[2] = {x.top_k, x.top_p};
  for (int k = 0; k < 2; ++k) {
    if (!sel[k]) continue;
    for (int pass = 0; pass < 4; ++pass) {
      full_hist_kernel<<<fa.n_blocks, kFullThreads, 0, stream>>>(x, k, pass);
      CUDA_CHECK_LAUNCH(stream);
    }
  }
  full_draw1_kernel<<<fa.n_blocks, kFullThreads, 0, stream>>>(x);
  CUDA_CHECK_LAUNCH(stream);
  full_draw2_kernel<<<1, kFinishThreads, 0, stream>>>(x);
  CUDA_CHECK_LAUNCH(stream);
}

// How many of n top log-probabilities exist (the mask leaves n_valid ids).
int top_valid(int n, const SamplingParams& p, int vocab) { return std::min(n, p.n_valid > 0 ? p.n_valid : vocab); }

// The finish launches' arguments after the prep's (pa), for top_fast top log-probabilities from the candidates.
FinishArgs finish_args(const PrepArgs& pa, int n_blocks, int* counts, uint64_t* rng, int* out_token,
                       float* out_logprob, int* advance, int top_fast, int* top_ids, float* top_lps) {
  FinishArgs fa{};
  fa.vocab = pa.vocab;
  fa.n_blocks = n_blocks;
  fa.cand = pa.cand;
  fa.p = pa.p;
  fa.cand_key = pa.cand_key;
  fa.cand_id = pa.cand_id;
  fa.z = pa.z;
  fa.stats = pa.stats;
  fa.counts = counts;
  fa.rng = rng;
  fa.out_token = out_token;
  fa.out_logprob = out_logprob;
  fa.advance = advance;
  fa.top_n = top_fast;
  fa.top_valid = top_valid(top_fast, pa.p, pa.vocab);
  fa.top_ids = top_ids;
  fa.top_lps = top_lps;
  return fa;
}
}  // namespace detail

void sample(const float* logits, int vocab, const SamplingParams& p, int* counts, uint64_t* rng,
            int* out_token, void* scratch, cudaStream_t stream, float* out_logprob, int* advance, int top_n,
            int* top_ids, float* top_lps) {
  LILY_CHECK(vocab > 0 && logits && rng && out_token && scratch, "sample: missing buffer");
  const detail::ScratchLayout l = detail::layout(vocab);
  const bool greedy = p.temperature <= 0.f;
  const bool fast = greedy || (p.top_k >= 1 && p.top_k <= kSampleFastTopK);
  LILY_CHECK(top_n <= 0 || (top_n <= kMaxTopLogprobs && top_ids && top_lps), "sample: top_n > ", kMaxTopLogprobs,
             " or its buffers missing");
  static_assert(kMaxTopLogprobs <= kSampleFastTopK, "the top log-probabilities fit the fast path's candidates");
  // the other paths keep no candidates: their top log-probabilities by top_logprobs() first (before the counts
  // update), which shares the scratch
  if (top_n > 0 && !fast) top_logprobs(logits, vocab, p, counts, top_n, top_ids, top_lps, scratch, stream);
  const int top_fast = fast ? std::max(top_n, 0) : 0;
  const int cand = fast ? std::max(greedy ? 1 : p.top_k, top_fast) : 0;
  const detail::PrepArgs pa = detail::prep_args(logits, vocab, p, counts, static_cast<char*>(scratch), l, cand, !fast);
  detail::prep_kernel<<<l.n_blocks, detail::kPrepThreads, 0, stream>>>(pa);
  CUDA_CHECK_LAUNCH(stream);
  const detail::FinishArgs fa = detail::finish_args(pa, l.n_blocks, counts, rng, out_token, out_logprob, advance,
                                                    top_fast, top_ids, top_lps);
  if (fast) {
    detail::finish_fast_kernel<<<1, detail::kFinishThreads, 0, stream>>>(fa);
    CUDA_CHECK_LAUNCH(stream);
  } else {
    detail::launch_full(fa, static_cast<char*>(scratch), l, stream);
  }
}

bool sample_rows_supported(const SamplingParams& p) {
  return p.temperature <= 0.f || (p.top_k >= 1 && p.top_k <= kSampleFastTopK);
}

size_t sample_rows_scratch_bytes(int vocab) {
  sampling_scratch_bytes(vocab);  // (checks the vocabulary)
  return detail::layout(vocab).z;  // the per-block stats and candidates: all the fast path uses
}

void sample_rows(const SampleRow* rows, int n, int vocab, void* scratch, cudaStream_t stream) {
  LILY_CHECK(n >= 0 && (n == 0 || (rows && scratch)), "sample_rows: ", n, " rows, missing buffer");
  const detail::ScratchLayout l = detail::layout(vocab);
  for (int r0 = 0; r0 < n; r0 += kSampleRowsPerLaunch) {
    const int m = std::min(kSampleRowsPerLaunch, n - r0);
    detail::PrepRows pr{};
    detail::FinishRows fr{};
    for (int j = 0; j < m; ++j) {  // sample()'s fast-path arguments, row by row
      const SampleRow& r = rows[r0 + j];
      LILY_CHECK(sample_rows_supported(r.p) && r.logits && r.rng && r.out_token, "sample_rows: row ", r0 + j,
                 " needs the full path (top_k ", r.p.top_k, ") or misses a buffer");
      LILY_CHECK(r.top_n <= 0 || (r.top_n <= kMaxTopLogprobs && r.top_ids && r.top_lps), "sample_rows: row ",
                 r0 + j, ": top_n > ", kMaxTopLogprobs, " or its buffers missing");
      const int top_fast = std::max(r.top_n, 0);
      const int cand = std::max(r.p.temperature <= 0.f ? 1 : r.p.top_k, top_fast);
      char* sc = static_cast<char*>(scratch) + static_cast<size_t>(r0 + j) * l.z;
      pr.a[j] = detail::prep_args(r.logits, vocab, r.p, r.counts, sc, l, cand, false);
      fr.a[j] = detail::finish_args(pr.a[j], l.n_blocks, r.counts, r.rng, r.out_token, r.out_logprob, nullptr,
                                    top_fast, r.top_ids, r.top_lps);
    }
    detail::prep_rows_kernel<<<dim3(l.n_blocks, m), detail::kPrepThreads, 0, stream>>>(pr);
    CUDA_CHECK_LAUNCH(stream);
    detail::finish_fast_rows_kernel<<<m, detail::kFinishThreads, 0, stream>>>(fr);
    CUDA_CHECK_LAUNCH(stream);
  }
}

void count_tokens(int* counts, int vocab, const int* tokens, int n, cudaStream_t stream) {
  if (n <= 0) return;
  detail::count_tokens_kernel<<<(n + 255) / 256, 256, 0, stream>>>(counts, vocab, tokens, n, false);
  CUDA_CHECK_LAUNCH(stream);
}

void top_logprobs(const float* logits, int vocab, const SamplingParams& p, const int* counts, int n, int* out_ids,
                  float* out_logprobs, void* scratch, cudaStream_t stream) {
  LILY_CHECK(n >= 1 && n <= kMaxTopLogprobs && logits && out_ids && out_logprobs && scratch,
             "top_logprobs: n must be in [1, ", kMaxTopLogprobs, "] and every buffer given");
  static_assert(kMaxTopLogprobs <= kSampleFastTopK, "the candidates of top_logprobs fit sample()'s scratch");
  const detail::ScratchLayout l = detail::layout(vocab);  // sample()'s: its stats and candidates
  const int nb = l.n_blocks;
  const detail::PrepArgs pa = detail::prep_args(logits, vocab, p, counts, static_cast<char*>(scratch), l, n, false);
  detail::prep_kernel<<<nb, detail::kPrepThreads, 0, stream>>>(pa);
  CUDA_CHECK_LAUNCH(stream);
  detail::TopArgs ta{};
  ta.n_blocks = nb;
  ta.cand = n;
  ta.n_out = detail::top_valid(n, p, vocab);
  ta.cand_key = pa.cand_key;
  ta.cand_id = pa.cand_id;
  ta.stats = pa.stats;
  ta.out_ids = out_ids;
  ta.out_logprobs = out_logprobs;
  detail::top_logprobs_kernel<<<1, detail::kFinishThreads, 0, stream>>>(ta);
  CUDA_CHECK_LAUNCH(stream);
}

void add_logit_bias(float* logits, int vocab, const int* ids, const float* bias, int n, cudaStream_t stream) {
  if (n <= 0) return;
  detail::add_logit_bias_kernel<<<(n + 255) / 256, 256, 0, stream>>>(logits, vocab, ids, bias, n);
  CUDA_CHECK_LAUNCH(stream);
}

uint32_t* token_mask_bits(uint32_t* slots, int vocab, uint64_t ticket) {
  return slots + (ticket & 1) * static_cast<size_t>(token_mask_slot_words(vocab)) + kTokenMaskHeader;
}

void publish_token_mask(uint32_t* slots, int vocab, uint64_t ticket, bool masked) {
  uint32_t& word = slots[(ticket & 1) * static_cast<size_t>(token_mask_slot_words(vocab))];
  std::atomic_ref<uint32_t>(word).store(token_mask_word(ticket, masked), std::memory_order_release);
}

bool token_mask_timed_out(const uint32_t* slots, int vocab, uint64_t ticket) {
  const volatile uint32_t* slot = slots + (ticket & 1) * static_cast<size_t>(token_mask_slot_words(vocab));
  return slot[2] == token_mask_word(ticket, false) >> 1;
}

void apply_token_mask(float* logits, int vocab, uint32_t* slots, const uint64_t* counter, long long timeout_ns,
                      cudaStream_t stream) {
  LILY_CHECK(vocab > 0 && logits && slots && counter, "apply_token_mask: missing buffer");
  const int blocks = (vocab + detail::kMaskPerBlock - 1) / detail::kMaskPerBlock;
  detail::apply_token_mask_kernel<<<blocks, detail::kMaskThreads, 0, stream>>>(
      logits, vocab, slots, token_mask_slot_words(vocab), counter, timeout_ns);
  CUDA_CHECK(cudaGetLastError());  // never LILY_CUDA_SYNC's synchronisation: it may wait for this very thread
}

void mark_context(int* counts, int vocab, const int* tokens, int n, cudaStream_t stream) {
  if (n <= 0) return;
  detail::count_tokens_kernel<<<(n + 255) / 256, 256, 0, stream>>>(counts, vocab, tokens, n, true);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace lily::cuda
