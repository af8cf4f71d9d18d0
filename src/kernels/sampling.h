// Token sampling on the GPU (kernels/sampling.cu): penalties from a device-side token-count buffer, padding
// mask, greedy argmax, temperature, top-k, top-p, min-p and a seeded counter-based RNG. The chosen token is
// written to device memory (read by embed_row for the next step) with no host synchronisation.
//
// Exact semantics (the tests' CPU reference implements the same):
//   z_i = logits_i for i < n_valid, -inf for i >= n_valid (padding mask)
//   c_i = counts[i] & kSampleCountMask (generated count); counts[i] != 0: id i is in the context (generated, or
//   marked by mark_context: the prompt)
//   if counts[i] != 0 and repetition != 1:  z_i = z_i > 0 ? z_i / repetition : z_i * repetition
//   z_i -= frequency * c_i + presence * (c_i > 0)
//   temperature <= 0  -> greedy: the largest z_i (ties: lowest id)
//   else z_i /= temperature, and the kept set is the longest prefix of the order (z desc, id asc) such that
//     - its length <= top_k                        (top_k <= 0: no limit)
//     - it is the shortest prefix whose softmax mass (renormalised over the top_k prefix) >= top_p
//     - every member has z >= z_max + log(min_p)   (min_p <= 0: no limit)
//   then u = uniform [0,1) from (seed, counter) = (rng[1], rng[0]) and the token is the first id, walking the
//   kept set in ascending id order, whose running sum of exp(z - z_max) exceeds u * total. rng[0] is incremented.
//   With update_counts, counts[token] += 1 afterwards.
//   A NaN z_i (i < n_valid) writes kSampleNanToken instead of a token (no count update): the host fails the
//   request (docs/api.md §10.1: never emit garbage).
// top_k in 1..kSampleFastTopK uses a one-pass candidate path; other values an exact full-vocabulary path (radix
// selects over all of z in many blocks, masses summed in fixed point: kernels/sample_full.cuh).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace lily::cuda {

inline constexpr int kSampleFastTopK = 64;
inline constexpr int kSampleNanToken = -2;  // written instead of a token when a logit is NaN
inline constexpr int kMaxTopLogprobs = 20;  // OpenAI's top_logprobs limit
inline constexpr int kSampleInContext = 1 << 30;               // counts[i] flag: id i is in the prompt
inline constexpr int kSampleCountMask = kSampleInContext - 1;  // counts[i] bits: times id i was generated

struct SamplingParams {
  float temperature = 1.0f;   // <= 0: greedy
  int top_k = 0;              // <= 0: off
  float top_p = 1.0f;         // >= 1: off
  float min_p = 0.0f;         // <= 0: off
  float presence = 0.0f;      // OpenAI presence_penalty
  float frequency = 0.0f;     // OpenAI frequency_penalty
  float repetition = 1.0f;    // HF repetition_penalty (1: off)
  int n_valid = 0;            // ids >= n_valid are masked (kVocabReal for the real model); 0: no mask
  bool update_counts = true;  // counts[token] += 1 after sampling
  bool operator==(const SamplingParams&) const = default;
};
// A presence, frequency or repetition penalty is set (sample() then needs the counts).
__host__ __device__ inline bool has_penalties(const SamplingParams& p) {
  return p.presence != 0.f || p.frequency != 0.f || p.repetition != 1.f;
}

// Device scratch for a vocabulary of V <= kSampleMaxVocab (the full path's fixed-point mass sums; a larger one
// throws here: the CUDA backend samples on the host then); sampling_scratch_bytes(V) bytes, alignment >= 256.
inline constexpr int kSampleMaxVocab = 1 << 18;
size_t sampling_scratch_bytes(int vocab);

// logits [vocab] fp32 (not modified); counts [vocab] int32 (may be null when no penalty is set; then
// update_counts is ignored); rng [2] device uint64 {draw counter, seed} (the seed in device memory: one captured
// graph serves every seed); out_token [1] device int32.
// out_logprob (device, may be null): the token's log-probability under the processed distribution before the
// truncations, z_token - log(sum_i exp z_i) (the host Sampler's SampledToken::logprob). advance (device, may be
// null): incremented once the token is written (a decode loop's position, without a kernel of its own).
// top_n > 0: also top_logprobs()'s output into top_ids / top_logprobs (device, [top_n]), from the sampler's own
// candidates where its path keeps them (top_k in 1..kSampleFastTopK or greedy), else by top_logprobs() first.
void sample(const float* logits, int vocab, const SamplingParams& p, int* counts, uint64_t* rng,
            int* out_token, void* scratch, cudaStream_t stream, float* out_logprob = nullptr,
            int* advance = nullptr, int top_n = 0, int* top_ids = nullptr, float* top_logprobs = nullptr);

