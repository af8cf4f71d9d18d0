// The sampler's full-vocabulary path (kernels/sampling.cu: top_k > kSampleFastTopK, or top_k off with top-p,
// min-p or plain temperature) over all of z in many blocks; included by sampling.cu after the helpers it uses
// (FinishArgs, emit, global_stats, any_nan). Launches:
//   begin    (1 block) NaN check, global max and mass, the selections' set-up
//   hist     (one block per 1,024 logits) per selection and 8-bit digit pass: the counts and masses of the keys
//            that match the selection's prefix, by digit, added into one 256-bin histogram; the last block to
//            finish then selects the digit where the running count (top-k) or mass (top-p) from the top reaches
//            the target; after the last pass the cut (key, how many ties at it in id order); top-k's cut sets
//            top-p's target
//   draw1    (one block per 1,024 logits) each block's mass above the shortest cut and its elements at the cut key
//   draw2    (1 block) the owner block of u * (kept mass) in id order, then the token inside it; emit
// Masses exp(z - zmax) in [0, 1] are summed as 64-bit fixed point (2^-45 units; 2^18 elements sum to <= 2^63),
// so every sum is exact and independent of the order the blocks add in: the same token for the same input on
// every run, and cuts as the host Sampler's double sums make them up to 2^-45 per element.
#pragma once
#include <climits>

namespace lily::cuda::detail {

inline constexpr int kMassShift = 45;
inline constexpr int kFullThreads = 256;  // hist / draw1: 4 logits per thread, like prep
static_assert(kPrepPerBlock == 4 * kFullThreads && kPrepPerBlock == kFinishThreads,
              "draw2: a thread per logit of a block");

__device__ __forceinline__ unsigned long long mass_fix(float z, float zmax) {
  return z > -INFINITY ? __float2ull_rn(ldexpf(expf(z - zmax), kMassShift)) : 0ull;
}

// One selection of the shortest prefix (key desc, id asc) whose count or mass reaches a target.
struct FullSel {
  int active;                      // runs (top-p after top-k: activated by top-k's last pass)
  int by_mass;                     // top-p (else top-k, by count)
  int need_mass;                   // top-k: also the mass above its cut (top-p follows)
  float frac;                      // top-p: the target is frac * base
  unsigned long long base;         // the top-k set's mass, or 0: the whole vocabulary's (from pass 0)
  unsigned long long target;       // count, or fixed-point mass (0 until pass 0 sets it for top-p)
  uint32_t prefix;                 // the key digits chosen so far
  unsigned long long count_above, mass_above;  // of the keys above the prefix's range
  uint32_t cut_key;                // result: every key > cut_key, and the first cut_tie ids at it
  int cut_tie;
};
struct FullState {
  int done;  // the token is written (NaN logits)
  float zmax, total;
  FullSel sel[2];  // 0: top-k, 1: top-p
};

struct FullArgs {
  FinishArgs f;
  bool top_k, top_p;          // the selections launched (launch_full decides; begin sets them up)
  FullState* st;
  unsigned* hcount;           // [256] the pass's histogram: zeroed by begin, and by select after reading it
  unsigned long long* hmass;  // [256]
  unsigned* arrived;          // hist blocks done with the pass (the last one selects; zeroed by begin and by it)
  unsigned long long* bmass;  // [n_blocks] draw1: each block's mass above the cut
  int* bties;                 // [n_blocks] draw1: each block's elements at the cut key
};

__device__ __forceinline__ bool cut_shorter(const Cut& x, const Cut& y) {
  return x.key > y.key || (x.key == y.key && x.n_tie < y.n_tie);
}

// The shortest of the top-k, top-p and min-p cuts (an inactive selection's cut keeps everything).
__device__ Cut full_cut(const FullState& s, const SamplingParams& p) {
  Cut best{0u, INT_MAX, 0, 0.f, 0};
  for (int k = 0; k < 2; ++k) {
    const Cut c{s.sel[k].cut_key, s.sel[k].cut_tie, 0, 0.f, 0};
    if (cut_shorter(c, best)) best = c;
  }
  if (p.min_p > 0.f) {
    const Cut c{key_of(s.zmax + logf(p.min_p)), INT_MAX, 0, 0.f, 0};
    if (cut_shorter(c, best)) best = c;
  }
  return best;
}

// Block-wide inclusive scan of NT threads' values (every thread calls; two barriers).
template <int NT>
__device__ unsigned long long block_scan_u64(unsigned long long v, unsigned long long* warp_tot) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  if (lane == 31) warp_tot[warp] = v;
  __syncthreads();
  if (warp == 0) {
    unsigned long long w = lane < NT / 32 ? warp_tot[lane] : 0ull;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long u = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += u;
    }
    if (lane < NT / 32) warp_tot[lane] = w;
  }
  __syncthreads();
  return v + (warp > 0 ? warp_tot[warp - 1] : 0ull);
}

