// Probe of the costs a persistent decode kernel is made of, on the GPU at hand (H200: 132 SMs):
//   launch     an empty cooperative launch of one 512-thread block per SM, back to back in a CUDA graph
//   barrier    one grid barrier (kernels/grid_barrier.cuh GridSync), from a launch with 16 of them
//   cluster    one cluster barrier (barrier.cluster arrive.release / wait.acquire) in clusters of 8 blocks,
//              with and without a DSMEM store to every block of the cluster before it; how many clusters of
//              8 and 16 one-block-per-SM blocks can be resident at once
//   atomic     the round trip of one atom.add.acq_rel.gpu with its result used (a last-arriver reduction)
//   L2 warm    the 108 KB/SM slab read by register loads after a 5 or 10 us kernel that leaves the HBM
//              idle: cold, or with that kernel putting the slab into the L2 by cp.async.bulk.prefetch.L2 (one
//              request per 27 KB per block; also with an evict_last policy), by prefetch.global.L2 per
//              128-byte line, by register loads, by cp.async 16-byte copies or by bulk copies into a scratch
//              buffer in shared memory; and the slab read again and again while it stays in the L2
//   slab       one phase's weight slab of S bytes per SM (every SM its own contiguous slab, fresh from HBM)
//              read (a) by 16-byte register loads all issued up front (how gemv_stream.cuh streams) and
//              (b) by one bulk copy into shared memory completing on an mbarrier (bulk_copy.cuh),
//              (c) as (b) in 4 copies on 4 mbarriers, consumed as they land
//   phase      (first) the GDN in_proj phase's loads, dot products and request orders, one launch at a time
//              with in-kernel stamps, and the latency of a critical L2 read behind an SM's own loads
//              (phase_probes below)
// Each case but phase: a graph of 64 launches over buffers larger than the L2, median of 15 replays / 64.
// Usage: bench_stream (PROBES_ONLY=1: the phase probes only)
#include <algorithm>
#include <functional>
#include <iterator>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "graph_time.cuh"
#include "bulk_copy.cuh"
#include "kernels/common.cuh"
#include "kernels/grid_barrier.cuh"
#include "kernels/gemv_stream.cuh"
#include "kernels/qdot.cuh"

using namespace lily::cuda;
using namespace lily::cuda::detail;

namespace {

constexpr int kThreads = 512;
constexpr int kLaunches = 64;

__global__ void __launch_bounds__(kThreads, 1) empty_kernel(unsigned* bar, int barriers, float* out) {
  GridSync gs = grid_sync_begin(bar);
  for (int i = 0; i < barriers; ++i) grid_sync(gs);
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = 1.f;
}

// Cluster barriers: `barriers` of them, each after (dsmem) a store of one word into every block of the cluster.
__global__ void __launch_bounds__(kThreads, 1) cluster_kernel(int barriers, bool dsmem, float* out) {
  __shared__ float word[16];
  unsigned rank, n;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  for (int i = 0; i < barriers; ++i) {
    if (dsmem && threadIdx.x < n) {
      unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(&word[rank])), remote;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(threadIdx.x));
      asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(static_cast<float>(i)));
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  }
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = word[0];
}

// `n` dependent atomic round trips by thread 0 of every block (each on its own word).
__global__ void __launch_bounds__(kThreads, 1) atomic_kernel(unsigned* words, int n, float* out) {
  if (threadIdx.x != 0) return;
  unsigned v = 0;
  for (int i = 0; i < n; ++i) {
    unsigned* p = words + blockIdx.x * 32 + (v & 1);
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(v) : "l"(p) : "memory");
  }
  if (v == 0xffffffffu) out[1] = 1.f;
}

