// CPU matrix products: dequantize a block of rows into a per-thread fp32 buffer, then one fixed-order dot
// kernel (4 rows x 1 input, 8-lane vectors, two accumulators per row) for every input vector.
#include "model/matmul_cpu.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "util/bf16.h"
#include "util/check.h"

namespace lily {
namespace {

constexpr int64_t kBlockRows = 16;  // rows dequantized together; a multiple of 4

#pragma GCC diagnostic ignored "-Wpsabi"  // 32-byte vectors in static helpers only; no ABI crosses files
typedef float f32x8 __attribute__((vector_size(32)));

__attribute__((always_inline)) inline f32x8 load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

__attribute__((always_inline)) inline float hsum(f32x8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// out[r] = sum_i w[r][i] x[i] for the four rows w[0..3]. The summation order depends only on n: lanes
// i % 8, two accumulators (i / 8 even / odd), a fixed horizontal sum, then the scalar tail.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void dot4(const float* const w[4], const float* x, int64_t n, float out[4]) {
  f32x8 a0 = {}, a1 = {}, a2 = {}, a3 = {}, b0 = {}, b1 = {}, b2 = {}, b3 = {};
  const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const f32x8 xa = load8(x + i), xb = load8(x + i + 8);
    a0 += load8(w0 + i) * xa;
    b0 += load8(w0 + i + 8) * xb;
    a1 += load8(w1 + i) * xa;
    b1 += load8(w1 + i + 8) * xb;
    a2 += load8(w2 + i) * xa;
    b2 += load8(w2 + i + 8) * xb;
    a3 += load8(w3 + i) * xa;
    b3 += load8(w3 + i + 8) * xb;
  }
  if (i + 8 <= n) {
    const f32x8 xa = load8(x + i);
    a0 += load8(w0 + i) * xa;
    a1 += load8(w1 + i) * xa;
    a2 += load8(w2 + i) * xa;
    a3 += load8(w3 + i) * xa;
    i += 8;
  }
  float t0 = 0, t1 = 0, t2 = 0, t3 = 0;
  for (; i < n; ++i) {
    t0 += w0[i] * x[i];
    t1 += w1[i] * x[i];
    t2 += w2[i] * x[i];
    t3 += w3[i] * x[i];
  }
  out[0] = hsum(a0 + b0) + t0;
  out[1] = hsum(a1 + b1) + t1;
  out[2] = hsum(a2 + b2) + t2;
  out[3] = hsum(a3 + b3) + t3;
}

typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef uint8_t u8x8 __attribute__((vector_size(8)));

// One affine row: out[i] = scale[g] * q_i + bias[g], q_i the i-th `bits`-wide field, low bits first.
// 4- and 8-bit rows unpack eight fields per step with vector shifts; other widths go field by field.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void dequant_affine_row(const Mat& w, int64_t row, float* out) {
  const int per_word = 32 / w.bits;
  const uint32_t mask = (1u << w.bits) - 1u;
  const int64_t words_per_row = w.cols / per_word;
  const int64_t groups = w.cols / w.group_size;
  const uint32_t* q = static_cast<const uint32_t*>(w.data) + row * words_per_row;
  const uint16_t* sc = w.scales + row * groups;
  const uint16_t* bi = w.biases + row * groups;
  const int64_t words_per_group = w.group_size / per_word;
  for (int64_t g = 0; g < groups; ++g) {
    const float s = bf16_to_f32(sc[g]);
    const float b = bf16_to_f32(bi[g]);
    const f32x8 sv = {s, s, s, s, s, s, s, s}, bv = {b, b, b, b, b, b, b, b};
    const uint32_t* qg = q + g * words_per_group;
    float* o = out + g * w.group_size;
    if (w.bits == 4) {
      const i32x8 shifts = {0, 4, 8, 12, 16, 20, 24, 28};
      for (int64_t k = 0; k < words_per_group; ++k) {
        const int32_t word = static_cast<int32_t>(qg[k]);
        const i32x8 v = (i32x8{word, word, word, word, word, word, word, word} >> shifts) & 15;
        const f32x8 f = __builtin_convertvector(v, f32x8) * sv + bv;
        std::memcpy(o + 8 * k, &f, sizeof(f));
      }
    } else if (w.bits == 8 && w.group_size % 8 == 0) {
      const uint8_t* bytes = reinterpret_cast<const uint8_t*>(qg);  // little-endian: byte j = field j
      for (int64_t k = 0; k < w.group_size; k += 8) {
        u8x8 v;
        std::memcpy(&v, bytes + k, sizeof(v));
        const f32x8 f = __builtin_convertvector(__builtin_convertvector(v, i32x8), f32x8) * sv + bv;
        std::memcpy(o + k, &f, sizeof(f));
      }
    } else {
      for (int64_t k = 0; k < words_per_group; ++k) {
        uint32_t word = qg[k];
        for (int j = 0; j < per_word; ++j) {
          o[k * per_word + j] = s * static_cast<float>(word & mask) + b;
          word >>= w.bits;
        }
      }
    }
  }
}

