// The Gated DeltaNet prompt chunk in the chunked (WY) form on the tensor cores (kernels/gdn_wy.cu, through
// launch_gdn_chunk with wy on) against the token-by-token recurrence in fp64. Tolerance: 2x the larger error of
// two same-precision CPU references, the recurrence in fp32 and an emulation of the kernel's own arithmetic (the
// chunked form in fp32 with every product's operands as two bf16 terms, the lo x lo term dropped), plus a small
// absolute term; the worst elements are printed on failure. Cases: pieces cut at absolute multiples of 64 from
// odd starts, one- and two-token launches across a boundary, several pieces, and the decode step after.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/gdn_prep.cuh"
#include "kernels/mixers.h"
#include "mixer_ref.h"

using namespace lily;
using namespace lily::cuda;
using namespace lily::cuda::testing;

namespace {

float bf16r(float x) {  // round to nearest even bf16, back to float
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  float y;
  std::memcpy(&y, &u, 4);
  return y;
}
struct Split {
  float hi, lo;
};
Split split(float x) {
  const float h = bf16r(x);
  return {h, bf16r(x - h)};
}
float mul3(Split a, Split b) { return a.lo * b.hi + a.hi * b.lo + a.hi * b.hi; }

// The kernel's arithmetic on the CPU: the prep in fp32 (as GdnRef<float>), then pieces of 64 at absolute
// multiples of 64 in the chunked form, products of split operands summed in fp32.
struct WyEmu {
  GdnDims dm;
  std::vector<float> S;  // [Hv][Dk][Dv]
  std::vector<std::vector<float>> hist;
  // o (gated) for n tokens at pos0 ..: qkv [n][C], z [n][Hv Dv], a, b [n][Hv]
  std::vector<float> run(int pos0, int n, const std::vector<float>& qkv, const std::vector<float>& z,
                         const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& cw,
                         const std::vector<float>& alog, const std::vector<float>& dtb, const std::vector<float>& nw) {
    const int C = dm.conv_dim(), Dk = dm.k_dim, Dv = dm.v_dim, Hv = dm.n_v_heads, key = dm.n_k_heads * Dk;
    const int VD = Hv * Dv;
    std::vector<float> q((size_t)n * key), k((size_t)n * key), v((size_t)n * VD), beta((size_t)n * Hv),
        lg((size_t)n * Hv);
    for (int t = 0; t < n; ++t) {
      const float* x = &qkv[(size_t)t * C];
      std::vector<float> u(C);
      for (int c = 0; c < C; ++c) {
        float acc = cw[c * 4 + 3] * x[c];
        for (int back = 1; back <= 3; ++back)
          if ((int)hist.size() >= back) acc += cw[c * 4 + 3 - back] * hist[hist.size() - back][c];
        u[c] = silu_t(acc);
      }
      hist.emplace_back(x, x + C);
      for (int kh = 0; kh < dm.n_k_heads; ++kh) {
        float sq = 0, sk = 0;
        for (int i = 0; i < Dk; ++i) sq += u[kh * Dk + i] * u[kh * Dk + i], sk += u[key + kh * Dk + i] * u[key + kh * Dk + i];
        for (int i = 0; i < Dk; ++i) {
          q[(size_t)t * key + kh * Dk + i] = u[kh * Dk + i] / std::sqrt(sq + 1e-6f) / std::sqrt((float)Dk);
          k[(size_t)t * key + kh * Dk + i] = u[key + kh * Dk + i] / std::sqrt(sk + 1e-6f);
        }
      }
      for (int j = 0; j < VD; ++j) v[(size_t)t * VD + j] = u[2 * key + j];
      for (int h = 0; h < Hv; ++h) {
        beta[(size_t)t * Hv + h] = 1.f / (1.f + std::exp(-b[(size_t)t * Hv + h]));
        const float xa = a[(size_t)t * Hv + h] + dtb[h];
        lg[(size_t)t * Hv + h] = -std::exp(alog[h]) * (xa > 20.f ? xa : std::log1p(std::exp(xa)));
      }
    }
    std::vector<float> o((size_t)n * VD);
    for (int s0 = 0; s0 < n;) {
      const int len = std::min(n, s0 + 64 - (pos0 + s0) % 64) - s0;
      for (int h = 0; h < Hv; ++h) piece(h, s0, len, q, k, v, beta, lg, o);
      s0 += len;
    }
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < Hv; ++h) {
        float* r = &o[(size_t)t * VD + h * Dv];
        float ss = 0;
        for (int j = 0; j < Dv; ++j) ss += r[j] * r[j];
        const float rs = 1.f / std::sqrt(ss / Dv + 1e-6f);
        for (int j = 0; j < Dv; ++j) r[j] = r[j] * rs * nw[j] * silu_t(z[(size_t)t * VD + h * Dv + j]);
      }
    return o;
  }

  void piece(int h, int s0, int L, const std::vector<float>& q, const std::vector<float>& k,
             const std::vector<float>& v, const std::vector<float>& beta, const std::vector<float>& lg,
             std::vector<float>& o) {
    const int Dk = dm.k_dim, Dv = dm.v_dim, Hv = dm.n_v_heads, kh = h / (Hv / dm.n_k_heads);
    const int key = dm.n_k_heads * Dk, VD = Hv * Dv;
    auto qs = [&](int i, int d) { return split(q[(size_t)(s0 + i) * key + kh * Dk + d]); };
    auto ks = [&](int i, int d) { return split(k[(size_t)(s0 + i) * key + kh * Dk + d]); };
    std::vector<double> lam(L);  // (the kernel's running sums are fp64 too)
    std::vector<float> bt(L);
    double run = 0;
    for (int i = 0; i < L; ++i)
      run += std::max(lg[(size_t)(s0 + i) * Hv + h], -1e4f), lam[i] = run, bt[i] = beta[(size_t)(s0 + i) * Hv + h];
    auto ex = [](double x) { return std::exp((float)x); };
    std::vector<float> A((size_t)L * L, 0.f), P((size_t)L * L, 0.f);
    for (int i = 0; i < L; ++i)
      for (int j = 0; j <= i; ++j) {
        float kk = 0, qk = 0;
        for (int d = 0; d < Dk; ++d) kk += mul3(ks(i, d), ks(j, d)), qk += mul3(qs(i, d), ks(j, d));
        const float dec = ex(lam[i] - lam[j]);
        if (j < i) A[(size_t)i * L + j] = bt[i] * dec * kk;
        P[(size_t)i * L + j] = dec * qk;
      }
    // (I + A) [W | U] = [diag(beta Gam) K | diag(beta) V]
    std::vector<float> W((size_t)L * Dk), U((size_t)L * Dv);
    for (int i = 0; i < L; ++i) {
      for (int d = 0; d < Dk; ++d) {
        float acc = k[(size_t)(s0 + i) * key + kh * Dk + d] * (bt[i] * ex(lam[i]));
        for (int j = 0; j < i; ++j) acc = std::fma(-A[(size_t)i * L + j], W[(size_t)j * Dk + d], acc);
        W[(size_t)i * Dk + d] = acc;
      }
      for (int c = 0; c < Dv; ++c) {
        float acc = v[(size_t)(s0 + i) * VD + h * Dv + c] * bt[i];
        for (int j = 0; j < i; ++j) acc = std::fma(-A[(size_t)i * L + j], U[(size_t)j * Dv + c], acc);
        U[(size_t)i * Dv + c] = acc;
      }
    }
    float* Sh = &S[(size_t)h * Dk * Dv];
    std::vector<float> Dl((size_t)L * Dv);
    for (int i = 0; i < L; ++i)
      for (int c = 0; c < Dv; ++c) {
        float ws = 0, qs0 = 0;
        for (int d = 0; d < Dk; ++d) {
          const Split s = split(Sh[(size_t)d * Dv + c]);
          ws += mul3(split(W[(size_t)i * Dk + d]), s), qs0 += mul3(qs(i, d), s);
        }
        Dl[(size_t)i * Dv + c] = U[(size_t)i * Dv + c] - ws;
        o[(size_t)(s0 + i) * VD + h * Dv + c] = qs0 * ex(lam[i]);
      }
    for (int i = 0; i < L; ++i)
      for (int c = 0; c < Dv; ++c) {
        float acc = o[(size_t)(s0 + i) * VD + h * Dv + c];
        for (int j = 0; j <= i; ++j) acc += mul3(split(P[(size_t)i * L + j]), split(Dl[(size_t)j * Dv + c]));
        o[(size_t)(s0 + i) * VD + h * Dv + c] = acc;
      }
    const float gl = ex(lam[L - 1]);
    for (int d = 0; d < Dk; ++d)
      for (int c = 0; c < Dv; ++c) {
        float acc = Sh[(size_t)d * Dv + c] * gl;
        for (int j = 0; j < L; ++j)
          acc += mul3(split(k[(size_t)(s0 + j) * key + kh * Dk + d] * ex(lam[L - 1] - lam[j])),
                      split(Dl[(size_t)j * Dv + c]));
        Sh[(size_t)d * Dv + c] = acc;
      }
  }
};

