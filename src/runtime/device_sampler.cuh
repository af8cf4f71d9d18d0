// The per-sequence state of sampling on the device: the penalty counts, RNG counter and seed, logit_bias,
// top_logprobs output, and the decode graphs (the engine's step followed by this sampler, which writes the id into
// the next step's StepDev, advances the position and copies {id, position, log-probability} to mapped pinned host
// memory) captured once per sampling configuration and kept for the last few. Per token the host launches a
// graph (two may be queued) and reads 12 bytes. With a TokenFilter (structured output) the graph's tail first waits
// for the host's mask of that token (kernels/sampling.h apply_token_mask), which the host computes while the
// step's layers run (device_sampler.cu states the order, above publish()). CUDA only: included by
// runtime/cuda_backend.cu.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/sampling.h"
#include "model/cuda_engine.h"
#include "runtime/sampler.h"
#include "runtime/token_filter.h"

namespace lily::cuda {

// The host Sampler's parameters as the device sampler's (kernels/sampling.h); update_counts when a penalty reads
// the counts. logit_bias goes separately: device_logit_bias.
SamplingParams device_params(const lily::SamplingParams& p, int vocab);
// The logit_bias pairs the host Sampler applies (ids in [0, vocab)), in the map's order.
void device_logit_bias(const lily::SamplingParams& p, int vocab, std::vector<int>& ids, std::vector<float>& vals);

class DeviceSampler {
 public:
  explicit DeviceSampler(CudaEngine& engine);
  ~DeviceSampler();
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  // Starts one generation (RNG counter 0, penalty counts from `prompt`); false when these parameters cannot be
  // sampled on the device with the host Sampler's semantics (then nothing changed). `filter` (may be null, not
  // owned): structured output; the sampler calls its allowed() / accept() once per sampled id, in order.
  bool begin(const lily::SamplingParams& p, std::span<const int32_t> prompt, bool logprobs,
             TokenFilter* filter = nullptr);
  // The next id from the logits of the last consumed position (the engine's logits and step()).
  lily::SampledToken sample();
  // Launches the decode graph: consumes {pending id, position} from step() and samples the next id. The caller
  // makes the KV room for that position. Up to two queued; wait() returns their ids in launch order.
  void launch();
  lily::SampledToken wait();
  // Forgets launches a failed generation left queued (synchronises the stream).
  void drop_queued();
  // Publishes "every id allowed" for each masked sample enqueued whose mask the host has not published (a
  // generation abandoned by an exception), so that nothing on the stream waits for the host any more. Call
  // before anything that synchronises the stream outside the generation protocol.
  void unblock();

 private:
  void sample_tail(int slot);
  lily::SampledToken sampled(int slot) const;
  void publish(bool from_filter);             // the mask of ticket published_ (the filter's, or all allowed)
  lily::SampledToken accept(lily::SampledToken r);  // the filter told; the next ticket published

  CudaEngine& engine_;
  struct SampleConfig {                   // what a decode graph bakes in
    SamplingParams params{};
    bool logprobs = false;                // the sampled id's log-probability
    int top_n = 0;                        // top_logprobs
    int n_bias = 0;                       // logit_bias pairs
    bool masked = false;                  // apply_token_mask first (structured output)
    bool operator==(const SampleConfig&) const = default;
  };
  struct TopDev {                         // top_logprobs' output
    int ids[kMaxTopLogprobs];
    float logprobs[kMaxTopLogprobs];
  };
  bool sampling_ = false;                 // begin() succeeded once (until the sampler goes away)
  int queued_ = 0;                        // launch() calls not yet waited for (<= 2)
  int slot_ = 0;                          // host slot of the next launch (launches alternate 0, 1)
  cudaEvent_t done_[2] = {};              // recorded after the launch writing slot k
  struct SampleGraphs {                   // the decode graphs of one configuration
    SampleConfig config;
    cudaGraphExec_t graph[2] = {};        // copying the id to host slot k
    uint64_t used = 0;                    // sample_uses_ at its last begin()
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
  // structured output: the two mask slots (kernels/sampling.h), tickets = masked samples of this generation
  TokenFilter* filter_ = nullptr;         // this generation's (null: unmasked)
  uint32_t* mask_host_ = nullptr;         // pinned, mapped [2 * token_mask_slot_words(vocab)]
  uint32_t* mask_dev_ = nullptr;          // its device pointer
  uint64_t issued_ = 0;                   // masked samples enqueued (the device consumes tickets 0..issued_-1)
  uint64_t published_ = 0;                // tickets whose mask the host has published (0..published_-1)
  uint64_t timeouts_ = 0;                 // masks the device gave up waiting for (logged)
};

}  // namespace lily::cuda
