// The host implementation of the generation protocol (see backend.h): the Sampler over forward()'s logits.
// decode_launch runs the step and the sample at once, so its queue only carries results to decode_wait; the
// order of forward() and sampler calls is exactly the device pipeline's.
#include "runtime/backend.h"

#include <limits>

#include "util/check.h"

namespace lily {

void Backend::begin_sampling(const SamplingSetup& setup, std::span<const int32_t> prompt) { host_begin(setup, prompt); }
void Backend::prefill(std::span<const int32_t> tokens, bool last) { host_prefill(tokens, last); }
bool Backend::prefill_stoppable(std::span<const int32_t> tokens, bool last, const std::function<bool()>&) {
  prefill(tokens, last);
  return true;
}
SampledToken Backend::sample() { return host_sample(); }
void Backend::decode_launch() { host_launch(); }
SampledToken Backend::decode_wait() { return host_wait(); }

void Backend::host_begin(const SamplingSetup& setup, std::span<const int32_t> prompt) {
  const int V = config().vocab;
  sampler_.emplace(setup.params, V);  // validates the parameters
  sampler_->add_prompt(prompt);
  filter_ = setup.filter;
  logprobs_ = setup.logprobs;
  logits_.assign(static_cast<size_t>(V), 0.0f);
  mask_.assign(static_cast<size_t>((V + 31) / 32), 0u);
  pending_ = -1;
  done_.clear();
}

void Backend::host_prefill(std::span<const int32_t> tokens, bool last) {
  if (tokens.empty()) return;
  forward(tokens, last ? logits_.data() : nullptr, false);
}

SampledToken Backend::host_sample() {
  LILY_CHECK(sampler_.has_value(), name(), " backend: sample() without begin_sampling()");
  const bool masked = filter_ && filter_->allowed(mask_);
  SampledToken s = sampler_->sample(logits_.data(), masked ? mask_.data() : nullptr);
  if (filter_) filter_->accept(s.token);
  if (!logprobs_) s.logprob = std::numeric_limits<float>::quiet_NaN();
  pending_ = s.token;
  return s;
}

void Backend::host_launch() {
  LILY_CHECK(pending_ >= 0 && done_.size() < 2, name(), " backend: decode_launch() without a pending id, or a third");
  LILY_CHECK(position() + 1 <= max_context(), name(), " backend: ", position() + 1, " tokens exceed the context of ",
             max_context());
  forward(std::span<const int32_t>(&pending_, 1), logits_.data(), false);
  Done d;
  try {
    d.token = host_sample();
  } catch (const NanLogitsError&) {
    d.error = std::current_exception();
  }
  done_.push_back(std::move(d));
}

SampledToken Backend::host_wait() {
  LILY_CHECK(!done_.empty(), name(), " backend: decode_wait() without decode_launch()");
  Done d = std::move(done_.front());
  done_.pop_front();
  if (d.error) std::rethrow_exception(d.error);
  return d.token;
}

}  // namespace lily
