// What the GPU tests of the prompt GEMMs share (tests/gpu/test_batched.cu, tests/gpu/test_gemm_rows.cu): seeded
// inputs of varied magnitude, the x~ = hi + lo the tensor cores receive read back from a GemmX buffer, and the
// reference row dot product on it (see test_batched.cu's header for why the reference takes x~).
#pragma once
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/batched.h"

namespace lily::cuda::test {

inline bool no_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) != cudaSuccess || n == 0;
}

inline const char* fmt_name(QFormat f) { return f == QFormat::q4 ? "q4" : f == QFormat::q8 ? "q8" : "bf16"; }

template <typename T>
inline std::vector<T> to_host(const T* p, size_t n) {
  std::vector<T> v(n);
  CUDA_CHECK(cudaMemcpy(v.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost));
  return v;
}

struct XBuf {  // a GemmXBuf freed on scope exit (f16: with the fp16 form, which the q4 launches then take)
  GemmXBuf b;
  XBuf(int n, int K, bool f16 = false) : b(gemm_x_alloc(n, K, f16)) {}
  ~XBuf() { gemm_x_free(b); }
  XBuf(const XBuf&) = delete;
  XBuf& operator=(const XBuf&) = delete;
};

// x [n][ld] with varied magnitudes: per row 2^-3..2^3, per element another 2^-2..2^2 (never zero).
inline std::vector<float> random_x(std::mt19937_64& rng, int n, int ld) {
  std::uniform_int_distribution<int> e_row(-3, 3), e_el(-2, 2);
  std::vector<float> x = random_vec(rng, static_cast<size_t>(n) * ld);
  for (int t = 0; t < n; ++t) {
    const int er = e_row(rng);
    float* row = &x[static_cast<size_t>(t) * ld];
    for (int k = 0; k < ld; ++k) row[k] = std::ldexp(row[k], er + e_el(rng));
  }
  return x;
}

// The storage position of column c of a 64-element group (the inverse of gemm_x_col).
inline int pos_of(int c) {
  for (int p = 0; p < 64; ++p)
    if (gemm_x_col(p) == c) return p;
  return -1;
}

// The fp16 form of n rows (x~ = (hi + lo) inv): its terms as the tensor cores take them, [n][K] by column, and
// inv [n].
struct F16X {
  std::vector<float> hi, lo, inv;
};
// Reads it back from b; bad counts the elements outside |x - x~| <= 2^-20 |x| + 2^-24 inv (x [n][ldx]).
inline F16X f16_of(const GemmXBuf& b, int n, const std::vector<float>& x, int ldx, size_t& bad) {
  const size_t m = static_cast<size_t>(n) * b.K;
  const std::vector<uint16_t> hi = to_host(b.f16hi, m), lo = to_host(b.f16lo, m);
  F16X f{std::vector<float>(m), std::vector<float>(m), to_host(b.f16inv, n)};
  bad = 0;
  for (int t = 0; t < n; ++t)
    for (int k = 0; k < b.K; ++k) {
      const size_t i = static_cast<size_t>(t) * b.K + k;
      const size_t p = static_cast<size_t>(t) * b.K + (k / 64) * 64 + pos_of(k % 64);
      f.hi[i] = __half2float(__ushort_as_half(hi[p]));
      f.lo[i] = __half2float(__ushort_as_half(lo[p]));
      const double xt = (static_cast<double>(f.hi[i]) + f.lo[i]) * f.inv[t];
      const double xv = x[static_cast<size_t>(t) * ldx + k];
      if (!(std::fabs(xv - xt) <= std::ldexp(std::fabs(xv), -20) + std::ldexp(f.inv[t], -24))) ++bad;
    }
  return f;
}
// Its x~ alone, as split_of gives the bf16 terms'.
inline std::vector<double> f16_xt(const F16X& f, int K) {
  std::vector<double> xt(f.hi.size());
  for (size_t i = 0; i < xt.size(); ++i) xt[i] = (static_cast<double>(f.hi[i]) + f.lo[i]) * f.inv[i / K];
  return xt;
}

// x~ = hi + lo of the n rows in b ([n][K]); bad counts the elements outside |x - x~| <= 2^-16 |x| (x [n][ldx]).
// (The fp16 form's x~, which the q4 launches take where b has it: f16_of, f16_xt.)
inline std::vector<double> split_of(const GemmXBuf& b, int n, const std::vector<float>& x, int ldx, size_t& bad) {
  const size_t m = static_cast<size_t>(n) * b.K;
  const std::vector<uint16_t> hi = to_host(b.hi, m), lo = to_host(b.lo, m);
  std::vector<double> xt(m);
  bad = 0;
  for (int t = 0; t < n; ++t)
    for (int k = 0; k < b.K; ++k) {
      const size_t i = static_cast<size_t>(t) * b.K + k;  // column k, stored at position p (batched.h)
      const size_t p = static_cast<size_t>(t) * b.K + (k / 64) * 64 + pos_of(k % 64);
      xt[i] = static_cast<double>(bf16_to_f32(hi[p])) + bf16_to_f32(lo[p]);
      const double xv = x[static_cast<size_t>(t) * ldx + k];
      if (!(std::fabs(xv - xt[i]) <= std::ldexp(std::fabs(xv), -16))) ++bad;
    }
  return xt;
}

