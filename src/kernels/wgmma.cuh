// Hopper warpgroup tensor-core primitives (sm_90a) for the prompt path's 4-bit GEMM (kernels/gemm.cu):
// wgmma.mma_async m64nNk16 (N = 64 / 32 / 16) with A (bf16) in registers and B (bf16) in shared memory, the
// shared-memory matrix descriptor of a K-major B tile with the 128-byte swizzle, and the fences around the
// asynchronous operations.
// Layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
//  - A, 64 x 16 per instruction, in registers: warp w of the warpgroup holds rows 16 w .. 16 w + 15 in the
//    m16n8k16 A fragment order (reg 0: row g, k 2t, 2t+1; reg 1: row g + 8; reg 2: row g, k 2t + 8, +9; reg 3:
//    row g + 8, k 2t + 8, +9; g = lane / 4, t = lane % 4);
//  - D, 64 x 64 fp32: per warp the same 16 rows, per thread d[4 j + e]: row g + 8 (e / 2), column 8 j + 2 t +
//    e % 2 (j < 8);
//  - B, 16 x 64 in shared memory, K-major: 64 rows (n) of 128 bytes (64 k-values of a group), 8-row atoms of 1 KB,
//    16-byte chunk c of row n stored at chunk c ^ (n % 8) (the 128-byte swizzle); the atom base 1 KB aligned.
#pragma once
#include <cstdint>

namespace lily::cuda::wgmma {

// Byte offset in a swizzled B tile of the 16-byte chunk c (< 8) of row n.
__host__ __device__ constexpr int b_chunk_offset(int n, int c) { return n * 128 + ((c ^ (n & 7)) << 4); }

// Descriptor of the K-major, 128-byte-swizzled tile at shared address `addr` (1 KB aligned), in two words: the
// high one is every tile's (stride byte offset 1024 >> 4 between 8-row atoms, swizzle mode 1: 128 B), the low one
// the start address >> 4 with leading byte offset 1 (unused with this swizzle). Shared addresses stay below
// 256 KB, so k-step s of a group (32 s bytes along K) is the low word + 2 s, and a tile `bytes` further (a
// multiple of 16) the low word + bytes >> 4.
constexpr uint32_t kBDescHi = (1024 >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t b_desc_lo(uint32_t addr) { return (addr >> 4) | (1u << 16); }
__device__ __forceinline__ uint64_t b_desc_from(uint32_t lo) { return (uint64_t{kBDescHi} << 32) | lo; }

// Before the first wgmma of a batch: orders the registers (A, D) written by ordinary instructions.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>  // until at most N committed batches are in flight
__device__ __forceinline__ void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// Shared memory written by ordinary stores or cp.async, made visible to the asynchronous proxy (wgmma's reads).
__device__ __forceinline__ void fence_proxy_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// d (+)= A B: A four bf16x2 registers, B by descriptor; accumulate false overwrites d.
__device__ __forceinline__ void m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}

// The same for 32 / 16 columns of B (d[4 j + e], j < 4 / 2).
__device__ __forceinline__ void m64n32k16(float (&d)[16], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}
__device__ __forceinline__ void m64n16k16(float (&d)[8], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}
// d (+)= A B over NT columns: d's first NT / 2 registers.
template <int NT>
__device__ __forceinline__ void m64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  if constexpr (NT == 64) m64n64k16(d, a, b, accumulate);
  else if constexpr (NT == 32) m64n32k16(reinterpret_cast<float(&)[16]>(d), a, b, accumulate);
  else m64n16k16(reinterpret_cast<float(&)[8]>(d), a, b, accumulate);
}

}  // namespace lily::cuda::wgmma
