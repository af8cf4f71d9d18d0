// Getting weights into the QMat layout (kernels/qmat.h) on the GPU: allocation, MLX checkpoint upload/repack
// (the packed words are copied as they are, scales and biases interleaved into one uint32 per group), and
// bf16 -> q4/q8 quantisation with the MLX affine rule (docs/model.md §4.2), round half to even.
// Tested by tests/gpu/test_gemv.cu.
#include "kernels/common.cuh"
#include "kernels/qdot.cuh"

namespace lily::cuda {
namespace detail {

__global__ void interleave_sb_kernel(const uint16_t* scales, const uint16_t* biases, uint32_t* sb, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    sb[i] = static_cast<uint32_t>(scales[i]) | (static_cast<uint32_t>(biases[i]) << 16);
}

__device__ __forceinline__ uint16_t to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// One thread per 64-element group: MLX affine_quantize (CPU rounding: rint), packs q into w, scale|bias into sb.
template <int BITS>
__global__ void quantize_kernel(const uint16_t* src, uint8_t* w, uint32_t* sb, size_t n_groups) {
  const size_t g = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (g >= n_groups) return;
  const uint16_t* s = src + g * kGroupSize;
  constexpr float n_bins = static_cast<float>((1 << BITS) - 1);
  float wmax = -INFINITY, wmin = INFINITY;
  for (int i = 0; i < kGroupSize; ++i) {
    const float v = bf16_lo(s[i]);
    wmax = fmaxf(wmax, v);
    wmin = fminf(wmin, v);
  }
  float scale = fmaxf((wmax - wmin) / n_bins, 1e-7f);
  float edge = wmax;
  if (fabsf(wmin) > fabsf(wmax)) edge = wmin;
  else scale = -scale;
  const float q0 = rintf(edge / scale);
  float bias = 0.f;
  if (q0 != 0.f) {
    scale = edge / q0;
    bias = edge;
  }
  uint8_t* out = w + g * (kGroupSize * BITS / 8);
  for (int i = 0; i < kGroupSize; i += 8 / BITS) {
    uint32_t byte = 0;
    for (int k = 0; k < 8 / BITS; ++k) {
      const float q = fminf(fmaxf(rintf((bf16_lo(s[i + k]) - bias) / scale), 0.f), n_bins);
      byte |= static_cast<uint32_t>(q) << (BITS * k);
    }
    out[i / (8 / BITS)] = static_cast<uint8_t>(byte);
  }
  sb[g] = static_cast<uint32_t>(to_bf16(scale)) | (static_cast<uint32_t>(to_bf16(bias)) << 16);
}

int grid_for(size_t n, int threads) {
  const size_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 65536 ? (b == 0 ? 1 : b) : 65536);
}

}  // namespace detail

void qmat_alloc(QMat& m) {
  LILY_CHECK(m.rows > 0 && m.cols > 0 && m.n_mats > 0 && m.cols % kGroupSize == 0, "qmat_alloc: bad shape ",
             m.n_mats, "x", m.rows, "x", m.cols);
  CUDA_CHECK(cudaMalloc(&m.w, m.w_bytes()));
  m.sb = nullptr;
  if (m.format != QFormat::bf16) CUDA_CHECK(cudaMalloc(&m.sb, m.sb_bytes()));
}

void qmat_free(QMat& m) {
  if (m.w) cudaFree(m.w);
  if (m.sb) cudaFree(m.sb);
  m.w = nullptr;
  m.sb = nullptr;
}

void repack_mlx(const QMat& m, const uint32_t* words, const uint16_t* scales, const uint16_t* biases,
                cudaStream_t stream) {
  LILY_CHECK(m.format != QFormat::bf16 && m.w && m.sb, "repack_mlx: destination must be an allocated q4/q8 matrix");
  if (reinterpret_cast<const void*>(words) != m.w)
    CUDA_CHECK(cudaMemcpyAsync(m.w, words, m.w_bytes(), cudaMemcpyDeviceToDevice, stream));
  const size_t n = m.mat_groups() * m.n_mats;
  detail::interleave_sb_kernel<<<detail::grid_for(n, 256), 256, 0, stream>>>(scales, biases, m.sb, n);
  CUDA_CHECK_LAUNCH(stream);
}

size_t upload_mlx_staging_bytes(const QMat& m) { return 2 * m.mat_groups() * m.n_mats * sizeof(uint16_t); }

void upload_mlx(const QMat& m, const uint32_t* host_words, const uint16_t* host_scales,
                const uint16_t* host_biases, void* staging, cudaStream_t stream) {
  LILY_CHECK(m.format != QFormat::bf16 && m.w && m.sb && staging, "upload_mlx: needs an allocated q4/q8 matrix and staging");
  const size_t n = m.mat_groups() * m.n_mats;
  uint16_t* s = static_cast<uint16_t*>(staging);
  CUDA_CHECK(cudaMemcpyAsync(m.w, host_words, m.w_bytes(), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaMemcpyAsync(s, host_scales, n * sizeof(uint16_t), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaMemcpyAsync(s + n, host_biases, n * sizeof(uint16_t), cudaMemcpyHostToDevice, stream));
  repack_mlx(m, reinterpret_cast<const uint32_t*>(m.w), s, s + n, stream);
}

void from_bf16(const QMat& m, const uint16_t* src, cudaStream_t stream) {
  LILY_CHECK(m.w && (m.format == QFormat::bf16 || m.sb), "from_bf16: destination not allocated");
  if (m.format == QFormat::bf16) {
    CUDA_CHECK(cudaMemcpyAsync(m.w, src, m.w_bytes(), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const size_t n = m.mat_groups() * m.n_mats;
  const int blocks = static_cast<int>((n + 127) / 128);
  if (m.format == QFormat::q4) detail::quantize_kernel<4><<<blocks, 128, 0, stream>>>(src, m.w, m.sb, n);
  else detail::quantize_kernel<8><<<blocks, 128, 0, stream>>>(src, m.w, m.sb, n);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace lily::cuda
