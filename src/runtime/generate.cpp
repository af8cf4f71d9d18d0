// generate(): prefill, then sample -> callback -> stop checks -> decode one token, repeated.
#include "runtime/generate.h"

#include <algorithm>

#include "util/check.h"

namespace lily {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
  }
  return "?";
}

GenerateResult generate(Backend& backend, std::span<const int32_t> prompt, const GenerateOptions& opt) {
  LILY_CHECK(!prompt.empty(), "generate: the prompt is empty");
  const Config& cfg = backend.config();
  GenerateResult res;
  res.prompt_tokens = static_cast<int>(prompt.size());
  std::vector<int32_t> stop_ids = opt.extra_stop_ids;
  if (!opt.ignore_eos) stop_ids.insert(stop_ids.end(), cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());

  Sampler sampler(opt.sampling, cfg.vocab);  // also validates the parameters on the device path
  sampler.add_prompt(prompt);
  const bool dev = !opt.host_sampling && backend.begin_device_sampling(opt.sampling, prompt, opt.logprobs);
  std::vector<float> logits(dev ? 0 : cfg.vocab);
  backend.forward(prompt, dev ? nullptr : logits.data(), false);
  SampleResult pending = dev ? backend.sample_device() : SampleResult{};  // device path: sampled, not consumed
  // Device path: the step of id i + 1 is queued behind the step of id i as soon as on_token has taken id i, before
  // the host has seen id i + 1, so the device never waits for the host's turnaround. The step of a stop id has then
  // run too (it is consumed), as has that of an id on_token cancels at.
  const auto room = [&] { return backend.position() < backend.max_context(); };
  bool queued = dev && opt.max_tokens > 1 && room();  // the step of id i is queued (i = 0 here)
  if (queued) backend.decode_device_launch();
  res.finish = FinishReason::length;
  for (int i = 0; i < opt.max_tokens; ++i) {
    const SampleResult s = dev ? pending : sampler.sample(logits.data());
    res.tokens.push_back(s.token);
    res.samples.push_back(s);
    const bool stop = std::find(stop_ids.begin(), stop_ids.end(), s.token) != stop_ids.end();
    const bool keep_going = !opt.on_token || opt.on_token(s, i);
    if (stop) res.finish = FinishReason::stop;
    else if (!keep_going) res.finish = FinishReason::cancelled;
    if (dev) {
      const bool stepped = queued;  // id i's step ran: there is an id i + 1
      queued = stepped && !stop && keep_going && i + 2 < opt.max_tokens && room();
      if (queued) backend.decode_device_launch();  // id i + 1's step
      if (stepped) pending = backend.decode_device_wait();
      if (stop || !keep_going || !stepped) break;
      continue;
    }
    // host path: no room to decode another token, or no need
    if (stop || !keep_going || i + 1 == opt.max_tokens || !room()) break;
    backend.forward(std::span<const int32_t>(&s.token, 1), logits.data(), false);
  }
  return res;
}

}  // namespace lily