__global__ void __launch_bounds__(kFinishThreads) full_begin_kernel(FullArgs a) {
  FullState& s = *a.st;
  const SamplingParams& p = a.f.p;
  if (threadIdx.x < 256) {
    a.hcount[threadIdx.x] = 0u;
    a.hmass[threadIdx.x] = 0ull;
  }
  if (threadIdx.x == 0) *a.arrived = 0u;
  if (any_nan(a.f)) {  // (block-uniform) no selection on NaN keys
    if (threadIdx.x == 0) {
      s.done = 1;
      emit(a.f, kSampleNanToken, NAN);
    }
    return;
  }
  float zmax, total;
  global_stats(a.f, zmax, total);
  const bool top_k = a.top_k, top_p = a.top_p;
  if (threadIdx.x == 0) {
    s.done = 0;
    s.zmax = zmax;
    s.total = total;
    for (int k = 0; k < 2; ++k) {
      FullSel& q = s.sel[k];
      q = FullSel{};
      q.cut_key = 0u;
      q.cut_tie = INT_MAX;
    }
    s.sel[0].active = top_k;
    s.sel[0].need_mass = top_p;
    s.sel[0].target = top_k ? static_cast<unsigned long long>(p.top_k) : 0ull;
    s.sel[1].active = top_p && !top_k;
    s.sel[1].by_mass = 1;
    s.sel[1].frac = top_p ? p.top_p : 0.f;
  }
}

// Run by the pass's last hist block (256 threads, after every block's histogram is in): the digit where the
// running count or mass from the top digit down reaches the target (warp 0: lane l sums digits 255 - 8l ..
// 248 - 8l, a scan over the lanes, the first lane that reaches it picks its digit); clears the histogram and the
// arrival counter for the next pass. After the last pass: the cut, and top-k's mass for top-p's target.
__device__ void full_select(const FullArgs& a, int sel, int pass, unsigned long long* hc, unsigned long long* hm) {
  FullState& s = *a.st;
  FullSel& q = s.sel[sel];
  const int t = threadIdx.x;
  hc[t] = __ldcg(a.hcount + t);  // (through L2: the other blocks' atomics)
  hm[t] = __ldcg(a.hmass + t);
  a.hcount[t] = 0u;
  a.hmass[t] = 0ull;
  if (t == 0) *a.arrived = 0u;
  __syncthreads();
  if (t >= 32) return;
  const int l = t;
  unsigned long long sc = 0ull, sm = 0ull;
  for (int r = 0; r < 8; ++r) {
    sc += hc[255 - 8 * l - r];
    sm += hm[255 - 8 * l - r];
  }
  unsigned long long pc = sc, pm = sm;  // inclusive over the lanes (top digits first)
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long c2 = __shfl_up_sync(0xffffffffu, pc, o), m2 = __shfl_up_sync(0xffffffffu, pm, o);
    if (l >= o) pc += c2, pm += m2;
  }
  const bool by_mass = q.by_mass;
  unsigned long long target = q.target;
  if (by_mass && pass == 0) {  // the mass target: frac of the top-k set's mass, or of the whole vocabulary's
    const unsigned long long all = __shfl_sync(0xffffffffu, pm, 31);
    target = static_cast<unsigned long long>(static_cast<double>(q.frac) * static_cast<double>(q.base ? q.base : all));
    target = target > 0ull ? target : 1ull;  // a tiny top_p keeps the first element, as the host does (not nothing)
  }
  const unsigned long long above = by_mass ? q.mass_above : q.count_above;
  const unsigned long long need = target > above ? target - above : 0ull;
  const unsigned hit = __ballot_sync(0xffffffffu, (by_mass ? pm : pc) >= need);
  const int owner = hit ? __ffs(hit) - 1 : 31;
  if (l != owner) return;
  unsigned long long cc = pc - sc, cm = pm - sm;  // the digits above this lane's first one
  int digit = 248 - 8 * l;
  for (int r = 0; r < 8; ++r) {
    const int dd = 255 - 8 * l - r;
    if ((by_mass ? cm + hm[dd] : cc + hc[dd]) >= need || r == 7) {
      digit = dd;
      break;
    }
    cc += hc[dd];
    cm += hm[dd];
  }
  const uint32_t prefix = q.prefix | (static_cast<uint32_t>(digit) << (24 - 8 * pass));
  q.target = target;
  q.prefix = prefix;
  q.count_above += cc;
  q.mass_above += cm;
  if (pass < 3) return;
  const long long n_at = static_cast<long long>(hc[digit]);
  const unsigned long long e = mass_fix(z_of(prefix), s.zmax);  // each element at the cut key
  long long n;
  if (by_mass) {
    const unsigned long long rem = target > q.mass_above ? target - q.mass_above : 0ull;
    n = e > 0ull ? static_cast<long long>((rem + e - 1) / e) : n_at;
  } else {
    n = static_cast<long long>(target) - static_cast<long long>(q.count_above);
  }
  n = n < 1 ? 1 : (n > n_at ? n_at : n);
  q.cut_key = prefix;
  q.cut_tie = static_cast<int>(n);
  if (sel == 0 && q.need_mass) {  // top-p within the top-k set
    s.sel[1].base = q.mass_above + static_cast<unsigned long long>(n) * e;
    s.sel[1].active = 1;
  }
}

