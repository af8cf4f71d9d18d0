// Device data of the GPU benchmarks (bench_kernels.cu, bench_prefill.cu): random weight matrices in lily's
// layout, random vectors, and allocations freed together at the end (free_all). Seeded from one counter, so a
// run always measures the same data.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/qmat.h"

namespace bench {

using lily::cuda::QFormat;
using lily::cuda::QMat;

__global__ void fill_words(uint32_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t x = seed ^ (i * 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    p[i] = static_cast<uint32_t>(x);
  }
}
// scale|bias words: bf16 values of magnitude ~0.004..0.008 with random signs.
__global__ void fill_sb(uint32_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t x = seed ^ (i * 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
    const uint32_t s = 0x3b80u | (x & 0x7fu) | ((x >> 8) & 1u) << 15;
    const uint32_t b = 0x3b80u | ((x >> 16) & 0x7fu) | ((x >> 24) & 1u) << 15;
    p[i] = s | (b << 16);
  }
}
// uniform in [-scale, scale)
__global__ void fill_floats(float* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t x = seed ^ (i * 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
    p[i] = (static_cast<float>(x >> 40) / 16777216.0f * 2.f - 1.f) * scale;
  }
}

inline uint64_t g_seed = 1;
inline std::vector<void*> g_allocs;

inline void* dalloc(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  g_allocs.push_back(p);
  return p;
}

inline QMat make_mat(QFormat f, int rows, int cols, int n_mats = 1) {
  QMat m;
  m.format = f; m.rows = rows; m.cols = cols; m.n_mats = n_mats;
  m.w = static_cast<uint8_t*>(dalloc(m.w_bytes()));
  fill_words<<<1024, 256>>>(reinterpret_cast<uint32_t*>(m.w), m.w_bytes() / 4, g_seed++);
  if (f != QFormat::bf16) {
    m.sb = static_cast<uint32_t*>(dalloc(m.sb_bytes()));
    fill_sb<<<1024, 256>>>(m.sb, m.sb_bytes() / 4, g_seed++);
  }
  CUDA_CHECK_LAUNCH(0);
  return m;
}

inline float* make_vec(size_t n, float scale = 1.f) {
  float* p = static_cast<float*>(dalloc(n * sizeof(float)));
  fill_floats<<<64, 256>>>(p, n, g_seed++, scale);
  CUDA_CHECK_LAUNCH(0);
  return p;
}

inline void free_all() {
  for (void* p : g_allocs) cudaFree(p);
  g_allocs.clear();
}

}  // namespace bench
