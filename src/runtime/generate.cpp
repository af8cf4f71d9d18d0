// generate(): prefill in pieces, then sample → report → queue the next step (see generate.h).
#include "runtime/generate.h"

#include <algorithm>

#include "util/check.h"

namespace lily {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "?";
}

std::vector<int32_t> GenerateResult::ids() const {
  std::vector<int32_t> v;
  v.reserve(tokens.size());
  for (const SampledToken& t : tokens) v.push_back(t.token);
  return v;
}

namespace {

// Consumes prompt[from, n) in pieces of at most `chunk` tokens that end at the checkpoints. False when
// interrupted (res.finish says why).
bool prefill(Backend& be, std::span<const int32_t> prompt, int from, const GenerateOptions& opt, GenerateResult& res) {
  const int n = static_cast<int>(prompt.size());
  std::vector<int> cuts;
  for (int c : opt.checkpoints)
    if (c > from && c < n) cuts.push_back(c);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  const int V = be.config().vocab;
  FinishReason why = FinishReason::none;  // what the last stop() saw
  const std::function<bool()> stop = [&] {
    why = opt.interrupt ? opt.interrupt() : FinishReason::none;
    return why != FinishReason::none;
  };
  size_t next_cut = 0;
  for (int pos = from; pos < n;) {
    if (stop()) {  // between pieces: the state is the consumed tokens'
      res.finish = why;
      return false;
    }
    int end = opt.prefill_chunk > 0 ? std::min(n, pos + opt.prefill_chunk) : n;
    const bool at_cut = next_cut < cuts.size() && cuts[next_cut] <= end;
    if (at_cut) end = cuts[next_cut++];
    const std::span<const int32_t> piece = prompt.subspan(pos, end - pos);
    if (opt.prompt_logits) be.forward(piece, opt.prompt_logits + static_cast<size_t>(pos - from) * V, true);
    else if (!be.prefill_stoppable(piece, end == n, stop)) {
      res.finish = why;
      res.state_valid = false;  // stopped inside the piece
      return false;
    }
    pos = end;
    if (at_cut && opt.on_checkpoint) opt.on_checkpoint(pos);
  }
  return true;
}

}  // namespace

GenerateResult generate(Backend& be, std::span<const int32_t> prompt, int from, const GenerateOptions& opt) {
  const int n = static_cast<int>(prompt.size());
  LILY_CHECK(opt.max_tokens >= 0 && (opt.max_tokens == 0 || !opt.prompt_logits),
             "generate: prompt_logits is for max_tokens 0 (scoring)");
  LILY_CHECK(from >= 0 && (from < n || (from == n && opt.max_tokens == 0)),
             "generate: nothing to consume: the prompt has ", n, " tokens, ", from, " of them consumed");
  LILY_CHECK(be.position() == from, "generate: the backend is at position ", be.position(), ", not ", from);
  GenerateResult res;
  res.prompt_tokens = n;
  if (opt.max_tokens > 0) be.begin_sampling(opt.sampling, prompt);
  if (!prefill(be, prompt, from, opt, res)) return res;
  res.prefilled = true;
  if (opt.on_prefilled) opt.on_prefilled();
  if (opt.max_tokens == 0) {
    res.finish = FinishReason::length;
    return res;
  }

  SampledToken pending = be.sample();  // from the prompt's last logits; not consumed yet
  const auto room = [&] { return be.position() < be.max_context(); };
  bool queued = opt.max_tokens > 1 && room();  // the step consuming `pending` is queued
  if (queued) be.decode_launch();
  // A look-ahead sample that is thrown away may be NaN (the step after the last id kept): the generation still
  // ends as it would have, but the state after that step is not finite.
  const auto drain = [&] {
    if (!queued) return;
    queued = false;
    try {
      be.decode_wait();
    } catch (const NanLogitsError&) {
      res.state_valid = false;
    }
  };
  for (int i = 0;; ++i) {
    if (opt.interrupt)
      if (const FinishReason r = opt.interrupt(); r != FinishReason::none) {
        res.finish = r;
        drain();
        break;
      }
    res.tokens.push_back(pending);
    const int32_t t = pending.token;
    const bool stop = std::find(opt.stop_ids.begin(), opt.stop_ids.end(), t) != opt.stop_ids.end();
    const FinishReason ended = opt.on_token ? opt.on_token(res.tokens.back(), i, stop) : FinishReason::none;
    if (stop || ended != FinishReason::none) {
      res.finish = stop ? FinishReason::stop : ended;
      res.stopped_by_id = stop;
      drain();
      break;
    }
    const bool stepped = queued;  // t's step ran: there is a next id
    queued = stepped && i + 2 < opt.max_tokens && room();
    if (queued) be.decode_launch();  // the step of the id after the next
    if (!stepped) {
      res.finish = FinishReason::length;
      break;
    }
    pending = be.decode_wait();  // reported next: a NaN fails the generation
  }
  return res;
}

}  // namespace lily
