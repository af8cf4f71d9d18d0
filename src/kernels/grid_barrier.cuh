// Grid-wide barriers for the persistent kernels (moe_fused.cu, gdn_fused.cu), launched cooperatively with one
// block per SM so every block is resident. State: kGridBarrierWords words (qmat.h), zeroed once, one array per
// kernel type (every launch on it must use the same grid), left ready for the next launch by every barrier:
// a 64-bit arrival counter (words 2, 3) that only grows. Arriving is a fire-and-forget release add; barrier k of
// a launch waits until the counter reaches base + k * grid, where base (the counter at the launch's start, a
// multiple of grid) is read by each block before its first arrival: no block can pass barrier 1 before all
// arrive, so that read lies in [base, base + grid).
// Ordering: every thread's writes reach thread 0 through __syncthreads (CTA-scope synchronisation), and thread
// 0's release add is cumulative, so other blocks that acquire the counter and then __syncthreads see them; no
// separate fence (a __threadfence before the add is slow).
// The persistent kernels are launched with programmatic dependent launch: a launch
// triggers its dependents at entry, so the next launch's blocks take the SMs as this launch's blocks leave, and
// each waits (griddepcontrol.wait) at entry, before reading the barrier counter or anything an earlier launch
// wrote. Only the input-norm weights (8 KB, constant, from DRAM) are requested before the wait; not the weight
// rows (h's reads would queue behind them: an SM receives its data in the order it requested it).
// Phase stamps for benchmarks: kernels/trace.h (host side in persistent.cu).
#pragma once
#include <cuda_runtime.h>

#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "kernels/trace.h"

namespace lily::cuda::detail {

// Thread 0 of every block of a persistent kernel stamps %globaltimer as phase i into the launch's trace slot
// (kernels/trace.h; null: not traced).
__device__ __forceinline__ void trace_stamp(unsigned long long* trace, int i) {
  if (trace && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    trace[blockIdx.x * kTraceStamps + i] = t;
  }
}

// The same for the attention kernels' 2-D grids (block: the linear block index; blocks from kTraceBlocks on are
// not stamped); stamp_time false stores 0 instead of the time (a block without work: the printer skips it).
__device__ __forceinline__ void trace_stamp_at(unsigned long long* trace, int block, int i, bool stamp_time = true) {
  if (trace && threadIdx.x == 0 && block < kTraceBlocks) {
    unsigned long long t = 0;
    if (stamp_time) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    trace[block * kTraceStamps + i] = t;
  }
}

__device__ __forceinline__ unsigned long long ld_acquire_gpu_u64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

struct GridSync {
  unsigned* bar;            // the kernel's barrier words
  unsigned long long base;  // thread 0: counter at this launch's start (as read, until the first barrier)
  unsigned k;               // thread 0: barriers passed
};

// Call once per launch before any barrier, after dep_wait() (thread 0 reads the counter), and after the block's
// first loads are issued. The read is relaxed and its value used only at the first barrier, so thread 0 never
// waits for it: an acquire load held back thread 0's later loads by a memory round trip and, through the
// block's first __syncthreads, the whole block. No acquire is needed: griddepcontrol.wait
// made the previous launches' arrivals visible, so the value lies in [base, base + grid) as above.
__device__ __forceinline__ GridSync grid_sync_begin(unsigned* bar) {
  GridSync s{bar, 0ull, 0u};
  if (threadIdx.x == 0)
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(s.base) : "l"(bar + 2) : "memory");
  return s;
}

__device__ __forceinline__ void grid_sync(GridSync& s) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long* ctr = reinterpret_cast<unsigned long long*>(s.bar + 2);
    if (s.k == 0) s.base -= s.base % gridDim.x;
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(ctr) : "memory");
    const unsigned long long target = s.base + static_cast<unsigned long long>(++s.k) * gridDim.x;
    while (ld_acquire_gpu_u64(ctr) < target) {
    }
  }
  __syncthreads();
}

// Launches a persistent kernel: one block of `threads` per SM, cooperatively (the launch fails instead of
// deadlocking if the blocks cannot all be resident), with programmatic dependent launch.
template <typename Args>
void launch_persistent(void (*kernel)(Args), const Args& a, int threads, cudaStream_t stream) {
  launch_ex(kernel, dim3(sm_count()), dim3(threads), 0, stream,
            LaunchOpts{true, 1, true}, a);
}

}  // namespace lily::cuda::detail
