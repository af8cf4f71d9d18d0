// The prompt path's GEMM over lily's weight layout (kernels/qmat.h): y[t] = W x[t] for many tokens at once on
// the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate). The weights enter as their integer codes q
// (0..15 / 0..255, exact in bf16) or, for bf16 weights, as they are; x enters split into two bf16 halves
// (hi + lo, ~16 bits of mantissa), so the products are fp32-exact but for that split. Per 64-element group the
// block finishes sum_k q x in fp32 and adds scale * that + bias * sum_k x (the group sums come with x).
// A block computes 128 weight rows x 64 tokens (8 warps of 16 rows), streaming one group (64 columns) of weights
// and inputs per stage through shared memory, four stages in flight (cp.async; inputs only for the 16-token
// pairs that hold a valid token, which is what an expert with few tokens streams).
// Dense launches take tokens [0, n); grouped launches (MoE experts) take matrix e for the slots of
// [offsets[e], offsets[e+1]) and gather their input rows. Tested by tests/gpu/test_batched.cu.
#include <cuda_bf16.h>

#include <cstring>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/mma.cuh"

namespace lily::cuda {
namespace detail {

constexpr int kGemmRows = 128;    // weight rows per block (8 warps x 16)
constexpr int kGemmTok = 64;      // tokens per block (8 n-tiles of 8)
constexpr int kGemmThreads = 256;
constexpr int kGemmStages = 4;    // groups in flight through shared memory (3 requested while one is computed)
constexpr int kXStride = 64 + 8;  // bf16 per staged x row: 144 bytes, so ldmatrix's 8 rows hit distinct banks
constexpr int kGemmMaxParts = kMaxGemmParts;

template <int BITS>
struct GemmTile {
  static constexpr int kRowBytes = 64 * BITS / 8;     // one group of one weight row
  static constexpr int kWStride = kRowBytes + 16;     // staged row stride: conflict-free fragment reads
  static constexpr int kWBytes = kGemmRows * kWStride;
  static constexpr int kXBytes = 2 * kGemmTok * kXStride * 2;  // hi and lo
  static constexpr int kStage = kWBytes + kXBytes + kGemmRows * 4 + kGemmTok * 4;  // + scale|bias, group sums
  static constexpr int kSmem = kGemmStages * kStage;
};

struct GemmPart {        // one matrix of a launch (several share x: gemm_multi)
  const uint8_t* w;      // its stack's matrix `mat`
  const uint32_t* sb;
  int rows;
  float* y;
  int ldy;
  int tile_end;          // row tiles of this and the earlier parts (blockIdx.x below it: this part)
};

struct GemmArgs {
  GemmPart part[kGemmMaxParts];
  int parts;
  size_t mat_w_bytes, mat_groups;  // grouped: the stride between the stack's matrices
  int cols;
  const uint16_t* xhi;
  const uint16_t* xlo;
  const float* xsum;
  const int* x_row;      // grouped: input row of each slot (null: the slot itself)
  const int* offsets;    // grouped: [n_mats + 1] slot ranges; null: dense over [0, n)
  int n;                 // dense: tokens
  bool accumulate;
};

// Two weights (columns k, k+1 of a row) as a bf16x2 register, low half = column k.
template <int BITS>
__device__ __forceinline__ uint32_t a_pair(const uint8_t* row, int k) {
  if constexpr (BITS == 4) {
    // one byte: column k in the low nibble; 0x4300 | q is the bf16 of 128 + q, so subtracting 128 gives q exactly
    const uint32_t b = row[k >> 1];
    const uint32_t v = ((b & 0xFu) | ((b & 0xF0u) << 12)) | 0x43004300u;
    __nv_bfloat162 r = *reinterpret_cast<const __nv_bfloat162*>(&v);
    r = __hsub2(r, __floats2bfloat162_rn(128.f, 128.f));
    return *reinterpret_cast<uint32_t*>(&r);
  } else if constexpr (BITS == 8) {
    const uint32_t b = *reinterpret_cast<const uint16_t*>(row + k);
    __nv_bfloat162 r = __floats2bfloat162_rn(static_cast<float>(b & 0xFFu), static_cast<float>(b >> 8));
    return *reinterpret_cast<uint32_t*>(&r);
  } else {
    return *reinterpret_cast<const uint32_t*>(row + 2 * k);
  }
}

template <int BITS>
__global__ void __launch_bounds__(kGemmThreads, 2) gemm_kernel(GemmArgs a) {
  using T = GemmTile<BITS>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  int pi = 0;
  while (pi + 1 < a.parts && static_cast<int>(blockIdx.x) >= a.part[pi].tile_end) ++pi;
  const GemmPart& part = a.part[pi];
  const int r_base = (blockIdx.x - (pi ? a.part[pi - 1].tile_end : 0)) * kGemmRows;
  const int rows = part.rows;
  int mat = 0, slot0 = 0, count = a.n;
  if (a.offsets) {
    mat = blockIdx.y;
    slot0 = a.offsets[mat];
    count = a.offsets[mat + 1] - slot0;
  }
  const int t_base = blockIdx.z * kGemmTok;  // within this matrix's slots
  if (t_base >= count) return;
  const int t_count = min(kGemmTok, count - t_base);
  const int groups = a.cols / 64;
  const uint8_t* w = part.w + mat * a.mat_w_bytes;
  const uint32_t* sb = part.sb ? part.sb + mat * a.mat_groups : nullptr;
  const size_t row_bytes = static_cast<size_t>(a.cols) * BITS / 8;

  // the rows this thread copies, clamped (rows / tokens past the end load the last one and are not stored)
  auto stage = [&](int g, int buf) {
    uint8_t* base = smem + buf * T::kStage;
    constexpr int wchunks = kGemmRows * T::kRowBytes / 16;
    for (int c = tid; c < wchunks; c += kGemmThreads) {
      const int r = c / (T::kRowBytes / 16), piece = c % (T::kRowBytes / 16);
      const int gr = min(r_base + r, rows - 1);
      mma::cp16(base + r * T::kWStride + piece * 16,
                w + gr * row_bytes + static_cast<size_t>(g) * T::kRowBytes + piece * 16);
    }
    uint8_t* xs = base + T::kWBytes;
    const int x_rows = (t_count + 15) & ~15;  // the tokens' 16-row pairs that hold a valid token (the rest unread)
    for (int c = tid; c < 2 * x_rows * 8; c += kGemmThreads) {
      const int half = c / (x_rows * 8), rem = c % (x_rows * 8);
      const int t = rem / 8, piece = rem % 8;
      int slot = slot0 + t_base + min(t, t_count - 1);
      const int row = a.x_row ? a.x_row[slot] : slot;
      const uint16_t* src = (half ? a.xlo : a.xhi) + static_cast<size_t>(row) * a.cols + g * 64 + piece * 8;
      mma::cp16(xs + (half * kGemmTok + t) * kXStride * 2 + piece * 16, src);
    }
    float* sbs = reinterpret_cast<float*>(xs + T::kXBytes);
    if constexpr (BITS != 16) {
      if (tid < kGemmRows) {
        const int gr = min(r_base + tid, rows - 1);
        mma::cp4(sbs + tid, sb + static_cast<size_t>(gr) * groups + g);
      } else if (tid < kGemmRows + kGemmTok) {
        const int t = tid - kGemmRows;
        const int slot = slot0 + t_base + min(t, t_count - 1);
        const int row = a.x_row ? a.x_row[slot] : slot;
        mma::cp4(sbs + kGemmRows + t, a.xsum + static_cast<size_t>(row) * groups + g);
      }
    }
    mma::commit();
  };

  float acc[8][4];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
  const int n_pairs = (t_count + 15) / 16;  // pairs of 8-token tiles with at least one token
  const int gq = lane >> 2, tq = lane & 3;
  const int r0 = warp * 16 + gq;  // this thread's rows in the tile: r0 and r0 + 8

  for (int g = 0; g < kGemmStages - 1; ++g) {
    if (g < groups) stage(g, g);
    else mma::commit();  // (empty groups keep the count of groups in flight uniform)
  }
  for (int g = 0; g < groups; ++g) {
    mma::wait<kGemmStages - 2>();
    __syncthreads();  // group g has landed for every thread; group g - 1's buffer is read by no one any more
    const int next = g + kGemmStages - 1;
    if (next < groups) stage(next, next % kGemmStages);
    else mma::commit();
    const uint8_t* base = smem + (g % kGemmStages) * T::kStage;
    const uint8_t* ws = base;
    const uint8_t* xs = base + T::kWBytes;
    const float* sbs = reinterpret_cast<const float*>(xs + T::kXBytes);
    float cg[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) cg[i][j] = 0.f;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const int k = ks * 16 + tq * 2;
      uint32_t af[4];
      af[0] = a_pair<BITS>(ws + r0 * T::kWStride, k);
      af[1] = a_pair<BITS>(ws + (r0 + 8) * T::kWStride, k);
      af[2] = a_pair<BITS>(ws + r0 * T::kWStride, k + 8);
      af[3] = a_pair<BITS>(ws + (r0 + 8) * T::kWStride, k + 8);
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        if (p < n_pairs) {
          const int n = p * 16 + (lane >> 4) * 8 + (lane & 7);
          const int kk = ks * 16 + ((lane >> 3) & 1) * 8;
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            uint32_t b[4];
            mma::ldsm_x4(b, xs + ((half * kGemmTok + n) * kXStride + kk) * 2);
            mma::bf16_16816(cg[2 * p], af, b[0], b[1]);
            mma::bf16_16816(cg[2 * p + 1], af, b[2], b[3]);
          }
        }
      }
    }
    if constexpr (BITS == 16) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += cg[i][j];
    } else {
      const uint32_t s0 = __float_as_uint(sbs[r0]), s1 = __float_as_uint(sbs[r0 + 8]);
      const float sc0 = __uint_as_float(s0 << 16), bi0 = __uint_as_float(s0 & 0xFFFF0000u);
      const float sc1 = __uint_as_float(s1 << 16), bi1 = __uint_as_float(s1 & 0xFFFF0000u);
      const float* xsum = sbs + kGemmRows;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float x0 = xsum[i * 8 + tq * 2], x1 = xsum[i * 8 + tq * 2 + 1];
        acc[i][0] += fmaf(sc0, cg[i][0], bi0 * x0);
        acc[i][1] += fmaf(sc0, cg[i][1], bi0 * x1);
        acc[i][2] += fmaf(sc1, cg[i][2], bi1 * x0);
        acc[i][3] += fmaf(sc1, cg[i][3], bi1 * x1);
      }
    }
  }

  const int ra = r_base + r0, rb = ra + 8;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int t = i * 8 + tq * 2 + (j & 1);
      const int r = (j < 2) ? ra : rb;
      if (t < t_count && r < rows) {
        float* dst = part.y + static_cast<size_t>(slot0 + t_base + t) * part.ldy + r;
        *dst = a.accumulate ? *dst + acc[i][j] : acc[i][j];
      }
    }
  }
}