// Row r of matrix e as the GEMM applies it: w = sq + b, sq = scale * q (bf16: the weight) multiplies x~ and
// b = bias (bf16: 0) multiplies x (through the group sums). fp64 and fp32 copies.
struct RowW {
  std::vector<double> sq, b;
  std::vector<float> sq32, b32;
};
inline void row_w(const HostMat& h, int e, int r, RowW& w) {
  w.sq.resize(h.cols); w.b.resize(h.cols); w.sq32.resize(h.cols); w.b32.resize(h.cols);
  for (int k = 0; k < h.cols; ++k) {
    if (h.fmt == QFormat::bf16) {
      w.sq[k] = h.at(e, r, k); w.sq32[k] = h.at32(e, r, k); w.b[k] = 0; w.b32[k] = 0.f;
    } else {
      w.sq[k] = static_cast<double>(h.scale(e, r, k)) * h.q(e, r, k);
      w.sq32[k] = h.scale(e, r, k) * static_cast<float>(h.q(e, r, k));
      w.b[k] = w.b32[k] = h.bias(e, r, k);
    }
  }
}
// y = sum_k sq[k] x~[k] + b[k] x[k]: fp64, and a sequential fp32 sum for the tolerance.
inline void gemm_dot(const RowW& w, const double* xt, const float* x, int K, double& d64, float& d32) {
  d64 = 0; d32 = 0;
  for (int k = 0; k < K; ++k) {
    d64 += w.sq[k] * xt[k] + w.b[k] * x[k];
    d32 += w.sq32[k] * static_cast<float>(xt[k]) + w.b32[k] * x[k];
  }
}

// Row r of matrix e (q4) as the fp16-form kernel applies it: fp16(scale q + bias), rounded once.
inline std::vector<float> f16_row(const HostMat& h, int e, int r) {
  std::vector<float> w(h.cols);
  for (int k = 0; k < h.cols; ++k)
    w[k] = __half2float(__float2half_rn(h.scale(e, r, k) * static_cast<float>(h.q(e, r, k)) + h.bias(e, r, k)));
  return w;
}
// y = inv sum_k w[k] (hi[k] + lo[k]) of one token's fp16 form (hi, lo [K] by column): fp64, and in fp32 the way
// the tensor cores sum, for the tolerance: per group and k-step (16 positions, gemm_x_col's columns) the exact sum
// of the hi products added to the running sum, rounded toward zero, then the lo products'.
inline void gemm_dot_f16(const std::vector<float>& w, const float* hi, const float* lo, float inv, int K, double& d64,
                         float& d32) {
  auto rz = [](double v) {
    float f = static_cast<float>(v);
    if (std::fabs(f) > std::fabs(v)) f = std::nextafter(f, 0.f);
    return f;
  };
  d64 = 0;
  float acc = 0.f;
  for (int g = 0; g < K / 64; ++g)
    for (int ks = 0; ks < 4; ++ks)
      for (const float* term : {hi, lo}) {
        if (!term) continue;  // (one term)
        double s = 0;
        for (int i = 0; i < 16; ++i) {
          const int c = 64 * g + gemm_x_col(16 * ks + i);
          s += static_cast<double>(w[c]) * term[c];
        }
        d64 += s;
        acc = rz(acc + s);
      }
  d64 *= inv;
  d32 = acc * inv;
}

// The reference of a grouped launch: slot s of expert e (offsets[e] <= s < offsets[e + 1]) takes x row x_row[s]
// (xt its split form, x the values, both [..][K]); r64 / r32 [slots][rows] the fp64 and fp32 dot products.
// f16: the fp16 form's reference on its terms (gemm_dot_f16) instead.
inline void grouped_ref(const HostMat& h, const std::vector<int>& offsets, const std::vector<int>& x_row, int rows,
                        int K, const std::vector<double>& xt, const std::vector<float>& x, std::vector<double>& r64,
                        std::vector<float>& r32, const F16X* f16 = nullptr) {
  const int E = static_cast<int>(offsets.size()) - 1;
  r64.assign(static_cast<size_t>(offsets[E]) * rows, 0.0);
  r32.assign(r64.size(), 0.f);
  RowW w;
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < rows; ++r) {
      row_w(h, e, r, w);
      const std::vector<float> w16 = f16 ? f16_row(h, e, r) : std::vector<float>();
      for (int s = offsets[e]; s < offsets[e + 1]; ++s) {
        const size_t xi = static_cast<size_t>(x_row[s]) * K, i = static_cast<size_t>(s) * rows + r;
        if (f16)
          gemm_dot_f16(w16, &f16->hi[xi], &f16->lo[xi], f16->inv[x_row[s]], K, r64[i], r32[i]);
        else
          gemm_dot(w, &xt[xi], &x[xi], K, r64[i], r32[i]);
      }
    }
}

// A token's outputs do not depend on the launch's other tokens: y = W x over n_all tokens (x prepared in xb), then
// for each n in ns the first n tokens alone must give the same bits.
inline void expect_first_tokens_alone_same(const QMat& m, const GemmXBuf& xb, int n_all, int rows,
                                           std::initializer_list<int> ns, const char* what) {
  DevBuf<float> all(std::vector<float>(static_cast<size_t>(n_all) * rows, 0.f));
  gemm(m, 0, xb.view(), n_all, all.p, rows, false, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> ya = all.download();
  for (int n : ns) {
    DevBuf<float> part(std::vector<float>(static_cast<size_t>(n) * rows, 0.f));
    gemm(m, 0, xb.view(), n, part.p, rows, false, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> yp = part.download();
    EXPECT_EQ(0, std::memcmp(yp.data(), ya.data(), yp.size() * sizeof(float)))
        << what << ": the first " << n << " tokens alone differ from the same tokens among " << n_all;
  }
}

}  // namespace lily::cuda::test
