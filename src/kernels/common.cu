#include "kernels/common.cuh"

namespace lily::cuda {
bool debug_sync_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("LILY_CUDA_SYNC");
    return e && e[0] == '1';
  }();
  return on;
}
}  // namespace lily::cuda
