// Benchmark of the weight-streaming kernels on the real Qwen3.6-35B-A3B shapes (batch-1 decode).
// Usage: bench_kernels [out.json]
// For each case: the weights are replicated into enough copies to exceed the L2 several times (>= ~600 MB),
// one CUDA graph launches the kernel once per copy, the graph is replayed (after warm-up) and the median
// replay time / copies is the per-kernel time (includes the graph's inter-kernel gap, as in decode).
// Reported: µs, bytes streamed (weights + scale/bias words), GB/s and % of the measured D2D copy bandwidth
// (cudaMemcpy D2D of 1 GiB, bytes read + written). A last case runs the whole per-token weight stream
// (40 layers of mixer projections + MoE, lm_head) as one graph.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "device_data.cuh"
#include "graph_time.cuh"
#include "kernels/common.cuh"
#include "kernels/mixers.h"
#include "kernels/qmat.h"
#include "kernels/batched.h"
#include "kernels/sampling.h"
#include "kernels/trace.h"

using namespace lily::cuda;
using bench::dalloc;
using bench::make_mat;
using bench::make_vec;

namespace {

struct Result {
  std::string name;
  double us = 0, bytes = 0, gbs = 0, pct = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Captures launch(i) for i < copies into one graph on a fresh stream; the median µs per launch.
double time_graph(int copies, const std::function<void(int, cudaStream_t)>& launch, int replays = 15) {
  CUDA_CHECK(cudaDeviceSynchronize());  // the weight fills ran on the legacy stream
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double us = graph_median_us(s, copies, launch, replays);
  CUDA_CHECK(cudaStreamDestroy(s));
  return us;
}

double copy_bandwidth() {
  const size_t n = size_t{1} << 30;
  void* src = dalloc(n);
  void* dst = dalloc(n);
  CUDA_CHECK(cudaMemset(src, 1, n));
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> gbs;
  for (int r = 0; r < 12; ++r) {
    CUDA_CHECK(cudaEventRecord(a));
    CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r >= 2) gbs.push_back(2.0 * n / (ms * 1e-3) / 1e9);
  }
  return median(gbs);
}

int copies_for(double bytes) { return std::max(2, static_cast<int>(std::ceil(640e6 / bytes))); }

// A MoE block's random weights in lily's layout: a q8 router of E experts and shared-expert gate, E 4-bit experts
// and the 4-bit shared expert.
MoeWeightsDev make_moe(int E) {
  const QFormat q4 = QFormat::q4, q8 = QFormat::q8;
  MoeWeightsDev m;
  m.gate = make_mat(q8, E, kHidden);
  m.shared_expert_gate = make_mat(q8, 1, kHidden);
  m.experts_gate = make_mat(q4, kMoeFfn, kHidden, E);
  m.experts_up = make_mat(q4, kMoeFfn, kHidden, E);
  m.experts_down = make_mat(q4, kHidden, kMoeFfn, E);
  m.shared_gate = make_mat(q4, kMoeFfn, kHidden);
  m.shared_up = make_mat(q4, kMoeFfn, kHidden);
  m.shared_down = make_mat(q4, kHidden, kMoeFfn);
  return m;
}

using Report = std::function<void(const std::string&, double, double)>;

// The MoE block of a decode pass of n one-token rows in one launch (moe_fused_rows, after moe_router_sums_rows:
// in a pass the out projection adds the sums), 8 full-size layers (E = 256, 3.6 GB) in turn, random h: the
// bytes are the expected distinct experts of n rows of uniform top-8 routing.
// Then one traced launch a layer: per phase (kernels/moe_fused_rows.cu's stamps), the median block's time after
// the first block returned from griddepcontrol.wait, averaged over the layers.
void moe_rows_case(const Report& report) {
  const int L = 8;
  std::vector<MoeWeightsDev> rm(L);
  for (int l = 0; l < L; ++l) {
    rm[l] = make_moe(kExperts);
    moe_build_router_slices(rm[l], nullptr);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  if (moe_fused_rows_supported(rm[0], kTopK)) {
    MoeRowsScratch rs = moe_fused_rows_alloc(kExperts);
    float* hr = make_vec(static_cast<size_t>(kMoeFusedMaxRows) * kHidden, 3.f);
    float* nw = make_vec(kHidden);
    const double per_expert = 3.0 * (rm[0].experts_gate.mat_w_bytes() + 4.0 * rm[0].experts_gate.mat_groups());
    auto* tr = static_cast<unsigned long long*>(dalloc(sizeof(unsigned long long) * L * kTraceBlocks * kTraceStamps));
    const char* names[] = {"x", "shared", "select", "gate|up", "barrier", "staged", "end"};
    constexpr int kStamps = 7;
    for (int n = 1; n <= kMoeFusedMaxRows; n = n < 2 ? 2 : n + 2) {
      const double distinct = kExperts * (1.0 - std::pow(1.0 - static_cast<double>(kTopK) / kExperts, n));
      const double us = time_graph(L * 4, [&](int i, cudaStream_t s) {
        moe_router_sums_rows(moe_fused_rows_sums(rm[i % L], nw, rs), hr, n, s);
        moe_fused_rows(rm[i % L], hr, n, nw, 1e-6f, rs, s);
      });
      report("router sums + moe_fused_rows " + std::to_string(n) + " rows", us, (distinct + 1) * per_expert);
      CUDA_CHECK(cudaMemset(tr, 0, sizeof(unsigned long long) * L * kTraceBlocks * kTraceStamps));
      for (int l = 0; l < L; ++l) {
        moe_router_sums_rows(moe_fused_rows_sums(rm[l], nw, rs), hr, n, nullptr);
        moe_fused_rows(rm[l], hr, n, nw, 1e-6f, rs, nullptr, tr + static_cast<size_t>(l) * kTraceBlocks * kTraceStamps);
      }
      CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<unsigned long long> t(static_cast<size_t>(L) * kTraceBlocks * kTraceStamps);
      CUDA_CHECK(cudaMemcpy(t.data(), tr, t.size() * sizeof(t[0]), cudaMemcpyDeviceToHost));
      const int nb = sm_count();
      double ph[kStamps + 1] = {};
      for (int l = 1; l < L; ++l) {  // the first layer's launch: cold start, left out
        const unsigned long long* b = t.data() + static_cast<size_t>(l) * kTraceBlocks * kTraceStamps;
        unsigned long long w0 = ~0ull;
        for (int i = 0; i < nb; ++i) w0 = std::min(w0, b[i * kTraceStamps + 15]);
        for (int p = 1; p <= kStamps; ++p) {
          std::vector<double> v;
          for (int i = 0; i < nb; ++i) v.push_back(static_cast<double>(b[i * kTraceStamps + p]) - static_cast<double>(w0));
          ph[p] += median(v) / 1e3 / (L - 1);
        }
      }
      std::printf("  phases (median block, us after the first wait):");
      for (int p = 1; p <= kStamps; ++p) std::printf(" %s %.1f", names[p - 1], ph[p]);
      std::printf("\n");
    }
    moe_fused_rows_free(rs);
  }
}

}  // namespace

int main(int argc, char** argv) {
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double bw = copy_bandwidth();
  std::printf("device %s, %d SMs, L2 %d MB; D2D copy bandwidth %.0f GB/s\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, bw);
  std::vector<Result> res;
  auto report = [&](const std::string& name, double us, double bytes) {
    Result r{name, us, bytes, bytes / (us * 1e-6) / 1e9, 0};
    r.pct = 100.0 * r.gbs / bw;
    res.push_back(r);
    std::printf("%-36s %9.2f us %10.2f MB %8.0f GB/s %6.1f%%\n", name.c_str(), us, bytes / 1e6, r.gbs, r.pct);
    std::fflush(stdout);
  };
  float* x = make_vec(8192);
  float* y = make_vec(1 << 20);
  const QFormat q4 = QFormat::q4, q8 = QFormat::q8;

  // Plain GEMVs (x fp32 -> y fp32)
  struct G { const char* name; QFormat f; int rows, cols; bool acc; };
  const G gemvs[] = {{"gdn in_proj_qkv 8192x2048", q4, 8192, 2048, false},
                     {"gdn in_proj_z 4096x2048", q4, 4096, 2048, false},
                     {"gdn out_proj 2048x4096 (+=)", q4, 2048, 4096, true},
                     {"attn q_proj 8192x2048", q4, 8192, 2048, false},
                     {"attn o_proj 2048x4096 (+=)", q4, 2048, 4096, true},
                     {"router q8 256x2048", q8, 256, 2048, false}};
  for (const G& g : gemvs) {
    QMat proto;
    proto.format = g.f; proto.rows = g.rows; proto.cols = g.cols;
    const int n = copies_for(static_cast<double>(proto.bytes()));
    std::vector<QMat> ms;
    for (int i = 0; i < n; ++i) ms.push_back(make_mat(g.f, g.rows, g.cols));
    const double us = time_graph(n, [&](int i, cudaStream_t s) { gemv(ms[i], x, y, g.acc, s); });
    report(g.name, us, static_cast<double>(proto.bytes()));
  }
  // Batched mixer input projections (one launch)
  {
    struct M { const char* name; std::vector<int> rows; };
    for (const M& mm : {M{"gdn qkv+z+b+a (one launch)", {8192, 4096, 32, 32}}, M{"attn q+k+v (one launch)", {8192, 512, 512}}}) {
      double bytes = 0;
      for (int r : mm.rows) {
        QMat p; p.format = q4; p.rows = r; p.cols = 2048;
        bytes += static_cast<double>(p.bytes());
      }
      const int n = copies_for(bytes);
      std::vector<GemvBatch> bs(n);
      for (int i = 0; i < n; ++i) {
        bs[i].n = static_cast<int>(mm.rows.size());
        int off = 0;
        for (int j = 0; j < bs[i].n; ++j) {
          bs[i].W[j] = make_mat(q4, mm.rows[j], 2048);
          bs[i].y[j] = y + off;
          off += mm.rows[j];
        }
      }
      const double us = time_graph(n, [&](int i, cudaStream_t s) { gemv_multi(bs[i], x, false, s); });
      report(mm.name, us, bytes);
    }
  }
  // LILY_BENCH_GEMV_ONLY=1: only the plain / batched GEMVs and lm_head (quick comparisons of GEMV variants).
  const char* only = std::getenv("LILY_BENCH_GEMV_ONLY");
  const bool gemv_only = only && only[0] == '1';
  // LILY_BENCH_MOE_ROWS=1: also the decode pass's MoE launch at 1..8 rows (3.6 GB of weights more); =only: just it.
  const char* mr = std::getenv("LILY_BENCH_MOE_ROWS");
  const bool rows_case = mr && mr[0] == '1';
  if (mr && std::string(mr) == "only") {
    moe_rows_case(report);
    bench::free_all();
    return 0;
  }
  // MoE: per layer copy a full-size set of E experts would be 453 MB; use 64 experts per copy (the selection is
  // random and distinct per copy, so the bytes streamed per call are those of 8 experts + the shared one).
  const int E = 64, n_layers = 16;
  std::vector<MoeWeightsDev> moe(n_layers);
  std::vector<MoeScratch> scr(n_layers);
  for (int l = 0; l < (gemv_only ? 0 : n_layers); ++l) {
    moe[l] = make_moe(E);
    scr[l] = moe_scratch_alloc(E, kTopK, kMoeFfn);
    std::vector<int> idx(kTopK);
    for (int j = 0; j < kTopK; ++j) idx[j] = (l * 7 + j * 5) % E;
    std::vector<float> w(kTopK, 1.f / kTopK), sh(1, 0.5f);
    CUDA_CHECK(cudaMemcpy(scr[l].topk_idx, idx.data(), sizeof(int) * kTopK, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(scr[l].topk_w, w.data(), sizeof(float) * kTopK, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(scr[l].sh_scale, sh.data(), sizeof(float), cudaMemcpyHostToDevice));
  }
  const double expert_gu = 2.0 * moe[0].experts_gate.mat_w_bytes() + 2.0 * moe[0].experts_gate.mat_groups() * 4;
  const double expert_d = moe[0].experts_down.mat_w_bytes() + moe[0].experts_down.mat_groups() * 4.0;
  const double route_bytes =
      static_cast<double>(moe[0].gate.bytes() / E * kExperts + moe[0].shared_expert_gate.bytes());
  if (!gemv_only) {
    // gate/up and down: copies = layers (16 layers x ~15 MB, rotated 4 times inside one graph)
    const int reps = 4;
    double us = time_graph(n_layers * reps, [&](int i, cudaStream_t s) { moe_gate_up(moe[i % n_layers], x, scr[i % n_layers], s); });
    report("moe gate/up 8 experts + shared", us, 9 * expert_gu);
    us = time_graph(n_layers * reps, [&](int i, cudaStream_t s) { moe_down(moe[i % n_layers], scr[i % n_layers], y, s); });
    report("moe down 8 + shared (+= residual)", us, 9 * expert_d);
    std::vector<MoeWeightsDev> r256(copies_for(route_bytes));
    std::vector<MoeScratch> s256(r256.size());
    for (size_t i = 0; i < r256.size(); ++i) {
      r256[i] = moe[0];
      r256[i].gate = make_mat(q8, kExperts, kHidden);
      r256[i].shared_expert_gate = make_mat(q8, 1, kHidden);
      s256[i] = moe_scratch_alloc(kExperts, kTopK, kMoeFfn);
    }
    us = time_graph(static_cast<int>(r256.size()), [&](int i, cudaStream_t s) { moe_route(r256[i], x, s256[i], s); });
    report("moe route (q8 256x2048 + gate, top-8)", us, route_bytes);
    us = time_graph(n_layers * reps, [&](int i, cudaStream_t s) {
      moe_forward(moe[i % n_layers], x, scr[i % n_layers], y, s);
    });
    report("moe block (route E=64 + gate/up + down)", us, 9 * (expert_gu + expert_d) + moe[0].gate.bytes());
  }
  if (rows_case) moe_rows_case(report);
  // lm_head
  float* logits = nullptr;  // [kVocab], lm_head's output: the sampler's input below
  {
    const int n = 3;
    std::vector<QMat> hs;
    for (int i = 0; i < n; ++i) hs.push_back(make_mat(q4, kVocab, kHidden));
    logits = make_vec(kVocab);
    const double us = time_graph(n, [&](int i, cudaStream_t s) { gemv(hs[i], x, logits, false, s); }, 9);
    report("lm_head 248320x2048", us, static_cast<double>(hs[0].bytes()));
  }
  if (!gemv_only) {
    QMat head0 = make_mat(q4, 64, kHidden);
    // embedding gather and sampling (latency; bytes ~0)
    int* tok = static_cast<int*>(dalloc(sizeof(int)));
    CUDA_CHECK(cudaMemset(tok, 0, sizeof(int)));
    double t = time_graph(64, [&](int, cudaStream_t s) { embed_row(head0, tok, y, s); });
    report("embed row gather (q4)", t, kHidden * 0.5625);
    int* counts = static_cast<int*>(dalloc(sizeof(int) * kVocab));
    CUDA_CHECK(cudaMemset(counts, 0, sizeof(int) * kVocab));
    uint64_t* ctr = static_cast<uint64_t*>(dalloc(sizeof(uint64_t)));
    CUDA_CHECK(cudaMemset(ctr, 0, sizeof(uint64_t)));
    void* scratch = dalloc(sampling_scratch_bytes(kVocab));
    SamplingParams p;
    p.n_valid = kVocabReal;
    p.temperature = 0.f;
    t = time_graph(32, [&](int, cudaStream_t s) { sample(logits, kVocab, p, counts, ctr, tok, scratch, s); });
    report("sample greedy V=248320", t, kVocab * 4.0);
    p.temperature = 1.f; p.top_k = 20; p.top_p = 0.95f; p.presence = 0.5f;
    t = time_graph(32, [&](int, cudaStream_t s) { sample(logits, kVocab, p, counts, ctr, tok, scratch, s); });
    report("sample top_k20 top_p.95 +penalty", t, kVocab * 8.0);
    p.top_k = 0;
    t = time_graph(32, [&](int, cudaStream_t s) { sample(logits, kVocab, p, counts, ctr, tok, scratch, s); });
    report("sample top_p.95, flat logits (select over all z)", t, kVocab * 8.0);
    p.top_k = 100; p.top_p = 0.8f;
    t = time_graph(32, [&](int, cudaStream_t s) { sample(logits, kVocab, p, counts, ctr, tok, scratch, s); });
    report("sample top_k100 top_p.8 (full path)", t, kVocab * 8.0);
    p.top_k = 0; p.top_p = 1.f; p.min_p = 0.05f;
    t = time_graph(32, [&](int, cudaStream_t s) { sample(logits, kVocab, p, counts, ctr, tok, scratch, s); });
    report("sample min_p.05 (full path)", t, kVocab * 8.0);
    p.min_p = 0.f;
    t = time_graph(32, [&](int, cudaStream_t s) { sample(logits, kVocab, p, counts, ctr, tok, scratch, s); });
    report("sample temperature only (full path)", t, kVocab * 8.0);
    p.top_p = 0.95f;
    {  // a peaked distribution (tail in [-12, -4], 40 logits in [5, 10]): the nucleus in the head
      std::mt19937 g(5);
      std::uniform_real_distribution<float> tail(-12.f, -4.f), head(5.f, 10.f);
      std::vector<float> hl(kVocab);
      for (float& x : hl) x = tail(g);
      for (int i = 0; i < 40; ++i) hl[g() % kVocab] = head(g);
      float* peaked = static_cast<float*>(dalloc(sizeof(float) * kVocab));
      CUDA_CHECK(cudaMemcpy(peaked, hl.data(), sizeof(float) * kVocab, cudaMemcpyHostToDevice));
      t = time_graph(32, [&](int, cudaStream_t s) { sample(peaked, kVocab, p, counts, ctr, tok, scratch, s); });
      report("sample top_p.95, peaked logits", t, kVocab * 8.0);
    }
  }
  // Whole per-token weight stream: 30 GDN + 10 attention mixers' projections, 40 full MoE blocks (E = 256
  // experts per layer, 18 GB), lm_head.
  if (!gemv_only) {
    std::vector<GemvBatch> in(40);
    std::vector<QMat> out(40);
    for (int l = 0; l < 40; ++l) {
      const bool attn = (l + 1) % 4 == 0;
      const std::vector<int> rows = attn ? std::vector<int>{8192, 512, 512} : std::vector<int>{8192, 4096, 32, 32};
      in[l].n = static_cast<int>(rows.size());
      int off = 0;
      for (int j = 0; j < in[l].n; ++j) {
        in[l].W[j] = make_mat(q4, rows[j], 2048);
        in[l].y[j] = y + off;
        off += rows[j];
      }
      out[l] = make_mat(q4, 2048, 4096);
    }
    std::vector<MoeWeightsDev> lm(40);
    std::vector<MoeScratch> ls(40);
    for (int l = 0; l < 40; ++l) {
      lm[l] = make_moe(kExperts);
      ls[l] = moe_scratch_alloc(kExperts, kTopK, kMoeFfn);
    }
    QMat head = make_mat(q4, kVocab, kHidden);
    float* head_out = make_vec(kVocab);
    float* h = make_vec(kHidden);
    double bytes = static_cast<double>(head.bytes());
    for (int l = 0; l < 40; ++l) {
      for (int j = 0; j < in[l].n; ++j) bytes += static_cast<double>(in[l].W[j].bytes());
      bytes += static_cast<double>(out[l].bytes()) +
               static_cast<double>(lm[l].gate.bytes() + lm[l].shared_expert_gate.bytes());
      bytes += 9 * (expert_gu + expert_d);
    }
    const double us = time_graph(1, [&](int, cudaStream_t s) {
      for (int l = 0; l < 40; ++l) {
        gemv_multi(in[l], x, false, s);
        gemv(out[l], x, h, true, s);
        moe_forward(lm[l], x, ls[l], h, s);
      }
      gemv(head, x, head_out, false, s);
    }, 11);
    report("TOKEN weight stream (40 layers + head)", us, bytes);
    std::printf("  -> %.0f tokens/s upper bound from weight streaming alone (%.0f launches)\n", 1e6 / us, 40 * 5.0 + 1);
  }
  // ---- decode attention (kernels/attention.cu): split + combine launches per call, real shapes (16 query
  // heads, 2 KV heads, head_dim 256, 1024-token bf16 pages). Each copy in the graph reads its own pages out of
  // a pool of >= ~640 MB, so the K/V come from DRAM as in decode; bytes = the K/V rows read.
  if (!gemv_only) {
    constexpr int kHeads = 16, kKv = 2, kD = 256, kPage = 1024, kSplitsMax = kAttnMaxSplits;
    const int splits = std::min(kSplitsMax, sm_count() / kKv);  // as the engine: one split block per SM
    const int contexts[] = {1, 4096, 32768, 131072};
    const size_t page_elems = kv_page_elems(kPage, kKv, kD);
    const int pool_pages = 384;  // 768 MB: 3 copies of a 128K-token cache
    uint16_t* pool = static_cast<uint16_t*>(dalloc(pool_pages * page_elems * 2));
    // finite bf16 pairs (fill_sb's scale|bias words: magnitude ~0.004..0.008, random signs)
    bench::fill_sb<<<1024, 256>>>(reinterpret_cast<uint32_t*>(pool), pool_pages * page_elems / 2, bench::g_seed++);
    CUDA_CHECK_LAUNCH(0);
    AttnIn in;  // the current token's raw q|gate, k, v and the norm weights (the split kernel normalises them)
    in.qg = make_vec(kHeads * 2 * kD);
    in.k = make_vec(kKv * kD);
    in.v = make_vec(kKv * kD);
    in.q_norm = make_vec(kD);
    in.k_norm = make_vec(kD);
    in.eps = 1e-6f;
    attn_in_rope(in, kD / 4, 1e7);
    float* out = make_vec(kHeads * kD);
    AttnScratch sc;
    sc.max_splits = kSplitsMax;
    sc.partial = static_cast<float*>(dalloc(attn_scratch_floats(kKv, kSplitsMax, kHeads / kKv, kD) * sizeof(float)));
    int* pos = static_cast<int*>(dalloc(sizeof(int)));
    for (int ctx : contexts) {
      const int n_pages = (ctx + kPage - 1) / kPage;
      const double bytes = static_cast<double>(ctx) * kKv * 2 * kD * 2;
      const int copies = std::min({64, pool_pages / n_pages, copies_for(bytes)});
      std::vector<uint16_t**> tables(copies);  // copy i: its own pages of the pool
      for (int i = 0; i < copies; ++i) {
        std::vector<uint16_t*> t(n_pages);
        for (int p = 0; p < n_pages; ++p)
          t[p] = pool + static_cast<size_t>((i * n_pages + p) % pool_pages) * page_elems;
        tables[i] = static_cast<uint16_t**>(dalloc(n_pages * sizeof(uint16_t*)));
        CUDA_CHECK(cudaMemcpy(tables[i], t.data(), n_pages * sizeof(uint16_t*), cudaMemcpyHostToDevice));
      }
      const int p_host = ctx - 1;
      CUDA_CHECK(cudaMemcpy(pos, &p_host, sizeof(int), cudaMemcpyHostToDevice));
      const double us = time_graph(copies, [&](int i, cudaStream_t s) {
        KvPages kv;
        kv.pages = tables[i];
        kv.page_tokens = kPage;
        kv.n_kv = kKv;
        kv.head_dim = kD;
        launch_attention_decode(in, kv, pos, out, sc, splits, kHeads, s);
      }, 25);
      report("attention decode ctx " + std::to_string(ctx) + " (split+combine)", us, bytes);
    }
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  if (argc > 1) {
    FILE* f = std::fopen(argv[1], "w");
    if (f) {
      std::fprintf(f, "{\"device\": \"%s\", \"copy_gbs\": %.1f, \"kernels\": [\n", prop.name, bw);
      for (size_t i = 0; i < res.size(); ++i)
        std::fprintf(f, "  {\"name\": \"%s\", \"us\": %.3f, \"bytes\": %.0f, \"gbs\": %.1f, \"pct_copy\": %.1f}%s\n",
                     res[i].name.c_str(), res[i].us, res[i].bytes, res[i].gbs, res[i].pct, i + 1 < res.size() ? "," : "");
      std::fprintf(f, "]}\n");
      std::fclose(f);
    }
  }
  bench::free_all();
  return 0;
}
