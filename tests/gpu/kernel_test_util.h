// Helpers for the weight-streaming kernel tests (test_gemv.cu, test_moe.cu, test_sampling.cu): device
// buffers, random MLX-layout matrices with their CPU dequantisation, and the comparison that prints the worst
// elements. Tolerance rule: 2x the worst error of a plain fp32 reference (sequential fp32 dot) against the
// fp64 reference, plus a tiny absolute term.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/qmat.h"
#include "util/bf16.h"

namespace lily::cuda::test {

template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&p, sizeof(T) * (count ? count : 1))); }
  explicit DevBuf(const std::vector<T>& v) : DevBuf(v.size()) { upload(v); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { if (p) cudaFree(p); }
  void upload(const std::vector<T>& v) { CUDA_CHECK(cudaMemcpy(p, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice)); }
  std::vector<T> download() const {
    std::vector<T> v(n);
    CUDA_CHECK(cudaMemcpy(v.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost));
    return v;
  }
  void poison() { CUDA_CHECK(cudaMemset(p, 0xff, sizeof(T) * n)); }  // NaN for floats
};

inline uint16_t rand_bf16(std::mt19937_64& rng, float lo, float hi, bool random_sign) {
  std::uniform_real_distribution<float> u(lo, hi);
  float v = u(rng);
  if (random_sign && (rng() & 1)) v = -v;
  return f32_to_bf16(v);
}

// A stack of n matrices [rows, cols] in the MLX checkpoint layout (q4/q8) or bf16, on the host.
struct HostMat {
  QFormat fmt = QFormat::q4;
  int n = 1, rows = 0, cols = 0;
  std::vector<uint32_t> words;     // q4/q8: [n][rows][cols*bits/32]
  std::vector<uint16_t> scales;    // [n][rows][cols/64]
  std::vector<uint16_t> biases;    // [n][rows][cols/64]
  std::vector<uint16_t> bf16;      // bf16 format: [n][rows][cols]

  int bits() const { return static_cast<int>(fmt); }
  uint32_t q(int e, int r, int c) const {  // packed value (q4/q8)
    const size_t row = static_cast<size_t>(e) * rows + r;
    const int per = 32 / bits();
    const uint32_t w = words[row * (cols / per) + c / per];
    return (w >> (bits() * (c % per))) & ((1u << bits()) - 1u);
  }
  float scale(int e, int r, int c) const { return bf16_to_f32(scales[(static_cast<size_t>(e) * rows + r) * (cols / kGroupSize) + c / kGroupSize]); }
  float bias(int e, int r, int c) const { return bf16_to_f32(biases[(static_cast<size_t>(e) * rows + r) * (cols / kGroupSize) + c / kGroupSize]); }
  // Dequantised element as the kernels define it (scale*q + bias), in double and in fp32.
  double at(int e, int r, int c) const {
    if (fmt == QFormat::bf16) return bf16_to_f32(bf16[(static_cast<size_t>(e) * rows + r) * cols + c]);
    return static_cast<double>(scale(e, r, c)) * q(e, r, c) + bias(e, r, c);
  }
  float at32(int e, int r, int c) const {
    if (fmt == QFormat::bf16) return bf16_to_f32(bf16[(static_cast<size_t>(e) * rows + r) * cols + c]);
    return scale(e, r, c) * static_cast<float>(q(e, r, c)) + bias(e, r, c);
  }
};

inline HostMat random_mat(std::mt19937_64& rng, QFormat fmt, int n, int rows, int cols) {
  HostMat m;
  m.fmt = fmt; m.n = n; m.rows = rows; m.cols = cols;
  const size_t nr = static_cast<size_t>(n) * rows;
  if (fmt == QFormat::bf16) {
    m.bf16.resize(nr * cols);
    for (auto& v : m.bf16) v = rand_bf16(rng, 0.001f, 0.08f, true);
    return m;
  }
  m.words.resize(nr * cols * m.bits() / 32);
  for (auto& w : m.words) w = static_cast<uint32_t>(rng());
  m.scales.resize(nr * cols / kGroupSize);
  m.biases.resize(m.scales.size());
  const float smax = fmt == QFormat::q4 ? 0.01f : 0.0006f;
  for (auto& s : m.scales) s = rand_bf16(rng, smax * 0.05f, smax, true);  // negative scales included
  for (auto& b : m.biases) b = rand_bf16(rng, 0.001f, 0.08f, true);
  return m;
}

