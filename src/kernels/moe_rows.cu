// The routed experts of a pass with few slots per expert (a batched decode step: 4 to 64 one-token rows give one
// to three slots to each expert they use) with the decode kernels' arithmetic instead of tensor-core tiles whose
// 16 or 64 token columns would stay mostly empty. x per 32-element chunk in 16-bit fixed point, integer dot
// products (kernels/gemv_stream.cuh); each used expert's rows are streamed once: a warp issues every load of its
// rows before its first product, then takes the expert's slots one after another, their x staged in shared memory
// a round of slots at a time. A slot's result is computed the same way whatever the other slots hold, so a
// row's bits do not depend on the pass's other rows. The shared expert can be one more matrix of the work list
// (MoeRowsShared: its blocks read its own weights). Tested by tests/gpu/test_moe_rows.cu.
#include <algorithm>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/gemv_stream.cuh"
#include "kernels/mma.cuh"

namespace lily::cuda {
namespace detail {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kH = kHidden, kF = kMoeFfn;  // the real shapes (moe_rows_supported)
constexpr int kUpPairs = 2;      // (gate, up) row pairs per warp: 4 rows of 1 KB in flight per warp
constexpr int kDownPairs = 8;    // down rows per half warp (K = 512: 16 lanes take a row's 16 chunks)
constexpr int kUpRound = 8;      // slots whose staged x a block holds at once (4.6 KB each)
constexpr int kDownRound = 16;   // (1.3 KB each)

using XH = StreamX<kH>;
using XF = StreamX<kF>;
static_assert(sizeof(XH) % 16 == 0 && sizeof(XF) % 16 == 0, "staged rows are copied in 16-byte pieces");

// The block's tile of the grouped work list (gemm_grouped_tiles): matrix e's slots [s0, s1).
struct Work {
  int e = 0, s0 = 0, s1 = 0;
};
__device__ __forceinline__ bool tile_work(const int* tiles, const int* offsets, int tile, Work& w) {
  if (tile >= tiles[0]) return false;
  const int t = tiles[1 + tile];
  w.e = t >> 16;
  w.s0 = offsets[w.e] + 64 * (t & 0xffff);
  w.s1 = min(offsets[w.e + 1], w.s0 + 64);
  return w.s1 > w.s0;
}

// Copies n <= NMAX staged rows (slot s0 + j reads row x_row[s0 + j], or its own row when x_row is null) into dst
// by cp.async: the rows' indices through shared memory, then every piece in flight at once (two L2 round trips,
// not one per piece a thread copies); ends with a barrier.
template <int NMAX, typename Row>
__device__ __forceinline__ void stage_slots(Row* dst, const Row* src, const int* x_row, int s0, int n) {
  constexpr int W = sizeof(Row) / 16;
  __shared__ int rows[NMAX];
  if (x_row) {
    if (threadIdx.x < n) rows[threadIdx.x] = x_row[s0 + threadIdx.x];
    __syncthreads();
  }
  for (int i = threadIdx.x; i < n * W; i += kThreads) {
    const int j = i / W, q = i % W;
    const int row = x_row ? rows[j] : s0 + j;
    mma::cp16(reinterpret_cast<uint4*>(dst + j) + q, reinterpret_cast<const uint4*>(src + row) + q);
  }
  mma::commit();
  mma::wait<0>();
  __syncthreads();
}

struct UpArgs {
  const uint8_t* gw; const uint32_t* gsb; const uint8_t* uw; const uint32_t* usb;  // stacks [E][rows][H]
  size_t mat_w_bytes, mat_groups;
  int rows;                                          // F
  const XH* x; const int* x_row;                     // staged token rows; slot a reads x[x_row[a]]
  const int* offsets; const int* tiles;
  const float* scale;                                // [slots] or null
  float* act; int ldact;
  // the shared expert: the work list's matrix e_shared (-1: none) is gate / up [rows][H] here
  int e_shared;
  const uint8_t* sgw; const uint32_t* sgsb; const uint8_t* suw; const uint32_t* susb;
};

// Block (bx, tile): rows [16 bx, 16 bx + 16) of the tile's expert, 2 (gate, up) pairs per warp.
__global__ void __launch_bounds__(kThreads) up_kernel(UpArgs a) {
  dep_chain();
  constexpr int nc = kH / 1024, R = kUpPairs;
  extern __shared__ __align__(16) uint8_t smem[];
  XH* xs = reinterpret_cast<XH*>(smem);
  Work wk;
  if (!tile_work(a.tiles, a.offsets, blockIdx.y, wk)) return;
  const int lane = threadIdx.x & 31;
  const int r0 = (blockIdx.x * kWarps + threadIdx.x / 32) * R;
  const bool shared = wk.e == a.e_shared;
  const uint8_t* gw = shared ? a.sgw : a.gw + wk.e * a.mat_w_bytes;
  const uint8_t* uw = shared ? a.suw : a.uw + wk.e * a.mat_w_bytes;
  const uint32_t* gsb = shared ? a.sgsb : a.gsb + wk.e * a.mat_groups;
  const uint32_t* usb = shared ? a.susb : a.usb + wk.e * a.mat_groups;
  const uint8_t* w[2 * R];
  const uint32_t* sb[2 * R];
#pragma unroll
  for (int r = 0; r < R; ++r) {  // rows past the end load the last one and are not stored
    const size_t row = static_cast<size_t>(min(r0 + r, a.rows - 1));
    w[2 * r] = gw + row * (kH / 2);
    w[2 * r + 1] = uw + row * (kH / 2);
    sb[2 * r] = gsb + row * (kH / kGroupSize);
    sb[2 * r + 1] = usb + row * (kH / kGroupSize);
  }
  uint4 wv[2 * R][nc];
  uint32_t sv[2 * R][nc];
  stream_load_rows<kH, 2 * R>(w, sb, wv, sv);
  for (int s = wk.s0; s < wk.s1; s += kUpRound) {
    const int m = min(kUpRound, wk.s1 - s);
    if (s > wk.s0) __syncthreads();  // everyone is done with the last round's x
    stage_slots<kUpRound>(xs, a.x, a.x_row, s, m);
    for (int j = 0; j < m; ++j) {
      float acc[2 * R];
      stream_dots<kH, 2 * R>(xs[j], wv, sv, acc);
#pragma unroll
      for (int r = 0; r < 2 * R; ++r) acc[r] = group_sum<32>(acc[r]);
      const float scale = a.scale ? a.scale[s + j] : 1.f;
      float v = 0.f;
#pragma unroll
      for (int r = 0; r < R; ++r) v = lane == r ? swiglu_value(scale, acc[2 * r], acc[2 * r + 1]) : v;
      if (lane < R && r0 + lane < a.rows) a.act[static_cast<size_t>(s + j) * a.ldact + r0 + lane] = v;
    }
  }
}

struct DownArgs {
  const uint8_t* w; const uint32_t* sb;  // stack [E][rows][F]
  size_t mat_w_bytes, mat_groups;
  int rows;                              // H
  const XF* x;                           // staged act rows, one per slot
  const int* offsets; const int* tiles;
  float* y; int ldy;
  int e_shared;                          // the work list's matrix that is the shared expert's down (-1: none)
  const uint8_t* sw; const uint32_t* ssb;
};

// Block (bx, tile): rows [128 bx, 128 bx + 128) of the tile's expert. A half warp takes a row (lane c of it chunk c
// of the row's 16), 8 rows per half: rows r0 + 2 p + half.
__global__ void __launch_bounds__(kThreads, 3) down_kernel(DownArgs a) {
  dep_chain();
  constexpr int nch = kF / 32, P = kDownPairs;
  static_assert(nch == 16, "a half warp per row");
  extern __shared__ __align__(16) uint8_t smem[];
  XF* xs = reinterpret_cast<XF*>(smem);
  Work wk;
  if (!tile_work(a.tiles, a.offsets, blockIdx.y, wk)) return;
  const int lane = threadIdx.x & 31, half = lane >> 4, ch = lane & 15;
  const int r0 = (blockIdx.x * kWarps + threadIdx.x / 32) * 2 * P;
  const bool shared = wk.e == a.e_shared;
  const uint8_t* w = shared ? a.sw : a.w + wk.e * a.mat_w_bytes;
  const uint32_t* sbp = shared ? a.ssb : a.sb + wk.e * a.mat_groups;
  uint4 wv[P];
  uint32_t sv[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const size_t row = static_cast<size_t>(min(r0 + 2 * p + half, a.rows - 1));
    wv[p] = ld_stream(w + row * (kF / 2) + ch * 16);
    sv[p] = ld_stream_u32(sbp + row * (kF / kGroupSize) + ch / 2);
  }
  const int my_row = r0 + 2 * ch + half;  // lanes ch < P store row r0 + 2 ch + half: 16 consecutive floats
  for (int s = wk.s0; s < wk.s1; s += kDownRound) {
    const int m = min(kDownRound, wk.s1 - s);
    if (s > wk.s0) __syncthreads();
    stage_slots<kDownRound>(xs, a.x, nullptr, s, m);
    for (int j = 0; j < m; ++j) {
      const XF& x = xs[j];
      uint4 xq[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) xq[k] = x.xq[k * nch + ch];
      const float sx = x.sx[ch], X = x.xsum[ch];
      float out = 0.f;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        int dh = 0, dl = 0;
        word_dp4a(wv[p].x, xq[0], dh, dl);
        word_dp4a(wv[p].y, xq[1], dh, dl);
        word_dp4a(wv[p].z, xq[2], dh, dl);
        word_dp4a(wv[p].w, xq[3], dh, dl);
        const float v = group_sum<16>(chunk_from_sums(sv[p], sx, X, dh, dl));
        out = ch == p ? v : out;
      }
      if (ch < P && my_row < a.rows) a.y[static_cast<size_t>(s + j) * a.ldy + my_row] = out;
    }
  }
}

template <int K, int NT>
__global__ void __launch_bounds__(NT) prep_kernel(const float* x, int ldx, StreamX<K>* out) {
  dep_chain();
  stream_stage_x<K, NT>(x + static_cast<size_t>(blockIdx.x) * ldx, out[blockIdx.x]);
}

}  // namespace
}  // namespace detail

