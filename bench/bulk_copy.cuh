// Bulk copies global -> shared memory by the copy engine (cp.async.bulk, sm_90), completing on an mbarrier:
// one thread issues a copy of any size (a multiple of 16 bytes, both addresses 16-byte aligned), the bytes
// land in shared memory without passing through registers or the L1 miss queues, and every thread of the
// block waits on the mbarrier's phase. bench_stream.cu measures it against register loads for a persistent
// kernel's weight slab (~100 KB per SM): no faster (bench/RESULTS.md), so it lives here, beside the probe, until
// a kernel has a use for it. Usage per barrier and phase:
//   thread 0: mbar_expect(bar, total_bytes); bulk_g2s(dst, src, bytes, bar) ...   (total = sum of the copies)
//   all:      mbar_wait(bar, parity)   (parity 0 for the first use of bar, then 1, 0, ...)
// mbar_init by one thread, then __syncthreads(), before the first use.
#pragma once
#include <cstdint>

namespace lily::cuda::detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Arrive (one of the barrier's count) and announce `bytes` of copies completing on it in this phase.
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, unsigned parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

}  // namespace lily::cuda::detail
