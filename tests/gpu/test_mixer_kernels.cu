// GPU kernels of kernels/mixers.h against CPU references on seeded random inputs: residual add + RMSNorm,
// q/k norm + partial RoPE + KV append, the fused Gated DeltaNet step (several consecutive steps, real and odd
// sizes), and decode attention over a paged cache (short, odd, split tails and a 128K-token context).
// Tolerance: the GPU's max error against an fp64 reference must stay within 2x the error of the same
// reference computed in fp32, plus a small absolute term; the worst elements are printed on failure.
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/batched.h"
#include "kernels/mixers.h"
#include "util/bf16.h"

using namespace lily;
using namespace lily::cuda;

namespace {

std::vector<float> randv(size_t n, std::mt19937& g, float lo = -1.f, float hi = 1.f) {
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
float* poisoned(size_t n) {  // NaN-filled output buffer: unwritten elements fail the check
  float* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
  CUDA_CHECK(cudaMemset(p, 0xff, n * sizeof(float)));
  return p;
}

// max |gpu - ref64| <= 2 * max |ref32 - ref64| + atol; prints the worst elements.
void expect_close(const char* what, const std::vector<float>& gpu, const std::vector<double>& r64,
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

// ---------------- add + RMSNorm ----------------
template <typename T>
std::vector<T> add_rmsnorm_ref(std::vector<float> h, const std::vector<float>& d1, const std::vector<float>& w) {
  std::vector<T> x(h.size()), y(h.size());
  T ss = 0;
  for (size_t i = 0; i < h.size(); ++i) x[i] = T(h[i]) + T(d1[i]), ss += x[i] * x[i];
  const T r = T(1) / std::sqrt(ss / T(h.size()) + T(1e-6));
  for (size_t i = 0; i < h.size(); ++i) y[i] = x[i] * r * T(w[i]);
  return y;
}

TEST(MixerKernels, AddRmsNorm) {
  std::mt19937 g(1);
  for (int n : {2048, 777, 33}) {
    auto h = randv(n, g, -3, 3), d1 = randv(n, g), w = randv(n, g, 0.5f, 1.5f);
    float *dh = to_dev(h), *dd = to_dev(d1), *dw = to_dev(w), *dout = poisoned(n);
    launch_add_rmsnorm(dh, dd, nullptr, dw, dout, n, 1e-6f, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    auto r64 = add_rmsnorm_ref<double>(h, d1, w);
    auto r32d = add_rmsnorm_ref<float>(h, d1, w);
    expect_close("add_rmsnorm", from_dev(dout, n), r64, std::vector<float>(r32d.begin(), r32d.end()), 1e-6);
    auto hn = from_dev(dh, n);
    for (int i = 0; i < n; ++i) ASSERT_EQ(hn[i], h[i] + d1[i]) << i;
    for (float* p : {dh, dd, dw, dout}) cudaFree(p);
  }
}

// ---------------- q/k norm + RoPE (the attention kernel's prologue) ----------------
template <typename T>
std::vector<T> norm_rope_ref(const float* x, const float* w, int d, int rope, int pos, double theta) {
  std::vector<T> y(d);
  T ss = 0;
  for (int i = 0; i < d; ++i) ss += T(x[i]) * T(x[i]);
  const T r = T(1) / std::sqrt(ss / T(d) + T(1e-6));
  for (int i = 0; i < d; ++i) y[i] = T(x[i]) * r * T(w[i]);
  std::vector<T> o = y;
  for (int f = 0; f < rope / 2; ++f) {
    const T ang = T(pos) * T(std::pow(theta, -2.0 * f / rope));
    const T c = std::cos(ang), s = std::sin(ang);
    o[f] = y[f] * c - y[f + rope / 2] * s;
    o[f + rope / 2] = y[f + rope / 2] * c + y[f] * s;
  }
  return o;
}

struct PagedCache {
  std::vector<uint16_t*> pages;
  uint16_t** table = nullptr;
  KvPages kv;
  PagedCache(int n_tokens, int page_tokens, int n_kv, int d) {
    const int n_pages = (n_tokens + page_tokens - 1) / page_tokens;
    const size_t elems = kv_page_elems(page_tokens, n_kv, d);
    for (int p = 0; p < n_pages; ++p) {
      uint16_t* q = nullptr;
      CUDA_CHECK(cudaMalloc(&q, elems * 2));
      pages.push_back(q);
    }
    table = to_dev(pages);
    kv.pages = table;
    kv.page_tokens = page_tokens;
    kv.n_kv = n_kv;
    kv.head_dim = d;
  }
  ~PagedCache() {
    for (auto* p : pages) cudaFree(p);
    cudaFree(table);
  }
  size_t offset(int which, int g, int t) const {
    return ((size_t)(which * kv.n_kv + g) * kv.page_tokens + t % kv.page_tokens) * kv.head_dim;
  }
};

// ---------------- Gated DeltaNet step ----------------
template <typename T>
struct GdnRef {
  GdnDims dm;
  std::vector<T> S;                   // [Hv][Dk][Dv]
  std::vector<std::vector<float>> hist;  // raw qkv of earlier tokens, oldest first
  // when set: each step's recurrence inputs per value head (q | k | v | beta, log decay), for wy_emulate
  std::vector<std::vector<double>>* record = nullptr;
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
      if (record) {
        std::vector<double> r(q.begin(), q.end());
        r.insert(r.end(), k.begin(), k.end());
        for (int j = 0; j < Dv; ++j) r.push_back(double(u[2 * key + h * Dv + j]));
        r.push_back(double(beta)), r.push_back(double(-std::exp(T(alog[h])) * sp));
        record->push_back(std::move(r));
      }
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

void run_gdn_case(GdnDims dm, int steps, uint32_t seed) {
  std::mt19937 g(seed);
  const int C = dm.conv_dim(), Hv = dm.n_v_heads, Dv = dm.v_dim;
  const size_t nS = (size_t)Hv * dm.k_dim * Dv;
  auto cw = randv((size_t)C * 4, g, -0.6f, 0.6f), alog = randv(Hv, g, -2, 1), dtb = randv(Hv, g, -1, 1);
  auto nw = randv(Dv, g, 0.5f, 1.5f);
  auto S0 = randv(nS, g, -0.3f, 0.3f);
  GdnRef<double> r64{dm, std::vector<double>(S0.begin(), S0.end()), {}};
  GdnRef<float> r32{dm, S0, {}};
  float *dcw = to_dev(cw), *dal = to_dev(alog), *ddt = to_dev(dtb), *dnw = to_dev(nw), *dS = to_dev(S0);
  float* ring = poisoned((size_t)4 * C);  // earlier-than-start taps must never be read
  int* dpos = to_dev(std::vector<int>{0});
  for (int t = 0; t < steps; ++t) {
    auto qkv = randv(C, g, -2, 2), z = randv((size_t)Hv * Dv, g, -2, 2), a = randv(Hv, g, -2, 2), b = randv(Hv, g, -2, 2);
    float *dqkv = to_dev(qkv), *dz = to_dev(z), *da = to_dev(a), *db = to_dev(b), *dout = poisoned((size_t)Hv * Dv);
    CUDA_CHECK(cudaMemcpy(dpos, &t, sizeof(int), cudaMemcpyHostToDevice));
    launch_gdn_step(dqkv, dz, da, db, dcw, dal, ddt, dnw, ring, dS, dout, dpos, dm, 1e-6f, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    auto o64 = r64.step(qkv, z, a, b, cw, alog, dtb, nw);
    auto o32 = r32.step(qkv, z, a, b, cw, alog, dtb, nw);
    char name[96];
    std::snprintf(name, sizeof name, "gdn out Dk%d Dv%d t%d", dm.k_dim, Dv, t);
    expect_close(name, from_dev(dout, o64.size()), o64, std::vector<float>(o32.begin(), o32.end()), 2e-5);
    std::snprintf(name, sizeof name, "gdn state Dk%d Dv%d t%d", dm.k_dim, Dv, t);
    expect_close(name, from_dev(dS, nS), r64.S, r32.S, 2e-6);
    for (float* p : {dqkv, dz, da, db, dout}) cudaFree(p);
  }
  for (float* p : {dcw, dal, ddt, dnw, dS, ring}) cudaFree(p);
  cudaFree(dpos);
}

// A prompt chunk (launch_gdn_chunk, kernels/gdn_chunk.cu): `before` tokens through the decode step first (the
// ring and state then hold history; before < 3 leaves taps before the sequence start), then `n` tokens in one
// launch against the reference token by token (every output, the final state), then one more decode step, which
// reads the ring the chunk left.
void run_gdn_chunk_case(GdnDims dm, int before, int n, uint32_t seed) {
  std::mt19937 g(seed);
  const int C = dm.conv_dim(), Hv = dm.n_v_heads, Dv = dm.v_dim, VD = Hv * Dv;
  const size_t nS = (size_t)Hv * dm.k_dim * Dv;
  auto cw = randv((size_t)C * 4, g, -0.6f, 0.6f), alog = randv(Hv, g, -2, 1), dtb = randv(Hv, g, -1, 1);
  auto nw = randv(Dv, g, 0.5f, 1.5f);
  auto S0 = randv(nS, g, -0.3f, 0.3f);
  GdnRef<double> r64{dm, std::vector<double>(S0.begin(), S0.end()), {}};
  GdnRef<float> r32{dm, S0, {}};
  float *dcw = to_dev(cw), *dal = to_dev(alog), *ddt = to_dev(dtb), *dnw = to_dev(nw), *dS = to_dev(S0);
  float* ring = poisoned((size_t)4 * C);  // earlier-than-start taps must never be read
  int* dpos = to_dev(std::vector<int>{0});
  auto one_step = [&](int t, const char* what) {
    auto qkv = randv(C, g, -2, 2), z = randv(VD, g, -2, 2), a = randv(Hv, g, -2, 2), b = randv(Hv, g, -2, 2);
    float *dqkv = to_dev(qkv), *dz = to_dev(z), *da = to_dev(a), *db = to_dev(b), *dout = poisoned(VD);
    CUDA_CHECK(cudaMemcpy(dpos, &t, sizeof(int), cudaMemcpyHostToDevice));
    launch_gdn_step(dqkv, dz, da, db, dcw, dal, ddt, dnw, ring, dS, dout, dpos, dm, 1e-6f, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    auto o64 = r64.step(qkv, z, a, b, cw, alog, dtb, nw);
    auto o32 = r32.step(qkv, z, a, b, cw, alog, dtb, nw);
    if (what) expect_close(what, from_dev(dout, VD), o64, std::vector<float>(o32.begin(), o32.end()), 2e-5);
    for (float* p : {dqkv, dz, da, db, dout}) cudaFree(p);
  };
  for (int t = 0; t < before; ++t) one_step(t, nullptr);
  std::vector<float> qkv, z, a, b;
  std::vector<double> o64;
  std::vector<float> o32;
  for (int t = 0; t < n; ++t) {
    auto q1 = randv(C, g, -2, 2), z1 = randv(VD, g, -2, 2), a1 = randv(Hv, g, -2, 2), b1 = randv(Hv, g, -2, 2);
    auto e64 = r64.step(q1, z1, a1, b1, cw, alog, dtb, nw);
    auto e32 = r32.step(q1, z1, a1, b1, cw, alog, dtb, nw);
    qkv.insert(qkv.end(), q1.begin(), q1.end()), z.insert(z.end(), z1.begin(), z1.end());
    a.insert(a.end(), a1.begin(), a1.end()), b.insert(b.end(), b1.begin(), b1.end());
    o64.insert(o64.end(), e64.begin(), e64.end()), o32.insert(o32.end(), e32.begin(), e32.end());
  }
  float *dqkv = to_dev(qkv), *dz = to_dev(z), *da = to_dev(a), *db = to_dev(b), *dout = poisoned((size_t)n * VD);
  void* scratch = nullptr;
  CUDA_CHECK(cudaMalloc(&scratch, gdn_chunk_scratch_bytes(n, dm, false)));
  launch_gdn_chunk(dqkv, dz, da, db, dcw, dal, ddt, dnw, ring, dS, dout, scratch, before, n, dm, 1e-6f, false, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  char name[96];
  std::snprintf(name, sizeof name, "gdn chunk Dk%d Dv%d +%d x%d", dm.k_dim, Dv, before, n);
  expect_close(name, from_dev(dout, (size_t)n * VD), o64, o32, 2e-5);
  std::snprintf(name, sizeof name, "gdn chunk state Dk%d Dv%d", dm.k_dim, Dv);
  expect_close(name, from_dev(dS, nS), r64.S, r32.S, 2e-6);
  std::snprintf(name, sizeof name, "gdn step after chunk Dk%d Dv%d", dm.k_dim, Dv);
  one_step(before + n, name);
  for (float* p : {dqkv, dz, da, db, dout, dcw, dal, ddt, dnw, dS, ring}) cudaFree(p);
  cudaFree(dpos);
  cudaFree(scratch);
}

TEST(MixerKernels, GdnChunkRealShape) {
  run_gdn_chunk_case(GdnDims{16, 32, 128, 128}, 0, 37, 6);
  run_gdn_chunk_case(GdnDims{16, 32, 128, 128}, 5, 2, 7);
  run_gdn_chunk_case(GdnDims{16, 32, 128, 128}, 5, 200, 10);  // 7 staged (and prep) 32-token batches, the last of 8
}
TEST(MixerKernels, GdnChunkTinyAndOddShapes) {
  run_gdn_chunk_case(GdnDims{2, 4, 32, 32}, 2, 9, 8);
  run_gdn_chunk_case(GdnDims{3, 6, 47, 36}, 1, 13, 9);
  run_gdn_chunk_case(GdnDims{2, 4, 32, 32}, 2, 128, 11);  // whole staged batches
  run_gdn_chunk_case(GdnDims{3, 6, 47, 36}, 1, 150, 12);
}

// ---- the chunked (WY) form (launch_gdn_chunk with wy, kernels/gdn_wy.cu) ----
double f16(double x) { return double(__half2float(__float2half_rn(float(x)))); }
double f16x2(double x) {  // two fp16 terms (of the value's fp32 rounding, as the kernels hold it)
  const double hi = f16(x);
  return hi + f16(double(float(x)) - hi);
}

// The chunked form with the kernel's roundings (W and the state S_0 one fp16 term; q, Kd, P and Δ two; the
// rest in double): the same-precision reference whose error sets the tolerance. rec: the recurrence
// inputs of tokens pos0.. per (token, value head) (GdnRef::record); S [Hv][Dk][Dv] updated; returns the gated
// outputs [n][Hv*Dv].
std::vector<double> wy_emulate(GdnDims dm, std::vector<double>& S, const std::vector<std::vector<double>>& rec,
                               int pos0, int n, const std::vector<float>& z, const std::vector<float>& nw) {
  const int Dk = dm.k_dim, Dv = dm.v_dim, Hv = dm.n_v_heads, L = 64;
  std::vector<double> o((size_t)n * Hv * Dv, 0.0);
  for (int h = 0; h < Hv; ++h) {
    double* Sh = &S[(size_t)h * Dk * Dv];
    for (int p0 = pos0 / L * L; p0 < pos0 + n; p0 += L) {
      std::vector<double> q((size_t)L * Dk, 0), k((size_t)L * Dk, 0), v((size_t)L * Dv, 0), beta(L, 0), lg(L, 0);
      double acc = 0;
      for (int r = 0; r < L; ++r) {
        const int tok = p0 + r - pos0;
        if (tok >= 0 && tok < n) {
          const std::vector<double>& e = rec[(size_t)tok * Hv + h];
          std::copy(e.begin(), e.begin() + Dk, q.begin() + (size_t)r * Dk);
          std::copy(e.begin() + Dk, e.begin() + 2 * Dk, k.begin() + (size_t)r * Dk);
          std::copy(e.begin() + 2 * Dk, e.begin() + 2 * Dk + Dv, v.begin() + (size_t)r * Dv);
          beta[r] = e[2 * Dk + Dv], acc += e[2 * Dk + Dv + 1];
        }
        lg[r] = acc;
      }
      auto dot = [&](const std::vector<double>& x, int i, int j) {
        double s = 0;
        for (int d = 0; d < Dk; ++d) s += x[(size_t)i * Dk + d] * k[(size_t)j * Dk + d];
        return s;
      };
      std::vector<double> A((size_t)L * L, 0), P((size_t)L * L, 0);
      for (int i = 0; i < L; ++i)
        for (int j = 0; j <= i; ++j) {
          const double ratio = std::exp(lg[i] - lg[j]);
          if (j < i) A[(size_t)i * L + j] = beta[i] * dot(k, i, j) * ratio;
          P[(size_t)i * L + j] = f16x2(dot(q, i, j) * ratio);
        }
      std::vector<double> W((size_t)L * Dk), U((size_t)L * Dv);
      for (int i = 0; i < L; ++i) {
        for (int d = 0; d < Dk; ++d) {
          double x = beta[i] * std::exp(lg[i]) * k[(size_t)i * Dk + d];
          for (int j = 0; j < i; ++j) x -= A[(size_t)i * L + j] * W[(size_t)j * Dk + d];
          W[(size_t)i * Dk + d] = x;
        }
        for (int c = 0; c < Dv; ++c) {
          double x = beta[i] * v[(size_t)i * Dv + c];
          for (int j = 0; j < i; ++j) x -= A[(size_t)i * L + j] * U[(size_t)j * Dv + c];
          U[(size_t)i * Dv + c] = x;
        }
      }
      std::vector<double> Se((size_t)Dk * Dv), D((size_t)L * Dv);
      for (size_t e = 0; e < Se.size(); ++e) Se[e] = f16(Sh[e]);
      for (int i = 0; i < L; ++i)
        for (int c = 0; c < Dv; ++c) {
          double d = double(float(U[(size_t)i * Dv + c]));
          for (int dd = 0; dd < Dk; ++dd) d -= f16(W[(size_t)i * Dk + dd]) * Se[(size_t)dd * Dv + c];
          const double hi = f16(d);
          D[(size_t)i * Dv + c] = hi + f16(d - hi);
        }
      const double gl = std::exp(lg[L - 1]);
      for (int i = 0; i < L; ++i) {
        const int tok = p0 + i - pos0;
        if (tok < 0 || tok >= n) continue;
        for (int c = 0; c < Dv; ++c) {
          double sq = 0, pd = 0;
          for (int dd = 0; dd < Dk; ++dd) sq += f16x2(q[(size_t)i * Dk + dd]) * Se[(size_t)dd * Dv + c];
          for (int j = 0; j <= i; ++j) pd += P[(size_t)i * L + j] * D[(size_t)j * Dv + c];
          o[((size_t)tok * Hv + h) * Dv + c] = std::exp(lg[i]) * sq + pd;
        }
      }
      for (int dd = 0; dd < Dk; ++dd)
        for (int c = 0; c < Dv; ++c) {
          double s = gl * Sh[(size_t)dd * Dv + c];
          for (int i = 0; i < L; ++i)
            s += f16x2(k[(size_t)i * Dk + dd] * std::exp(lg[L - 1] - lg[i])) * D[(size_t)i * Dv + c];
          Sh[(size_t)dd * Dv + c] = s;
        }
    }
  }
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < Hv; ++h) {
      double* row = &o[((size_t)t * Hv + h) * Dv];
      double ss = 0;
      for (int c = 0; c < Dv; ++c) ss += row[c] * row[c];
      const double r = 1 / std::sqrt(ss / Dv + 1e-6);
      for (int c = 0; c < Dv; ++c) row[c] = row[c] * r * nw[c] * silu_t(double(z[((size_t)t * Hv + h) * Dv + c]));
    }
  return o;
}

// `before` tokens through the decode step, then n tokens in one chunked-form launch (or two, split at `split`
// tokens into the launch), against the fp64 recurrence with the tolerance set by wy_emulate's error; then one
// more decode step from the chunk's state and ring. alog_shift strengthens the decays (exp(A_log) up to e^3).
struct WyRun {
  std::vector<float> out, S;
};
WyRun run_gdn_wy_case(GdnDims dm, int before, int n, uint32_t seed, float alog_shift = 0, int split = 0) {
  std::mt19937 g(seed);
  const int C = dm.conv_dim(), Hv = dm.n_v_heads, Dv = dm.v_dim, VD = Hv * Dv;
  const size_t nS = (size_t)Hv * dm.k_dim * Dv;
  auto cw = randv((size_t)C * 4, g, -0.6f, 0.6f), alog = randv(Hv, g, -2 + alog_shift, 1 + alog_shift);
  auto dtb = randv(Hv, g, -1, 1), nw = randv(Dv, g, 0.5f, 1.5f), S0 = randv(nS, g, -0.3f, 0.3f);
  GdnRef<double> r64{dm, std::vector<double>(S0.begin(), S0.end()), {}};
  float *dcw = to_dev(cw), *dal = to_dev(alog), *ddt = to_dev(dtb), *dnw = to_dev(nw), *dS = to_dev(S0);
  float* ring = poisoned((size_t)4 * C);
  int* dpos = to_dev(std::vector<int>{0});
  auto step_inputs = [&] {
    return std::array<std::vector<float>, 4>{randv(C, g, -2, 2), randv(VD, g, -2, 2), randv(Hv, g, -2, 2),
                                             randv(Hv, g, -2, 2)};
  };
  auto gpu_step = [&](const std::array<std::vector<float>, 4>& in, int t) {
    float *dqkv = to_dev(in[0]), *dz = to_dev(in[1]), *da = to_dev(in[2]), *db = to_dev(in[3]), *dout = poisoned(VD);
    CUDA_CHECK(cudaMemcpy(dpos, &t, sizeof(int), cudaMemcpyHostToDevice));
    launch_gdn_step(dqkv, dz, da, db, dcw, dal, ddt, dnw, ring, dS, dout, dpos, dm, 1e-6f, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    auto o = from_dev(dout, VD);
    for (float* p : {dqkv, dz, da, db, dout}) cudaFree(p);
    return o;
  };
  for (int t = 0; t < before; ++t) {
    auto in = step_inputs();
    gpu_step(in, t);
    r64.step(in[0], in[1], in[2], in[3], cw, alog, dtb, nw);
  }
  std::vector<double> S_emu = r64.S;
  std::vector<std::vector<double>> rec;
  r64.record = &rec;
  std::vector<float> qkv, z, a, b;
  std::vector<double> o64;
  for (int t = 0; t < n; ++t) {
    auto in = step_inputs();
    auto e64 = r64.step(in[0], in[1], in[2], in[3], cw, alog, dtb, nw);
    qkv.insert(qkv.end(), in[0].begin(), in[0].end()), z.insert(z.end(), in[1].begin(), in[1].end());
    a.insert(a.end(), in[2].begin(), in[2].end()), b.insert(b.end(), in[3].begin(), in[3].end());
    o64.insert(o64.end(), e64.begin(), e64.end());
  }
  r64.record = nullptr;
  const std::vector<double> emu = wy_emulate(dm, S_emu, rec, before, n, z, nw);
  float *dqkv = to_dev(qkv), *dz = to_dev(z), *da = to_dev(a), *db = to_dev(b), *dout = poisoned((size_t)n * VD);
  void* scratch = nullptr;
  CUDA_CHECK(cudaMalloc(&scratch, gdn_chunk_scratch_bytes(n, dm, true)));
  for (const auto [t0, m] : {std::pair{0, split > 0 ? split : n}, std::pair{split, split > 0 ? n - split : 0}})
    if (m > 0)
      launch_gdn_chunk(dqkv + (size_t)t0 * C, dz + (size_t)t0 * VD, da + (size_t)t0 * Hv, db + (size_t)t0 * Hv, dcw,
                       dal, ddt, dnw, ring, dS, dout + (size_t)t0 * VD, scratch, before + t0, m, dm, 1e-6f, true, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  WyRun run{from_dev(dout, (size_t)n * VD), from_dev(dS, nS)};
  char name[96];
  std::snprintf(name, sizeof name, "gdn wy Dv%d Hv%d +%d x%d", Dv, Hv, before, n);
  expect_close(name, run.out, o64, std::vector<float>(emu.begin(), emu.end()), 1e-6);
  std::snprintf(name, sizeof name, "gdn wy state Dv%d Hv%d", Dv, Hv);
  expect_close(name, run.S, r64.S, std::vector<float>(S_emu.begin(), S_emu.end()), 1e-6);
  // one decode step from the chunk's state and ring, against the fp64 step from the exact state and from the
  // emulation's (the latter's error sets the tolerance)
  GdnRef<double> r_emu{dm, S_emu, r64.hist};
  auto in = step_inputs();
  const auto next = gpu_step(in, before + n);
  const auto n64 = r64.step(in[0], in[1], in[2], in[3], cw, alog, dtb, nw);
  const auto nemu = r_emu.step(in[0], in[1], in[2], in[3], cw, alog, dtb, nw);
  std::snprintf(name, sizeof name, "gdn step after wy Dv%d Hv%d", Dv, Hv);
  expect_close(name, next, n64, std::vector<float>(nemu.begin(), nemu.end()), 1e-5);
  for (float* p : {dqkv, dz, da, db, dout, dcw, dal, ddt, dnw, dS, ring}) cudaFree(p);
  cudaFree(dpos);
  cudaFree(scratch);
  return run;
}

TEST(MixerKernels, GdnWyRealShape) {
  const GdnDims real{16, 32, 128, 128};
  run_gdn_wy_case(real, 0, 37, 21);    // one partial piece from position 0
  run_gdn_wy_case(real, 5, 200, 22);   // a piece started before the launch, whole pieces, a partial last
  run_gdn_wy_case(real, 64, 1, 23);    // a one-token launch on the grid
  run_gdn_wy_case(real, 70, 600, 24);  // ten pieces
  run_gdn_wy_case(real, 3, 150, 25, 2.5f);  // decays down to e^-60 per token: Γ underflows within a piece
}
TEST(MixerKernels, GdnWySmallShape) {
  run_gdn_wy_case(GdnDims{2, 4, 128, 64}, 3, 100, 26);   // two column blocks per head
  run_gdn_wy_case(GdnDims{1, 3, 128, 32}, 0, 130, 27);  // three value heads per key head, one column block
  run_gdn_wy_case(GdnDims{1, 2, 128, 32}, 1, 2200, 29);  // more pieces than one work area holds
}
// Two launches split on the grid give the one launch's bits (what prefix resumes rely on).
TEST(MixerKernels, GdnWySplitOnTheGridKeepsTheBits) {
  const GdnDims real{16, 32, 128, 128};
  const WyRun whole = run_gdn_wy_case(real, 10, 300, 28);
  const WyRun split = run_gdn_wy_case(real, 10, 300, 28, 0.f, 118);  // the second launch from position 128
  EXPECT_EQ(whole.out, split.out);
  EXPECT_EQ(whole.S, split.S);
}

// Several sequences' steps in one launch (launch_gdn_step_rows) at scattered rows of a larger buffer, each at its
// own position with its own ring and state: bit for bit the one-sequence launch (same arithmetic), which the cases
// above hold against the fp64 reference. Rows not listed stay unwritten.
void run_gdn_rows_case(GdnDims dm, int seqs, uint32_t seed) {
  std::mt19937 g(seed);
  const int C = dm.conv_dim(), Hv = dm.n_v_heads, Dv = dm.v_dim, VD = Hv * Dv, rows = 2 * seqs + 1;
  const size_t nS = (size_t)Hv * dm.k_dim * Dv;
  auto cw = randv((size_t)C * 4, g, -0.6f, 0.6f), alog = randv(Hv, g, -2, 1), dtb = randv(Hv, g, -1, 1);
  auto nw = randv(Dv, g, 0.5f, 1.5f);
  auto qkv = randv((size_t)rows * C, g, -2, 2), z = randv((size_t)rows * VD, g, -2, 2);
  auto a = randv((size_t)rows * Hv, g, -2, 2), b = randv((size_t)rows * Hv, g, -2, 2);
  float *dcw = to_dev(cw), *dal = to_dev(alog), *ddt = to_dev(dtb), *dnw = to_dev(nw);
  float *dqkv = to_dev(qkv), *dz = to_dev(z), *da = to_dev(a), *db = to_dev(b);
  std::vector<int> row(seqs), pos(seqs);
  std::vector<float*> ring1(seqs), ring2(seqs), S1(seqs), S2(seqs);
  for (int q = 0; q < seqs; ++q) {
    row[q] = 2 * (seqs - 1 - q) + 1;  // descending, every other row
    pos[q] = (q * 7) % 11;            // 0 (no earlier taps), short and longer histories
    auto ring0 = randv((size_t)4 * C, g, -1, 1), S0 = randv(nS, g, -0.3f, 0.3f);
    ring1[q] = to_dev(ring0), ring2[q] = to_dev(ring0), S1[q] = to_dev(S0), S2[q] = to_dev(S0);
  }
  float* out1 = poisoned((size_t)rows * VD);
  float* out2 = poisoned((size_t)rows * VD);
  int* dpos = to_dev(pos);
  for (int q = 0; q < seqs; ++q) {
    const size_t r = (size_t)row[q];
    launch_gdn_step(dqkv + r * C, dz + r * VD, da + r * Hv, db + r * Hv, dcw, dal, ddt, dnw, ring1[q], S1[q],
                    out1 + r * VD, dpos + q, dm, 1e-6f, 0);
  }
  std::vector<int> dec(row);
  dec.insert(dec.end(), pos.begin(), pos.end());
  int* ddec = to_dev(dec);
  std::vector<float*> ptrs(ring2);
  ptrs.insert(ptrs.end(), S2.begin(), S2.end());
  float** dptrs = to_dev(ptrs);
  launch_gdn_step_rows(dqkv, dz, da, db, dcw, dal, ddt, dnw, GdnStepRows{ddec, ddec + seqs, dptrs, dptrs + seqs},
                       seqs, out2, dm, 1e-6f, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto o1 = from_dev(out1, (size_t)rows * VD), o2 = from_dev(out2, (size_t)rows * VD);
  EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)), 0) << "outputs (unlisted rows: NaN in both)";
  for (int q = 0; q < seqs; ++q) {
    EXPECT_EQ(from_dev(S1[q], nS), from_dev(S2[q], nS)) << "state of sequence " << q;
    EXPECT_EQ(from_dev(ring1[q], (size_t)4 * C), from_dev(ring2[q], (size_t)4 * C)) << "ring of sequence " << q;
    for (float* p : {ring1[q], ring2[q], S1[q], S2[q]}) cudaFree(p);
  }
  for (float* p : {dcw, dal, ddt, dnw, dqkv, dz, da, db, out1, out2}) cudaFree(p);
  cudaFree(dpos);
  cudaFree(ddec);
  cudaFree(dptrs);
}

TEST(MixerKernels, GdnStepRowsMatchOneSequenceLaunches) {
  run_gdn_rows_case(GdnDims{16, 32, 128, 128}, 5, 21);
  run_gdn_rows_case(GdnDims{3, 6, 47, 36}, 3, 22);
}

TEST(MixerKernels, GdnStepRealShape) { run_gdn_case(GdnDims{16, 32, 128, 128}, 5, 3); }
TEST(MixerKernels, GdnStepTinyShape) { run_gdn_case(GdnDims{2, 4, 32, 32}, 5, 4); }
TEST(MixerKernels, GdnStepOddShape) { run_gdn_case(GdnDims{3, 6, 47, 36}, 5, 5); }

// ---------------- decode attention ----------------
// Reference over the bf16 cache contents for heads [h0, h1); out [n_heads * d] (only those heads filled).
template <typename T>
std::vector<T> attention_ref(const std::vector<T>& q, const std::vector<float>& qg,
                             const std::vector<std::vector<uint16_t>>& pages, const PagedCache& cache, int len,
                             int n_heads, int h0, int h1) {
  const int d = cache.kv.head_dim, group = n_heads / cache.kv.n_kv, P = cache.kv.page_tokens;
  std::vector<T> out((size_t)n_heads * d, T(0));
  std::vector<T> s(len);
  for (int h = h0; h < h1; ++h) {
    const int g = h / group;
    T mx = -INFINITY;
    for (int t = 0; t < len; ++t) {
      const uint16_t* kr = pages[t / P].data() + cache.offset(0, g, t);
      T dot = 0;
      for (int i = 0; i < d; ++i) dot += T(q[(size_t)h * d + i]) * T(bf16_to_f32(kr[i]));
      s[t] = dot / std::sqrt(T(d));
      mx = std::max(mx, s[t]);
    }
    T den = 0;
    for (int t = 0; t < len; ++t) s[t] = std::exp(s[t] - mx), den += s[t];
    for (int t = 0; t < len; ++t) {
      const uint16_t* vr = pages[t / P].data() + cache.offset(1, g, t);
      for (int i = 0; i < d; ++i) out[(size_t)h * d + i] += s[t] / den * T(bf16_to_f32(vr[i]));
    }
    for (int i = 0; i < d; ++i) {
      const T gate = T(qg[(size_t)h * 2 * d + d + i]);
      out[(size_t)h * d + i] /= T(1) + std::exp(-gate);
    }
  }
  return out;
}

// A random bf16 cache in `cache`'s pages (P tokens each), with its host copy for the references.
std::vector<std::vector<uint16_t>> random_cache(const PagedCache& cache, int P, int n_kv, int d, std::mt19937& g) {
  const size_t elems = kv_page_elems(P, n_kv, d);
  std::vector<std::vector<uint16_t>> host(cache.pages.size(), std::vector<uint16_t>(elems));
  std::uniform_real_distribution<float> kd(-2.f, 2.f);
  for (size_t p = 0; p < host.size(); ++p) {
    for (auto& x : host[p]) x = f32_to_bf16(kd(g));
    CUDA_CHECK(cudaMemcpy(cache.pages[p], host[p].data(), elems * 2, cudaMemcpyHostToDevice));
  }
  return host;
}

// The K and V rows the kernel appended for KV head kh at pos (from raw k [d], v [d]): K against the reference
// norm + RoPE within one bf16 rounding step, V exactly; then copied into the host cache for the references.
void check_appended(const PagedCache& cache, std::vector<std::vector<uint16_t>>& host, int P, const float* k,
                    const float* v, const std::vector<float>& kn, int d, int rope, int pos, double theta, int kh) {
  auto kr = norm_rope_ref<double>(k, kn.data(), d, rope, pos, theta);
  auto kr32 = norm_rope_ref<float>(k, kn.data(), d, rope, pos, theta);
  double e32 = 0;  // fp32 angles at large positions cost ~1e-3 (the same in both fp32 computations)
  for (int i = 0; i < d; ++i) e32 = std::max(e32, std::fabs(kr32[i] - kr[i]));
  auto kg = from_dev(cache.pages[pos / P] + cache.offset(0, kh, pos), d);
  auto vg = from_dev(cache.pages[pos / P] + cache.offset(1, kh, pos), d);
  for (int i = 0; i < d; ++i) {
    ASSERT_NEAR(bf16_to_f32(kg[i]), kr[i], std::fabs(kr[i]) * (1.0 / 256) + 2 * e32 + 1e-6)
        << "k head " << kh << " " << i << " pos " << pos;
    ASSERT_EQ(vg[i], f32_to_bf16(v[i])) << "v head " << kh << " " << i << " pos " << pos;
  }
  std::copy(kg.begin(), kg.end(), host[pos / P].begin() + cache.offset(0, kh, pos));
  std::copy(vg.begin(), vg.end(), host[pos / P].begin() + cache.offset(1, kh, pos));
}

// Every head's q normed and rotated at pos (from one token's q|gate rows), fp64 and fp32.
void q_refs(const float* qg, const std::vector<float>& qn, int n_heads, int d, int rope, int pos, double theta,
            std::vector<double>& q64, std::vector<float>& q32) {
  for (int h = 0; h < n_heads; ++h) {
    auto a = norm_rope_ref<double>(&qg[(size_t)h * 2 * d], qn.data(), d, rope, pos, theta);
    auto b = norm_rope_ref<float>(&qg[(size_t)h * 2 * d], qn.data(), d, rope, pos, theta);
    q64.insert(q64.end(), a.begin(), a.end());
    q32.insert(q32.end(), b.begin(), b.end());
  }
}

// The attention of the token at len - 1 from its raw inputs (q|gate, k, v; the kernel normalises and rotates q
// and k and appends k, v to the cache) over a random bf16 cache: the appended row against the reference norm +
// RoPE, then the output against a reference over the cache as the kernel left it.
void run_attention_case(int n_heads, int n_kv, int d, int len, int splits, int check_heads, uint32_t seed) {
  std::mt19937 g(seed);
  const int P = 1024, rope = d / 4, pos = len - 1;
  const double theta = d == 256 ? 1e7 : 1e6;
  PagedCache cache(len, P, n_kv, d);
  std::vector<std::vector<uint16_t>> host = random_cache(cache, P, n_kv, d, g);
  auto qg = randv((size_t)n_heads * 2 * d, g, -2, 2), k = randv((size_t)n_kv * d, g, -2, 2);
  auto v = randv((size_t)n_kv * d, g), qn = randv(d, g, 0.5f, 1.5f), kn = randv(d, g, 0.5f, 1.5f);
  const int group = n_heads / n_kv;
  AttnScratch sc;
  sc.max_splits = 128;
  CUDA_CHECK(cudaMalloc(&sc.partial, attn_scratch_floats(n_kv, sc.max_splits, group, d) * sizeof(float)));
  AttnIn in;
  float *dqg = to_dev(qg), *dk = to_dev(k), *dv = to_dev(v), *dqn = to_dev(qn), *dkn = to_dev(kn);
  in.qg = dqg, in.k = dk, in.v = dv, in.q_norm = dqn, in.k_norm = dkn, in.eps = 1e-6f;
  attn_in_rope(in, rope, theta);
  float* dout = poisoned((size_t)n_heads * d);
  int* dpos = to_dev(std::vector<int>{pos});
  std::vector<float> first;
  for (int rep = 0; rep < 2; ++rep) {  // twice: the result must be bit-identical (fixed reduction order)
    launch_attention_decode(in, cache.kv, dpos, dout, sc, splits, n_heads, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    if (rep == 0) first = from_dev(dout, (size_t)n_heads * d);
  }
  for (int kh = 0; kh < n_kv; ++kh)  // the appended K and V rows
    ASSERT_NO_FATAL_FAILURE(
        check_appended(cache, host, P, &k[(size_t)kh * d], &v[(size_t)kh * d], kn, d, rope, pos, theta, kh));
  std::vector<double> q64;
  std::vector<float> q32;
  q_refs(qg.data(), qn, n_heads, d, rope, pos, theta, q64, q32);
  const int h1 = std::min(n_heads, check_heads);
  auto r64 = attention_ref<double>(q64, qg, host, cache, len, n_heads, 0, h1);
  auto r32 = attention_ref<float>(q32, qg, host, cache, len, n_heads, 0, h1);
  auto got = from_dev(dout, (size_t)n_heads * d);
  ASSERT_EQ(0, std::memcmp(first.data(), got.data(), got.size() * sizeof(float))) << "not deterministic, len " << len;
  for (size_t i = (size_t)h1 * d; i < got.size(); ++i) ASSERT_TRUE(std::isfinite(got[i])) << "head output " << i;
  got.resize((size_t)h1 * d);
  r64.resize(got.size());
  r32.resize(got.size());
  char name[96];
  std::snprintf(name, sizeof name, "attention d%d len%d splits%d", d, len, splits);
  expect_close(name, got, r64, r32, 1e-5);
  for (float* p : {dqg, dk, dv, dqn, dkn, dout, sc.partial}) cudaFree(p);
  cudaFree(dpos);
}

// Splits 66 = the engine's choice on 132 SMs. Lengths cover: one token (one split, one warp busy), exactly one
// and just over one 64-token split, 8-token step tails, splits whose warps get no step (4097: 65 splits of 7-8
// steps), several pipelined steps per warp (33000 at 66 and 128 splits), a single split walking everything.
TEST(MixerKernels, AttentionShort) {
  run_attention_case(16, 2, 256, 1, 66, 16, 6);
  run_attention_case(16, 2, 256, 64, 66, 16, 14);
  run_attention_case(16, 2, 256, 65, 66, 16, 15);
  run_attention_case(16, 2, 256, 77, 64, 16, 7);
  run_attention_case(16, 2, 256, 3001, 64, 16, 8);
  run_attention_case(16, 2, 256, 3001, 1, 16, 9);
  run_attention_case(16, 2, 256, 4097, 66, 16, 16);
  run_attention_case(16, 2, 256, 33000, 66, 16, 17);
  run_attention_case(16, 2, 256, 33000, 128, 16, 18);
}
TEST(MixerKernels, AttentionTinyShapes) {
  run_attention_case(4, 2, 32, 300, 64, 4, 10);
  run_attention_case(6, 2, 64, 1025, 7, 6, 11);
  run_attention_case(8, 1, 128, 513, 3, 8, 12);
}
// The attention kernel alone at 128K+ tokens against the CPU reference on a few heads of each KV head.
TEST(MixerKernels, AttentionLongContext) { run_attention_case(16, 2, 256, 131072 + 37, 66, 16, 13); }

// Several sequences' one-token attention in one pair of launches (launch_attention_decode_rows) at scattered rows,
// each over its own cache and length: bit for bit the one-sequence launch with the row's own split count
// (attention_row_splits; same arithmetic, held against the fp64 reference above), outputs and appended rows.
void run_attention_rows_case(int n_heads, int n_kv, int d, const std::vector<int>& lens, uint32_t seed) {
  std::mt19937 g(seed);
  const int P = 64, rope = d / 4, R = static_cast<int>(lens.size()), rows = 2 * R + 1;
  const double theta = 1e7;
  const int qr = n_heads * 2 * d, kvd = n_kv * d, od = n_heads * d, group = n_heads / n_kv;
  auto qg = randv((size_t)rows * qr, g, -2, 2), k = randv((size_t)rows * kvd, g, -2, 2);
  auto v = randv((size_t)rows * kvd, g), qn = randv(d, g, 0.5f, 1.5f), kn = randv(d, g, 0.5f, 1.5f);
  float *dqg = to_dev(qg), *dk = to_dev(k), *dv = to_dev(v), *dqn = to_dev(qn), *dkn = to_dev(kn);
  int splits = 1;
  for (int len : lens) splits = std::max(splits, attention_row_splits(len));
  AttnScratch sc;
  sc.max_splits = splits;
  CUDA_CHECK(cudaMalloc(&sc.partial, (size_t)R * attn_scratch_floats(n_kv, splits, group, d) * sizeof(float)));
  std::vector<std::unique_ptr<PagedCache>> one, many;
  std::vector<int> row(R), pos(R);
  std::vector<uint16_t**> tables;
  for (int q = 0; q < R; ++q) {
    row[q] = 2 * (R - 1 - q) + 1;
    pos[q] = lens[q] - 1;
    one.push_back(std::make_unique<PagedCache>(lens[q], P, n_kv, d));
    many.push_back(std::make_unique<PagedCache>(lens[q], P, n_kv, d));
    std::mt19937 gc(seed + 100 + q), gc2(seed + 100 + q);
    random_cache(*one[q], P, n_kv, d, gc);
    random_cache(*many[q], P, n_kv, d, gc2);
    tables.push_back(many[q]->table);
  }
  float* out1 = poisoned((size_t)rows * od);
  float* out2 = poisoned((size_t)rows * od);
  int* dpos = to_dev(pos);
  AttnIn in;
  in.q_norm = dqn, in.k_norm = dkn, in.eps = 1e-6f;
  attn_in_rope(in, rope, theta);
  for (int q = 0; q < R; ++q) {
    const size_t r = (size_t)row[q];
    in.qg = dqg + r * qr, in.k = dk + r * kvd, in.v = dv + r * kvd;
    launch_attention_decode(in, one[q]->kv, dpos + q, out1 + r * od, sc, attention_row_splits(lens[q]), n_heads, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<int> dec(row);
  dec.insert(dec.end(), pos.begin(), pos.end());
  int* ddec = to_dev(dec);
  uint16_t*** dtables = to_dev(tables);
  in.qg = dqg, in.k = dk, in.v = dv;
  KvPages kv = many[0]->kv;
  kv.pages = nullptr;
  launch_attention_decode_rows(in, kv, AttnRows{ddec, ddec + R, dtables}, R, out2, sc, splits, n_heads, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto o1 = from_dev(out1, (size_t)rows * od), o2 = from_dev(out2, (size_t)rows * od);
  EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)), 0) << "outputs, splits " << splits;
  for (int q = 0; q < R; ++q) {
    const size_t elems = kv_page_elems(P, n_kv, d);
    const int p = pos[q] / P;
    EXPECT_EQ(from_dev(one[q]->pages[p], elems), from_dev(many[q]->pages[p], elems)) << "appended row, sequence " << q;
    for (int kh = 0; kh < n_kv; ++kh)  // the row was appended at all
      EXPECT_EQ(from_dev(many[q]->pages[p] + many[q]->offset(1, kh, pos[q]), 1)[0],
                f32_to_bf16(v[(size_t)row[q] * kvd + (size_t)kh * d]))
          << "sequence " << q;
  }
  for (float* x : {dqg, dk, dv, dqn, dkn, out1, out2, sc.partial}) cudaFree(x);
  cudaFree(dpos);
  cudaFree(ddec);
  cudaFree(dtables);
}

TEST(MixerKernels, AttentionRowsMatchOneSequenceLaunches) {
  run_attention_rows_case(16, 2, 256, {1, 65, 513, 3001, 77, 20000}, 31);  // 1 to 32 splits
  std::vector<int> lens;
  for (int q = 0; q < 70; ++q) lens.push_back(1 + (q * 137) % 1500);
  run_attention_rows_case(16, 2, 256, lens, 32);                            // 70 rows of 1-3 splits
  run_attention_rows_case(6, 2, 64, {9, 1, 130}, 33);
}

}  // namespace

// ---------------- attention over a prompt chunk ----------------
// n tokens at positions before.. in one launch (launch_attention_chunk) over a random bf16 cache of `before`
// tokens: the appended K rows against the reference norm + RoPE (within a bf16 step) and V rows exactly; then the
// outputs of the checked tokens (every `every`-th and the last) against the reference over the cache as the kernel
// left it, each token over [0, its position]; twice, bit-identical.
void run_attention_chunk_case(int n_heads, int n_kv, int d, int before, int n, int every, uint32_t seed,
                              bool one_term = false, bool wgmma = false) {
  std::mt19937 g(seed);
  const int P = 1024, rope = d / 4, len = before + n;
  const double theta = d == 256 ? 1e7 : 1e6;
  PagedCache cache(len, P, n_kv, d);
  std::vector<std::vector<uint16_t>> host = random_cache(cache, P, n_kv, d, g);
  auto qg = randv((size_t)n * n_heads * 2 * d, g, -2, 2), k = randv((size_t)n * n_kv * d, g, -2, 2);
  auto v = randv((size_t)n * n_kv * d, g), qn = randv(d, g, 0.5f, 1.5f), kn = randv(d, g, 0.5f, 1.5f);
  AttnIn in;
  float *dqg = to_dev(qg), *dk = to_dev(k), *dv = to_dev(v), *dqn = to_dev(qn), *dkn = to_dev(kn);
  in.qg = dqg, in.k = dk, in.v = dv, in.q_norm = dqn, in.k_norm = dkn, in.eps = 1e-6f;
  attn_in_rope(in, rope, theta);
  void* scratch = nullptr;
  CUDA_CHECK(cudaMalloc(&scratch, attention_chunk_scratch_bytes(n, n_heads, d)));
  const size_t n_out = (size_t)n * n_heads * d;
  float* dout = poisoned(n_out);
  std::vector<float> first;
  for (int rep = 0; rep < 2; ++rep) {
    launch_attention_chunk(in, cache.kv, before, n, n_heads, scratch, dout, 0, one_term, wgmma);
    CUDA_CHECK(cudaDeviceSynchronize());
    if (rep == 0) first = from_dev(dout, n_out);
  }
  const std::vector<float> got = from_dev(dout, n_out);
  ASSERT_EQ(0, std::memcmp(first.data(), got.data(), n_out * sizeof(float))) << "not deterministic";
  for (int t = 0; t < n; ++t) {  // the appended rows, copied into the host cache for the reference
    const int pos = before + t;
    for (int kh = 0; kh < n_kv; ++kh) {
      const size_t at = ((size_t)t * n_kv + kh) * d;
      ASSERT_NO_FATAL_FAILURE(check_appended(cache, host, P, &k[at], &v[at], kn, d, rope, pos, theta, kh));
    }
  }
  std::vector<float> gsel, r32sel;
  std::vector<double> r64sel;
  for (int t = 0; t < n; ++t) {
    if (t % every != 0 && t != n - 1) continue;
    const int pos = before + t;
    const size_t row = (size_t)n_heads * 2 * d;
    const std::vector<float> qgt(qg.begin() + t * row, qg.begin() + (t + 1) * row);
    std::vector<double> q64;
    std::vector<float> q32;
    q_refs(qgt.data(), qn, n_heads, d, rope, pos, theta, q64, q32);
    auto r64 = attention_ref<double>(q64, qgt, host, cache, pos + 1, n_heads, 0, n_heads);
    auto r32 = attention_ref<float>(q32, qgt, host, cache, pos + 1, n_heads, 0, n_heads);
    gsel.insert(gsel.end(), got.begin() + (size_t)t * n_heads * d, got.begin() + (size_t)(t + 1) * n_heads * d);
    r64sel.insert(r64sel.end(), r64.begin(), r64.end());
    r32sel.insert(r32sel.end(), r32.begin(), r32.end());
  }
  char name[96];
  std::snprintf(name, sizeof name, "attention chunk d%d +%d x%d%s%s", d, before, n, one_term ? " one term" : "",
                wgmma ? " wgmma" : "");
  // one term: q and p rounded to bf16 (2^-9 relative) before their products: a CPU emulation of these cases has
  // the largest error 6.5e-4 (d256) and 1.7e-3 (d64) with outputs of ~0.04 RMS, while one key dropped or the mask
  // one key off gives ~2e-2: so 5e-3
  expect_close(name, gsel, r64sel, r32sel, one_term ? 5e-3 : 1e-5);
  for (float* p : {dqg, dk, dv, dqn, dkn, dout}) cudaFree(p);
  cudaFree(scratch);
}

// A chunk from the sequence start (tokens attend to fewer keys than the block's last one), a chunk across a page
// boundary with an 8-token tail tile, one deep into a 33K cache; the test models' head sizes and groups.
TEST(MixerKernels, AttentionChunk) {
  run_attention_chunk_case(16, 2, 256, 0, 37, 1, 21);
  run_attention_chunk_case(16, 2, 256, 1000, 70, 3, 22);
  run_attention_chunk_case(16, 2, 256, 33000, 21, 10, 23);
  run_attention_chunk_case(4, 2, 32, 5, 9, 1, 24);
  run_attention_chunk_case(6, 2, 64, 100, 20, 1, 25);
  run_attention_chunk_case(8, 1, 128, 0, 17, 1, 26);
  // q and p in one bf16 term (KernelOptions::prompt_attn_one_term)
  run_attention_chunk_case(16, 2, 256, 1000, 70, 3, 27, true);
  run_attention_chunk_case(6, 2, 64, 100, 20, 1, 28, true);
  run_attention_chunk_case(8, 1, 128, 0, 17, 1, 29, true);
  run_attention_chunk_case(4, 2, 32, 5, 9, 1, 30, true);
  // the warpgroup-MMA kernel (one term, head_dim 256; KernelOptions::prompt_attn_wgmma): from the start, across a
  // page boundary, 33K deep, a chunk of 300 tokens (19 blocks of 16) whose keys end inside a 64-key tile
  run_attention_chunk_case(16, 2, 256, 0, 37, 1, 31, true, true);
  run_attention_chunk_case(16, 2, 256, 1000, 70, 3, 32, true, true);
  run_attention_chunk_case(16, 2, 256, 33000, 21, 10, 33, true, true);
  run_attention_chunk_case(16, 2, 256, 517, 300, 7, 34, true, true);
  run_attention_chunk_case(8, 1, 256, 64, 20, 1, 35, true, true);  // groups of 8, the test models' 8 heads
  run_attention_chunk_case(6, 2, 256, 100, 20, 1, 36, true, true);  // groups of 3: rows past the group are 0
}