// Pass `pass` (digit bits 31-8 pass .. 24-8 pass) of selection `sel`: the block's keys that match the prefix, by
// digit: counts (lanes with the same digit add once) and, where wanted, fixed-point masses (summed per digit
// group by two 32-bit warp reductions), added into the global histogram once per non-empty bin.
__global__ void __launch_bounds__(kFullThreads) full_hist_kernel(FullArgs a, int sel, int pass) {
  const FullState& s = *a.st;
  const FullSel& q = s.sel[sel];
  if (s.done || !q.active) return;
  const bool with_mass = q.by_mass || q.need_mass;
  const uint32_t prefix = q.prefix;
  const float zmax = s.zmax;
  const int shift = 24 - 8 * pass;
  const uint32_t hi_mask = pass == 0 ? 0u : 0xffffffffu << (32 - 8 * pass);
  __shared__ unsigned hc[256];
  __shared__ unsigned long long hm[256];
  hc[threadIdx.x] = 0u;
  hm[threadIdx.x] = 0ull;
  __syncthreads();
  const int base = blockIdx.x * kPrepPerBlock;
  for (int j = threadIdx.x; j < kPrepPerBlock; j += kFullThreads) {  // warp-uniform trip count
    const int i = base + j;
    const bool in = i < a.f.vocab;
    const float z = in ? a.f.z[i] : -INFINITY;
    const uint32_t k = key_of(z);
    const int d = in && (k & hi_mask) == prefix ? static_cast<int>((k >> shift) & 255u) : -1;
    const unsigned same = __match_any_sync(0xffffffffu, d);
    if (d < 0) continue;
    const bool lead = static_cast<int>(threadIdx.x & 31) == __ffs(same) - 1;
    if (lead) atomicAdd(&hc[d], static_cast<unsigned>(__popc(same)));
    if (with_mass) {  // m <= 2^45: 32 lanes' high parts (m >> 24) and low parts (24 bits) each fit 32 bits
      const unsigned long long m = mass_fix(z, zmax);
      const unsigned hi = __reduce_add_sync(same, static_cast<unsigned>(m >> 24));
      const unsigned lo = __reduce_add_sync(same, static_cast<unsigned>(m & 0xffffffull));
      if (lead) atomicAdd(&hm[d], (static_cast<unsigned long long>(hi) << 24) + lo);
    }
  }
  __syncthreads();
  const int d = threadIdx.x;
  if (hc[d]) atomicAdd(&a.hcount[d], hc[d]);
  if (hm[d]) atomicAdd(&a.hmass[d], hm[d]);
  __threadfence();  // this block's histogram before its arrival
  __syncthreads();
  __shared__ bool last;
  __shared__ unsigned long long sel_c[256], sel_m[256];
  if (threadIdx.x == 0) last = atomicAdd(a.arrived, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  __syncthreads();
  full_select(a, sel, pass, sel_c, sel_m);
}

// Each block's mass above the shortest cut and its elements at the cut key (integer sums: order-independent).
__global__ void __launch_bounds__(kFullThreads) full_draw1_kernel(FullArgs a) {
  const FullState& s = *a.st;
  if (s.done) return;
  const Cut best = full_cut(s, a.f.p);
  const float zmax = s.zmax;
  const int base = blockIdx.x * kPrepPerBlock;
  unsigned long long m = 0ull;
  unsigned ties = 0u;
  for (int j = threadIdx.x; j < kPrepPerBlock; j += kFullThreads) {
    const int i = base + j;
    if (i >= a.f.vocab) break;
    const float z = a.f.z[i];
    const uint32_t k = key_of(z);
    if (k > best.key) m += mass_fix(z, zmax);
    else ties += k == best.key;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    m += __shfl_xor_sync(0xffffffffu, m, o);
    ties += __shfl_xor_sync(0xffffffffu, ties, o);
  }
  __shared__ unsigned long long s_m;
  __shared__ unsigned s_t;
  if (threadIdx.x == 0) s_m = 0ull, s_t = 0u;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&s_m, m);
    atomicAdd(&s_t, ties);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    a.bmass[blockIdx.x] = s_m;
    a.bties[blockIdx.x] = static_cast<int>(s_t);
  }
}