// Several rows' draws at once (a batched decode step): one row's sample() arguments, fast path only.
inline constexpr int kSampleRowsPerLaunch = 32;  // rows per launch pair (their arguments are kernel parameters)
struct SampleRow {
  const float* logits; SamplingParams p; int* counts; uint64_t* rng; int* out_token; float* out_logprob;
  int top_n; int* top_ids; float* top_lps;
};
// sample_rows takes a row of these parameters: greedy, or top_k in 1..kSampleFastTopK (the one-pass path).
bool sample_rows_supported(const SamplingParams& p);
// Scratch bytes per row of sample_rows (alignment >= 256).
size_t sample_rows_scratch_bytes(int vocab);
// The draws of n rows (host array) in two launches per kSampleRowsPerLaunch rows, each row's blocks those of
// sample() with its arguments: the same token, log-probabilities, counts and rng update, bit for bit. scratch
// (device): n * sample_rows_scratch_bytes(vocab) bytes.
void sample_rows(const SampleRow* rows, int n, int vocab, void* scratch, cudaStream_t stream);

// counts[tokens[i]] += 1 for i < n (device tokens), e.g. the prompt before the first sampled token.
void count_tokens(int* counts, int vocab, const int* tokens, int n, cudaStream_t stream);
// The n (1..kMaxTopLogprobs, at most n_valid) most likely ids under the distribution sample() draws from before
// its truncations (penalties from counts, mask, temperature), descending (ties: lower id first), and their
// log-probabilities, into out_ids / out_logprobs (device, [n]): the host Sampler's SampledToken::top. Launch it
// before a sample() that updates the counts. scratch: a sample() scratch (sampling_scratch_bytes), reusable by
// the sample() launched after it on the same stream.
void top_logprobs(const float* logits, int vocab, const SamplingParams& p, const int* counts, int n, int* out_ids,
                  float* out_logprobs, void* scratch, cudaStream_t stream);
// logits[ids[i]] += bias[i] for i < n (device arrays; distinct ids, those outside [0, vocab) skipped): OpenAI's
// logit_bias, applied in place before sample() (the host Sampler adds it first too).
void add_logit_bias(float* logits, int vocab, const int* ids, const float* bias, int n, cudaStream_t stream);
// counts[tokens[i]] |= kSampleInContext: the repetition penalty applies to those ids, presence and frequency
// (generated ids only, as the host Sampler) do not.
void mark_context(int* counts, int vocab, const int* tokens, int n, cudaStream_t stream);

// step_io.cu: copies words_a 32-bit words from src_a and words_b (may be 0) from src_b (device) to dst_a / dst_b,
// pinned host memory mapped into the device (their device pointers), with one small kernel: the decode graph's
// sampled step and top log-probabilities to the host without a copy-engine transfer.
void copy_to_mapped(uint32_t* dst_a, const uint32_t* src_a, int words_a, uint32_t* dst_b, const uint32_t* src_b,
                    int words_b, cudaStream_t stream);

// ---- structured output: a host-computed token mask applied on the device (the decode graph's tail) ----
// Two mask slots in mapped pinned host memory, each token_mask_slot_words(vocab) words: word 0 the slot's
// sequence word, words 1..kTokenMaskHeader-1 spare (word 2: the kernel writes the sequence there when it gave up
// waiting), then the bitmask (bit id % 32 of word id / 32, 1 = allowed). The n-th masked sample of a generation
// (ticket n: the sampler's draw counter rng[0], which sample() increments once per call) reads slot n % 2. The
// host publishes ticket n by writing the bits, then (release) the sequence word token_mask_word(n, masked).
inline constexpr int kTokenMaskHeader = 4;
inline constexpr long long kTokenMaskTimeoutNs = 2'000'000'000;  // then the step samples unconstrained
inline int token_mask_slot_words(int vocab) { return kTokenMaskHeader + ((vocab + 31) / 32 + 3) / 4 * 4; }
// The sequence word of ticket n: (n + 1) mod 2^31 shifted left once, bit 0 = a mask follows (0: all allowed).
__host__ __device__ inline uint32_t token_mask_word(uint64_t ticket, bool masked) {
  return (static_cast<uint32_t>((ticket + 1) & 0x7fffffffu) << 1) | (masked ? 1u : 0u);
}
// Host side: the bits of ticket n's slot (slots: the host pointer), to fill before publishing.
uint32_t* token_mask_bits(uint32_t* slots, int vocab, uint64_t ticket);
// Host side: publishes ticket n (masked: its bits are filled; else every id is allowed): a release store of the
// sequence word after the bits.
void publish_token_mask(uint32_t* slots, int vocab, uint64_t ticket, bool masked);
// Host side: whether the kernel gave up waiting for ticket n (read once the step that used it has finished).
bool token_mask_timed_out(const uint32_t* slots, int vocab, uint64_t ticket);
// Device: waits until slot (counter[0] % 2)'s sequence word is that of ticket counter[0] (each block polls it,
// with backoff), then sets logits[i] = -inf for every i < vocab whose bit is clear (the host Sampler's mask,
// applied before logit_bias and the penalties as there). After timeout_ns without it, it leaves the logits
// alone and records the timeout in the slot (word 2): the GPU never hangs on a host that failed to publish.
// slots: the device pointer of the mapped slots; counter: the sampler's rng (device).
void apply_token_mask(float* logits, int vocab, uint32_t* slots, const uint64_t* counter, long long timeout_ns,
                      cudaStream_t stream);

// The uniform number in [0,1) the sampler draws for (seed, counter); host and device give the same value.
float sample_uniform(uint64_t seed, uint64_t counter);

}  // namespace lily::cuda
