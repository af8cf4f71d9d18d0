// MLX affine quantization and dequantization; see mlx_quant.h.
#include "model/mlx_quant.h"

#include <algorithm>
#include <cmath>

#include "util/bf16.h"
#include "util/check.h"

namespace lily {

void mlx_affine_quantize(const float* w, int64_t rows, int64_t cols, int bits, int group_size, uint32_t* packed,
                         uint16_t* scales, uint16_t* biases) {
  LILY_CHECK((bits == 4 || bits == 8) && group_size > 0 && cols % group_size == 0 && (cols * bits) % 32 == 0,
             "mlx_affine_quantize: unsupported bits ", bits, " / group_size ", group_size, " for ", cols, " columns");
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const float eps = 1e-7f;
  const int per_word = 32 / bits;
  const int64_t groups = cols / group_size;
  const int64_t words = cols / per_word;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = w + r * cols;
    uint32_t* out = packed + r * words;
    std::fill(out, out + words, 0u);
    for (int64_t g = 0; g < groups; ++g) {
      const float* gx = x + g * group_size;
      float w_min = gx[0], w_max = gx[0];
      for (int i = 1; i < group_size; ++i) {
        w_min = std::min(w_min, gx[i]);
        w_max = std::max(w_max, gx[i]);
      }
      float scale = std::max((w_max - w_min) / n_bins, eps);
      float edge;
      if (std::fabs(w_min) > std::fabs(w_max)) {
        edge = w_min;
      } else {
        edge = w_max;
        scale = -scale;
      }
      float q0 = std::rint(edge / scale);
      float bias = 0.0f;
      if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
      }
      scales[r * groups + g] = f32_to_bf16(scale);
      biases[r * groups + g] = f32_to_bf16(bias);
      for (int i = 0; i < group_size; ++i) {
        float q = std::clamp(std::rint((gx[i] - bias) / scale), 0.0f, n_bins);
        int64_t col = g * group_size + i;
        out[col / per_word] |= static_cast<uint32_t>(q) << (bits * (col % per_word));
      }
    }
  }
}

float mlx_affine_dequant(const uint32_t* packed, const uint16_t* scales, const uint16_t* biases, int64_t cols,
                         int bits, int group_size, int64_t row, int64_t col) {
  const int per_word = 32 / bits;
  uint32_t word = packed[row * (cols / per_word) + col / per_word];
  uint32_t q = (word >> (bits * (col % per_word))) & ((1u << bits) - 1);
  int64_t g = row * (cols / group_size) + col / group_size;
  return bf16_to_f32(scales[g]) * static_cast<float>(q) + bf16_to_f32(biases[g]);
}

}  // namespace lily