bool moe_rows_supported(const QMat& gate, const QMat& up, const QMat& down) {
  auto q4 = [](const QMat& m) { return m.format == QFormat::q4 && m.w && m.sb; };
  return q4(gate) && q4(up) && q4(down) && gate.cols == kHidden && up.cols == kHidden && gate.rows == kMoeFfn &&
         up.rows == kMoeFfn && down.rows == kHidden && down.cols == kMoeFfn && gate.n_mats == up.n_mats &&
         down.n_mats == gate.n_mats;
}

size_t stream_row_bytes(int K) {
  LILY_CHECK(K == kHidden || K == kMoeFfn, "stream_row_bytes: K ", K, " (2048 or 512)");
  return K == kHidden ? sizeof(detail::XH) : sizeof(detail::XF);
}

void stream_rows_prep(const float* x, int ldx, int n, int K, void* out, cudaStream_t s) {
  LILY_CHECK(n >= 0 && ldx % 4 == 0 && ldx >= K, "stream_rows_prep: n ", n, " ldx ", ldx, " K ", K);
  if (n == 0) return;
  if (K == kHidden) {
    launch_pdl(detail::prep_kernel<kHidden, 256>, dim3(n), dim3(256), 0, s, x, ldx, static_cast<detail::XH*>(out));
  } else {
    LILY_CHECK(K == kMoeFfn, "stream_rows_prep: K ", K, " (2048 or 512)");
    launch_pdl(detail::prep_kernel<kMoeFfn, 128>, dim3(n), dim3(128), 0, s, x, ldx, static_cast<detail::XF*>(out));
  }
}

