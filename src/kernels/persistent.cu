// Host side of the persistent kernels (moe_fused.cu, gdn_fused.cu; device side in grid_barrier.cuh): the
// environment switches of their launch and barrier, and the LILY_TRACE=1 phase stamps.
#include <cstdio>
#include <cstdlib>

#include "kernels/grid_barrier.cuh"
#include "kernels/qmat.h"

namespace lily::cuda {
namespace detail {

bool persistent_pdl() {
  static const bool on = [] {
    const char* e = std::getenv("LILY_PERSIST_PDL");
    return !(e && e[0] == '0');
  }();
  return on;
}

__device__ unsigned long long g_trace[2 * 16];

// A static device array (no allocation: this runs inside graph capture).
unsigned long long* persistent_trace(int kernel) {
  static unsigned long long* buf = [] {
    const char* e = std::getenv("LILY_TRACE");
    unsigned long long* p = nullptr;
    if (e && e[0] == '1') CUDA_CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&p), g_trace));
    return p;
  }();
  return buf ? buf + 16 * kernel : nullptr;
}
}  // namespace detail

// Prints block 0's phase times of the last launch of each persistent kernel (LILY_TRACE=1; benchmarks).
void print_persistent_trace() {
  unsigned long long* d = detail::persistent_trace(0);
  if (!d) return;
  unsigned long long t[32] = {};
  CUDA_CHECK(cudaMemcpy(t, d, sizeof t, cudaMemcpyDeviceToHost));
  const char* moe[] = {"entry", "x normed", "phase A done", "barrier 1", "selection", "phase B done", "barrier 2",
                       "act staged", "end"};
  const char* gdn[] = {"entry", "x normed", "in_proj done", "barrier 1", "step done", "barrier 2", "staged", "end"};
  std::printf("fused MoE, block 0 (ns since entry):");
  for (int i = 1; i < 9; ++i) std::printf(" %s %llu;", moe[i], t[i] - t[0]);
  std::printf("\nfused GDN mixer, block 0 (ns since entry):");
  for (int i = 1; i < 8; ++i) std::printf(" %s %llu;", gdn[i], t[16 + i] - t[16]);
  std::printf("\n");
}
}  // namespace lily::cuda
