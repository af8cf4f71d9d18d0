// Token sampling on the host (the CPU backend's sampler and the reference for the GPU one). Steps, in order:
//   allowed-token mask (structured output) -> logit_bias -> repetition penalty (HF: over prompt + generated ids, z > 0 ? z / p : z * p)
//   -> presence / frequency penalties (OpenAI: over generated ids, z -= frequency * count + presence * [count > 0])
//   -> padding mask (ids >= n_valid get -inf) -> temperature (<= 0: greedy argmax, ties to the lowest id)
//   -> top_k -> top_p -> min_p -> draw.
// The kept set is the longest prefix of the order (z desc, id asc) such that: its length <= top_k; it is the
// shortest prefix whose softmax mass (renormalised over the top_k prefix) >= top_p; every member has
// z >= z_max + log(min_p). The draw: u = sample_uniform(seed, counter) (counter = draws so far), and the token
// is the first id, walking the kept set in ascending id order, whose running sum of exp(z - z_max) exceeds
// u * total. The same seed gives the same tokens on every platform (no std:: distributions).
// A NaN among the logits is an engine failure, never a token (docs/api.md §10.1): NanLogitsError.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "util/check.h"

namespace lily {

// The model produced NaN logits (corrupt weights, an overflow): the request fails (HTTP 500 `nan_logits`).
struct NanLogitsError : Error {
  using Error::Error;
};

struct SamplingParams {
  float temperature = 1.0f;        // <= 0: greedy
  int top_k = 0;                   // <= 0: off
  float top_p = 1.0f;              // >= 1: off
  float min_p = 0.0f;              // <= 0: off
  float presence_penalty = 0.0f;   // OpenAI presence_penalty, over generated ids
  float frequency_penalty = 0.0f;  // OpenAI frequency_penalty, over generated ids
  float repetition_penalty = 1.0f; // HF repetition_penalty over prompt + generated ids (1: off)
  std::map<int32_t, float> logit_bias;  // id -> added to its logit
  uint64_t seed = 0;
  int n_valid = 0;                 // ids >= n_valid are padding (the tokenizer's size); <= 0: the whole vocab
  int top_logprobs = 0;            // how many alternatives SampledToken::top lists
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

// One generated token as every layer sees it (backends, the generation loop, the server's sessions).
struct SampledToken {
  int32_t token = 0;
  float logprob = 0;               // log-softmax of the processed logits (see Sampler::process) at `token`; NaN
                                   // when the backend was not asked for log-probabilities
  std::vector<TokenLogprob> top;   // the top_logprobs most likely ids, descending (ties: lower id first)
};

// splitmix64(seed ^ splitmix64(counter)), top 24 bits mapped to [0, 1) (exact in float); the GPU sampler
// (kernels/sampling.h) draws the same stream.
float sample_uniform(uint64_t seed, uint64_t counter);

class Sampler {
 public:
  Sampler(const SamplingParams& params, int vocab);

  const SamplingParams& params() const { return p_; }
  // Ids already in the context (the prompt): they count for the repetition penalty only.
  void add_prompt(std::span<const int32_t> prompt);
  // Records a generated id (counts for all penalties). sample() records its own choice.
  void add_generated(int32_t token);

  // Chooses the next id from logits [vocab] (not modified) and records it as generated. Throws NanLogitsError
  // when a logit (of a valid id) is NaN. `allowed` (optional, TokenFilter's bitmask [ceil(vocab / 32)]): ids
  // whose bit is clear get -inf before anything else, so log-probabilities refer to the constrained distribution.
  SampledToken sample(const float* logits, const uint32_t* allowed = nullptr);

  // An id drawn elsewhere (a backend's device sampler, with these parameters, penalties and draw counter): recorded
  // as sample() records its own choice (the generated count, the draw counter).
  void record_drawn(int32_t token);
  uint64_t draws() const { return draws_; }                         // the draw counter (the next draw's)
  const std::vector<int32_t>& context_ids() const { return context_ids_; }  // prompt or generated, each once
  int generated_count(int32_t id) const { return generated_count_[id]; }

  // z [vocab] = logits after logit_bias, penalties, padding mask and temperature (skipped when greedy): the
  // distribution the log-probabilities refer to, before top_k / top_p / min_p truncation.
  void process(const float* logits, float* z, const uint32_t* allowed = nullptr) const;

 private:
  SamplingParams p_;
  int vocab_ = 0;
  int n_valid_ = 0;
  uint64_t draws_ = 0;                 // RNG counter
  std::vector<int32_t> generated_count_;  // [vocab]
  std::vector<uint8_t> in_context_;       // [vocab] prompt or generated
  std::vector<int32_t> context_ids_;      // the ids with in_context_ set, each once (the penalties' only work)
  std::vector<float> z_;                  // [vocab] scratch
};

}  // namespace lily
