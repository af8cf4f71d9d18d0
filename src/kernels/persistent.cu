// Host side of the step trace (kernels/trace.h; device side in grid_barrier.cuh): the slots and their printer.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/trace.h"

namespace lily::cuda {

unsigned long long* StepTrace::take(int kernel) {
  if (!stamps || used >= kTraceSlots || sm_count() > kTraceBlocks) return nullptr;
  kind[used] = kernel;
  return stamps + static_cast<size_t>(used++) * kTraceBlocks * kTraceStamps;
}

StepTrace step_trace_alloc() {
  StepTrace t;
  const size_t bytes = sizeof(unsigned long long) * kTraceSlots * kTraceBlocks * kTraceStamps;
  CUDA_CHECK(cudaMalloc(&t.stamps, bytes));
  CUDA_CHECK(cudaMemset(t.stamps, 0, bytes));
  return t;
}

void step_trace_free(StepTrace& t) {
  if (t.stamps) cudaFree(t.stamps);
  t = StepTrace{};
}

// The last step's persistent launches (LILY_TRACE=1; benchmarks): per kernel kind, averaged over its launches,
// when the blocks finished each phase (earliest, median and latest block), in µs after the launch's first block
// returned from griddepcontrol.wait; and the gap from the previous persistent launch's last block to that
// first wait return (the launch boundary, plus any plain launches in between). For the attention layers (the
// q|k|v GEMV, then the split and combine launches, then the MoE), when their split and combine blocks reached
// which point, in µs after the previous persistent launch's last block ended.
void print_step_trace(const StepTrace& tr) {
  const unsigned long long* d = tr.stamps;
  if (!d || tr.used == 0) return;
  const int nb = sm_count(), ns = tr.used;
  const int* kind_of = tr.kind;
  std::vector<unsigned long long> t(static_cast<size_t>(ns) * kTraceBlocks * kTraceStamps);
  CUDA_CHECK(cudaMemcpy(t.data(), d, t.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  const char* moe[] = {"entry", "selected+x", "shared", "gate/up", "barrier", "act staged", "end"};
  const char* gdn[] = {"entry", "x normed", "in_proj", "barrier 1", "step", "barrier 2", "staged", "end"};
  const char* const* names[2] = {moe, gdn};  // by kernel (TraceKernel)
  const int n_stamps[2] = {7, 8};
  // kinds: 0 MoE after a GDN mixer, 1 MoE after attention (o_proj phase; plain launches before it), 2 GDN mixer
  const char* kind_name[3] = {"MoE (after a GDN mixer)", "MoE + o_proj (after attention)", "GDN mixer"};
  const int kernel_of[3] = {0, 0, 1};
  double sum_lo[3][kTraceStamps] = {}, sum_hi[3][kTraceStamps] = {}, sum_med[3][kTraceStamps] = {}, gap[3] = {},
         wait_spread[3] = {};
  int count[3] = {};
  unsigned long long prev_end = 0;
  // attention layers (slot kinds 2 = split, 3 = combine; not the `kind` rows below)
  double at[11] = {};
  int n_at = 0;
  for (int s = 0; s < ns; ++s) {
    const int k = kind_of[s];
    if (k >= 2) {
      if (k == 2 && s + 2 < ns && kind_of[s + 1] == 3 && kind_of[s + 2] == 0 && prev_end) {
        const unsigned long long* sp = t.data() + static_cast<size_t>(s) * kTraceBlocks * kTraceStamps;
        const unsigned long long* cb = sp + kTraceBlocks * kTraceStamps;
        const unsigned long long* mo = cb + kTraceBlocks * kTraceStamps;
        std::vector<double> e0, w, q, e, lp;
        for (int i = 0; i < kTraceBlocks; ++i) {
          const unsigned long long* b = sp + i * kTraceStamps;
          if (!b[0]) continue;
          e0.push_back((double)b[0] - (double)prev_end);
          if (!b[2]) continue;
          w.push_back((double)b[15] - (double)prev_end);
          q.push_back((double)b[1] - (double)prev_end);
          e.push_back((double)b[2] - (double)prev_end);
          lp.push_back((double)b[3] - (double)prev_end);
        }
        std::vector<double> c0, cw, ce, mw;
        for (int i = 0; i < kTraceBlocks; ++i) {
          const unsigned long long* b = cb + i * kTraceStamps;
          if (!b[0]) continue;  // past the grid
          c0.push_back((double)b[0] - (double)prev_end);
          cw.push_back((double)b[15] - (double)prev_end);
          ce.push_back((double)b[1] - (double)prev_end);
        }
        for (int i = 0; i < nb; ++i) mw.push_back((double)mo[i * kTraceStamps + 15] - (double)prev_end);
        for (auto* v : {&e0, &w, &q, &e, &lp, &c0, &cw, &ce, &mw}) std::sort(v->begin(), v->end());
        const double r[11] = {e0.front(), w.front(), w.back(), q[q.size() / 2], lp[lp.size() / 2], e[e.size() / 2],
                              e.back(), c0.front(), cw.front(), ce.back(), mw.front()};
        for (int j = 0; j < 11; ++j) at[j] += r[j];
        ++n_at;
      }
      continue;
    }
    const int n = n_stamps[k];
    const unsigned long long* b = t.data() + static_cast<size_t>(s) * kTraceBlocks * kTraceStamps;
    unsigned long long w_lo = ~0ull, w_hi = 0, end_hi = 0;
    for (int i = 0; i < nb; ++i) {
      w_lo = std::min(w_lo, b[i * kTraceStamps + 15]);
      w_hi = std::max(w_hi, b[i * kTraceStamps + 15]);
      end_hi = std::max(end_hi, b[i * kTraceStamps + n - 1]);
    }
    const int kind = k == 1 ? 2 : (s > 0 && kind_of[s - 1] == 1 ? 0 : 1);
    if (s > 0) gap[kind] += static_cast<double>(w_lo) - static_cast<double>(prev_end);
    wait_spread[kind] += static_cast<double>(w_hi - w_lo);
    for (int p = 1; p < n; ++p) {
      std::vector<unsigned long long> v(static_cast<size_t>(nb));
      for (int i = 0; i < nb; ++i) v[i] = b[i * kTraceStamps + p];
      std::sort(v.begin(), v.end());
      sum_lo[kind][p] += static_cast<double>(v.front()) - static_cast<double>(w_lo);
      sum_med[kind][p] += static_cast<double>(v[v.size() / 2]) - static_cast<double>(w_lo);
      sum_hi[kind][p] += static_cast<double>(v.back()) - static_cast<double>(w_lo);
    }
    count[kind] += s > 0;
    prev_end = end_hi;
  }
  if (n_at) {
    const char* nm[11] = {"split entry", "split wait first", "split wait last", "q staged (median)",
                          "step loop end (median)", "split end (median)", "split end (last)", "combine entry",
                          "combine wait first", "combine end (last)", "MoE wait first"};
    std::printf("attention layers, %d (us after the previous MoE's last block ended):", n_at);
    for (int j = 0; j < 11; ++j) std::printf(" %s %.2f;", nm[j], at[j] / n_at / 1e3);
    std::printf("\n");
  }
  for (int kind = 0; kind < 3; ++kind) {
    if (count[kind] == 0) continue;
    const double c = count[kind];
    std::printf("%s, %d launches (us after the first wait return; earliest/median/latest block):\n"
                "  gap from the previous persistent launch %.2f, wait spread %.2f;", kind_name[kind], count[kind],
                gap[kind] / c / 1e3, wait_spread[kind] / c / 1e3);
    const int k = kernel_of[kind];
    for (int p = 1; p < n_stamps[k]; ++p)
      std::printf(" %s %.2f/%.2f/%.2f;", names[k][p], sum_lo[kind][p] / c / 1e3, sum_med[kind][p] / c / 1e3,
                  sum_hi[kind][p] / c / 1e3);
    std::printf("\n");
  }
}
}  // namespace lily::cuda
