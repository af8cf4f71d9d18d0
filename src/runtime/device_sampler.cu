// DeviceSampler (see device_sampler.cuh).
#include "runtime/device_sampler.cuh"

#include <algorithm>
#include <limits>

#include "kernels/common.cuh"
#include "util/check.h"
#include "util/log.h"

namespace lily::cuda {

DeviceSampler::DeviceSampler(CudaEngine& engine) : engine_(engine) {
  CUDA_CHECK(cudaHostAlloc(&host_step_, 2 * sizeof(StepDev), cudaHostAllocMapped));
  CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_step_dev_), host_step_, 0));
  for (cudaEvent_t& e : done_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

DeviceSampler::~DeviceSampler() {
  unblock();
  cudaStreamSynchronize(engine_.stream());
  for (SampleGraphs& e : sample_graphs_)
    for (cudaGraphExec_t g : e.graph)
      if (g) cudaGraphExecDestroy(g);
  for (cudaEvent_t e : done_) cudaEventDestroy(e);
  for (void* p : {(void*)counts_, (void*)rng_, sample_scratch_, (void*)d_prompt_, (void*)bias_ids_, (void*)bias_vals_,
                  (void*)top_dev_})
    cudaFree(p);
  if (top_host_) cudaFreeHost(top_host_);
  if (mask_host_) cudaFreeHost(mask_host_);
  cudaFreeHost(host_step_);
}

void DeviceSampler::drop_queued() {
  unblock();  // (a queued masked step may still wait for its mask)
  if (queued_ == 0) return;
  CUDA_CHECK(cudaStreamSynchronize(engine_.stream()));
  queued_ = 0;
}

SamplingParams device_params(const lily::SamplingParams& p, int vocab) {
  SamplingParams d;
  d.temperature = p.temperature;
  d.top_k = p.top_k;
  d.top_p = p.top_p;
  d.min_p = p.min_p;
  d.presence = p.presence_penalty;
  d.frequency = p.frequency_penalty;
  d.repetition = p.repetition_penalty;
  d.n_valid = p.n_valid > 0 && p.n_valid < vocab ? p.n_valid : 0;
  d.update_counts = has_penalties(d);
  return d;
}

void device_logit_bias(const lily::SamplingParams& p, int vocab, std::vector<int>& ids, std::vector<float>& vals) {
  ids.clear();
  vals.clear();
  for (const auto& [id, b] : p.logit_bias)
    if (id >= 0 && id < vocab) ids.push_back(id), vals.push_back(b);
}

bool DeviceSampler::begin(const lily::SamplingParams& p, std::span<const int32_t> prompt, bool logprobs,
                          TokenFilter* filter) {
  unblock();  // an abandoned generation's masked steps: they must not wait for the host (synchronised below)
  filter_ = nullptr;
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
  if (filter) {  // the mask slots, their sequence words cleared (no kernel reads them now); tickets from 0
    const int words = 2 * token_mask_slot_words(V);
    if (!mask_host_) {
      CUDA_CHECK(cudaHostAlloc(&mask_host_, words * sizeof(uint32_t), cudaHostAllocMapped));
      CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&mask_dev_), mask_host_, 0));
    }
    std::fill(mask_host_, mask_host_ + words, 0u);
  }
  issued_ = published_ = 0;
  SampleConfig c;
  c.params = device_params(p, V);
  const SamplingParams& d = c.params;
  c.logprobs = logprobs;
  c.top_n = p.top_logprobs;
  c.masked = filter != nullptr;
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
  device_logit_bias(p, V, bias_ids, bias_vals);
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
  filter_ = filter;
  sampling_ = true;
  return true;
}

