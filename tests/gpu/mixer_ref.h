// CPU references and checks shared by the mixer kernels' GPU tests (test_mixer_kernels.cu, test_gdn_wy.cu):
// seeded random vectors, device copies, NaN-poisoned outputs, the fp64 / fp32 error check, and the Gated
// DeltaNet decode step's reference (GdnRef, templated on the arithmetic's precision).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/mixers.h"

namespace lily::cuda::testing {

inline std::vector<float> randv(size_t n, std::mt19937& g, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

template <typename T>
T* to_dev(const std::vector<T>& v) {
  T* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(v.size(), 1) * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <typename T>
std::vector<T> from_dev(const T* p, size_t n) {
  std::vector<T> v(n);
  CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
inline float* poisoned(size_t n) {  // NaN-filled output buffer: unwritten elements fail the check
  float* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
  CUDA_CHECK(cudaMemset(p, 0xff, n * sizeof(float)));
  return p;
}

// max |gpu - ref64| <= 2 * max |ref32 - ref64| + atol; prints the worst elements.
inline void expect_close(const char* what, const std::vector<float>& gpu, const std::vector<double>& r64,
                         const std::vector<float>& r32, double atol) {
  ASSERT_EQ(gpu.size(), r64.size());
  double e_gpu = 0, e32 = 0;
  std::vector<std::pair<double, size_t>> worst;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double e = std::isfinite(gpu[i]) ? std::fabs(gpu[i] - r64[i]) : INFINITY;
    e_gpu = std::max(e_gpu, e);
    e32 = std::max(e32, std::fabs(r32[i] - r64[i]));
    worst.push_back({e, i});
  }
  const double tol = 2 * e32 + atol;
  std::printf("%-28s n=%zu max err gpu %.3g, fp32 ref %.3g, tol %.3g\n", what, gpu.size(), e_gpu, e32, tol);
  if (e_gpu > tol) {
    std::partial_sort(worst.begin(), worst.begin() + std::min<size_t>(5, worst.size()), worst.end(),
                      [](auto& a, auto& b) { return a.first > b.first; });
    for (size_t k = 0; k < std::min<size_t>(5, worst.size()); ++k)
      std::printf("  [%zu] gpu %.7g ref %.7g\n", worst[k].second, gpu[worst[k].second], r64[worst[k].second]);
  }
  EXPECT_LE(e_gpu, tol) << what;
}

template <typename T>
T silu_t(T x) { return x / (T(1) + std::exp(-x)); }

template <typename T>
struct GdnRef {
  GdnDims dm;
  std::vector<T> S;                   // [Hv][Dk][Dv]
  std::vector<std::vector<float>> hist;  // raw qkv of earlier tokens, oldest first
  std::vector<T> step(const std::vector<float>& qkv, const std::vector<float>& z, const std::vector<float>& a,
                      const std::vector<float>& b, const std::vector<float>& cw, const std::vector<float>& alog,
                      const std::vector<float>& dtb, const std::vector<float>& nw) {
    const int C = dm.conv_dim(), Dk = dm.k_dim, Dv = dm.v_dim, Hv = dm.n_v_heads, key = dm.n_k_heads * Dk;
    std::vector<T> u(C);
    for (int c = 0; c < C; ++c) {
      T acc = T(cw[c * 4 + 3]) * T(qkv[c]);
      for (int back = 1; back <= 3; ++back)
        if ((int)hist.size() >= back) acc += T(cw[c * 4 + 3 - back]) * T(hist[hist.size() - back][c]);
      u[c] = silu_t(acc);
    }
    hist.push_back(qkv);
    std::vector<T> out((size_t)Hv * Dv);
    for (int h = 0; h < Hv; ++h) {
      const int kh = h / (Hv / dm.n_k_heads);
      std::vector<T> q(Dk), k(Dk);
      T sq = 0, sk = 0;
      for (int i = 0; i < Dk; ++i) q[i] = u[kh * Dk + i], k[i] = u[key + kh * Dk + i], sq += q[i] * q[i], sk += k[i] * k[i];
      for (int i = 0; i < Dk; ++i) q[i] *= T(1) / std::sqrt(sq + T(1e-6)) / std::sqrt(T(Dk)), k[i] *= T(1) / std::sqrt(sk + T(1e-6));
      const T beta = T(1) / (T(1) + std::exp(-T(b[h])));
      const T x = T(a[h]) + T(dtb[h]);
      const T sp = x > T(20) ? x : std::log1p(std::exp(x));
      const T decay = std::exp(-std::exp(T(alog[h])) * sp);
      T* Sh = &S[(size_t)h * Dk * Dv];
      std::vector<T> o(Dv, T(0));
      for (int j = 0; j < Dv; ++j) {
        T mem = 0;
        for (int i = 0; i < Dk; ++i) Sh[i * Dv + j] *= decay, mem += Sh[i * Dv + j] * k[i];
        const T dl = beta * (u[2 * key + h * Dv + j] - mem);
        for (int i = 0; i < Dk; ++i) Sh[i * Dv + j] += k[i] * dl, o[j] += Sh[i * Dv + j] * q[i];
      }
      T ss = 0;
      for (int j = 0; j < Dv; ++j) ss += o[j] * o[j];
      const T r = T(1) / std::sqrt(ss / T(Dv) + T(1e-6));
      for (int j = 0; j < Dv; ++j) out[(size_t)h * Dv + j] = o[j] * r * T(nw[j]) * silu_t(T(z[(size_t)h * Dv + j]));
    }
    return out;
  }
};

}  // namespace lily::cuda::testing