// Device copy in the QMat layout (q4/q8 through upload_mlx from host pointers, bf16 through from_bf16).
struct DevMat {
  QMat m;
  explicit DevMat(const HostMat& h) {
    m.format = h.fmt; m.n_mats = h.n; m.rows = h.rows; m.cols = h.cols;
    qmat_alloc(m);
    if (h.fmt == QFormat::bf16) {
      DevBuf<uint16_t> src(h.bf16);
      from_bf16(m, src.p, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
    } else {
      void* staging = nullptr;
      CUDA_CHECK(cudaMalloc(&staging, upload_mlx_staging_bytes(m)));
      upload_mlx(m, h.words.data(), h.scales.data(), h.biases.data(), staging, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      cudaFree(staging);
    }
  }
  DevMat(const DevMat&) = delete;
  DevMat& operator=(const DevMat&) = delete;
  ~DevMat() { qmat_free(m); }
};

inline std::vector<float> random_vec(std::mt19937_64& rng, size_t n, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = u(rng);
    if (x == 0.f) x = 0.5f;
  }
  return v;
}

// Reference dot products of row r of matrix e with x: fp64 and a sequential fp32 one.
inline void ref_dot(const HostMat& m, int e, int r, const std::vector<float>& x, double& d64, float& d32) {
  d64 = 0;
  d32 = 0;
  for (int c = 0; c < m.cols; ++c) {
    d64 += m.at(e, r, c) * x[c];
    d32 += m.at32(e, r, c) * x[c];
  }
}

// The streaming q4 kernels (gemv_stream.cuh; qmat.h gemv_streams, moe_gate_up_streams, the fused kernels) take x
// per 32-element chunk as 16-bit fixed point x~ = sx * (256 hi + lo); these are the same fp32 steps
// (x16_split), so a reference on x~ checks their arithmetic to fp32 rounding.
// chunk: elements per unit sx (the int8 GEMM, kernels/gemm_i8.cu, takes 64).
inline std::vector<double> stream_x(const std::vector<float>& x, size_t chunk = 32) {
  std::vector<double> q(x.size());
  for (size_t c0 = 0; c0 < x.size(); c0 += chunk) {
    float m = 0.f;
    for (size_t i = c0; i < c0 + chunk; ++i) m = std::max(m, std::fabs(x[i]));
    const float inv = m > 0.f ? 127.f / m : 0.f, sx = m / 32512.f;
    for (size_t i = c0; i < c0 + chunk; ++i) {
      const float t = x[i] * inv;
      const float h = std::nearbyint(t);
      const int lo = std::clamp(static_cast<int>(std::nearbyint((t - h) * 256.f)), -127, 127);
      q[i] = static_cast<double>(sx) * (256.0 * h + lo);
    }
  }
  return q;
}
// ref_dot of the kernel's arithmetic: with x16 (the kernel streams, as the library reports) on x~ for the scale
// term and on x for the bias term (d32: the same in fp32, for the tolerance), else ref_dot.
inline void ref_dot_k(const HostMat& m, int e, int r, const std::vector<float>& x, bool x16, double& d64,
                      float& d32) {
  if (!x16) return ref_dot(m, e, r, x, d64, d32);
  static std::vector<float> last_x;  // x~ of the last x (callers go row by row over one x)
  static std::vector<double> xq;
  if (x != last_x) {
    last_x = x;
    xq = stream_x(x);
  }
  d64 = 0;
  d32 = 0;
  for (int c = 0; c < m.cols; ++c) {
    const double q = m.q(e, r, c);
    d64 += m.scale(e, r, c) * q * xq[c] + static_cast<double>(m.bias(e, r, c)) * x[c];
    d32 += m.scale(e, r, c) * static_cast<float>(q) * static_cast<float>(xq[c]) + m.bias(e, r, c) * x[c];
  }
}

// Compares got against ref64 with tol = 2 * max|ref32 - ref64| + atol_rel * max|ref64|; prints the worst.
inline ::testing::AssertionResult close_enough(const std::vector<float>& got, const std::vector<double>& ref64,
                                               const std::vector<float>& ref32, const std::string& what,
                                               double atol_rel = 1e-6) {
  double err32 = 0, scale = 0;
  for (size_t i = 0; i < ref64.size(); ++i) {
    err32 = std::max(err32, std::fabs(ref32[i] - ref64[i]));
    scale = std::max(scale, std::fabs(ref64[i]));
  }
  const double tol = 2 * err32 + atol_rel * scale + 1e-30;
  std::vector<std::pair<double, size_t>> errs;
  size_t bad = 0;
  for (size_t i = 0; i < ref64.size(); ++i) {
    const double e = std::isfinite(got[i]) ? std::fabs(got[i] - ref64[i]) : INFINITY;
    if (!(e <= tol)) ++bad;
    errs.push_back({e, i});
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::sort(errs.rbegin(), errs.rend());
  auto r = ::testing::AssertionFailure();
  r << what << ": " << bad << " of " << ref64.size() << " elements exceed tol " << tol << " (fp32 ref err " << err32
    << "); worst:";
  for (size_t k = 0; k < std::min<size_t>(8, errs.size()); ++k) {
    const size_t i = errs[k].second;
    r << "\n  [" << i << "] got " << got[i] << " ref " << ref64[i] << " err " << errs[k].first;
  }
  return r;
}

// max |a - b| / max |b| of two paths' results (non-finite a counts as infinite), printing the worst element:
// "  <what> max|<vs>| / max|.| = ...".
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b, const char* what, const char* vs) {
  double scale = 0, worst = 0;
  size_t at = 0;
  for (float v : b) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::isfinite(a[i]) ? std::fabs(static_cast<double>(a[i]) - b[i]) : INFINITY;
    if (!(d <= worst)) worst = d, at = i;
  }
  std::printf("  %-6s max|%s| / max|.| = %.3g (element %zu: %.8g vs %.8g)\n", what, vs, worst / scale, at, a[at],
              b[at]);
  return worst / scale;
}

}  // namespace lily::cuda::test
