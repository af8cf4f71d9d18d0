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
  res.finish = FinishReason::length;
  for (int i = 0; i < opt.max_tokens; ++i) {
    const SampleResult s = dev ? pending : sampler.sample(logits.data());
    res.tokens.push_back(s.token);
    res.samples.push_back(s);
    const bool stop = std::find(stop_ids.begin(), stop_ids.end(), s.token) != stop_ids.end();
    // no room to decode another token, or no need
    const bool last = stop || i + 1 == opt.max_tokens || backend.position() >= backend.max_context();
    // device path: the next step runs while on_token handles this id (it is consumed even if on_token cancels)
    if (dev && !last) backend.decode_device_launch();
    const bool keep_going = !opt.on_token || opt.on_token(s, i);
    if (dev && !last) pending = backend.decode_device_wait();
    if (stop) {
      res.finish = FinishReason::stop;
      break;
    }
    if (!keep_going) {
      res.finish = FinishReason::cancelled;
      break;
    }
    if (last) break;
    if (!dev) backend.forward(std::span<const int32_t>(&s.token, 1), logits.data(), false);
  }
  return res;
}

}  // namespace lily
