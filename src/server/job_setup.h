// From a validated request to the engine's GenJob fields: context checks (docs/api.md §10.1 rows 4-5), the
// max_tokens default and clamp, sampling defaults per thinking mode (docs/chat.md §5.1), and the prompt positions
// where the prefix cache snapshots the state (docs/api.md §11).
#pragma once
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "server/request.h"
#include "server/served_model.h"

namespace lily::server {

enum class SamplingMode { thinking, non_thinking, raw };

// 400 exceed_context_size_error (with n_prompt_tokens, n_ctx) unless n_prompt < the context. `param` names the
// request field the prompt came from: "messages" (chat) or "prompt" (completions).
void check_context(const ServedModel& m, int n_prompt, const std::string& param);
// Absent: min(remaining, cap); larger than the remaining context: clamped (ends with finish_reason length).
int resolve_max_tokens(std::optional<int> requested, const ServedModel& m, int n_prompt, int cap);
// Request fields over the defaults of `mode`; n_valid masks the model-vocab padding.
SamplingParams resolve_sampling(const SamplingRequest& r, const ServedModel& m, SamplingMode mode);
// Snapshot positions: right after the last "<|im_end|>\n" before the generation prompt.
std::vector<int> turn_checkpoints(std::span<const int32_t> prompt, const ServedModel& m);

}  // namespace lily::server
