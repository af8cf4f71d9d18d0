// The CUDA Backend: adapts CudaEngine (model/cuda_engine.cu) to the Backend interface: token staging, the
// chunked prompt path (model/prefill_cuda.cu) for prompts of kPrefillMin tokens or more, sampling on the device
// (the decode graph followed by the sampler, which writes the id into the next step's StepDev, advances the
// position and copies {id, position, log-probability} to mapped pinned host memory: per token the host launches
// a graph (two are queued) and reads 12 bytes), and the device pool of prefix-cache snapshots.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/common.cuh"
#include "kernels/sampling.h"
#include "model/cuda_engine.h"
#include "model/forward_cuda.h"

namespace lily::cuda {

// ---- Backend adapter ----
namespace {

// Device memory for prefix-cache snapshots (every snapshot is one GDN state, gdn_state_bytes): blocks are
// allocated up to a byte budget and recycled, never freed while the pool lives (cudaFree would synchronise the
// device). A snapshot holds its block through a shared_ptr whose deleter returns it here; the pool lives until
// the last one is gone. Saving and restoring are device-to-device copies on the engine's stream (~30 us for the
// real model's 64 MB), where a host snapshot cost tens of ms per prompt (pageable copies of the whole state).
class SnapshotPool {
 public:
  SnapshotPool(size_t block, size_t budget, int device) : block_(block), budget_(budget), device_(device) {}
  ~SnapshotPool() {
    cudaSetDevice(device_);
    for (void* p : free_) cudaFree(p);  // errors ignored: may run at exit, after the runtime is gone
  }
  // A block, or null when the budget is spent or the device has no memory left (then: a host snapshot).
  void* get() {
    std::lock_guard<std::mutex> lk(mu_);
    if (!free_.empty()) {
      void* p = free_.back();
      free_.pop_back();
      return p;
    }
    if (allocated_ + block_ > budget_) return nullptr;
    void* p = nullptr;
    CUDA_CHECK(cudaSetDevice(device_));
    if (cudaMalloc(&p, block_) != cudaSuccess) {
      cudaGetLastError();  // clear the allocation error; the caller falls back to host memory
      budget_ = allocated_;
      return nullptr;
    }
    allocated_ += block_;
    return p;
  }
  void put(void* p) {
    std::lock_guard<std::mutex> lk(mu_);
    free_.push_back(p);
  }

 private:
  std::mutex mu_;
  size_t block_, budget_, allocated_ = 0;
  int device_;
  std::vector<void*> free_;
};

class CudaBackend : public Backend {
 public:
  CudaBackend(const Model& model, const CudaOptions& opt)
      : CudaBackend(model.config, upload(model, opt),
                    opt.max_context > 0 ? opt.max_context : model.config.max_position_embeddings, opt.device,
                    opt.snapshot_device_bytes, opt.chunked_prompts) {}
  CudaBackend(const Config& c, DeviceWeights w, int max_context, int device, long long snapshot_device_bytes,
              bool chunked_prompts)
      : cfg_(c), engine_(c, std::move(w), max_context, device),
        chunked_(chunked_prompts && kernel_options_from_env().prefill) {
    CUDA_CHECK(cudaMallocHost(&staging_, sizeof(StepDev) * kStaging));
    CUDA_CHECK(cudaHostAlloc(&host_step_, 2 * sizeof(StepDev), cudaHostAllocMapped));
    CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_step_dev_), host_step_, 0));
    for (cudaEvent_t& e : done_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
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
    cudaStreamSynchronize(engine_.stream());
    for (SampleGraphs& e : sample_graphs_)
      for (cudaGraphExec_t g : e.graph)
        if (g) cudaGraphExecDestroy(g);
    for (cudaEvent_t e : done_) cudaEventDestroy(e);
    for (void* p : {(void*)d_steps_, (void*)counts_, (void*)rng_, sample_scratch_, (void*)d_prompt_, (void*)bias_ids_,
                    (void*)bias_vals_, (void*)top_dev_})
      cudaFree(p);
    if (top_host_) cudaFreeHost(top_host_);
    cudaFreeHost(staging_);
    cudaFreeHost(host_step_);
  }

