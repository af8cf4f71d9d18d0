// Benchmark of the prompt path's kernels (kernels/batched.h) on the real Qwen3.6-35B-A3B shapes for one chunk
// of n tokens: the dense GEMMs of a layer, the MoE's grouped GEMMs (each token's 8 experts drawn at random),
// the GEMM's input split, the GDN chunk and the attention chunk (at context 0, 4K and 30K); up to 64 tokens, also the
// routed experts streamed as a decode pass takes them (kernels/moe_rows.cu) and lm_head; up to 64 tokens, the dense
// GEMMs also on the int8 tensor cores (kernels/gemm_i8.cu).
// Usage: bench_prefill [tokens per chunk, default 2048] [rows] [f16] [one] [ws] [attn1 | wg]: f16, the 4-bit GEMMs
// on x's fp16 form (KernelOptions::prompt_gemm_f16); one, its first term alone; ws, by the warp-specialised tile
// (KernelOptions::prompt_gemm_ws, kernels/gemm_q4ws.cu); attn1, the attention chunk
// with q and p in one bf16 term (KernelOptions::prompt_attn_one_term), wg the same on warpgroup MMA
// (prompt_attn_wgmma); rows, launches of <= 16 tokens a tile through kernels/gemm_rows.cu
// (KernelOptions::gemm_rows). Each case is captured into a CUDA graph several times over distinct weight copies
// (>= ~256 MB, beyond the L2) and replayed; the median time per launch is
// reported with the useful FLOPs (2 x weights x tokens; the GEMM's split input doubles the tensor-core work),
// TFLOP/s and the weights' GB/s.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "device_data.cuh"
#include "graph_time.cuh"
#include "kernels/batched.h"
#include "kernels/common.cuh"

using namespace lily::cuda;
using bench::dalloc;
using bench::make_mat;
using bench::make_vec;

