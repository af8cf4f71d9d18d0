// The generation loop, the one that `lily generate`, `lily score`, `lily serve` and `lily bench` run over any
// Backend: prefill the prompt in pieces (ending at checkpoint positions, checking for interruption between
// pieces), then sample → report → queue the next step, until a stop id, max_tokens, the context limit, an
// interruption or the callback ends it. The device pipeline is two deep: the step of id i + 1 is queued behind
// the step of id i as soon as id i is reported, before the host has seen id i + 1, so the device never waits
// for the host's turnaround; the step of the id a generation ends at has then usually run too (it is consumed:
// Backend::position() tells how many ids were).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/backend.h"
#include "runtime/sampler.h"

namespace lily {

enum class FinishReason { none, stop, length, cancelled, error };
const char* finish_reason_name(FinishReason r);  // "none", "stop", "length", "cancelled", "error"

struct GenerateOptions {
  int max_tokens = 16;                  // ids to generate at most; 0: consume the prompt only (scoring)
  std::vector<int32_t> stop_ids;        // ids that end the generation (the caller adds Config::eos_token_ids)
  SamplingSetup sampling;
  // ---- the prompt ----
  int prefill_chunk = 0;                // tokens per Backend::prefill call (<= 0: the rest of the prompt at once)
  std::vector<int> checkpoints;         // prompt positions where a piece ends and on_checkpoint(position) runs
  std::function<void(int position)> on_checkpoint;
  std::function<void()> on_prefilled;   // the prompt is consumed (before the first sample)
  float* prompt_logits = nullptr;       // max_tokens 0: [n - from][vocab] every prompt position's logits
  // ---- control ----
  // Checked before each prompt piece, inside a piece where the backend can stop partway
  // (Backend::prefill_stoppable), and before each reported id: a reason to end now (cancelled; length for a time
  // limit), or FinishReason::none to go on.
  std::function<FinishReason()> interrupt;
  // Every sampled id in order, stop ids too (`stop_id`); returns a reason to end after this id, or none.
  std::function<FinishReason(const SampledToken& token, int index, bool stop_id)> on_token;
};

struct GenerateResult {
  std::vector<SampledToken> tokens;     // generated ids; ends with the stop id when stopped_by_id
  FinishReason finish = FinishReason::none;
  bool stopped_by_id = false;
  bool prefilled = false;               // false: interrupted while consuming the prompt
  bool state_valid = true;              // false: the backend's state is not its position's (a discarded look-ahead
                                        // step had non-finite logits, or a prompt piece was stopped partway): reset it
  int prompt_tokens = 0;
  std::vector<int32_t> ids() const;     // tokens' ids
};

// Consumes prompt[from, n) (the backend must be at position `from`: the tokens before it are already consumed),
// then generates. A NaN among the logits of a reported id throws NanLogitsError.
GenerateResult generate(Backend& backend, std::span<const int32_t> prompt, int from, const GenerateOptions& opt);
inline GenerateResult generate(Backend& backend, std::span<const int32_t> prompt, const GenerateOptions& opt) {
  return generate(backend, prompt, backend.position(), opt);
}

}  // namespace lily