  const Config& config() const override { return cfg_; }
  std::string name() const override { return "cuda"; }
  int max_context() const override { return engine_.max_context(); }
  int position() const override { return pos_; }
  void reset() override {
    if (queued_ > 0) {  // steps a failed generation left queued: finished and forgotten
      CUDA_CHECK(cudaStreamSynchronize(engine_.stream()));
      queued_ = 0;
    }
    engine_.reset_state();
    pos_ = 0;
  }

  void forward(std::span<const int32_t> tokens, float* logits, bool all_logits) override {
    const int n = (int)tokens.size();
    LILY_CHECK(pos_ + n <= engine_.max_context(), "CUDA backend: ", pos_ + n, " tokens exceed the context of ",
               engine_.max_context());
    const int V = cfg_.vocab;
    for (int32_t t : tokens) LILY_CHECK(t >= 0 && t < V, "CUDA backend: token id ", t, " outside [0, ", V, ")");
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
    const int chunk = CudaEngine::prefill_chunk();
    for (int i0 = 0; i0 < n; i0 += chunk) {
      const int m = std::min(chunk, n - i0);
      engine_.prefill(tokens.data() + i0, pos_, m);
      auto head = [&](int t, float* dst) {  // the lm_head per token (the GEMV of the decode step)
        engine_.lm_head(engine_.prefill_h(t));
        if (dst)
          CUDA_CHECK(cudaMemcpyAsync(dst, engine_.logits(), (size_t)V * sizeof(float), cudaMemcpyDeviceToHost, s));
      };
      if (logits && all_logits)
        for (int t = 0; t < m; ++t) head(t, logits + (size_t)(i0 + t) * V);
      else if (i0 + m == n)
        head(m - 1, logits);
      pos_ += m;
    }
    CUDA_CHECK(cudaStreamSynchronize(s));  // staging_ is free
    staging_[0] = StepDev{tokens[n - 1], pos_ - 1, 0.f};
    CUDA_CHECK(cudaMemcpyAsync(engine_.step(), staging_, sizeof(StepDev), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
  }
  // shorter prompts: the decode step per token (H200, `eaf5e76`: a chunk of 16 tokens 15.4 ms, of 24 18.0 ms, the
  // decode step 1.09 ms per token: even at ~14 tokens); LILY_PREFILL_MIN (benchmarks) moves it
  static constexpr int kPrefillMin = 16;
  const int prefill_min_ = kernel_options_from_env().prefill_min > 0 ? kernel_options_from_env().prefill_min
                                                                     : kPrefillMin;

  // ---- sampling on the device (kernels/sampling.h) ----
  bool begin_device_sampling(const lily::SamplingParams& p, std::span<const int32_t> prompt, bool logprobs) override {
    const int V = cfg_.vocab;
    if (p.top_logprobs > kMaxTopLogprobs || V > kSampleMaxVocab) return false;  // the host samples
    cudaStream_t s = engine_.stream();
    if (!sample_scratch_) {
      sample_scratch_ = device_alloc<uint8_t>(sampling_scratch_bytes(V));
      counts_ = device_alloc<int>(V);
      rng_ = device_alloc<uint64_t>(2);
      CUDA_CHECK(cudaHostAlloc(&top_host_, 2 * sizeof(TopDev), cudaHostAllocMapped));
      CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&top_host_dev_), top_host_, 0));
      top_dev_ = device_alloc<TopDev>(1);
    }
    CUDA_CHECK(cudaStreamSynchronize(s));  // launches an earlier generation left (its caller threw before waiting)
    queued_ = 0;
    SampleConfig c;
    SamplingParams& d = c.params;
    d.temperature = p.temperature;
    d.top_k = p.top_k;
    d.top_p = p.top_p;
    d.min_p = p.min_p;
    d.presence = p.presence_penalty;
    d.frequency = p.frequency_penalty;
    d.repetition = p.repetition_penalty;
    d.n_valid = p.n_valid > 0 && p.n_valid < V ? p.n_valid : 0;
    d.update_counts = has_penalties(d);
    c.logprobs = logprobs;
    c.top_n = p.top_logprobs;
    const uint64_t rng[2] = {0, p.seed};  // draw counter, seed: in device memory, so the graph serves every seed
    CUDA_CHECK(cudaMemcpyAsync(rng_, rng, sizeof rng, cudaMemcpyHostToDevice, s));
    if (d.update_counts) CUDA_CHECK(cudaMemsetAsync(counts_, 0, (size_t)V * sizeof(int), s));
    if (d.repetition != 1.0f && !prompt.empty()) {  // the prompt counts for the repetition penalty only
      for (int32_t t : prompt) LILY_CHECK(t >= 0 && t < V, "CUDA backend: token id ", t, " outside [0, ", V, ")");
      if ((int)prompt.size() > prompt_cap_) {
        cudaFree(d_prompt_);
        prompt_cap_ = (int)prompt.size();
        d_prompt_ = device_alloc<int32_t>(prompt_cap_);
      }
      CUDA_CHECK(cudaMemcpyAsync(d_prompt_, prompt.data(), prompt.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s));
      mark_context(counts_, V, d_prompt_, (int)prompt.size(), s);
    }
    // logit_bias: its (id, bias) pairs with an id in [0, V) (the host Sampler ignores the others), at most V
    std::vector<int> bias_ids;
    std::vector<float> bias_vals;
    for (const auto& [id, b] : p.logit_bias)
      if (id >= 0 && id < V) bias_ids.push_back(id), bias_vals.push_back(b);
    c.n_bias = (int)bias_ids.size();
    if (c.n_bias > 0) {
      if (!bias_ids_) {
        bias_ids_ = device_alloc<int>(V);
        bias_vals_ = device_alloc<float>(V);
      }
      CUDA_CHECK(cudaMemcpyAsync(bias_ids_, bias_ids.data(), c.n_bias * sizeof(int), cudaMemcpyHostToDevice, s));
      CUDA_CHECK(cudaMemcpyAsync(bias_vals_, bias_vals.data(), c.n_bias * sizeof(float), cudaMemcpyHostToDevice, s));
    }
    CUDA_CHECK(cudaStreamSynchronize(s));  // the host copies' sources go away
    // the decode graphs (step + bias + this sampler + the id to host slot 0 or 1), captured once per configuration
    // and kept for the kSampleGraphCache configurations used last (a server alternating between, say, the thinking
    // and non-thinking defaults captures each once: ~1.4 ms per capture on the H200)
    auto hit = std::find_if(sample_graphs_.begin(), sample_graphs_.end(),
                            [&](const SampleGraphs& e) { return e.config == c; });
    sample_config_ = c;  // (sample_tail reads it, also while capturing)
    if (hit == sample_graphs_.end()) {
      if (sample_graphs_.size() == kSampleGraphCache) {  // the least recently used goes
        auto lru = std::min_element(sample_graphs_.begin(), sample_graphs_.end(),
                                    [](const SampleGraphs& a, const SampleGraphs& b) { return a.used < b.used; });
        for (cudaGraphExec_t g : lru->graph) CUDA_CHECK(cudaGraphExecDestroy(g));
        sample_graphs_.erase(lru);
      }
      SampleGraphs e;
      e.config = c;
      for (int k = 0; k < 2; ++k) e.graph[k] = engine_.capture([&] { sample_tail(k); });
      sample_graphs_.push_back(e);
      hit = sample_graphs_.end() - 1;
    }
    hit->used = ++sample_uses_;
    for (int k = 0; k < 2; ++k) sample_graph_[k] = hit->graph[k];
    slot_ = 0;
    sampling_ = true;
    return true;
  }

  lily::SampleResult sample_device() override {
    LILY_CHECK(sampling_ && queued_ == 0,
               "CUDA backend: sample_device without begin_device_sampling, or with steps queued");
    sample_tail(0);  // from the logits of position pos_ - 1: the step on the device is {its id, pos_ - 1}
    CUDA_CHECK(cudaStreamSynchronize(engine_.stream()));
    return sampled(0);
  }

  void decode_device_launch() override {
    LILY_CHECK(sampling_ && queued_ < 2,
               "CUDA backend: decode_device_launch without begin_device_sampling, or a third");
    LILY_CHECK(pos_ + 1 <= engine_.max_context(), "CUDA backend: ", pos_ + 1, " tokens exceed the context of ",
               engine_.max_context());
    engine_.ensure_kv(pos_ + 1);
    CUDA_CHECK(cudaGraphLaunch(sample_graph_[slot_], engine_.stream()));  // consumes {pending id, pos_}
    CUDA_CHECK(cudaEventRecord(done_[slot_], engine_.stream()));
    slot_ ^= 1;
    ++pos_;
    ++queued_;
  }

  lily::SampleResult decode_device_wait() override {
    LILY_CHECK(queued_ > 0, "CUDA backend: decode_device_wait without decode_device_launch");
    const int k = queued_ == 2 ? slot_ : slot_ ^ 1;  // the older launch's slot
    CUDA_CHECK(cudaEventSynchronize(done_[k]));
    --queued_;
    return sampled(k);
  }

  StateSnapshot save_state() const override {
    StateSnapshot snap;
    snap.position = pos_;
    const size_t n = engine_.gdn_state_bytes();
    if (void* p = pool_->get()) {  // ordered before the next step on the stream: no synchronisation
      CUDA_CHECK(cudaMemcpyAsync(p, engine_.gdn_state(), n, cudaMemcpyDeviceToDevice, engine_.stream()));
      snap.device = std::shared_ptr<void>(p, [pool = pool_](void* q) { pool->put(q); });
      snap.device_bytes = n;
      return snap;
    }
    snap.bytes.resize(n);
    CUDA_CHECK(cudaMemcpyAsync(snap.bytes.data(), engine_.gdn_state(), snap.bytes.size(), cudaMemcpyDeviceToHost,
                               engine_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(engine_.stream()));
    return snap;
  }

  void restore_state(const StateSnapshot& snap) override {
    LILY_CHECK(snap.size() == engine_.gdn_state_bytes() && snap.position >= 0 && snap.position <= pos_,
               "CUDA backend: state snapshot of ", snap.size(), " bytes at position ", snap.position,
               " does not match this sequence (", engine_.gdn_state_bytes(), " bytes, position ", pos_, ")");
    if (snap.device) {  // on the stream, before the next step (the block is reused only by a later copy)
      CUDA_CHECK(cudaMemcpyAsync(engine_.gdn_state(), snap.device.get(), snap.device_bytes, cudaMemcpyDeviceToDevice,
                                 engine_.stream()));
    } else {
      CUDA_CHECK(cudaMemcpyAsync(engine_.gdn_state(), snap.bytes.data(), snap.bytes.size(), cudaMemcpyHostToDevice,
                                 engine_.stream()));
      CUDA_CHECK(cudaStreamSynchronize(engine_.stream()));
    }
    pos_ = snap.position;  // KV entries [0, position) are kept
  }

 private:
  static constexpr int kStaging = 4096;  // {token, pos} pairs staged per host->device copy

  static DeviceWeights upload(const Model& model, const CudaOptions& opt) {
    CUDA_CHECK(cudaSetDevice(opt.device));
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    DeviceWeights w = upload_weights(model, opt.quantize_bf16, opt.progress, s);
    CUDA_CHECK(cudaStreamDestroy(s));
    return w;
  }

  // The sampler on the logits, the id (and its log-probability) into the step's input (read by the next step's
  // embedding), the position advanced, the step copied to mapped pinned host memory: one launch sequence, plain
  // or inside the decode graph.
  void sample_tail(int slot) {
    cudaStream_t s = engine_.stream();
    const SampleConfig& c = sample_config_;
    const SamplingParams& d = c.params;
    int* counts = d.update_counts ? counts_ : nullptr;
    StepDev* step = engine_.step();
    add_logit_bias(engine_.logits(), cfg_.vocab, bias_ids_, bias_vals_, c.n_bias, s);
    sample(engine_.logits(), cfg_.vocab, d, counts, rng_, &step->token, sample_scratch_, s,
           c.logprobs ? &step->logprob : nullptr, &step->pos, c.top_n, top_dev_ ? top_dev_->ids : nullptr,
           top_dev_ ? top_dev_->logprobs : nullptr);
    static_assert(sizeof(StepDev) % 4 == 0 && sizeof(TopDev) % 4 == 0, "copied as 32-bit words");
    auto words = [](auto* p) { return reinterpret_cast<uint32_t*>(p); };
    copy_to_mapped(words(host_step_dev_ + slot), words(step), sizeof(StepDev) / 4,
                   c.top_n > 0 ? words(top_host_dev_ + slot) : nullptr, words(top_dev_),
                   c.top_n > 0 ? sizeof(TopDev) / 4 : 0, s);
  }
  lily::SampleResult sampled(int slot) const {
    const SampleConfig& c = sample_config_;
    const StepDev& st = host_step_[slot];
    if (st.token == kSampleNanToken)
      throw lily::NanLogitsError("CUDA sampler: NaN logits (the model's output is not finite)");
    lily::SampleResult r;
    r.token = st.token;
    r.logprob = c.logprobs ? st.logprob : std::numeric_limits<float>::quiet_NaN();
    for (int j = 0; j < c.top_n; ++j)
      if (top_host_[slot].ids[j] >= 0) r.top.push_back({top_host_[slot].ids[j], top_host_[slot].logprobs[j]});
    return r;
  }

  Config cfg_;
  CudaEngine engine_;
  int pos_ = 0;
  StepDev* staging_ = nullptr;  // pinned [kStaging]
  StepDev* d_steps_ = nullptr;  // device [kStaging]
  // device sampling
  struct SampleConfig {                   // what a decode graph bakes in
    SamplingParams params{};
    bool logprobs = false;                // the sampled id's log-probability
    int top_n = 0;                        // top_logprobs
    int n_bias = 0;                       // logit_bias pairs
    bool operator==(const SampleConfig&) const = default;
  };
  struct TopDev {                         // top_logprobs' output
    int ids[kMaxTopLogprobs];
    float logprobs[kMaxTopLogprobs];
  };
  bool sampling_ = false;                 // begin_device_sampling succeeded (until the backend goes away)
  bool chunked_ = true;                    // prompts of >= kPrefillMin tokens through forward_chunks
  int queued_ = 0;                        // decode_device_launch calls not yet waited for (<= 2)
  int slot_ = 0;                          // host slot of the next launch (launches alternate 0, 1)
  cudaEvent_t done_[2] = {};              // recorded after the launch writing slot k
  struct SampleGraphs {                   // the decode graphs of one configuration
    SampleConfig config;
    cudaGraphExec_t graph[2] = {};        // copying the id to host slot k
    uint64_t used = 0;                    // sample_uses_ at its last begin_device_sampling
  };
  static constexpr size_t kSampleGraphCache = 4;
  std::vector<SampleGraphs> sample_graphs_;  // at most kSampleGraphCache, owned (destroyed on eviction)
  uint64_t sample_uses_ = 0;
  SampleConfig sample_config_;            // that of sample_graph_
  cudaGraphExec_t sample_graph_[2] = {};  // the active configuration's graphs (owned by sample_graphs_)
  void* sample_scratch_ = nullptr;        // sampling_scratch_bytes(vocab), also top_logprobs'
  int* counts_ = nullptr;                 // [vocab] penalty counts
  uint64_t* rng_ = nullptr;               // [2] RNG draw counter, seed
  int32_t* d_prompt_ = nullptr;           // [prompt_cap_] prompt ids for mark_context
  int prompt_cap_ = 0;
  int* bias_ids_ = nullptr;               // [vocab] logit_bias ids (allocated at the first request with one)
  float* bias_vals_ = nullptr;            // [vocab] their biases
  TopDev* top_dev_ = nullptr;             // device [1]
  TopDev* top_host_ = nullptr;            // pinned, mapped [2]
  TopDev* top_host_dev_ = nullptr;        // its device pointer (written by copy_to_mapped)
  StepDev* host_step_ = nullptr;          // pinned, mapped [2]: per slot, the step after a sample (id, logprob)
  StepDev* host_step_dev_ = nullptr;      // its device pointer
  std::shared_ptr<SnapshotPool> pool_;    // device memory of save_state
};

}  // namespace

}  // namespace lily::cuda

namespace lily {

bool cuda_device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string cuda_device_description(int device) {
  cudaDeviceProp p{};
  if (!cuda_device_available() || cudaGetDeviceProperties(&p, device) != cudaSuccess) return "";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s, %d SMs, %.1f GiB", p.name, p.multiProcessorCount,
                p.totalGlobalMem / (1024.0 * 1024 * 1024));
  return buf;
}

namespace cuda {
std::unique_ptr<Backend> make_cuda_backend(const Config& c, DeviceWeights w, int max_context, int device,
                                           long long snapshot_device_bytes) {
  return std::make_unique<CudaBackend>(c, std::move(w), max_context, device, snapshot_device_bytes, true);
}
}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(const Model& model, const CudaOptions& opt) {
  const Config& c = model.config;
  LILY_CHECK(c.shared_ffn == c.moe_ffn, "CUDA backend: the shared expert's FFN (", c.shared_ffn,
             ") must equal the routed experts' FFN (", c.moe_ffn, "); kernels/moe.cu fuses them");
  return std::make_unique<cuda::CudaBackend>(model, opt);
}

}  // namespace lily
