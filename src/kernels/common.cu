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

bool env_flag(const char* name, bool dflt) {
  const char* e = std::getenv(name);
  if (e && e[0] == (dflt ? '0' : '1')) return !dflt;
  return dflt;
}

int env_int(const char* name, int dflt) {
  const char* e = std::getenv(name);
  return e && e[0] ? std::atoi(e) : dflt;
}

bool debug_sync_enabled() {
  static const bool on = env_flag("LILY_CUDA_SYNC", false);
  return on;
}
}  // namespace lily::cuda
