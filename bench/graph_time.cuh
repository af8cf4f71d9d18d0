// Timing helper of the GPU benchmarks (bench_kernels.cu, bench_stream.cu, bench_prefill.cu).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "kernels/common.cuh"

// Captures launch(i, s) for i < launches into one CUDA graph on stream s, replays it (3 warm-up replays, then
// `replays` timed with CUDA events) and returns the median µs per launch.
inline double graph_median_us(cudaStream_t s, int launches, const std::function<void(int, cudaStream_t)>& launch,
                              int replays = 15) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < launches; ++i) launch(i, s);
  CUDA_CHECK(cudaStreamEndCapture(s, &g));
  CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int w = 0; w < 3; ++w) CUDA_CHECK(cudaGraphLaunch(ge, s));
  std::vector<double> t;
  for (int r = 0; r < replays; ++r) {
    CUDA_CHECK(cudaEventRecord(a, s));
    CUDA_CHECK(cudaGraphLaunch(ge, s));
    CUDA_CHECK(cudaEventRecord(b, s));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0 / launches);
  }
  CUDA_CHECK(cudaGraphExecDestroy(ge));
  CUDA_CHECK(cudaGraphDestroy(g));
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