// Spins ~ns nanoseconds (the HBM idle), after prefetching this block's S bytes of `pre` into L2 (mode 1: bulk
// prefetches of S / 4 bytes by thread 0; mode 2: prefetch.global.L2 per 128-byte line by every thread).
template <int S>
__global__ void __launch_bounds__(kThreads, 1) idle_kernel(const uint8_t* pre, int mode, unsigned ns) {
  const uint8_t* p = pre + static_cast<size_t>(blockIdx.x) * S;
  if (mode == 1 && threadIdx.x == 0) {
    static_assert(S % 64 == 0, "4 parts of 16-byte multiples");
    for (int k = 0; k < 4; ++k)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + k * (S / 4)), "r"(S / 4) : "memory");
  }
  if (mode == 2)
    for (int c = threadIdx.x; c < S / 128; c += kThreads) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + 128 * c));
  if (mode == 3) {  // loads into registers, discarded
    uint32_t x = 0;
    for (int c = threadIdx.x; c < S / 16; c += kThreads) {
      const uint4 v = ld_stream(p + 16 * c);
      x ^= v.x;
    }
    if (x == 0x12345678u) asm volatile("trap;");
  }
  if (mode == 4 && threadIdx.x == 0) {  // bulk prefetches with an evict_last cache policy
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    for (int k = 0; k < 4; ++k)
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(p + k * (S / 4)), "r"(S / 4),
                   "l"(pol) : "memory");
  }
  __shared__ __align__(128) uint8_t scratch[16384];
  __shared__ __align__(8) uint64_t bar;
  if (mode == 5) {  // cp.async 16-byte copies into a scratch buffer whose contents nobody reads
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(scratch + 16 * (threadIdx.x % 1024)));
    for (int c = threadIdx.x; c < S / 16; c += kThreads)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(p + 16 * c) : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  if (mode == 6 && threadIdx.x == 0) {  // bulk copies into the scratch buffer, one mbarrier
    mbar_init(&bar, 1);
    mbar_expect(&bar, S / 16384 * 16384);
    for (int k = 0; k < S / 16384; ++k) bulk_g2s(scratch, p + k * 16384, 16384, &bar);
  }
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
  if (mode == 5) asm volatile("cp.async.wait_all;" ::: "memory");
  if (mode == 6 && threadIdx.x == 0) mbar_wait(&bar, 0);
}

