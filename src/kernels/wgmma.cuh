// Hopper warpgroup tensor-core primitives (sm_90a) for the prompt path's 4-bit GEMMs (kernels/gemm.cu,
// kernels/gemm_q4f16.cu, kernels/gemm_q4ws.cu) and attention (kernels/attention_chunk.cu): wgmma.mma_async
// m64nNk16 (N = 64 / 32 / 16; on fp16 also 96 / 128) with A (bf16 or fp16) in registers and B in shared memory,
// m64n64k16 with both in shared memory, m64n256k16 with an MN-major B, the shared-memory matrix descriptors of
// 128-byte-swizzled tiles, and the fences around the asynchronous operations.
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
// Descriptor of an MN-major, 128-byte-swizzled tile at `addr` (1 KB aligned): for each k a 128-byte row of 64
// values along N, 16-byte chunk c of row k at chunk c ^ (k % 8), 8-row atoms of 1 KB (the stride byte offset), the
// next 64 values along N `lbo` bytes further (the leading byte offset, a multiple of 16).
__device__ __forceinline__ uint64_t mn_desc(uint32_t addr, uint32_t lbo) {
  return (uint64_t{kBDescHi} << 32) | (addr >> 4) | ((lbo >> 4) << 16);
}

// Before the first wgmma of a batch: orders the registers (A, D) written by ordinary instructions.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>  // until at most N committed batches are in flight
__device__ __forceinline__ void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// Shared memory written by ordinary stores or cp.async, made visible to the asynchronous proxy (wgmma's reads).
__device__ __forceinline__ void fence_proxy_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// d (+)= A B: A four 16-bit pair registers (bf16, or fp16 where F16: kernels/gemm_q4f16.cu), B by descriptor;
// accumulate false overwrites d. (The operand lists as macros: each shape's asm exists once per type.)
#define LILY_WG_D8 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define LILY_WG_D16 \
  LILY_WG_D8, "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define LILY_WG_D32                                                                                          \
  LILY_WG_D16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),   \
      "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), \
      "+f"(d[31])
#define LILY_WG_A "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate))
template <bool F16 = false>
__device__ __forceinline__ void m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  if constexpr (F16)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : LILY_WG_D32
        : LILY_WG_A);
  else
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : LILY_WG_D32
        : LILY_WG_A);
}

// The same for 32 / 16 columns of B (d[4 j + e], j < 4 / 2).
template <bool F16 = false>
__device__ __forceinline__ void m64n32k16(float (&d)[16], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  if constexpr (F16)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : LILY_WG_D16
        : LILY_WG_A);
  else
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : LILY_WG_D16
        : LILY_WG_A);
}
template <bool F16 = false>
__device__ __forceinline__ void m64n16k16(float (&d)[8], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  if constexpr (F16)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
        : LILY_WG_D8
        : LILY_WG_A);
  else
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
        : LILY_WG_D8
        : LILY_WG_A);
}
// The fp16 products over 96 / 128 columns of B (kernels/gemm_q4ws.cu's tiles of 128 tokens).
#define LILY_WG_D48                                                                                           \
  LILY_WG_D32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]),  \
      "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), \
      "+f"(d[47])
#define LILY_WG_D64                                                                                           \
  LILY_WG_D48, "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),  \
      "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
      "+f"(d[63])
#define LILY_WG_R32                                                                                 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
#define LILY_WG_R48 LILY_WG_R32 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
__device__ __forceinline__ void m64n96k16_f16(float (&d)[48], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 {" LILY_WG_R48 "}, "
      "{%48, %49, %50, %51}, %52, p, 1, 1, 0;\n}\n"
      : LILY_WG_D48
      : LILY_WG_A);
}
__device__ __forceinline__ void m64n128k16_f16(float (&d)[64], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" LILY_WG_R48
      ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : LILY_WG_D64
      : LILY_WG_A);
}

// d (+)= A B over NT columns: d's first NT / 2 registers.
template <int NT, bool F16 = false>
__device__ __forceinline__ void m64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  if constexpr (NT == 64) m64n64k16<F16>(d, a, b, accumulate);
  else if constexpr (NT == 32) m64n32k16<F16>(reinterpret_cast<float(&)[16]>(d), a, b, accumulate);
  else m64n16k16<F16>(reinterpret_cast<float(&)[8]>(d), a, b, accumulate);
}

// The same up to NT = 128 (kernels/gemm_q4ws.cu; fp16): d's first NT / 2 registers.
template <int NT>
__device__ __forceinline__ void m64k16_f16(float (&d)[64], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  if constexpr (NT == 128) m64n128k16_f16(d, a, b, accumulate);
  else if constexpr (NT == 96) m64n96k16_f16(reinterpret_cast<float(&)[48]>(d), a, b, accumulate);
  else m64k16<NT, true>(reinterpret_cast<float(&)[32]>(d), a, b, accumulate);
}

// d += A B with N = 256: A four bf16x2 registers, B by the descriptor of an MN-major tile (imm-trans-b = 1: the
// attention's V, keys x dims with the dims contiguous). Always accumulates (d starts as zeros).
__device__ __forceinline__ void m64n256k16_tb(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// d (+)= A B, both by descriptors of K-major tiles (the attention's q and K).
__device__ __forceinline__ void m64n64k16_ss(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : LILY_WG_D32
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

#undef LILY_WG_D8
#undef LILY_WG_D48
#undef LILY_WG_D64
#undef LILY_WG_R32
#undef LILY_WG_R48
#undef LILY_WG_D16
#undef LILY_WG_D32
#undef LILY_WG_A

}  // namespace lily::cuda::wgmma
