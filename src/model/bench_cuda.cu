// The decode benchmark behind `lily bench` (forward_cuda.h): measures the device copy bandwidth (the floor's
// ceiling), then for each context length fills the KV cache with random bf16 (the decode step still reads
// every cached token) and times >= 128 replays of the captured graph "decode step + greedy sampling + position
// advance" with CUDA events (median per token). Bytes per token are counted from the resident weights in the
// order of docs/model.md §8 (active weights + GDN state read/write + conv ring + KV read/append). A per-family
// breakdown comes from an instrumented pass without the graph (events between kernel families). The kernel
// options in force and the decode plan are printed once; the bench's StepRecorder applies LILY_SKIP and LILY_TRACE.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "kernels/common.cuh"
#include "kernels/sampling.h"
#include "model/cuda_engine.h"
#include "model/forward_cuda.h"
#include "model/synth.h"

namespace lily {

namespace {

using namespace lily::cuda;

struct Event {
  cudaEvent_t e = nullptr;
  Event() { CUDA_CHECK(cudaEventCreate(&e)); }
  ~Event() { cudaEventDestroy(e); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// The bench's hooks into the step: families left out (KernelOptions::skip), phase stamps (KernelOptions::trace),
// and, during the instrumented pass, an event before each family.
class BenchRecorder : public StepRecorder {
 public:
  BenchRecorder(const KernelOptions& o, cudaStream_t s) : skip_("," + o.skip + ","), stream_(s) {
    if (o.trace) trace_ = step_trace_alloc();
  }
  ~BenchRecorder() override {
    clear_marks();
    step_trace_free(trace_);
  }
  BenchRecorder(const BenchRecorder&) = delete;
  BenchRecorder& operator=(const BenchRecorder&) = delete;

  void begin_step() override { trace_.begin(); }
  bool skips(const char* family) override { return skip_.find("," + std::string(family) + ",") != std::string::npos; }
  void mark(const char* family) override {
    if (!timing) return;
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    CUDA_CHECK(cudaEventRecord(e, stream_));
    marks.emplace_back(family, e);
  }
  StepTrace* trace() override { return trace_.stamps ? &trace_ : nullptr; }
  const StepTrace& step_trace() const { return trace_; }
  void clear_marks() {
    for (auto& m : marks) cudaEventDestroy(m.second);
    marks.clear();
  }

  bool timing = false;  // record events at the marks (the instrumented pass; not during graph capture)
  std::vector<std::pair<std::string, cudaEvent_t>> marks;

 private:
  std::string skip_;
  cudaStream_t stream_;
  StepTrace trace_;
};

float elapsed_ms(const Event& a, const Event& b) {
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a.e, b.e));
  return ms;
}

// Device-to-device copy bandwidth, counting bytes read plus bytes written (GB/s), median of 10 copies of 2 GiB.
double measure_copy_bandwidth(cudaStream_t s) {
  const size_t bytes = size_t(2) << 30;
  void *a = nullptr, *b = nullptr;
  CUDA_CHECK(cudaMalloc(&a, bytes));
  CUDA_CHECK(cudaMalloc(&b, bytes));
  CUDA_CHECK(cudaMemsetAsync(a, 1, bytes, s));
  std::vector<double> t;
  Event e0, e1;
  for (int i = 0; i < 12; ++i) {
    CUDA_CHECK(cudaEventRecord(e0.e, s));
    CUDA_CHECK(cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice, s));
    CUDA_CHECK(cudaEventRecord(e1.e, s));
    CUDA_CHECK(cudaEventSynchronize(e1.e));
    if (i >= 2) t.push_back(elapsed_ms(e0, e1));
  }
  CUDA_CHECK(cudaFree(a));
  CUDA_CHECK(cudaFree(b));
  std::sort(t.begin(), t.end());
  return 2.0 * bytes / (t[t.size() / 2] * 1e-3) / 1e9;
}

// Bytes one decode step moves at context n (tokens already cached), docs/model.md §8 with our resident formats.
double bytes_per_token(const Config& c, const DeviceWeights& w, int n) {
  double b =
      (double)w.lm_head.bytes() + (double)w.embed_tokens.bytes() / w.embed_tokens.rows;  // head + one embedding row
  b += (2.0 * c.n_layers + 1) * c.hidden * 4;                                      // norm weights (fp32)
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerDev& l = w.layers[i];
    if (c.is_attention(i)) {
      b += (double)l.attn.q_proj.bytes() + l.attn.k_proj.bytes() + l.attn.v_proj.bytes() + l.attn.o_proj.bytes();
      b += (double)c.n_kv_heads * c.head_dim * 2 * 2 * (n + 1);  // K and V rows read (incl. the new one)
    } else {
      b += (double)l.gdn.in_proj_qkv.bytes() + l.gdn.in_proj_z.bytes() + l.gdn.in_proj_b.bytes() +
           l.gdn.in_proj_a.bytes() + l.gdn.out_proj.bytes();
      b += 2.0 * c.lin_v_heads * c.lin_k_dim * c.lin_v_dim * 4;  // recurrent state read + write
      b += 4.0 * c.conv_dim() * 4;                               // conv ring: 3 slots read, 1 written
    }
    const MoeWeightsDev& m = l.moe;
    b += (double)m.gate.bytes() + m.shared_expert_gate.bytes() + m.shared_gate.bytes() + m.shared_up.bytes() +
         m.shared_down.bytes();
    b += (double)(m.experts_gate.bytes() + m.experts_up.bytes() + m.experts_down.bytes()) / c.n_experts * c.top_k;
  }
  return b;
}

}  // namespace