// The draw in id order: the kept mass per block (the ties at the cut key kept up to n_tie in id order), the block
// holding u * total, then the element inside it whose running mass exceeds the rest.
__global__ void __launch_bounds__(kFinishThreads) full_draw2_kernel(FullArgs a) {
  const FullState& s = *a.st;
  if (s.done) return;
  __shared__ unsigned long long warp_tot[kFinishThreads / 32];
  __shared__ int s_owner, s_token;
  __shared__ unsigned long long s_rest, s_tie_base;
  const Cut best = full_cut(s, a.f.p);
  const float zmax = s.zmax;
  const int t = threadIdx.x, nb = a.f.n_blocks;
  const unsigned long long e = best.key != 0u ? mass_fix(z_of(best.key), zmax) : 0ull;
  const unsigned long long ties = t < nb ? static_cast<unsigned long long>(a.bties[t]) : 0ull;
  const unsigned long long tie_incl = block_scan_u64<kFinishThreads>(ties, warp_tot);
  const unsigned long long tie_before = tie_incl - ties;
  const unsigned long long n_tie = static_cast<unsigned long long>(best.n_tie);
  const unsigned long long kept_ties =
      tie_before >= n_tie ? 0ull : (n_tie - tie_before < ties ? n_tie - tie_before : ties);
  const unsigned long long kept = (t < nb ? a.bmass[t] : 0ull) + kept_ties * e;
  __syncthreads();  // warp_tot reused
  const unsigned long long incl = block_scan_u64<kFinishThreads>(kept, warp_tot);
  const unsigned long long total = warp_tot[kFinishThreads / 32 - 1];
  const float u = uniform_from(a.f.rng[1], a.f.rng[0]);
  const unsigned long long target =
      static_cast<unsigned long long>(static_cast<double>(u) * static_cast<double>(total));
  if (t == 0) s_owner = INT_MAX, s_token = -1;
  __syncthreads();
  if (t < nb && kept > 0ull && incl > target) atomicMin(&s_owner, t);
  __syncthreads();
  if (t == s_owner) {
    s_rest = target - (incl - kept);
    s_tie_base = tie_before;
  }
  __syncthreads();
  const int b = s_owner;
  if (b == INT_MAX) {  // nothing kept has mass (cannot happen: the largest logit is always kept): fail the step
    if (t == 0) emit(a.f, kSampleNanToken, NAN);
    return;
  }
  const int i = b * kPrepPerBlock + t;
  const bool in = i < a.f.vocab;
  const float z = in ? a.f.z[i] : -INFINITY;
  const uint32_t k = key_of(z);
  const bool tie = in && k == best.key;
  __syncthreads();  // warp_tot reused
  const unsigned long long tie_rank = s_tie_base + block_scan_u64<kFinishThreads>(tie ? 1ull : 0ull, warp_tot) - tie;
  const bool keep = in && (k > best.key || (tie && tie_rank < n_tie));
  const unsigned long long m = keep ? mass_fix(z, zmax) : 0ull;
  __syncthreads();
  const unsigned long long run = block_scan_u64<kFinishThreads>(m, warp_tot);
  if (keep && m > 0ull && run > s_rest && run - m <= s_rest) s_token = i;  // exactly one element crosses
  __syncthreads();
  if (t == 0) emit(a.f, s_token, s_token >= 0 ? a.f.z[s_token] - zmax - logf(s.total) : NAN);
}

}  // namespace lily::cuda::detail
