// Grid-wide barriers for the persistent kernels (moe_fused.cu, gdn_fused.cu), launched cooperatively with one
// block per SM so every block is resident. State: kGridBarrierWords words (qmat.h), zeroed once, one array per
// kernel type (every launch on it must use the same grid), left ready for the next launch by every barrier.
//   GridSync (default): a 64-bit arrival counter that only grows. Arriving is a fire-and-forget release add;
//     barrier k of a launch waits until the counter reaches base + k * grid, where base (the counter at the
//     launch's start, a multiple of grid) is read by each block before its first arrival: no block can pass
//     barrier 1 before all arrive, so that read lies in [base, base + grid).
//   grid_barrier (LILY_GRID_BARRIER=gen): arrivals counted with a returning atomic, the last block resets the
//     count and releases a generation word the others poll (two round trips more per barrier).
// Host helpers (launch switches, LILY_TRACE stamps) are defined in persistent.cu.
#pragma once
#include <cuda_runtime.h>

#include "kernels/common.cuh"
#include "kernels/launch.cuh"

namespace lily::cuda::detail {

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void grid_barrier(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned gen = ld_acquire_gpu(bar + 1);
    __threadfence();  // this block's global writes before its arrival
    if (atomicAdd(bar, 1u) == gridDim.x - 1) {
      atomicExch(bar, 0u);
      __threadfence();
      st_release_gpu(bar + 1, gen + 1);
    } else {
      while (ld_acquire_gpu(bar + 1) == gen) {
      }
    }
  }
  __syncthreads();
}

// Diagnostics (LILY_TRACE=1): block 0 of a persistent kernel stamps %globaltimer at its phase boundaries into
// persistent_trace(kernel) (16 words, kernel 0 = MoE, 1 = GDN mixer); null when tracing is off.
unsigned long long* persistent_trace(int kernel);
__device__ __forceinline__ void trace_stamp(unsigned long long* trace, int i) {
  if (trace && blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    trace[i] = t;
  }
}

__device__ __forceinline__ unsigned long long ld_acquire_gpu_u64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

struct GridSync {
  unsigned* bar;            // the kernel's barrier words
  bool gen;                 // grid_barrier instead of the counter
  unsigned long long base;  // thread 0: counter at this launch's start
  unsigned k;               // thread 0: barriers passed
};

// Call once at kernel entry, before any barrier (thread 0 reads the counter).
__device__ __forceinline__ GridSync grid_sync_begin(unsigned* bar, bool gen) {
  GridSync s{bar, gen, 0ull, 0u};
  if (threadIdx.x == 0 && !gen) {
    const unsigned long long c = ld_acquire_gpu_u64(reinterpret_cast<const unsigned long long*>(bar + 2));
    s.base = c - c % gridDim.x;
  }
  return s;
}

__device__ __forceinline__ void grid_sync(GridSync& s) {
  if (s.gen) {
    grid_barrier(s.bar);
    return;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long* ctr = reinterpret_cast<unsigned long long*>(s.bar + 2);
    __threadfence();  // this block's global writes before its arrival
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(ctr) : "memory");
    const unsigned long long target = s.base + static_cast<unsigned long long>(++s.k) * gridDim.x;
    while (ld_acquire_gpu_u64(ctr) < target) {
    }
  }
  __syncthreads();
}

bool grid_barrier_gen();  // LILY_GRID_BARRIER=gen (benchmarks)

bool cooperative_launch();  // false with LILY_COOP=0 (benchmarks: the launch without the residency check)

// Launches a persistent kernel: one block of `threads` per SM, cooperatively (the launch fails instead of
// deadlocking if the blocks cannot all be resident).
template <typename Args>
void launch_persistent(void (*kernel)(Args), const Args& a, int threads, cudaStream_t stream) {
  launch_ex(kernel, dim3(sm_count()), dim3(threads), 0, stream, LaunchOpts{false, 1, cooperative_launch()}, a);
}

}  // namespace lily::cuda::detail
