// Grid-wide barrier for the persistent kernels (moe_fused.cu, gdn_fused.cu): launched cooperatively with one
// block per SM, so every block is resident. bar[0] counts arrivals, bar[1] is the generation; both start at zero
// (cudaMemset once) and every barrier leaves them consistent for the next one, in this launch or a later one.
// The generation is read before arriving, so the last block to arrive cannot release a generation this block
// has not seen; its release store publishes the reset count and, through each block's fence before arriving,
// every block's global writes.
#pragma once
#include <cuda_runtime.h>

#include "kernels/common.cuh"

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

// Number of SMs of the current device (the persistent kernels' grid).
int sm_count();
bool cooperative_launch();  // false with LILY_COOP=0 (benchmarks: the launch without the residency check)

// Launches a persistent kernel: one block of `threads` per SM, cooperatively (the launch fails instead of
// deadlocking if the blocks cannot all be resident).
template <typename Args>
void launch_persistent(void (*kernel)(Args), const Args& a, int threads, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(sm_count());
  cfg.blockDim = dim3(threads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cooperative_launch() ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a));
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda::detail