void moe_rows_swiglu(const QMat& gate, const QMat& up, const void* x, const int* x_row, const int* offsets,
                     const int* tiles, int max_tiles, const float* scale, float* act, int ldact, cudaStream_t s,
                     const MoeRowsShared* shared) {
  LILY_CHECK(gate.format == QFormat::q4 && up.format == QFormat::q4 && gate.cols == kHidden && up.cols == kHidden &&
                 gate.rows == up.rows && gate.n_mats == up.n_mats,
             "moe_rows_swiglu: gate / up must be q4 [rows, 2048] stacks of one shape");
  LILY_CHECK(!shared || moe_rows_shared_ok(gate, *shared), "moe_rows_swiglu: the shared expert must be q4 of the "
             "routed experts' shape");
  if (max_tiles <= 0) return;
  using namespace detail;
  UpArgs a{gate.w, gate.sb, up.w, up.sb, gate.mat_w_bytes(), gate.mat_groups(), gate.rows,
           static_cast<const XH*>(x), x_row, offsets, tiles, scale, act, ldact, -1};
  if (shared) a.e_shared = shared->e, a.sgw = shared->gate->w, a.sgsb = shared->gate->sb, a.suw = shared->up->w,
              a.susb = shared->up->sb;
  const int per_block = kWarps * kUpPairs;
  const dim3 grid((gate.rows + per_block - 1) / per_block, max_tiles);
  launch_pdl(up_kernel, grid, dim3(kThreads), kUpRound * sizeof(XH), s, a);
}

void moe_rows_down(const QMat& down, const void* act, const int* offsets, const int* tiles, int max_tiles, float* y,
                   int ldy, cudaStream_t s, const MoeRowsShared* shared) {
  LILY_CHECK(down.format == QFormat::q4 && down.cols == kMoeFfn, "moe_rows_down: down must be a q4 [rows, 512] stack");
  LILY_CHECK(!shared || (shared->down && shared->down->format == QFormat::q4 && shared->down->rows == down.rows &&
                         shared->down->cols == down.cols && shared->down->n_mats == 1),
             "moe_rows_down: the shared expert's down must be one q4 matrix of the routed experts' shape");
  if (max_tiles <= 0) return;
  using namespace detail;
  DownArgs a{down.w, down.sb, down.mat_w_bytes(), down.mat_groups(), down.rows, static_cast<const XF*>(act),
             offsets, tiles, y, ldy, -1};
  if (shared) a.e_shared = shared->e, a.sw = shared->down->w, a.ssb = shared->down->sb;
  const int per_block = kWarps * 2 * kDownPairs;
  const dim3 grid((down.rows + per_block - 1) / per_block, max_tiles);
  launch_pdl(down_kernel, grid, dim3(kThreads), kDownRound * sizeof(XF), s, a);
}

bool moe_rows_shared_ok(const QMat& gate, const MoeRowsShared& sh) {
  auto one = [&](const QMat* m, int rows, int cols) {
    return m && m->format == QFormat::q4 && m->w && m->sb && m->n_mats == 1 && m->rows == rows && m->cols == cols;
  };
  return sh.e >= 0 && one(sh.gate, gate.rows, gate.cols) && one(sh.up, gate.rows, gate.cols) &&
         one(sh.down, gate.cols, gate.rows);
}

}  // namespace lily::cuda
