// Embedding row gather: dequantise row `token[t]` of embed_tokens (q4 / q8 / bf16 QMat) to fp32 or bf16 row t of
// the output, for one token (the decode step) or a prompt chunk's. The ids are read on the device (e.g. written by
// the sampler), so decode steps chain without a host sync.
// Tested by tests/gpu/test_gemv.cu (one row) and tests/gpu/test_batched.cu (rows).
#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "kernels/qdot.cuh"

namespace lily::cuda {
namespace detail {

// Stage: element c of row `row` of m, dequantised.
template <QFormat F>
__device__ __forceinline__ float dequant(const uint8_t* w, const uint32_t* sb, int cols, size_t row, int c) {
  if constexpr (F == QFormat::bf16) {
    return bf16_lo(reinterpret_cast<const uint16_t*>(w)[row * cols + c]);
  } else {
    const uint8_t byte = w[(row * cols + c) * static_cast<int>(F) / 8];
    const uint32_t q = F == QFormat::q4 ? ((c & 1) ? byte >> 4 : byte & 15u) : byte;
    const uint32_t g = sb[row * (cols / kGroupSize) + c / kGroupSize];
    return fmaf(bf16_lo(g), static_cast<float>(q), bf16_hi(g));
  }
}

__device__ __forceinline__ uint16_t to_bf16_rne(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Launched plainly (it waits for everything before it); it lets the next launch in at entry: the first GDN mixer
// (programmatic dependent launch) then takes the SMs and requests its constant norm weights while this runs, and
// waits for this kernel's completion before it reads h. Grid (column blocks, tokens).
template <QFormat F, typename OT>
__global__ void embed_kernel(const uint8_t* w, const uint32_t* sb, int rows, int cols, const int* token, OT* out) {
  dep_trigger();
  const int t = token[blockIdx.y];
  const bool ok = t >= 0 && t < rows;
  out += static_cast<size_t>(blockIdx.y) * cols;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
    const float v = ok ? dequant<F>(w, sb, cols, static_cast<size_t>(t), c) : 0.f;
    if constexpr (sizeof(OT) == 4) out[c] = v;
    else out[c] = to_bf16_rne(v);
  }
}

template <typename OT>
void launch_embed(const QMat& E, const int* token, int n, OT* out, cudaStream_t s) {
  LILY_CHECK(E.w && E.n_mats == 1 && E.cols % kGroupSize == 0 && (E.format == QFormat::bf16 || E.sb),
             "embed_row: embedding matrix not allocated or stacked");
  if (n <= 0) return;
  const dim3 blocks((E.cols + 255) / 256, n);
  switch (E.format) {
    case QFormat::q4: embed_kernel<QFormat::q4, OT><<<blocks, 256, 0, s>>>(E.w, E.sb, E.rows, E.cols, token, out); break;
    case QFormat::q8: embed_kernel<QFormat::q8, OT><<<blocks, 256, 0, s>>>(E.w, E.sb, E.rows, E.cols, token, out); break;
    case QFormat::bf16: embed_kernel<QFormat::bf16, OT><<<blocks, 256, 0, s>>>(E.w, E.sb, E.rows, E.cols, token, out); break;
  }
  CUDA_CHECK_LAUNCH(s);
}

}  // namespace detail

void embed_row(const QMat& E, const int* token, float* out, cudaStream_t stream) {
  detail::launch_embed(E, token, 1, out, stream);
}

void embed_row_bf16(const QMat& E, const int* token, uint16_t* out, cudaStream_t stream) {
  detail::launch_embed(E, token, 1, out, stream);
}

void embed_rows(const QMat& E, const int* tokens, int n, float* out, cudaStream_t stream) {
  detail::launch_embed(E, tokens, n, out, stream);
}

}  // namespace lily::cuda