// This block's S bytes at p by 16-byte register loads, all issued up front; returns their xor (keeps the loads).
template <int S>
__device__ __forceinline__ uint32_t slab_xor(const uint8_t* p) {
  constexpr int kPer = (S / 16 + kThreads - 1) / kThreads;
  uint4 v[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int c = threadIdx.x + u * kThreads;
    v[u] = c < S / 16 ? ld_stream(p + 16 * c) : make_uint4(0, 0, 0, 0);
  }
  uint32_t x = 0;
#pragma unroll
  for (int u = 0; u < kPer; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  return x;
}

template <int S>
__global__ void __launch_bounds__(kThreads, 1) slab_regs(const uint8_t* src, float* out) {
  const uint32_t x = slab_xor<S>(src + static_cast<size_t>(blockIdx.x) * S);
  if (x == 0x12345678u) out[blockIdx.x] = 1.f;  // keeps the loads
}

template <int S, int kParts>
__global__ void __launch_bounds__(kThreads, 1) slab_bulk(const uint8_t* src, float* out) {
  extern __shared__ __align__(128) uint8_t sm[];
  __shared__ __align__(8) uint64_t bars[kParts];
  constexpr int kPart = S / kParts;
  static_assert(kPart % 16 == 0, "parts of 16-byte multiples");
  const uint8_t* p = src + static_cast<size_t>(blockIdx.x) * S;
  if (threadIdx.x == 0) {
    for (int k = 0; k < kParts; ++k) mbar_init(&bars[k], 1);
    for (int k = 0; k < kParts; ++k) {
      mbar_expect(&bars[k], kPart);
      bulk_g2s(sm + k * kPart, p + k * kPart, kPart, &bars[k]);
    }
  }
  __syncthreads();
  uint32_t x = 0;
  for (int k = 0; k < kParts; ++k) {
    mbar_wait(&bars[k], 0);
    for (int c = threadIdx.x; c < kPart / 16; c += kThreads) {
      const uint4 v = reinterpret_cast<const uint4*>(sm + k * kPart)[c];
      x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (x == 0x12345678u) out[blockIdx.x] = 1.f;
}

// The GDN in_proj phase alone: 12352 q4 rows of K = 2048 (1152 B each), warp g = warp * grid + block owns
// rows [6g, 6g + 6) (as gdn_fused.cu), x staged in shared memory; DOTS = false only loads (xor of the words).
template <bool DOTS>
__global__ void __launch_bounds__(kThreads, 1) inproj(const uint8_t* w, const uint32_t* sb, const float* x, float* y) {
  constexpr int K = 2048, R = 6, rows = 12352;
  __shared__ __align__(16) StreamX<K> xs;
  const int g = (threadIdx.x / 32) * gridDim.x + blockIdx.x;
  uint4 wv[R][K / 1024];
  uint32_t sv[R][K / 1024];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row = min(g * R + r, rows - 1);
    stream_load_row<K>(w + static_cast<size_t>(row) * (K / 2), sb + static_cast<size_t>(row) * (K / 64), wv[r], sv[r]);
  }
  stream_stage_x<K, kThreads>(x, xs);
  if (DOTS) {
    float acc[R];
    stream_dots<K, R>(xs, wv, sv, acc);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = group_sum<32>(acc[r]);
      if ((threadIdx.x & 31) == 0 && g * R + r < rows) y[g * R + r] = v;
    }
  } else {
    uint32_t t = 0;
#pragma unroll
    for (int r = 0; r < R; ++r) t ^= wv[r][0].x ^ wv[r][0].y ^ wv[r][1].z ^ wv[r][1].w ^ sv[r][0] ^ sv[r][1];
    if (t == 0x12345678u) y[g] = 1.f;
  }
}

double time_graph(cudaStream_t s, const std::function<void(int)>& launch) {
  return graph_median_us(s, kLaunches, [&](int i, cudaStream_t) { launch(i); });
}

template <int S>
void slab_cases(cudaStream_t s, int sms, const uint8_t* buf, float* out) {
  const size_t per = static_cast<size_t>(S) * sms;
  const double mb = per / 1e6;
  auto report = [&](const char* name, double us) {
    std::printf("  slab %6d B/SM (%5.1f MB) %-22s %7.2f us  %6.0f GB/s\n", S, mb, name, us, per / us / 1e3);
  };
  report("registers", time_graph(s, [&](int i) { slab_regs<S><<<sms, kThreads, 0, s>>>(buf + i * per, out); }));
  const size_t smem = S;
  CUDA_CHECK(cudaFuncSetAttribute(slab_bulk<S, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  CUDA_CHECK(cudaFuncSetAttribute(slab_bulk<S, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  report("bulk copy x1", time_graph(s, [&](int i) { slab_bulk<S, 1><<<sms, kThreads, smem, s>>>(buf + i * per, out); }));
  report("bulk copy x4", time_graph(s, [&](int i) { slab_bulk<S, 4><<<sms, kThreads, smem, s>>>(buf + i * per, out); }));
}


// Phase probes with in-kernel stamps (%globaltimer): one launch at a time after a synchronisation, so the HBM
// is idle at the start, as after a grid barrier. Every block stamps its entry and its end; a launch's time is
// the latest end after the earliest entry. The critical read (modes 6, 7): thread 0 reads one word of a buffer
// a previous kernel wrote (an L2 hit, like h after the previous launch) and stamps when it has arrived.
//   0 slab: 108,288 B per SM, each block its own contiguous slab (slab_regs)
//   1 in_proj rows (12,352 rows of K = 2048, warp g = warp * grid + block owns rows [6g, 6g + 6)), loads only
//   2 as 1 without the scale|bias words
//   3 as 1 with x staged after the loads are issued and the integer dot products (gdn_fused.cu's phase 1)
//   4 as 3 with the rows block-contiguous (warp g = block * 16 + warp)
//   5 as 3 with x staged before the loads are issued
//   6 as 3, thread 0's critical read issued right after its loads
//   7 even blocks stream their slab (half the bytes in all), odd blocks only make the critical read ~300 ns
//     after their entry
//   8 as 3 with chunk 0 of the rows requested, x staged, then chunk 1 (gdn_fused.cu's order)
constexpr int kProbeRows = 12352, kProbeR = 6, kProbeK = 2048, kProbeSlab = 108288;
template <int MODE>
__global__ void __launch_bounds__(kThreads, 1) phase_probe(const uint8_t* w, const uint32_t* sb, const float* x,
                                                           float* y, const unsigned* crit,
                                                           unsigned long long* st, int d_ns) {
  constexpr int K = kProbeK, R = kProbeR;
  __shared__ __align__(16) StreamX<K> xs;
  auto now = [] {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  };
  const unsigned long long t0 = now();
  unsigned long long tc0 = 0, tc1 = 0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  uint32_t t = 0;
  if constexpr (MODE == 0 || MODE == 7) {
    if (MODE == 0 || blockIdx.x % 2 == 0) {
      t = slab_xor<kProbeSlab>(w + static_cast<size_t>(blockIdx.x) * kProbeSlab);
    } else if (threadIdx.x == 0) {
      while (now() - t0 < 300) {
      }
      tc0 = now();
      const unsigned c = __ldcg(crit + blockIdx.x);
      if (c == 0xdeadbeefu) y[1] = 0.f;  // the stamp below waits for c
      tc1 = now();
      t ^= c;
    }
  } else {
    const int g = MODE == 4 ? blockIdx.x * (kThreads / 32) + warp : warp * gridDim.x + blockIdx.x;
    const uint8_t* wr[R];
    const uint32_t* sr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int row = min(g * R + r, kProbeRows - 1);
      wr[r] = w + static_cast<size_t>(row) * (K / 2);
      sr[r] = sb + static_cast<size_t>(row) * (K / 64);
    }
    uint4 wv[R][K / 1024];
    uint32_t sv[R][K / 1024];
    if constexpr (MODE == 2) {
#pragma unroll
      for (int c = 0; c < K / 1024; ++c)
#pragma unroll
        for (int r = 0; r < R; ++r) wv[r][c] = ld_stream(wr[r] + (lane + 32 * c) * 16), sv[r][c] = 0;
    } else if constexpr (MODE == 5) {
      stream_stage_x<K, kThreads>(x, xs);
      stream_load_rows<K, R>(wr, sr, wv, sv);
    } else if constexpr (MODE == 9) {
      stream_load_rows<K, R, 0, 1>(wr, sr, wv, sv);
      while (now() - t0 < static_cast<unsigned long long>(d_ns)) {
      }
      stream_load_rows<K, R, 1, 2>(wr, sr, wv, sv);
    } else if constexpr (MODE == 10) {  // two rows at a time, two pairs in flight
      stream_stage_x<K, kThreads>(x, xs);
      uint4 pw[3][2][K / 1024];
      uint32_t ps[3][2][K / 1024];
      auto issue = [&](int p) {
        const uint8_t* w2[2] = {wr[2 * p], wr[2 * p + 1]};
        const uint32_t* s2[2] = {sr[2 * p], sr[2 * p + 1]};
        stream_load_rows<K, 2>(w2, s2, pw[p], ps[p]);
      };
      issue(0);
      issue(1);
#pragma unroll
      for (int p = 0; p < 3; ++p) {
        if (p + 2 < 3) issue(p + 2);
        float acc[2];
        stream_dots<K, 2>(xs, pw[p], ps[p], acc);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float v = group_sum<32>(acc[r]);
          if (lane == 0 && g * R + 2 * p + r < kProbeRows) y[g * R + 2 * p + r] = v;
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) wv[r][0] = wv[r][1] = make_uint4(0, 0, 0, 0), sv[r][0] = sv[r][1] = 0;
    } else if constexpr (MODE == 8) {
      stream_load_rows<K, R, 0, 1>(wr, sr, wv, sv);
      stream_stage_x<K, kThreads>(x, xs);
      stream_load_rows<K, R, 1, 2>(wr, sr, wv, sv);
    } else {
      stream_load_rows<K, R>(wr, sr, wv, sv);
    }
    if (MODE == 6 && threadIdx.x == 0) {
      tc0 = now();
      const unsigned c = __ldcg(crit + blockIdx.x);
      if (c == 0xdeadbeefu) y[1] = 0.f;  // the stamp below waits for c
      tc1 = now();
      t ^= c;
    }
    if constexpr (MODE == 1 || MODE == 2 || MODE == 9) {
#pragma unroll
      for (int r = 0; r < R; ++r) t ^= wv[r][0].x ^ wv[r][0].w ^ wv[r][1].y ^ wv[r][1].z ^ sv[r][0] ^ sv[r][1];
    } else if constexpr (MODE != 10) {
      if constexpr (MODE != 5 && MODE != 8) stream_stage_x<K, kThreads>(x, xs);
      float acc[R];
      stream_dots<K, R>(xs, wv, sv, acc);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float v = group_sum<32>(acc[r]);
        if (lane == 0 && g * R + r < kProbeRows) y[g * R + r] = v;
      }
    }
  }
  if (t == 0x12345678u) y[0] = 1.f;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long* s = st + blockIdx.x * 4;
    s[0] = t0, s[1] = now(), s[2] = tc0, s[3] = tc1;
  }
}

__global__ void write_words(unsigned* p, int n, unsigned v) {
  for (int i = threadIdx.x + blockIdx.x * blockDim.x; i < n; i += blockDim.x * gridDim.x) p[i] = v + i;
}

using ProbeKernel = void (*)(const uint8_t*, const uint32_t*, const float*, float*, const unsigned*,
                            unsigned long long*, int);
constexpr ProbeKernel kProbes[] = {phase_probe<0>, phase_probe<1>, phase_probe<2>, phase_probe<3>,
                                   phase_probe<4>, phase_probe<5>, phase_probe<6>, phase_probe<7>,
                                   phase_probe<8>, phase_probe<9>, phase_probe<10>};

void phase_probes(cudaStream_t s, int sms, const uint8_t* buf, size_t buf_bytes, const uint8_t* far,
                  size_t far_bytes) {
  const size_t wb = static_cast<size_t>(kProbeRows) * (kProbeK / 2), per = wb + kProbeRows * (kProbeK / 64) * 4;
  float *x, *y;
  unsigned* crit;
  unsigned long long* st;
  CUDA_CHECK(cudaMalloc(&x, kProbeK * 4));
  CUDA_CHECK(cudaMalloc(&y, kProbeRows * 4));
  CUDA_CHECK(cudaMalloc(&crit, 4096 * 4));
  CUDA_CHECK(cudaMalloc(&st, static_cast<size_t>(sms) * 4 * 8));
  std::vector<float> hx(kProbeK);
  for (int i = 0; i < kProbeK; ++i) hx[i] = 0.01f * static_cast<float>((i * 37) % 101 - 50);
  CUDA_CHECK(cudaMemcpy(x, hx.data(), kProbeK * 4, cudaMemcpyHostToDevice));
  const char* names[] = {"slab (contiguous per SM)", "rows, loads only", "rows, loads only, no scales",
                         "rows + dots", "rows block-contiguous + dots", "rows + dots, x staged first",
                         "rows + dots + critical read", "half slab + others' critical read",
                         "rows + dots, chunk 0 / x / chunk 1", "rows, chunk 0, spin, chunk 1",
                         "rows + dots, 2 rows at a time"};
  int d_ns = 0;
  auto launch = [&](int mode, const uint8_t* base) {
    const uint32_t* sbp = reinterpret_cast<const uint32_t*>(base + wb);
    kProbes[mode]<<<sms, kThreads, 0, s>>>(base, sbp, x, y, crit, st, d_ns);
    CUDA_CHECK(cudaGetLastError());
  };
  const int reps = 31;
  const size_t slots = buf_bytes / per;
  std::vector<unsigned long long> h(static_cast<size_t>(sms) * 4);
  std::printf("  phase probes (one launch at a time, HBM idle at entry; us after the earliest block's entry, "
              "medians of %d launches):\n", reps);
  // runs: every mode over the 1.7 GB buffer; then modes 0, 3, 8 at random places of a 24 GB one (TLB reach);
  // then mode 9 with spins of 250 .. 1500 ns
  struct Run {
    int mode, d;
    bool far;
  };
  std::vector<Run> runs;
  static_assert(std::size(names) == std::size(kProbes), "a name per probe");
  for (int m = 0; m < static_cast<int>(std::size(kProbes)); ++m) runs.push_back({m, 0, false});
  for (int m : {0, 3, 8}) runs.push_back({m, 0, true});
  for (int d : {250, 500, 1000, 1500}) runs.push_back({9, d, false});
  unsigned rng = 12345;
  for (const Run& run : runs) {
    const int mode = run.mode;
    d_ns = run.d;
    std::vector<double> span, med_end, first_end, crit_lat;
    for (int r = 0; r < reps + 2; ++r) {
      write_words<<<4, 256, 0, s>>>(crit, 4096, r);
      rng = rng * 1664525u + 1013904223u;
      const uint8_t* base = run.far ? far + (static_cast<size_t>(rng >> 8) % (far_bytes / per - 1)) * per
                                    : buf + (static_cast<size_t>(r + mode * reps) % slots) * per;
      launch(mode, base);
      CUDA_CHECK(cudaStreamSynchronize(s));
      CUDA_CHECK(cudaMemcpy(h.data(), st, h.size() * 8, cudaMemcpyDeviceToHost));
      if (r < 2) continue;  // warm-up
      unsigned long long e0 = ~0ull;
      std::vector<double> ends, lat;
      for (int b = 0; b < sms; ++b) e0 = std::min(e0, h[b * 4]);
      for (int b = 0; b < sms; ++b) {
        ends.push_back(static_cast<double>(h[b * 4 + 1] - e0) / 1e3);
        if (h[b * 4 + 3] > h[b * 4 + 2]) lat.push_back(static_cast<double>(h[b * 4 + 3] - h[b * 4 + 2]) / 1e3);
      }
      std::sort(ends.begin(), ends.end());
      span.push_back(ends.back());
      med_end.push_back(ends[ends.size() / 2]);
      first_end.push_back(ends.front());
      if (!lat.empty()) {
        std::sort(lat.begin(), lat.end());
        crit_lat.push_back(lat[lat.size() / 2]);
      }
    }
    auto med = [](std::vector<double> v) {
      if (v.empty()) return 0.0;
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double bytes = mode == 0 ? static_cast<double>(kProbeSlab) * sms
                         : mode == 7 ? static_cast<double>(kProbeSlab) * ((sms + 1) / 2)
                         : mode == 2 ? static_cast<double>(wb) : static_cast<double>(per);
    std::printf("    %-36s%s%5d ns end first/median/last %5.2f / %5.2f / %5.2f us  %5.0f GB/s", names[mode], run.far ? " far" : "    ", run.d, med(first_end),
                med(med_end), med(span), bytes / med(span) / 1e3);
    if (!crit_lat.empty()) std::printf("  critical read %.2f us", med(crit_lat));
    std::printf("\n");
  }
  CUDA_CHECK(cudaFree(x));
  CUDA_CHECK(cudaFree(y));
  CUDA_CHECK(cudaFree(crit));
  CUDA_CHECK(cudaFree(st));
}
}  // namespace

int main() {
  const int sms = sm_count();
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned* bar;
  float* out;
  CUDA_CHECK(cudaMalloc(&bar, 64));
  CUDA_CHECK(cudaMemset(bar, 0, 64));
  CUDA_CHECK(cudaMalloc(&out, 4096));
  const size_t buf_bytes = static_cast<size_t>(200 * 1024) * sms * kLaunches;  // 1.7 GB at 132 SMs
  uint8_t* buf;
  CUDA_CHECK(cudaMalloc(&buf, buf_bytes));
  CUDA_CHECK(cudaMemset(buf, 0x5a, buf_bytes));
  std::printf("%d SMs, %d threads per block, graph of %d launches\n", sms, kThreads, kLaunches);
  {
    const size_t far_bytes = 24ull << 30;
    uint8_t* far = nullptr;
    CUDA_CHECK(cudaMalloc(&far, far_bytes));
    CUDA_CHECK(cudaMemset(far, 0x5a, far_bytes));
    phase_probes(s, sms, buf, buf_bytes, far, far_bytes);
    CUDA_CHECK(cudaFree(far));
  }
  if (std::getenv("PROBES_ONLY")) return 0;
  auto coop = [&](int barriers) {
    return time_graph(s, [&](int) {
      launch_ex(empty_kernel, dim3(sms), dim3(kThreads), 0, s, LaunchOpts{false, 1, true}, bar, barriers, out);
    });
  };
  const double t0 = coop(0), t16 = coop(16);
  const double plain = time_graph(s, [&](int) { empty_kernel<<<sms, kThreads, 0, s>>>(bar, 0, out); });
  std::printf("  empty launch: cooperative %.2f us, plain %.2f us; grid barrier %.3f us each\n", t0, plain,
              (t16 - t0) / 16);
  {
    auto clusters = [&](int size) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(size * 16);
      cfg.blockDim = dim3(kThreads);
      cfg.dynamicSmemBytes = 96 * 1024;
      cudaLaunchAttribute a;
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = size, a.val.clusterDim.y = 1, a.val.clusterDim.z = 1;
      cfg.attrs = &a;
      cfg.numAttrs = 1;
      if (size > 8) CUDA_CHECK(cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
      CUDA_CHECK(cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
      int c = 0;
      const cudaError_t e = cudaOccupancyMaxActiveClusters(&c, cluster_kernel, &cfg);
      if (e != cudaSuccess) (void)cudaGetLastError();
      return c;
    };
    std::printf("  resident clusters (512 threads, 96 KB smem): of 4 blocks %d, of 8 %d, of 16 %d\n", clusters(4),
                clusters(8), clusters(16));
    auto cl = [&](int barriers, bool dsmem) {
      return time_graph(s, [&](int) {
        launch_ex(cluster_kernel, dim3(128), dim3(kThreads), 0, s, LaunchOpts{false, 8, false}, barriers, dsmem, out);
      });
    };
    const double c0 = cl(0, false), c16 = cl(16, false), d16 = cl(16, true);
    std::printf("  cluster of 8 (128 blocks): empty launch %.2f us, barrier %.3f us each, store to 8 blocks + "
                "barrier %.3f us\n", c0, (c16 - c0) / 16, (d16 - c0) / 16);
    unsigned* words;
    CUDA_CHECK(cudaMalloc(&words, sms * 128));
    CUDA_CHECK(cudaMemset(words, 0, sms * 128));
    auto at = [&](int n) {
      return time_graph(s, [&](int) { atomic_kernel<<<sms, kThreads, 0, s>>>(words, n, out); });
    };
    const double a0 = at(0), a16 = at(16);
    std::printf("  atomic round trip (acq_rel, gpu scope): %.3f us each\n", (a16 - a0) / 16);
  }
  {
    const size_t wb = 12352ull * 1024, sbb = 12352ull * 128, per = wb + sbb;  // 14.2 MB per launch
    float* x;
    float* y;
    CUDA_CHECK(cudaMalloc(&x, 2048 * 4));
    CUDA_CHECK(cudaMalloc(&y, 12352 * 4));
    CUDA_CHECK(cudaMemset(x, 0x3c, 2048 * 4));
    auto run = [&](bool dots) {
      return time_graph(s, [&](int i) {
        const uint8_t* base = buf + i * per;
        if (dots)
          inproj<true><<<sms, kThreads, 0, s>>>(base, reinterpret_cast<const uint32_t*>(base + wb), x, y);
        else
          inproj<false><<<sms, kThreads, 0, s>>>(base, reinterpret_cast<const uint32_t*>(base + wb), x, y);
      });
    };
    const double ld = run(false), dt = run(true);
    std::printf("  GDN in_proj 14.2 MB: loads only %.2f us (%.0f GB/s), loads + dots %.2f us (%.0f GB/s)\n", ld,
                per / ld / 1e3, dt, per / dt / 1e3);
  }
  {
    constexpr int S = 108288;
    const size_t per = static_cast<size_t>(S) * sms;
    const double hot = time_graph(s, [&](int) { slab_regs<S><<<sms, kThreads, 0, s>>>(buf, out); });
    std::printf("  L2 warm: slab resident in L2 %.2f us\n", hot);
    for (unsigned ns : {5000u, 10000u}) {
      auto warm = [&](int mode) {
        return time_graph(s, [&](int i) {
          idle_kernel<S><<<sms, kThreads, 0, s>>>(buf + i * per, mode, ns);
          slab_regs<S><<<sms, kThreads, 0, s>>>(buf + i * per, out);
        });
      };
      const double idle =
          time_graph(s, [&](int i) { idle_kernel<S><<<sms, kThreads, 0, s>>>(buf + i * per, 0, ns); });
      const double cold = warm(0), bulk = warm(1), line = warm(2), load = warm(3), last = warm(4);
      const double cpa = warm(5), tma = warm(6);
      std::printf("  L2 warm: idle %u ns kernel alone %.2f us; slab after it: cold %.2f, bulk-prefetched %.2f, "
                  "line-prefetched %.2f, loaded %.2f, bulk evict_last %.2f, cp.async to smem %.2f, bulk copy to "
                  "smem %.2f us\n", ns, idle, cold - idle, bulk - idle, line - idle, load - idle, last - idle,
                  cpa - idle, tma - idle);
    }
  }
  slab_cases<36864>(s, sms, buf, out);    // out_proj 4096 -> 2048: 16 rows of 2304 B per SM
  slab_cases<108288>(s, sms, buf, out);   // GDN in_proj: 94 rows of 1152 B per SM
  slab_cases<147456>(s, sms, buf, out);   // both
  slab_cases<196608>(s, sms, buf, out);
  CUDA_CHECK(cudaDeviceSynchronize());
  return 0;
}
