// DeviceSampler (see device_sampler.cuh).
#include "runtime/device_sampler.cuh"

#include <algorithm>
#include <limits>

#include "kernels/common.cuh"
#include "util/check.h"

namespace lily::cuda {

DeviceSampler::DeviceSampler(CudaEngine& engine) : engine_(engine) {
  CUDA_CHECK(cudaHostAlloc(&host_step_, 2 * sizeof(StepDev), cudaHostAllocMapped));
  CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_step_dev_), host_step_, 0));
  for (cudaEvent_t& e : done_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

DeviceSampler::~DeviceSampler() {
  cudaStreamSynchronize(engine_.stream());
  for (SampleGraphs& e : sample_graphs_)
    for (cudaGraphExec_t g : e.graph)
      if (g) cudaGraphExecDestroy(g);
  for (cudaEvent_t e : done_) cudaEventDestroy(e);
  for (void* p : {(void*)counts_, (void*)rng_, sample_scratch_, (void*)d_prompt_, (void*)bias_ids_, (void*)bias_vals_,
                  (void*)top_dev_})
    cudaFree(p);
  if (top_host_) cudaFreeHost(top_host_);
  cudaFreeHost(host_step_);
}

void DeviceSampler::drop_queued() {
  if (queued_ == 0) return;
  CUDA_CHECK(cudaStreamSynchronize(engine_.stream()));
  queued_ = 0;
}

bool DeviceSampler::begin(const lily::SamplingParams& p, std::span<const int32_t> prompt, bool logprobs) {
  const int V = engine_.config().vocab;
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

lily::SampledToken DeviceSampler::sample() {
  LILY_CHECK(sampling_ && queued_ == 0,
             "CUDA sampler: sample() without begin(), or with steps queued");
  sample_tail(0);  // from the logits of position pos_ - 1: the step on the device is {its id, pos_ - 1}
  CUDA_CHECK(cudaStreamSynchronize(engine_.stream()));
  return sampled(0);
}

void DeviceSampler::launch() {
  LILY_CHECK(sampling_ && queued_ < 2,
             "CUDA sampler: launch() without begin(), or a third");
  CUDA_CHECK(cudaGraphLaunch(sample_graph_[slot_], engine_.stream()));  // consumes {pending id, pos_}
  CUDA_CHECK(cudaEventRecord(done_[slot_], engine_.stream()));
  slot_ ^= 1;
  ++queued_;
}

lily::SampledToken DeviceSampler::wait() {
  LILY_CHECK(queued_ > 0, "CUDA sampler: wait() without launch()");
  const int k = queued_ == 2 ? slot_ : slot_ ^ 1;  // the older launch's slot
  CUDA_CHECK(cudaEventSynchronize(done_[k]));
  --queued_;
  return sampled(k);
}

// The sampler on the logits, the id (and its log-probability) into the step's input (read by the next step's
// embedding), the position advanced, the step copied to mapped pinned host memory: one launch sequence, plain
// or inside the decode graph.
void DeviceSampler::sample_tail(int slot) {
  cudaStream_t s = engine_.stream();
  const SampleConfig& c = sample_config_;
  const SamplingParams& d = c.params;
  int* counts = d.update_counts ? counts_ : nullptr;
  StepDev* step = engine_.step();
  add_logit_bias(engine_.logits(), engine_.config().vocab, bias_ids_, bias_vals_, c.n_bias, s);
  lily::cuda::sample(engine_.logits(), engine_.config().vocab, d, counts, rng_, &step->token, sample_scratch_, s,
         c.logprobs ? &step->logprob : nullptr, &step->pos, c.top_n, top_dev_ ? top_dev_->ids : nullptr,
         top_dev_ ? top_dev_->logprobs : nullptr);
  static_assert(sizeof(StepDev) % 4 == 0 && sizeof(TopDev) % 4 == 0, "copied as 32-bit words");
  auto words = [](auto* p) { return reinterpret_cast<uint32_t*>(p); };
  copy_to_mapped(words(host_step_dev_ + slot), words(step), sizeof(StepDev) / 4,
                 c.top_n > 0 ? words(top_host_dev_ + slot) : nullptr, words(top_dev_),
                 c.top_n > 0 ? sizeof(TopDev) / 4 : 0, s);
}
lily::SampledToken DeviceSampler::sampled(int slot) const {
  const SampleConfig& c = sample_config_;
  const StepDev& st = host_step_[slot];
  if (st.token == kSampleNanToken)
    throw lily::NanLogitsError("CUDA sampler: NaN logits (the model's output is not finite)");
  lily::SampledToken r;
  r.token = st.token;
  r.logprob = c.logprobs ? st.logprob : std::numeric_limits<float>::quiet_NaN();
  for (int j = 0; j < c.top_n; ++j)
    if (top_host_[slot].ids[j] >= 0) r.top.push_back({top_host_[slot].ids[j], top_host_[slot].logprobs[j]});
  return r;
}

}  // namespace lily::cuda
