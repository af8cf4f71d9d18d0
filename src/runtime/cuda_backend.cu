// The CUDA Backend: adapts CudaEngine (model/cuda_engine.cu) to the Backend interface: token staging, the
// chunked prompt path (model/prefill_cuda.cu) for prompts of kPrefillMin tokens or more, sampling on the device
// (runtime/device_sampler.cuh) with the host's protocol as the fallback, and prefix-cache snapshots in a device
// pool (runtime/snapshot_pool.cuh).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/common.cuh"
#include "model/cuda_engine.h"
#include "model/event_profiler.cuh"
#include "model/synth.h"
#include "runtime/device_sampler.cuh"
#include "runtime/prefix_cache.h"
#include "runtime/resources.h"
#include "runtime/snapshot_pool.cuh"
#include "runtime/cuda_backend.h"
#include "runtime/cuda_batch_backend.cuh"

namespace lily::cuda {

// ---- Backend adapter ----
namespace {

class CudaBackend : public Backend {
 public:
  CudaBackend(const Model& model, const CudaOptions& opt)
      : CudaBackend(model.config, upload(model, opt),
                    opt.max_context > 0 ? opt.max_context : model.config.max_position_embeddings, opt.device,
                    opt.snapshot_device_bytes, opt.chunked_prompts, opt.kernels) {}
  CudaBackend(const Config& c, DeviceWeights w, int max_context, int device, long long snapshot_device_bytes,
              bool chunked_prompts, const KernelOptions& kopt)
      : cfg_(c), engine_(c, std::move(w), max_context, device, true, kopt),
        prefill_min_(kopt.prefill_min > 0 ? kopt.prefill_min : kPrefillMin), device_masks_(kopt.device_masks) {
    chunked_ = chunked_prompts && kopt.prefill;
    CUDA_CHECK(cudaMallocHost(&staging_, sizeof(StepDev) * kStaging));
    d_steps_ = device_alloc<StepDev>(kStaging);
    chunked_ = chunked_ && engine_.prefill_supported();
    if (chunked_) engine_.prefill_alloc();  // before the snapshots' budget is taken from what is free
    size_t budget = snapshot_device_bytes >= 0 ? static_cast<size_t>(snapshot_device_bytes) : 0;
    if (snapshot_device_bytes < 0) {  // free memory less the KV pages still to come and a margin
      size_t free_b = 0, total_b = 0;
      CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
      const size_t reserve = engine_.kv_bytes_to_come() + (size_t{2} << 30);
      budget = free_b > reserve ? free_b - reserve : 0;
    }
    pool_ = std::make_shared<SnapshotPool>(engine_.gdn_state_bytes(), budget, device);
  }
  ~CudaBackend() override {
    sampler_.unblock();  // (no step may wait for a token mask now)
    cudaStreamSynchronize(engine_.stream());
    cudaFree(d_steps_);
    cudaFreeHost(staging_);
  }

  const Config& config() const override { return cfg_; }
  std::string name() const override { return "cuda"; }
  CudaEngine& engine() { return engine_; }  // (the batch backend's, runtime/cuda_batch_backend.cuh)
  ResourceUse resources() const override {
    return {kv_pool_.in_use(), kv_pool_.capacity(), engine_.page_tokens(), state_slots_.in_use(),
            state_slots_.capacity()};
  }
  int max_context() const override { return engine_.max_context(); }
  int position() const override { return pos_; }
  int prompt_grid() const override { return engine_.prompt_grid(); }
  void reset() override {
    sampler_.drop_queued();  // steps a failed generation left queued: finished and forgotten
    engine_.reset_state();
    kv_.release(kv_pool_);
    pos_ = 0;
  }

  void forward(std::span<const int32_t> tokens, float* logits, bool all_logits) override {
    sampler_.unblock();  // it synchronises: a step an abandoned generation left queued must not wait for a mask
    const int n = (int)tokens.size();
    LILY_CHECK(pos_ + n <= engine_.max_context(), "CUDA backend: ", pos_ + n, " tokens exceed the context of ",
               engine_.max_context());
    const int V = cfg_.vocab;
    for (int32_t t : tokens) LILY_CHECK(t >= 0 && t < V, "CUDA backend: token id ", t, " outside [0, ", V, ")");
    reserve_kv(pos_ + n);
    cudaStream_t s = engine_.stream();
    if (n >= prefill_min_ && chunked_) {
      forward_chunks(tokens, logits, all_logits);
      return;
    }
    for (int i0 = 0; i0 < n; i0 += kStaging) {
      const int m = std::min(kStaging, n - i0);
      engine_.ensure_kv(pos_ + m);
      CUDA_CHECK(cudaStreamSynchronize(s));  // the pinned staging is free again
      for (int i = 0; i < m; ++i) staging_[i] = StepDev{tokens[i0 + i], pos_ + i, 0.f};
      CUDA_CHECK(cudaMemcpyAsync(d_steps_, staging_, m * sizeof(StepDev), cudaMemcpyHostToDevice, s));
      for (int i = 0; i < m; ++i) {
        CUDA_CHECK(cudaMemcpyAsync(engine_.step(), d_steps_ + i, sizeof(StepDev), cudaMemcpyDeviceToDevice, s));
        const bool last = i0 + i == n - 1;
        // the last token's logits stay on the device (device sampling reads them); earlier ones are computed
        // only when asked for (the lm_head is ~5 % of a step)
        engine_.launch_step(last || (logits && all_logits));
        if (logits && (all_logits || last)) {
          float* dst = logits + (all_logits ? (size_t)(i0 + i) * V : 0);
          CUDA_CHECK(cudaMemcpyAsync(dst, engine_.logits(), (size_t)V * sizeof(float), cudaMemcpyDeviceToHost, s));
        }
      }
      pos_ += m;
    }
    CUDA_CHECK(cudaStreamSynchronize(s));
  }

