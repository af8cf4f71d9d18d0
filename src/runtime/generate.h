// The generation loop over any Backend: prefill the prompt, then sample and decode one token at a time until
// a stop id (Config::eos_token_ids, unless ignore_eos), max_tokens, the context limit, or the callback
// cancels. The sampler sees the prompt (repetition penalty) and every generated id.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/sampler.h"

namespace lily {

enum class FinishReason { stop, length, cancelled };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled"

struct GenerateOptions {
  int max_tokens = 16;
  bool ignore_eos = false;
  std::vector<int32_t> extra_stop_ids;  // stop ids on top of the config's eos ids
  SamplingParams sampling;
  // A backend that samples on the device does so (Backend::begin_device_sampling) unless host_sampling; its
  // results carry SampleResult::logprob only with `logprobs` (else NaN), `top` with sampling.top_logprobs > 0.
  // Host sampling fills both always.
  bool logprobs = false;
  bool host_sampling = false;
  // Called for every generated id (the stop id too) in order; return false to cancel after this token.
  std::function<bool(const SampleResult& token, int index)> on_token;
};

struct GenerateResult {
  std::vector<int32_t> tokens;         // generated ids; ends with the stop id when finish == stop
  std::vector<SampleResult> samples;   // [tokens.size()] with log-probabilities
  FinishReason finish = FinishReason::length;
  int prompt_tokens = 0;
};

// Consumes `prompt` (non-empty) starting at the backend's current position, then generates. Afterwards the
// backend has consumed the prompt and every generated id except the last (which was never fed back), except
// with device sampling when the last id is a stop id or on_token cancels at it: its step ran ahead (queued
// before the host saw the id).
GenerateResult generate(Backend& backend, std::span<const int32_t> prompt, const GenerateOptions& opt);

}  // namespace lily