typedef uint16_t u16x8 __attribute__((vector_size(16)));

// out[i] = f32(p[i]) for bf16 p [n]: eight at a time (bf16 is the top half of an fp32).
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void widen_bf16_row(const uint16_t* p, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    u16x8 h;
    std::memcpy(&h, p + i, sizeof(h));
    const i32x8 v = __builtin_convertvector(h, i32x8) << 16;
    std::memcpy(out + i, &v, sizeof(v));
  }
  for (; i < n; ++i) out[i] = bf16_to_f32(p[i]);
}

// Pointers to rows [row0, row0 + n) as fp32: f32 matrices in place, others dequantized into `scratch`.
void row_pointers(const Mat& w, int64_t row0, int64_t n, std::vector<float>& scratch, const float** rows) {
  if (w.format == MatFormat::f32) {
    for (int64_t r = 0; r < n; ++r) rows[r] = static_cast<const float*>(w.data) + (row0 + r) * w.cols;
    return;
  }
  if (scratch.size() < static_cast<size_t>(n * w.cols)) scratch.resize(n * w.cols);
  dequantize_rows(w, row0, n, scratch.data());
  for (int64_t r = 0; r < n; ++r) rows[r] = scratch.data() + r * w.cols;
}

}  // namespace

void check_mat(const Mat& w, const char* what) {
  LILY_CHECK(w.data != nullptr && w.rows > 0 && w.cols > 0, what, ": empty matrix");
  if (w.format == MatFormat::affine) {
    LILY_CHECK(w.bits == 2 || w.bits == 4 || w.bits == 8, what, ": unsupported affine bits ", w.bits);
    LILY_CHECK(w.group_size > 0 && w.cols % w.group_size == 0 && w.group_size % (32 / w.bits) == 0, what,
               ": group size ", w.group_size, " does not divide ", w.cols, " columns");
    LILY_CHECK(w.scales != nullptr && w.biases != nullptr, what, ": affine matrix without scales/biases");
  }
}

void dequantize_rows(const Mat& w, int64_t row0, int64_t n_rows, float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* o = out + r * w.cols;
    const int64_t row = row0 + r;
    switch (w.format) {
      case MatFormat::f32:
        std::memcpy(o, static_cast<const float*>(w.data) + row * w.cols, w.cols * sizeof(float));
        break;
      case MatFormat::bf16:
        widen_bf16_row(static_cast<const uint16_t*>(w.data) + row * w.cols, w.cols, o);
        break;
      case MatFormat::affine:
        dequant_affine_row(w, row, o);
        break;
    }
  }
}

void gather_row(const Mat& w, int64_t row, float* out) {
  LILY_CHECK(row >= 0 && row < w.rows, "row ", row, " out of range [0, ", w.rows, ")");
  dequantize_rows(w, row, 1, out);
}

void matmul_rows(const Mat& w, const float* x, int64_t n, int64_t ldx, float* y, int64_t ldy, ThreadPool& pool) {
  if (n <= 0) return;
  const int64_t n_blocks = (w.rows + kBlockRows - 1) / kBlockRows;
  // Enough multiply-adds per chunk that the hand-off cost stays small.
  const int64_t work_per_block = kBlockRows * w.cols * std::max<int64_t>(n, 4);
  const int64_t grain = std::max<int64_t>(1, (1 << 18) / std::max<int64_t>(1, work_per_block));
  pool.parallel_for(
      0, n_blocks,
      [&](int64_t b0, int64_t b1) {
        thread_local std::vector<float> scratch;
        const float* rows[kBlockRows];
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t r0 = b * kBlockRows;
          const int64_t nr = std::min(kBlockRows, w.rows - r0);
          row_pointers(w, r0, nr, scratch, rows);
          for (int64_t t = 0; t < n; ++t) {
            const float* xt = x + t * ldx;
            float* yt = y + t * ldy + r0;
            for (int64_t r = 0; r < nr; r += 4) {
              // A short last group repeats its last row; the extra results are dropped.
              const float* quad[4];
              for (int k = 0; k < 4; ++k) quad[k] = rows[std::min(r + k, nr - 1)];
              float out[4];
              dot4(quad, xt, w.cols, out);
              for (int k = 0; k < 4 && r + k < nr; ++k) yt[r + k] = out[k];
            }
          }
        }
      },
      grain);
}

void matvec(const Mat& w, const float* x, float* y, ThreadPool& pool) {
  matmul_rows(w, x, 1, w.cols, y, w.rows, pool);
}

}  // namespace lily
