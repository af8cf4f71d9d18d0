// MLX affine quantization (docs/model.md §4.2): the exact rule of MLX's affine_quantize (CPU variant, round half
// to even) and the matching dequantization. Used to build MLX-layout test checkpoints and to check them.
#pragma once
#include <cstdint>

namespace lily {

// w [rows, cols] row-major fp32 -> packed uint32 [rows, cols*bits/32] (element 0 in the low bits),
// scales and biases bf16 [rows, cols/group_size]. bits 4 or 8; cols % group_size == 0.
void mlx_affine_quantize(const float* w, int64_t rows, int64_t cols, int bits, int group_size, uint32_t* packed,
                         uint16_t* scales, uint16_t* biases);

// One element of a packed matrix: scale * q + bias with bf16 scale/bias, fp32 math.
float mlx_affine_dequant(const uint32_t* packed, const uint16_t* scales, const uint16_t* biases, int64_t cols,
                         int bits, int group_size, int64_t row, int64_t col);

}  // namespace lily
