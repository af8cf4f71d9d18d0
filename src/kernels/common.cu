#include "kernels/common.cuh"

namespace lily::cuda {
int sm_count() {
  static const int sms = [] {
    int dev = 0, n = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return sms;
}

bool debug_sync_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("LILY_CUDA_SYNC");
    return e && e[0] == '1';
  }();
  return on;
}
}  // namespace lily::cuda