  // A prompt through the chunked path (model/prefill_cuda.cu): GEMMs over up to kPrefillChunk tokens at a time.
  // The last token's logits stay on the device and step() holds it, as after the token-by-token path.
  void forward_chunks(std::span<const int32_t> tokens, float* logits, bool all_logits) {
    const int n = (int)tokens.size(), V = cfg_.vocab;
    cudaStream_t s = engine_.stream();
    const int chunk = engine_.prefill_chunk(), grid = engine_.prompt_grid();
    const double head_flops = FamilyFlops(cfg_).lm_head;  // (profiling)
    for (int i0 = 0; i0 < n;) {
      int m = std::min(chunk, n - i0);
      // a chunk inside the prompt ends on the prompt grid, so the chunks' arithmetic is the whole prompt's
      if (const int cut = prompt_cut(pos_ + m, grid); i0 + m < n && cut > pos_) m = cut - pos_;
      // (stopped: the state is partway through the prompt, and the caller resets it)
      if ((stop_ && i0 > 0 && (*stop_)()) || !engine_.prefill(tokens.data() + i0, pos_, m, stop_)) {
        stopped_ = true;
        return;
      }
      auto head = [&](int t, float* dst) {  // the lm_head per token (the GEMV of the decode step)
        if (profiling_) prof_.mark("lm_head", head_flops);
        engine_.lm_head(engine_.prefill_h(t));
        if (dst)
          CUDA_CHECK(cudaMemcpyAsync(dst, engine_.logits(), (size_t)V * sizeof(float), cudaMemcpyDeviceToHost, s));
      };
      if (logits && all_logits)
        for (int t = 0; t < m; ++t) head(t, logits + (size_t)(i0 + t) * V);
      else if (i0 + m == n)
        head(m - 1, logits);
      pos_ += m;
      i0 += m;
    }
    CUDA_CHECK(cudaStreamSynchronize(s));  // staging_ is free
    staging_[0] = StepDev{tokens[n - 1], pos_ - 1, 0.f};
    CUDA_CHECK(cudaMemcpyAsync(engine_.step(), staging_, sizeof(StepDev), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
  }
  // shorter prompts take the decode step per token (the measured crossover is ~14 tokens: bench/RESULTS.md);
  // KernelOptions::prefill_min moves it
  static constexpr int kPrefillMin = 16;
  const int prefill_min_;
  const std::function<bool()>* stop_ = nullptr;  // prefill_stoppable's, while it runs
  bool stopped_ = false;
  const bool device_masks_;  // structured output samples on the device (KernelOptions::device_masks)

  // ---- the generation protocol: on the device where the sampler can be (else the host's, Backend's) ----
  // Structured output (setup.filter) samples on the device with KernelOptions::device_masks: the host computes
  // each mask while the step runs and the decode graph applies it before sampling (runtime/device_sampler.cu).
  void begin_sampling(const SamplingSetup& setup, std::span<const int32_t> prompt) override {
    lily::Sampler(setup.params, cfg_.vocab);  // validates the parameters whichever side samples
    device_ = !setup.host && (!setup.filter || device_masks_) &&
              sampler_.begin(setup.params, prompt, setup.logprobs, setup.filter);
    if (!device_) host_begin(setup, prompt);
  }
  void prefill(std::span<const int32_t> tokens, bool last) override {
    if (device_) forward(tokens, nullptr, false);  // the last token's logits stay on the device
    else host_prefill(tokens, last);
  }
  // The chunked path asks stop() between groups of layers (CudaEngine::prefill) and between chunks.
  bool prefill_stoppable(std::span<const int32_t> tokens, bool last, const std::function<bool()>& stop) override {
    stop_ = &stop;
    stopped_ = false;
    struct Clear {
      const std::function<bool()>*& p;
      ~Clear() { p = nullptr; }
    } clear{stop_};
    prefill(tokens, last);
    return !stopped_;
  }
  lily::SampledToken sample() override { return device_ ? sampler_.sample() : host_sample(); }
  void decode_launch() override {
    if (!device_) return host_launch();
    LILY_CHECK(pos_ + 1 <= engine_.max_context(), "CUDA backend: ", pos_ + 1, " tokens exceed the context of ",
               engine_.max_context());
    reserve_kv(pos_ + 1);
    sampler_.launch();  // consumes {pending id, pos_}
    ++pos_;
  }
  lily::SampledToken decode_wait() override { return device_ ? sampler_.wait() : host_wait(); }
  bool samples_on_device() const override { return device_; }

  bool profile_begin() override {
    prof_.finish();
    engine_.set_profiler(&prof_);
    profiling_ = true;
    return true;
  }
  std::vector<FamilyTime> profile_end() override {
    engine_.set_profiler(nullptr);
    profiling_ = false;
    return prof_.finish();
  }

  StateSnapshot save_state() const override {
    return take_snapshot(pool_, engine_.gdn_state(), engine_.gdn_state_bytes(), pos_, engine_.stream());
  }

  void restore_state(const StateSnapshot& snap) override {
    sampler_.unblock();  // (the host-copy case synchronises)
    LILY_CHECK(snap.size() == engine_.gdn_state_bytes() && snap.position >= 0 && snap.position <= pos_,
               "CUDA backend: state snapshot of ", snap.size(), " bytes at position ", snap.position,
               " does not match this sequence (", engine_.gdn_state_bytes(), " bytes, position ", pos_, ")");
    put_snapshot(snap, engine_.gdn_state(), engine_.stream());
    pos_ = snap.position;  // KV entries [0, position) are kept
    kv_.truncate(kv_pool_, pos_);
  }

 private:
  void reserve_kv(int n_tokens) {
    LILY_CHECK(kv_.reserve(kv_pool_, n_tokens), "CUDA backend: no KV pages left for ", n_tokens, " tokens");
    engine_.ensure_kv(n_tokens);
  }
  static constexpr int kStaging = 4096;  // {token, pos} pairs staged per host->device copy

  static DeviceWeights upload(const Model& model, const CudaOptions& opt) {
    CUDA_CHECK(cudaSetDevice(opt.device));
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    DeviceWeights w = upload_weights(model, opt.quantize_bf16, opt.progress, s);
    CUDA_CHECK(cudaStreamDestroy(s));
    return w;
  }

  Config cfg_;
  CudaEngine engine_;
  int pos_ = 0;
  StepDev* staging_ = nullptr;  // pinned [kStaging]
  StepDev* d_steps_ = nullptr;  // device [kStaging]
  DeviceSampler sampler_{engine_};
  // this sequence's resources: its KV page table over the engine's pages (allocated in order on first use, so a
  // page's id is its device index) and its recurrent-state slot (the engine holds one)
  IdPool kv_pool_{PageTable::pages_for(engine_.max_context(), engine_.page_tokens())};
  PageTable kv_{engine_.page_tokens()};
  IdPool state_slots_{1};
  int state_slot_ = *state_slots_.alloc();
  bool device_ = false;         // this generation samples on the device
  bool chunked_ = true;         // prompts of >= kPrefillMin tokens through forward_chunks
  std::shared_ptr<SnapshotPool> pool_;    // device memory of save_state
  EventProfiler prof_{engine_.stream()};  // the prompt path's family times (profile_begin .. profile_end)
  bool profiling_ = false;
};

}  // namespace

}  // namespace lily::cuda

namespace lily {

namespace cuda {
std::unique_ptr<Backend> make_cuda_backend(const Config& c, DeviceWeights w, int max_context, int device,
                                           long long snapshot_device_bytes) {
  return std::make_unique<CudaBackend>(c, std::move(w), max_context, device, snapshot_device_bytes, true,
                                       kernel_options_from_env());
}
}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(const Model& model, const CudaOptions& opt) {
  const Config& c = model.config;
  LILY_CHECK(c.shared_ffn == c.moe_ffn, "CUDA backend: the shared expert's FFN (", c.shared_ffn,
             ") must equal the routed experts' FFN (", c.moe_ffn, "); kernels/moe.cu fuses them");
  return std::make_unique<cuda::CudaBackend>(model, opt);
}

std::unique_ptr<BatchBackend> make_cuda_batch_backend(Backend& cuda_backend, int max_seqs, int graph_rows) {
  auto* b = dynamic_cast<cuda::CudaBackend*>(&cuda_backend);
  if (!b || !b->engine().prefill_supported()) return nullptr;
  return std::make_unique<cuda::CudaBatchBackend>(b->engine(), max_seqs, graph_rows);
}

std::unique_ptr<Backend> make_bench_cuda_backend(const std::string& model_dir, int max_context, int device) {
  CUDA_CHECK(cudaSetDevice(device));
  if (!model_dir.empty()) {
    const Model model = load_model(model_dir);
    CudaOptions o;
    o.device = device;
    o.max_context = max_context;
    o.progress = false;
    return make_cuda_backend(model, o);
  }
  SynthOptions so;
  so.preset = "full";
  so.layout = CheckpointLayout::mlx_affine;
  const Config cfg = synth_config(so);
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cuda::DeviceWeights w = cuda::synthetic_weights(cfg, 1234, s);
  CUDA_CHECK(cudaStreamSynchronize(s));
  CUDA_CHECK(cudaStreamDestroy(s));
  return cuda::make_cuda_backend(cfg, std::move(w), max_context, device);
}

}  // namespace lily
