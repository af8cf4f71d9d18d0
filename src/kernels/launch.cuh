// Launch helper for the mixer kernels (gdn.cu, attention.cu, norm_rope.cu): cudaLaunchKernelEx with
// programmatic dependent launch (PDL; off unless LILY_PDL=1, the switch lives in gemv.cu) and an optional
// thread-block cluster. Kernels launched this way must call dep_wait() before reading anything an earlier
// kernel wrote; dep_trigger() lets the next kernel be scheduled early (it still waits for this one to finish).
#pragma once
#include "kernels/common.cuh"

namespace lily::cuda {

namespace detail {
bool pdl_enabled();  // kernels/gemv.cu
}

__device__ __forceinline__ void dep_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void dep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

template <typename... P, typename... A>
void launch_mixer(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, int cluster_x, A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (detail::pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, static_cast<P>(args)...));
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda
