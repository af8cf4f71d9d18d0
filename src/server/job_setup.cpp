// Request -> GenJob helpers (see job_setup.h).
#include "server/job_setup.h"

#include <algorithm>
#include <random>

#include "server/api_error.h"

namespace lily::server {

void check_context(const ServedModel& m, int n_prompt, const std::string& param) {
  const int n_ctx = m.backend->max_context();
  if (n_prompt >= n_ctx) {
    ApiError e(400, "exceed_context_size_error", "context_length_exceeded", param,
               "'" + param + "': the prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                   std::to_string(n_ctx) + " (prompt plus at least one generated token)");
    e.extra = {{"n_prompt_tokens", n_prompt}, {"n_ctx", n_ctx}};
    throw e;
  }
}

int resolve_max_tokens(std::optional<int> requested, const ServedModel& m, int n_prompt, int cap) {
  const int remaining = m.backend->max_context() - n_prompt;
  if (requested) return std::max(1, std::min(*requested, remaining));
  return std::max(1, std::min(remaining, cap));
}

SamplingParams resolve_sampling(const SamplingRequest& r, const ServedModel& m, SamplingMode mode) {
  const Config& cfg = m.model->config;
  SamplingParams p;
  switch (mode) {
    case SamplingMode::thinking:  // model card, thinking/general (generation_config's values when it sets them)
      p.temperature = cfg.gen_temperature;
      p.top_p = cfg.gen_top_p < 1.0f ? cfg.gen_top_p : 0.95f;
      p.top_k = cfg.gen_top_k > 0 ? cfg.gen_top_k : 20;
      p.presence_penalty = 1.5f;
      break;
    case SamplingMode::non_thinking:  // model card, enable_thinking=false
      p.temperature = 0.7f;
      p.top_p = 0.8f;
      p.top_k = 20;
      p.presence_penalty = 1.5f;
      break;
    case SamplingMode::raw:  // /v1/completions: generation_config only, no penalties
      p.temperature = cfg.gen_temperature;
      p.top_p = cfg.gen_top_p;
      p.top_k = cfg.gen_top_k;
      break;
  }
  if (r.temperature) p.temperature = *r.temperature;
  if (r.top_p) p.top_p = *r.top_p;
  if (r.top_k) p.top_k = *r.top_k < 0 ? 0 : *r.top_k;
  if (r.min_p) p.min_p = *r.min_p;
  if (r.presence_penalty) p.presence_penalty = *r.presence_penalty;
  if (r.frequency_penalty) p.frequency_penalty = *r.frequency_penalty;
  if (r.repetition_penalty) p.repetition_penalty = *r.repetition_penalty;
  for (auto [id, bias] : r.logit_bias) p.logit_bias[id] = bias;
  p.seed = r.seed ? *r.seed : std::random_device{}() * 0x9E3779B97F4A7C15ULL ^ std::random_device{}();
  p.n_valid = m.n_vocab;
  return p;
}

std::vector<int> turn_checkpoints(std::span<const int32_t> prompt, const ServedModel& m) {
  const int n = static_cast<int>(prompt.size());
  for (int i = n - 1; i >= 0; --i) {
    if (prompt[i] != m.im_end) continue;
    int pos = i + 1;
    if (m.turn_tail.size() > 1 && pos < n && prompt[pos] == m.turn_tail[1]) ++pos;
    if (pos < n) return {pos};
    return {};
  }
  return {};
}

}  // namespace lily::server
