// The decode graph's tail to the host: the sampled step (and its top log-probabilities) copied by one small
// kernel into pinned host memory mapped into the device, instead of device-to-host copy nodes (copy-engine
// latency on the critical path of the next step).
// Tested through tests/gpu/test_cuda_backend.cpp (device sampling against the host Sampler).
#include "kernels/common.cuh"
#include "kernels/sampling.h"

namespace lily::cuda {
namespace {

__global__ void copy_to_mapped_kernel(uint32_t* dst_a, const uint32_t* __restrict__ src_a, int words_a,
                                      uint32_t* dst_b, const uint32_t* __restrict__ src_b, int words_b) {
  for (int i = threadIdx.x; i < words_a; i += blockDim.x) dst_a[i] = __ldcg(src_a + i);
  for (int i = threadIdx.x; i < words_b; i += blockDim.x) dst_b[i] = __ldcg(src_b + i);
}

}  // namespace

void copy_to_mapped(uint32_t* dst_a, const uint32_t* src_a, int words_a, uint32_t* dst_b, const uint32_t* src_b,
                    int words_b, cudaStream_t stream) {
  LILY_CHECK(dst_a && src_a && words_a > 0 && (words_b == 0 || (dst_b && src_b)), "copy_to_mapped: missing buffer");
  copy_to_mapped_kernel<<<1, 64, 0, stream>>>(dst_a, src_a, words_a, dst_b, src_b, words_b);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace lily::cuda
