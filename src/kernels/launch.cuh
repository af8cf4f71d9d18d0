// Kernel launches with attributes: launch_ex (cudaLaunchKernelEx with programmatic dependent launch, a
// thread-block cluster and/or a cooperative launch), used by launch_mixer (gdn.cu, norm.cu), attention.cu,
// launch_kernel (gemv.cu, moe.cu), launch_persistent (the one-launch MoE / GDN kernels) and launch_pdl (a decode
// pass's kernels, the prompt path's GEMMs). PDL: for the persistent kernels (grid_barrier.cuh), the attention split
// and combine kernels, the one-wave GEMV and launch_pdl's; the decode step's other kernels launch without it (it
// measured slower there). Kernels launched with PDL must call dep_wait() before
// reading anything an earlier kernel wrote; dep_trigger() lets the next kernel be scheduled early (it still waits
// for this one to finish); without PDL both are no-ops.
#pragma once
#include "kernels/common.cuh"

namespace lily::cuda {

__device__ __forceinline__ void dep_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void dep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// The one place kernels are launched with attributes (cudaLaunchKernelEx), every launch checked.
struct LaunchOpts {
  bool pdl = false;          // programmatic stream serialisation
  int cluster_x = 1;         // thread-block cluster size (> 1: clusters along x)
  bool cooperative = false;  // every block resident, or the launch fails
};

template <typename... P, typename... A>
void launch_ex(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, const LaunchOpts& o, A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[3];
  int n = 0;
  if (o.pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (o.cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = o.cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
  }
  if (o.cooperative) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n++].val.cooperative = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, static_cast<P>(args)...));
  CUDA_CHECK_LAUNCH(cfg.stream);
}

// The kernels of a decode pass (model/prefill_cuda.cu) and the prompt path's GEMMs: with PDL, so a launch's blocks
// are scheduled while the previous kernel finishes. Each such kernel calls dep_chain() before it reads or writes
// anything: every kernel of such a chain lets the next one in at entry, so a launch may start while kernels several
// launches back still run, and only data constant for the process may be read before the wait.
template <typename... P, typename... A>
void launch_pdl(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A... args) {
  launch_ex(k, grid, block, smem, s, LaunchOpts{true, 1, false}, args...);
}
__device__ __forceinline__ void dep_chain() {
  dep_trigger();
  dep_wait();
}

// The mixer kernels: without PDL, with an optional cluster.
template <typename... P, typename... A>
void launch_mixer(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, int cluster_x, A... args) {
  launch_ex(k, grid, block, smem, s, LaunchOpts{false, cluster_x, false}, args...);
}

}  // namespace lily::cuda