BenchReport run_decode_bench(const BenchOptions& opt) {
  LILY_CHECK(cuda_device_available(), "lily bench: no CUDA device");
  CUDA_CHECK(cudaSetDevice(opt.device));
  BenchReport rep;
  rep.device = cuda_device_description(opt.device);
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  rep.copy_gb_per_s = measure_copy_bandwidth(s);

  Config cfg;
  DeviceWeights w;
  std::unique_ptr<Model> model;
  if (opt.model_dir.empty()) {
    SynthOptions so;
    so.preset = "full";
    so.layout = CheckpointLayout::mlx_affine;
    cfg = synth_config(so);
    w = synthetic_weights(cfg, 1234, s);
    rep.weights = "synthetic full-size (MLX 4-bit layout, 8-bit router/shared gate), generated on the GPU";
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    model = std::make_unique<Model>(load_model(opt.model_dir));
    cfg = model->config;
    w = upload_weights(*model, false, true, s);  // returns after the stream's last copy / repack
    rep.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rep.file_bytes = (double)checkpoint_matrix_bytes(*model);
    rep.weights = opt.model_dir;
  }
  CUDA_CHECK(cudaStreamDestroy(s));
  rep.weight_bytes = w.bytes;
  {  // the graph replays (the engine and its weights go away before the loop measurement)
  const int max_ctx = *std::max_element(opt.contexts.begin(), opt.contexts.end()) + opt.steps + opt.warmup + 2;
  const DeviceWeights wcopy = w;  // the engine owns w; keep the shapes for the byte count
  const KernelOptions& kopt = kernel_options_from_env();
  CudaEngine eng(cfg, std::move(w), max_ctx, opt.device, true, kopt);
  cudaStream_t st = eng.stream();
  std::printf("kernel options: %s\n%s", describe(kopt).c_str(), describe(eng.plan()).c_str());
  BenchRecorder rec(kopt, st);

  // decode loop graph: step + greedy sampling (token fed back on the device) + position advance
  void* scratch = nullptr;
  uint64_t* rng = nullptr;
  CUDA_CHECK(cudaMalloc(&scratch, sampling_scratch_bytes(cfg.vocab)));
  CUDA_CHECK(cudaMalloc(&rng, 2 * sizeof(uint64_t)));  // draw counter, seed
  CUDA_CHECK(cudaMemsetAsync(rng, 0, 2 * sizeof(uint64_t), st));
  cuda::SamplingParams sp;
  sp.temperature = 0.f;
  sp.n_valid = cfg.vocab;
  sp.update_counts = false;
  cudaGraphExec_t loop = eng.capture([&] {
    sample(eng.logits(), cfg.vocab, sp, nullptr, rng, &eng.step()->token, scratch, st, nullptr, &eng.step()->pos);
  }, true, &rec);

  for (int ctx : opt.contexts) {
    BenchPoint pt;
    pt.context = ctx;
    eng.reset_state();
    eng.fill_kv_random(ctx + opt.steps + opt.warmup + 1, 77 + ctx);
    const StepDev start{1000, ctx, 0.f};
    CUDA_CHECK(cudaMemcpyAsync(eng.step(), &start, sizeof start, cudaMemcpyHostToDevice, st));
    for (int i = 0; i < opt.warmup; ++i) CUDA_CHECK(cudaGraphLaunch(loop, st));
    std::vector<Event> ev(opt.steps + 1);
    for (int i = 0; i < opt.steps; ++i) {
      CUDA_CHECK(cudaEventRecord(ev[i].e, st));
      CUDA_CHECK(cudaGraphLaunch(loop, st));
    }
    CUDA_CHECK(cudaEventRecord(ev[opt.steps].e, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    std::vector<double> t;
    for (int i = 0; i < opt.steps; ++i) t.push_back(elapsed_ms(ev[i], ev[i + 1]) * 1e3);
    print_step_trace(rec.step_trace());  // LILY_TRACE=1 only
    std::sort(t.begin(), t.end());
    pt.us_per_token = t[t.size() / 2];
    pt.tok_per_s = 1e6 / pt.us_per_token;
    pt.bytes_per_token = bytes_per_token(cfg, wcopy, ctx);
    pt.gb_per_s = pt.bytes_per_token / (pt.us_per_token * 1e-6) / 1e9;
    pt.floor_us = pt.bytes_per_token / (rep.copy_gb_per_s * 1e9) * 1e6;
    pt.pct_of_floor = pt.floor_us / pt.us_per_token * 100;

    if (opt.breakdown) {
      // instrumented pass: an event before each family; time between consecutive marks goes to the family
      const auto& marks = rec.marks;
      const int reps = 5;
      std::map<std::string, double> fam;
      std::vector<std::string> order;
      rec.timing = true;
      for (int r = 0; r < reps; ++r) {
        rec.clear_marks();
        eng.record_step(&rec);
        CUDA_CHECK(cudaStreamSynchronize(st));
        for (size_t i = 0; i + 1 < marks.size(); ++i) {
          float ms = 0;
          CUDA_CHECK(cudaEventElapsedTime(&ms, marks[i].second, marks[i + 1].second));
          if (!fam.count(marks[i].first)) order.push_back(marks[i].first);
          fam[marks[i].first] += ms * 1e3 / reps;
        }
      }
      rec.clear_marks();
      rec.timing = false;
      for (const std::string& f : order) pt.families.push_back({f, fam[f]});
    }
    rep.points.push_back(pt);
  }
  CUDA_CHECK(cudaGraphExecDestroy(loop));
  CUDA_CHECK(cudaFree(scratch));
  CUDA_CHECK(cudaFree(rng));
  }
  return rep;
}

}  // namespace lily