template <int BITS>
void launch_gemm(const GemmArgs& a, int n_mats_grid, int max_tokens, cudaStream_t s) {
  // set on every call (cheap, not a stream operation): no static state, any device, any thread
  CUDA_CHECK(cudaFuncSetAttribute(gemm_kernel<BITS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  GemmTile<BITS>::kSmem));
  const dim3 grid(a.part[a.parts - 1].tile_end, n_mats_grid, (max_tokens + kGemmTok - 1) / kGemmTok);
  gemm_kernel<BITS><<<grid, kGemmThreads, GemmTile<BITS>::kSmem, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

void run(QFormat f, GemmArgs& a, int n_mats_grid, int max_tokens, cudaStream_t s) {
  if (max_tokens <= 0 || a.part[a.parts - 1].tile_end == 0) return;
  switch (f) {
    case QFormat::q4: launch_gemm<4>(a, n_mats_grid, max_tokens, s); break;
    case QFormat::q8: launch_gemm<8>(a, n_mats_grid, max_tokens, s); break;
    case QFormat::bf16: launch_gemm<16>(a, n_mats_grid, max_tokens, s); break;
  }
}

// The launch's arguments for matrices W[0..n) (same format and cols) with outputs y[i] (row stride ldy[i]),
// matrix `mat` of each stack.
GemmArgs args_for(const QMat* W, float* const* y, const int* ldy, int n, int mat, const GemmX& x) {
  LILY_CHECK(n >= 1 && n <= kGemmMaxParts, "gemm: ", n, " matrices in one launch (1..", kGemmMaxParts, ")");
  GemmArgs a;
  std::memset(&a, 0, sizeof a);
  int tiles = 0;
  for (int i = 0; i < n; ++i) {
    const QMat& m = W[i];
    LILY_CHECK(m.w && m.cols == x.K && m.cols % kGroupSize == 0 && (m.format == QFormat::bf16 || m.sb),
               "gemm: matrix [", m.rows, ", ", m.cols, "] does not take inputs of width ", x.K);
    LILY_CHECK(m.format == W[0].format && m.cols == W[0].cols,
               "gemm: matrices of one launch differ in format or width");
    LILY_CHECK(ldy[i] >= m.rows, "gemm: output stride ", ldy[i], " below the matrix's ", m.rows, " rows");
    LILY_CHECK(mat >= 0 && mat < m.n_mats, "gemm: matrix ", mat, " of a stack of ", m.n_mats);
    GemmPart& p = a.part[i];
    p.w = m.w + mat * m.mat_w_bytes();
    p.sb = m.sb ? m.sb + mat * m.mat_groups() : nullptr;
    p.rows = m.rows;
    p.y = y[i];
    p.ldy = ldy[i];
    tiles += (m.rows + kGemmRows - 1) / kGemmRows;
    p.tile_end = tiles;
  }
  a.parts = n;
  a.mat_w_bytes = W[0].mat_w_bytes();
  a.mat_groups = W[0].mat_groups();
  a.cols = W[0].cols;
  a.xhi = x.hi;
  a.xlo = x.lo;
  a.xsum = x.gsum;
  return a;
}

}  // namespace detail

void gemm(const QMat& W, int mat, const GemmX& x, int n, float* y, int ldy, bool accumulate, cudaStream_t s) {
  detail::GemmArgs a = detail::args_for(&W, &y, &ldy, 1, mat, x);
  a.n = n;
  a.accumulate = accumulate;
  detail::run(W.format, a, 1, n, s);
}

void gemm_multi(const GemmBatch& b, const GemmX& x, int n, bool accumulate, cudaStream_t s) {
  detail::GemmArgs a = detail::args_for(b.W, b.y, b.ldy, b.n, 0, x);
  a.n = n;
  a.accumulate = accumulate;
  detail::run(b.W[0].format, a, 1, n, s);
}

void gemm_grouped(const QMat& W, const GemmX& x, const int* x_row, const int* offsets, int max_count, float* y,
                  int ldy, cudaStream_t s) {
  LILY_CHECK(offsets, "gemm_grouped: no slot offsets");
  detail::GemmArgs a = detail::args_for(&W, &y, &ldy, 1, 0, x);
  a.x_row = x_row;
  a.offsets = offsets;
  detail::run(W.format, a, W.n_mats, max_count, s);
}

}  // namespace lily::cuda