namespace {

int kN = 2048;  // tokens per chunk (CudaEngine::kPrefillChunk; argv[1] for another)
bool kOne = false;  // argument "one": the fp16 form's first term alone (KernelOptions::prompt_x_one_term)
bool kWs = false;   // argument "ws": the warp-specialised tile (KernelOptions::prompt_gemm_ws)
GemmX view_of(const GemmXBuf& b) {
  GemmX v = b.view();
  if (kOne) v.f16lo = nullptr;
  v.ws = kWs;
  return v;
}

double time_graph(int copies, const std::function<void(int, cudaStream_t)>& launch) {
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double us = graph_median_us(s, copies, launch, 9);
  CUDA_CHECK(cudaStreamDestroy(s));
  return us;
}

void report(const char* name, double us, double flops, double bytes) {
  std::printf("%-44s %9.1f us %8.2f GFLOP %7.1f TFLOP/s %7.0f GB/s\n", name, us, flops / 1e9, flops / us / 1e6,
              bytes / us / 1e3);
}

// Up to kI8MaxTokens tokens: x staged for kernels/gemm_i8.cu at width K (from the fp32 rows src), once per K.
const float* kSrc = nullptr;
const void* i8x_for(int K) {
  static const void* staged[2] = {};
  const int i = K == 2048 ? 0 : 1;
  if (!staged[i]) {
    void* p = dalloc(kN * i8x_row_bytes(K));
    i8x_prep(kSrc, 4096, kN, K, nullptr, 0.f, p, 0);
    staged[i] = p;
  }
  return staged[i];
}
bool i8_applies(QFormat f, int cols) {
  return kN <= kI8MaxTokens && f == QFormat::q4 && (cols == 2048 || cols == 4096);
}

// The launches b[i] (one per weight copy) on the int8 tensor cores: ks 0 (the launcher's choice), then each split of
// K between a tile's warps.
void int8_variants(const char* name, const std::vector<GemmBatch>& b, int cols, double flops, double bytes) {
  const void* xs = i8x_for(cols);
  for (int ks : {0, 1, 2, 4, 8}) {
    if (cols % (512 * std::max(ks, 1)) != 0) continue;
    const double us = time_graph((int)b.size(), [&](int i, cudaStream_t s) { gemm_i8(b[i], xs, kN, false, s, ks); });
    report((std::string(name) + ", int8 ks " + (ks ? std::to_string(ks) : "auto")).c_str(), us, flops, bytes);
  }
}

// Dense GEMM rows x cols over kN tokens (over `copies` weight copies); up to kI8MaxTokens also on the int8 cores.
void dense(const char* name, QFormat f, int rows, int cols, const GemmXBuf& x, float* y) {
  const QMat probe = [&] { QMat m; m.format = f, m.rows = rows, m.cols = cols; return m; }();
  const int copies = std::max(2, (int)std::ceil(256e6 / probe.bytes()));
  std::vector<QMat> w;
  for (int i = 0; i < copies; ++i) w.push_back(make_mat(f, rows, cols));
  GemmXBuf xv = x;
  xv.K = cols;
  const double us =
      time_graph(copies, [&](int i, cudaStream_t s) { gemm(w[i], 0, view_of(xv), kN, y, rows, false, s); });
  report(name, us, 2.0 * rows * cols * kN, (double)probe.bytes());
  if (!i8_applies(f, cols)) return;
  std::vector<GemmBatch> b(copies);
  for (int i = 0; i < copies; ++i) b[i].n = 1, b[i].W[0] = w[i], b[i].y[0] = y, b[i].ldy[0] = rows;
  int8_variants(name, b, cols, 2.0 * rows * cols * kN, (double)probe.bytes());
}

// Several matrices sharing x in one launch (gemm_multi), as the prompt path projects.
void multi(const char* name, QFormat f, std::vector<int> rows, int cols, const GemmXBuf& x, float* y) {
  double bytes = 0, flops = 0;
  for (int r : rows) {
    QMat m;
    m.format = f, m.rows = r, m.cols = cols;
    bytes += (double)m.bytes();
    flops += 2.0 * r * cols * kN;
  }
  const int copies = std::max(2, (int)std::ceil(256e6 / bytes));
  std::vector<GemmBatch> b(copies);
  for (auto& bb : b) {
    bb.n = (int)rows.size();
    size_t off = 0;
    for (int i = 0; i < bb.n; ++i) {
      bb.W[i] = make_mat(f, rows[i], cols);
      bb.y[i] = y + off;
      bb.ldy[i] = rows[i];
      off += (size_t)rows[i] * kN;
    }
  }
  GemmXBuf xv = x;
  xv.K = cols;
  const double us = time_graph(copies, [&](int i, cudaStream_t s) { gemm_multi(b[i], view_of(xv), kN, false, s); });
  report(name, us, flops, bytes);
  if (i8_applies(f, cols)) int8_variants(name, b, cols, flops, bytes);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) kN = std::clamp(std::atoi(argv[1]), 1, 4096);  // (moe_group: 4096 tokens x 8 at most)
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  bool attn1 = false, few = false, attn_wg = false, f16 = false;
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "attn1") {
      attn1 = true;
      std::printf("attention with q and p in one bf16 term\n");
    } else if (std::string(argv[i]) == "wg") {
      attn1 = attn_wg = true;
      std::printf("attention with q and p in one bf16 term on warpgroup MMA\n");
    } else if (std::string(argv[i]) == "f16") {
      f16 = true;
      std::printf("the 4-bit GEMMs on x's fp16 form (kernels/gemm_q4f16.cu)\n");
    } else if (std::string(argv[i]) == "one") {
      f16 = kOne = true;
      std::printf("the 4-bit GEMMs on the first term of x's fp16 form alone\n");
    } else if (std::string(argv[i]) == "ws") {
      f16 = kWs = true;
      std::printf("the 4-bit GEMMs on x's fp16 form by the warp-specialised tile (kernels/gemm_q4ws.cu)\n");
    } else if (std::string(argv[i]) == "rows") {
      few = true;
      std::printf("launches of <= 16 tokens a tile through kernels/gemm_rows.cu\n");
    }
  }
  const int H = 2048, E = 256, k = 8, F = 512;
  std::printf("prompt-path kernels, one chunk of n = %d tokens (real shapes; weights beyond the L2)\n", kN);
  GemmXBuf x = gemm_x_alloc(kN * k, 4096, f16);
  x.few = few;
  float* src = make_vec((size_t)kN * k * 4096);
  kSrc = src;
  float* y = static_cast<float*>(dalloc(std::max((size_t)kN * k * 8192, (size_t)kN * 248320) * sizeof(float)));
  float* norm_w = make_vec(H);
  {
    GemmXBuf xh = x;
    xh.K = H;
    const double us =
        time_graph(8, [&](int, cudaStream_t s) { gemm_x_prep(src, H, kN, norm_w, 1e-6f, xh, nullptr, s); });
    report("x prep (RMSNorm + split), n x 2048", us, 0, (double)kN * H * 4);
    GemmXBuf xw = x;
    xw.K = 4096;
    gemm_x_prep(src, 4096, kN * k, nullptr, 0.f, xw, nullptr, 0);  // every width below reads valid rows
  }
  dense("gemm q4 in_proj_qkv 8192 x 2048", QFormat::q4, 8192, H, x, y);
  dense("gemm q4 in_proj_z 4096 x 2048", QFormat::q4, 4096, H, x, y);
  dense("gemm q4 in_proj_b / _a 32 x 2048", QFormat::q4, 32, H, x, y);
  dense("gemm q4 out_proj / o_proj 2048 x 4096", QFormat::q4, H, 4096, x, y);
  dense("gemm q4 attn k / v 512 x 2048", QFormat::q4, 512, H, x, y);
  dense("gemm q4 shared gate / up 512 x 2048", QFormat::q4, F, H, x, y);
  dense("gemm q4 shared down 2048 x 512", QFormat::q4, H, F, x, y);
  dense("gemm q8 router 256 x 2048", QFormat::q8, E, H, x, y);
  if (kN <= 64) dense("gemm q4 lm_head 248320 x 2048", QFormat::q4, 248320, H, x, y);
  multi("gemm_multi q4 GDN in_proj qkv|z|b|a", QFormat::q4, {8192, 4096, 32, 32}, H, x, y);
  multi("gemm_multi q4 attention q|k|v", QFormat::q4, {8192, 512, 512}, H, x, y);
  multi("gemm_multi q8 router|shared expert gate", QFormat::q8, {256, 1}, H, x, y);
  {  // the prompt path's shared expert gate alone (kernels/gemm_one_row.cu; its bytes are x's, not the row's)
    std::vector<QMat> w;
    for (int i = 0; i < 8; ++i) w.push_back(make_mat(QFormat::q8, 1, H));
    GemmXBuf xv = x;
    xv.K = H;
    const double us = time_graph(8, [&](int i, cudaStream_t s) { gemm_one_row(w[i], xv.view(), kN, y, 1, s); });
    report("gemm_one_row q8 shared expert gate 1 x 2048", us, 2.0 * H * kN, (double)kN * H * 4);
  }
  multi("gemm_multi q4 shared expert gate|up", QFormat::q4, {512, 512}, H, x, y);
  {
    const QMat g = make_mat(QFormat::q4, 512, H), u = make_mat(QFormat::q4, 512, H);
    GemmXBuf xh = x;
    xh.K = H;
    const double us = time_graph(1, [&](int, cudaStream_t s) { gemm_swiglu(g, u, view_of(xh), kN, y, 512, s); });
    report("gemm_swiglu q4 shared expert gate|up", us, 4.0 * 512 * H * kN, 2.0 * g.bytes());
  }

  // routed experts: each token's 8 distinct experts at random, grouped as moe_group does
  {
    std::mt19937 rng(7);
    std::vector<int> idx(kN * k);
    std::vector<float> w(kN * k, 0.125f);
    for (int t = 0; t < kN; ++t) {
      std::vector<int> e(E);
      for (int i = 0; i < E; ++i) e[i] = i;
      std::shuffle(e.begin(), e.end(), rng);
      for (int j = 0; j < k; ++j) idx[t * k + j] = e[j];
    }
    int* d_idx = static_cast<int*>(dalloc(idx.size() * sizeof(int)));
    float* d_w = static_cast<float*>(dalloc(w.size() * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_idx, idx.data(), idx.size() * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_w, w.data(), w.size() * sizeof(float), cudaMemcpyHostToDevice));
    int* off = static_cast<int*>(dalloc((E + 1) * sizeof(int)));
    int* x_row = static_cast<int*>(dalloc(kN * k * sizeof(int)));
    float* w_slot = static_cast<float*>(dalloc(kN * k * sizeof(float)));
    int* slot_of = static_cast<int*>(dalloc(kN * k * sizeof(int)));
    const double us_group = time_graph(8, [&](int, cudaStream_t s) {
      moe_group(d_idx, d_w, kN, k, E, off, x_row, w_slot, slot_of, s);
    });
    report("moe_group n tokens x 8", us_group, 0, 0);
    const int max_tiles = gemm_grouped_max_tiles(kN * k, E);
    int* tiles = static_cast<int*>(dalloc((1 + max_tiles) * sizeof(int)));
    const int tile_tok = kWs ? kGemmWsTok : 64;
    const double us_tiles =
        time_graph(8, [&](int, cudaStream_t s) { gemm_grouped_tiles(off, E, tiles, s, tile_tok); });
    report("gemm_grouped_tiles", us_tiles, 0, 0);
    const QMat up_probe = [&] { QMat m; m.format = QFormat::q4, m.rows = F, m.cols = H, m.n_mats = E; return m; }();
    const int copies = 3;
    std::vector<QMat> gate, down;
    for (int i = 0; i < copies; ++i) {
      gate.push_back(make_mat(QFormat::q4, F, H, E));
      down.push_back(make_mat(QFormat::q4, H, F, E));
    }
    GemmXBuf xh = x, xf = x;
    xh.K = H, xf.K = F;
    const double us_gate = time_graph(copies, [&](int i, cudaStream_t s) {
      gemm_grouped(gate[i], view_of(xh), x_row, off, tiles, max_tiles, y, F, s, kN);
    });
    report("gemm_grouped q4 experts gate / up 256 x 512 x 2048", us_gate, 2.0 * F * H * kN * k,
           (double)up_probe.bytes());
    std::vector<QMat> up;
    for (int i = 0; i < copies; ++i) up.push_back(make_mat(QFormat::q4, F, H, E));
    const double us_pair = time_graph(copies, [&](int i, cudaStream_t s) {
      gemm_grouped_swiglu(gate[i], up[i], view_of(xh), x_row, off, tiles, max_tiles, w_slot, y, F, s, kN);
    });
    report("gemm_grouped_swiglu q4 experts gate|up", us_pair, 4.0 * F * H * kN * k, 2.0 * up_probe.bytes());
    const double us_down = time_graph(copies, [&](int i, cudaStream_t s) {
      gemm_grouped(down[i], view_of(xf), nullptr, off, tiles, max_tiles, y, H, s, kN);
    });
    report("gemm_grouped q4 experts down 256 x 2048 x 512", us_down, 2.0 * F * H * kN * k, (double)up_probe.bytes());
    if (kN <= 64) {  // a decode pass's experts streamed (kernels/moe_rows.cu); GB/s of the experts the tokens use
      gemm_grouped_tiles(off, E, tiles, nullptr, 64);  // (its work list: 64-slot tiles)
      std::vector<char> used(E, 0);
      for (int i : idx) used[i] = 1;
      const double used_bytes = up_probe.bytes() / E * std::count(used.begin(), used.end(), 1);
      std::printf("(%d of %d experts used; the gemm_grouped lines' GB/s count all of them)\n",
                  (int)std::count(used.begin(), used.end(), 1), E);
      void* xs = dalloc(std::max(kN * stream_row_bytes(H), (size_t)kN * k * stream_row_bytes(F)));
      float* src = make_vec((size_t)kN * k * F);  // (>= kN * H values)
      const double us_prep = time_graph(8, [&](int, cudaStream_t s) { stream_rows_prep(src, H, kN, H, xs, s); });
      report("stream_rows_prep n x 2048", us_prep, 0, 0);
      const double us_up = time_graph(copies, [&](int i, cudaStream_t s) {
        moe_rows_swiglu(gate[i], up[i], xs, x_row, off, tiles, max_tiles, w_slot, y, F, s);
      });
      report("moe_rows_swiglu q4 experts gate|up", us_up, 4.0 * F * H * kN * k, 2.0 * used_bytes);
      stream_rows_prep(src, F, kN * k, F, xs, 0);
      const double us_dn = time_graph(copies, [&](int i, cudaStream_t s) {
        moe_rows_down(down[i], xs, off, tiles, max_tiles, y, H, s);
      });
      report("moe_rows_down q4 experts down", us_dn, 2.0 * F * H * kN * k, used_bytes);
    }
  }

  // GDN chunk (real dims) and attention chunk at context 0, 4K and 30K
  {
    const GdnDims d{16, 32, 128, 128};
    const int C = d.conv_dim(), VD = d.n_v_heads * d.v_dim;
    float *qkv = make_vec((size_t)kN * C), *z = make_vec((size_t)kN * VD);
    float *a = make_vec((size_t)kN * 32), *b = make_vec((size_t)kN * 32);
    float *cw = make_vec((size_t)C * 4, 0.5f), *al = make_vec(32), *dt = make_vec(32), *nw = make_vec(128);
    float* ring = make_vec((size_t)4 * C);
    float* S = make_vec((size_t)32 * 128 * 128, 0.1f);
    float* out = static_cast<float*>(dalloc((size_t)kN * VD * sizeof(float)));
    void* scratch = dalloc(gdn_chunk_scratch_bytes(kN, d, true));
    for (const bool wy : {false, true}) {
      const double us = time_graph(4, [&](int, cudaStream_t s) {
        launch_gdn_chunk(qkv, z, a, b, cw, al, dt, nw, ring, S, out, scratch, 4096, kN, d, 1e-6f, wy, s);
      });
      report(wy ? "gdn chunk WY (Hv 32, Dk = Dv 128)" : "gdn chunk (Hv 32, Dk = Dv 128)", us, 0, 0);
    }
    // the chunked form's two kernels apart (on the prep rows the chunk launches left in the scratch)
    for (const int parts : {1, 2}) {
      const size_t work_at = gdn_chunk_scratch_bytes(kN, d, true) - gdn_wy_work_bytes(d);
      const double us = time_graph(4, [&](int, cudaStream_t s) {
        launch_gdn_wy(static_cast<const float*>(scratch), a, al, dt, S, out, static_cast<uint8_t*>(scratch) + work_at,
                      4096, kN, d, s, parts);
      });
      report(parts == 1 ? "gdn WY piece kernels" : "gdn WY chain kernels", us, 0, 0);
    }
  }
  for (const int ctx : {0, 4096, 30720}) {
    const int Hq = 16, Hkv = 2, D = 256, P = 1024;
    const int pages = (ctx + kN + P - 1) / P;
    std::vector<uint16_t*> pg(pages);
    for (auto& p : pg) {
      p = static_cast<uint16_t*>(dalloc(kv_page_elems(P, Hkv, D) * 2));
      CUDA_CHECK(cudaMemset(p, 0x3c, kv_page_elems(P, Hkv, D) * 2));  // bf16 ~0.011
    }
    uint16_t** table = static_cast<uint16_t**>(dalloc(pages * sizeof(uint16_t*)));
    CUDA_CHECK(cudaMemcpy(table, pg.data(), pages * sizeof(uint16_t*), cudaMemcpyHostToDevice));
    KvPages kv{table, P, Hkv, D};
    AttnIn in;
    in.qg = make_vec((size_t)kN * Hq * 2 * D);
    in.k = make_vec((size_t)kN * Hkv * D), in.v = make_vec((size_t)kN * Hkv * D);
    in.q_norm = make_vec(D), in.k_norm = make_vec(D), in.eps = 1e-6f;
    attn_in_rope(in, 64, 1e7);
    void* scratch = dalloc(attention_chunk_scratch_bytes(kN, Hq, D));
    float* out = static_cast<float*>(dalloc((size_t)kN * Hq * D * sizeof(float)));
    const double us = time_graph(4, [&](int, cudaStream_t s) {
      launch_attention_chunk(in, kv, ctx, kN, Hq, scratch, out, s, attn1, attn_wg);
    });
    // QK and PV: 2 x 2 x d FLOPs per (query head, key) over the causal triangle plus the context
    const double pairs = (double)kN * ctx + (double)kN * (kN + 1) / 2;
    const std::string name = "attention chunk after " + std::to_string(ctx);
    report(name.c_str(), us, 4.0 * D * Hq * pairs, 0);
  }
  bench::free_all();
  gemm_x_free(x);
  return 0;
}