// max |gpu - ref64| <= 2 * max(e32, e_emu) + atol (expect_close with the larger of the two references' errors)
void expect_wy(const char* what, const std::vector<float>& gpu, const std::vector<double>& r64,
               const std::vector<float>& r32, const std::vector<float>& emu, double atol) {
  double e32 = 0, eemu = 0;
  for (size_t i = 0; i < r64.size(); ++i)
    e32 = std::max(e32, std::fabs(r32[i] - r64[i])), eemu = std::max(eemu, std::fabs(emu[i] - r64[i]));
  std::printf("%-28s emulated kernel arithmetic %.3g, fp32 recurrence %.3g\n", what, eemu, e32);
  // the emulation must stay near the fp32 recurrence (~20-30x: the split's 2^-16), or it would widen the bound
  EXPECT_LE(eemu, 64 * e32 + atol) << what << ": the emulated reference itself is off";
  expect_close(what, gpu, r64, eemu > e32 ? emu : r32, atol);
}

// `before` tokens through the decode step (GPU) and all three references, then n tokens in one launch_gdn_chunk
// with wy on, then one more decode step reading the ring and state the chunk left.
// strong: decays down to ~e^-300 a token (A_log up to 4, a up to 6), the state reset within a piece.
void run_wy_case(int before, int n, uint32_t seed, bool strong = false) {
  const GdnDims dm{16, 32, 128, 128};
  ASSERT_TRUE(gdn_wy_supported(dm));  // (else launch_gdn_chunk would take the sequential kernel)
  std::mt19937 g(seed);
  const int C = dm.conv_dim(), Hv = dm.n_v_heads, Dv = dm.v_dim, VD = Hv * Dv;
  const size_t nS = (size_t)Hv * dm.k_dim * Dv;
  auto cw = randv((size_t)C * 4, g, -0.6f, 0.6f), alog = randv(Hv, g, -2, strong ? 4 : 1), dtb = randv(Hv, g, -1, 1);
  auto nw = randv(Dv, g, 0.5f, 1.5f);
  auto S0 = randv(nS, g, -0.3f, 0.3f);
  const float a_hi = strong ? 6 : 2;
  GdnRef<double> r64{dm, std::vector<double>(S0.begin(), S0.end()), {}};
  GdnRef<float> r32{dm, S0, {}};
  WyEmu emu{dm, S0, {}};
  float *dcw = to_dev(cw), *dal = to_dev(alog), *ddt = to_dev(dtb), *dnw = to_dev(nw), *dS = to_dev(S0);
  float* ring = poisoned((size_t)4 * C);
  int* dpos = to_dev(std::vector<int>{0});
  auto one_step = [&](int t, const char* what) {
    auto qkv = randv(C, g, -2, 2), z = randv(VD, g, -2, 2), a = randv(Hv, g, -2, a_hi), b = randv(Hv, g, -2, 2);
    float *dqkv = to_dev(qkv), *dz = to_dev(z), *da = to_dev(a), *db = to_dev(b), *dout = poisoned(VD);
    CUDA_CHECK(cudaMemcpy(dpos, &t, sizeof(int), cudaMemcpyHostToDevice));
    launch_gdn_step(dqkv, dz, da, db, dcw, dal, ddt, dnw, ring, dS, dout, dpos, dm, 1e-6f, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    auto o64 = r64.step(qkv, z, a, b, cw, alog, dtb, nw);
    auto o32 = r32.step(qkv, z, a, b, cw, alog, dtb, nw);
    auto oe = emu.run(t, 1, qkv, z, a, b, cw, alog, dtb, nw);
    if (what) expect_wy(what, from_dev(dout, VD), o64, std::vector<float>(o32.begin(), o32.end()), oe, 2e-5);
    for (float* p : {dqkv, dz, da, db, dout}) cudaFree(p);
  };
  for (int t = 0; t < before; ++t) one_step(t, nullptr);
  std::vector<float> qkv, z, a, b, o32;
  std::vector<double> o64;
  for (int t = 0; t < n; ++t) {
    auto q1 = randv(C, g, -2, 2), z1 = randv(VD, g, -2, 2), a1 = randv(Hv, g, -2, a_hi), b1 = randv(Hv, g, -2, 2);
    auto e64 = r64.step(q1, z1, a1, b1, cw, alog, dtb, nw);
    auto e32 = r32.step(q1, z1, a1, b1, cw, alog, dtb, nw);
    qkv.insert(qkv.end(), q1.begin(), q1.end()), z.insert(z.end(), z1.begin(), z1.end());
    a.insert(a.end(), a1.begin(), a1.end()), b.insert(b.end(), b1.begin(), b1.end());
    o64.insert(o64.end(), e64.begin(), e64.end()), o32.insert(o32.end(), e32.begin(), e32.end());
  }
  auto oe = emu.run(before, n, qkv, z, a, b, cw, alog, dtb, nw);
  float *dqkv = to_dev(qkv), *dz = to_dev(z), *da = to_dev(a), *db = to_dev(b), *dout = poisoned((size_t)n * VD);
  void* scratch = nullptr;
  CUDA_CHECK(cudaMalloc(&scratch, gdn_chunk_scratch_bytes(n, dm, true)));
  launch_gdn_chunk(dqkv, dz, da, db, dcw, dal, ddt, dnw, ring, dS, dout, scratch, before, n, dm, 1e-6f, true, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  char name[96];
  std::snprintf(name, sizeof name, "gdn wy +%d x%d", before, n);
  expect_wy(name, from_dev(dout, (size_t)n * VD), o64, o32, oe, 2e-5);
  std::snprintf(name, sizeof name, "gdn wy state +%d x%d", before, n);
  expect_wy(name, from_dev(dS, nS), r64.S, r32.S, emu.S, 2e-6);
  std::snprintf(name, sizeof name, "gdn step after wy +%d x%d", before, n);
  one_step(before + n, name);
  for (float* p : {dqkv, dz, da, db, dout, dcw, dal, ddt, dnw, dS, ring}) cudaFree(p);
  cudaFree(dpos);
  cudaFree(scratch);
}

}  // namespace

TEST(GdnWy, WithinOnePiece) {
  run_wy_case(0, 37, 21);
  run_wy_case(5, 2, 22);
}
TEST(GdnWy, AcrossPieceBoundaries) {
  run_wy_case(63, 2, 23);    // one token each side of position 64
  run_wy_case(5, 200, 24);   // a short first piece, two whole, a short last
  run_wy_case(128, 128, 25); // two whole pieces
}
TEST(GdnWy, ManyPieces) { run_wy_case(60, 300, 26); }
TEST(GdnWy, StrongDecays) { run_wy_case(30, 150, 27, true); }
