// Shared CUDA helpers for every kernel file: CUDA_CHECK (statement, file, line, error name) and the debug
// switch (KernelOptions::debug_sync, LILY_CUDA_SYNC=1) that synchronises after every launch so a failing kernel
// is named at once.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "util/check.h"

namespace lily::cuda {

[[noreturn]] inline void cuda_fail(cudaError_t e, const char* stmt, const char* file, int line) {
  ::lily::fail("CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ") in `", stmt, "` at ", file, ":",
               line);
}

// KernelOptions::debug_sync of the options read at start-up (defined with them in model/kernel_options.cpp).
bool debug_sync_enabled();
int sm_count();             // multiprocessors of the current device (read once)

}  // namespace lily::cuda

#define CUDA_CHECK(stmt)                                                             \
  do {                                                                               \
    cudaError_t e_ = (stmt);                                                         \
    if (e_ != cudaSuccess) ::lily::cuda::cuda_fail(e_, #stmt, __FILE__, __LINE__);   \
  } while (0)

namespace lily::cuda {

// The debug switch's wait after a launch on s (CUDA_CHECK_LAUNCH).
inline void debug_sync_after(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  if (st == cudaStreamCaptureStatusNone) CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace lily::cuda

// After a launch on `stream`: check the launch and, in debug mode, wait for the stream and check its execution,
// unless the stream is being captured into a graph (its work runs when the graph is launched; a synchronisation
// would end the capture with an error).
#define CUDA_CHECK_LAUNCH(stream)                                                                \
  do {                                                                                           \
    CUDA_CHECK(cudaGetLastError());                                                              \
    if (::lily::cuda::debug_sync_enabled()) ::lily::cuda::debug_sync_after(stream);              \
  } while (0)