// Structured output. Ticket n is the n-th sample of the generation (the eager one here is ticket 0, the step
// launched k-th is ticket k); the host publishes the tickets in order, each as soon as its filter state is known:
//   sample():  publish 0 → sample → accept(id 0) → publish 1
//   wait() of the step of ticket j (it sampled id j): accept(id j) → publish j + 1
// The generation loop (runtime/generate.cpp) launches the step of ticket j + 1 before waiting for that of ticket
// j, so the host computes mask j + 1 while step j + 1's layers run, and the step's tail waits for it only if the
// host is late. No hang: (1) a wait() is for the oldest queued step, ticket j, published by the sample() or
// wait() before it (published_ = 2 + waits so far, checked below); (2) launch() (and the KV growth before it, which
// may synchronise) runs when every enqueued ticket is published (the loop launches with at most one step queued:
// issued_ = 1 + launches <= 2 + waits); (3) an exception between a launch and its publication (the filter throws,
// NaN logits) publishes "all allowed" for it (unblock()), as do drop_queued(), begin() and the destructor before
// they synchronise; (4) the kernel itself gives up after kTokenMaskTimeoutNs. A slot is rewritten (ticket n + 2)
// only after ticket n's step has finished: publication n + 2 follows the wait for ticket n + 1's step.
void DeviceSampler::publish(bool from_filter) {
  const int V = engine_.config().vocab;
  bool masked = false;
  if (from_filter) {
    uint32_t* bits = token_mask_bits(mask_host_, V, published_);
    const size_t words = static_cast<size_t>(V + 31) / 32;
    std::fill(bits, bits + words, 0u);
    masked = filter_->allowed(std::span<uint32_t>(bits, words));
  }
  publish_token_mask(mask_host_, V, published_, masked);
  ++published_;
}

void DeviceSampler::unblock() {
  while (published_ < issued_) publish(false);
}

lily::SampledToken DeviceSampler::accept(lily::SampledToken r) {
  if (!filter_) return r;
  try {
    filter_->accept(r.token);
    publish(true);
  } catch (...) {
    unblock();
    throw;
  }
  return r;
}

lily::SampledToken DeviceSampler::sample() {
  LILY_CHECK(sampling_ && queued_ == 0,
             "CUDA sampler: sample() without begin(), or with steps queued");
  if (filter_) publish(true);  // ticket 0, before the sample that waits for it
  sample_tail(0);  // from the logits of position pos_ - 1: the step on the device is {its id, pos_ - 1}
  if (filter_) ++issued_;
  CUDA_CHECK(cudaStreamSynchronize(engine_.stream()));
  return accept(sampled(0));
}

void DeviceSampler::launch() {
  LILY_CHECK(sampling_ && queued_ < 2,
             "CUDA sampler: launch() without begin(), or a third");
  CUDA_CHECK(cudaGraphLaunch(sample_graph_[slot_], engine_.stream()));  // consumes {pending id, pos_}
  if (filter_) ++issued_;
  CUDA_CHECK(cudaEventRecord(done_[slot_], engine_.stream()));
  slot_ ^= 1;
  ++queued_;
}

lily::SampledToken DeviceSampler::wait() {
  LILY_CHECK(queued_ > 0, "CUDA sampler: wait() without launch()");
  const int k = queued_ == 2 ? slot_ : slot_ ^ 1;  // the older launch's slot
  const uint64_t ticket = issued_ - static_cast<uint64_t>(queued_);  // that launch's (when masked)
  if (filter_ && published_ <= ticket) {  // not by the protocol above: fail rather than wait for the timeout
    unblock();
    LILY_CHECK(false, "CUDA sampler: wait() for a step whose token mask was never published");
  }
  CUDA_CHECK(cudaEventSynchronize(done_[k]));
  --queued_;
  if (filter_ && token_mask_timed_out(mask_host_, engine_.config().vocab, ticket)) {
    ++timeouts_;
    log::warn("structured output: the token mask of sample ", ticket, " came later than ",
              kTokenMaskTimeoutNs / 1000000, " ms; that token was sampled unconstrained (", timeouts_, " so far)");
  }
  lily::SampledToken r;
  try {
    r = sampled(k);
  } catch (...) {  // NaN logits: the step queued behind must not wait for a mask
    unblock();
    throw;
  }
  return accept(std::move(r));
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
  if (c.masked) apply_token_mask(engine_.logits(), engine_.config().vocab, mask_dev_, rng_, kTokenMaskTimeoutNs, s);
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
