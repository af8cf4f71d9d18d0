// The engine thread: queue, prefix reuse, chunked prefill with checkpoints, decode loop (see engine.h).
#include "server/engine.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "runtime/sampler.h"
#include "server/api_error.h"
#include "util/check.h"
#include "util/log.h"

namespace lily::server {
namespace {

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

}  // namespace

Engine::Engine(Backend& backend, Metrics& metrics, EngineOptions options)
    : backend_(backend), metrics_(metrics), opt_(options), cache_(options.cache_bytes) {
  max_context_ = backend_.max_context();
  vocab_ = backend_.config().vocab;
  start_over();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(Clock::now()); }

void Engine::submit(std::shared_ptr<GenJob> job) {
  std::lock_guard l(mu_);
  if (!accepting_.load() || stop_) {
    ApiError e(503, "unavailable_error", "shutting_down", "", "the server is shutting down");
    e.retry_after = 1;
    throw e;
  }
  // queue_size requests may wait behind the running one; while no request runs, the first in the queue is about
  // to start (the engine thread has not yet taken it), so it does not count as waiting: 32 clients arriving at an
  // idle server at once got 16 completions instead of 17 when they all queued before the thread woke up
  const int room = opt_.queue_size + (running_ ? 0 : 1);
  if (static_cast<int>(queue_.size()) >= room) {
    metrics_.request_rejected("queue_full");
    ApiError e(429, "rate_limit_error", "queue_full", "",
               "the server is busy: " + std::to_string(queue_.size()) + " requests are waiting; retry later");
    double wait = avg_job_s_ * double(queue_.size() + 1);
    e.retry_after = std::max(1, static_cast<int>(std::ceil(wait)));
    throw e;
  }
  queue_.push_back(std::move(job));
  metrics_.set_queue(static_cast<int>(queue_.size()), running_ ? 1 : 0);
  cv_.notify_all();
}

void Engine::cancel(const std::shared_ptr<GenJob>& job) {
  job->cancel.store(true);
  std::shared_ptr<GenJob> removed;
  {
    std::lock_guard l(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it != queue_.end()) {
      removed = *it;
      queue_.erase(it);
      metrics_.set_queue(static_cast<int>(queue_.size()), running_ ? 1 : 0);
    }
  }
  if (removed) finish(*removed, FinishReason::cancelled);
}

int Engine::estimated_wait_s() const {
  std::lock_guard l(mu_);
  return std::max(1, static_cast<int>(std::ceil(avg_job_s_ * double(queue_.size() + 1))));
}

void Engine::shutdown(Clock::time_point drain_deadline) {
  if (!thread_.joinable()) return;
  {
    std::lock_guard l(mu_);
    accepting_.store(false);
    stop_ = true;
    cv_.notify_all();
  }
  bool cancelled = false;
  while (!exited_.load()) {
    if (!cancelled && Clock::now() >= drain_deadline) {
      std::lock_guard l(mu_);
      for (auto& j : queue_) j->cancel.store(true);
      if (running_) running_->cancel.store(true);
      cancelled = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  thread_.join();
}

void Engine::start_over() {
  backend_.reset();
  resident_.clear();
}

void Engine::update_gauges() {
  metrics_.set_queue(static_cast<int>(queue_.size()), running_ ? 1 : 0);
}

void Engine::loop() {
  for (;;) {
    std::shared_ptr<GenJob> job;
    {
      std::unique_lock l(mu_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) break;  // stop_ and nothing left
      job = queue_.front();
      queue_.pop_front();
      running_ = job;
      update_gauges();
    }
    auto t0 = Clock::now();
    try {
      run(*job);
    } catch (const std::exception& e) {
      log::error("engine: request failed: ", e.what());
      job->error = e.what();
      job->error_code = dynamic_cast<const NanLogitsError*>(&e) ? "nan_logits" : "internal_error";
      start_over();  // the backend state is unknown after a failure: the next request starts from scratch
      finish(*job, FinishReason::error);
    }
    double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    {
      std::lock_guard l(mu_);
      running_.reset();
      avg_job_s_ = 0.8 * avg_job_s_ + 0.2 * dt;
      update_gauges();
    }
    metrics_.set_kv_tokens(static_cast<int64_t>(resident_.size()));
    metrics_.set_checkpoints(static_cast<int64_t>(cache_.count()), static_cast<int64_t>(cache_.bytes()));
  }
  exited_.store(true);
}

void Engine::finish(GenJob& job, FinishReason reason) {
  job.finish = reason;
  if (job.on_done) job.on_done();
}

// Chooses where prefill starts: the live state when the prompt extends the resident tokens, else the newest
// snapshot inside the prefix shared with the resident KV, else position 0. Returns the restored length.
int Engine::prepare_prefix(GenJob& job) {
  const auto& p = job.prompt;
  const int n = static_cast<int>(p.size());
  if (!opt_.prefix_cache) {
    start_over();
    return 0;
  }
  int lcp = 0;
  const int r = static_cast<int>(resident_.size());
  while (lcp < r && lcp < n && resident_[lcp] == p[lcp]) ++lcp;
  const int limit = std::min(lcp, n - 1);  // recompute at least one token for its logits
  if (lcp == r && r <= n - 1 && backend_.position() == r) return r;  // continue the live sequence
  if (const StateSnapshot* s = cache_.lookup(p, limit)) {
    backend_.restore_state(*s);
    resident_.resize(s->position);
    return s->position;
  }
  start_over();
  return 0;
}

// Prefill prompt[from, n) in chunks that end at checkpoint positions; leaves the last position's logits in
// `logits` (null: on the backend, for device sampling).
bool Engine::prefill(GenJob& job, int from, float* logits) {
  const auto& p = job.prompt;
  const int n = static_cast<int>(p.size());
  std::vector<int> cuts;
  for (int c : job.checkpoints)
    if (c > from && c < n) cuts.push_back(c);
  if (opt_.checkpoint_interval > 0)
    for (int c = (from / opt_.checkpoint_interval + 1) * opt_.checkpoint_interval; c < n; c += opt_.checkpoint_interval)
      cuts.push_back(c);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  int pos = from;
  size_t next_cut = 0;
  while (pos < n) {
    if (job.cancel.load() || Clock::now() > job.deadline) return false;
    int end = std::min(n, pos + opt_.prefill_chunk);
    bool at_cut = next_cut < cuts.size() && cuts[next_cut] <= end;
    if (at_cut) end = cuts[next_cut++];
    std::span<const int32_t> chunk(p.data() + pos, static_cast<size_t>(end - pos));
    backend_.forward(chunk, end == n ? logits : nullptr, false);
    resident_.insert(resident_.end(), chunk.begin(), chunk.end());
    pos = end;
    if (at_cut && opt_.prefix_cache) cache_.insert(std::span(p.data(), static_cast<size_t>(pos)), backend_.save_state());
  }
  return true;
}

void Engine::run(GenJob& job) {
  const auto start = Clock::now();
  job.queue_ms = std::chrono::duration<double, std::milli>(start - job.arrival).count();
  metrics_.observe_queue_wait(job.queue_ms / 1000.0);
  if (job.cancel.load()) return finish(job, FinishReason::cancelled);
  const int n = static_cast<int>(job.prompt.size());
  LILY_CHECK(n >= 1 && n < max_context_, "prompt of ", n, " tokens does not fit the context of ", max_context_);

  Sampler sampler(job.sampling, vocab_);  // also validates the parameters on the device path
  sampler.add_prompt(job.prompt);
  // sampling next to the logits where the backend can (no logits copy per token); host sampling otherwise
  const bool dev = backend_.begin_device_sampling(job.sampling, job.prompt, job.logprobs);
  std::vector<float> logits(dev ? 0 : static_cast<size_t>(vocab_));
  job.n_cached = prepare_prefix(job);
  if (!prefill(job, job.n_cached, dev ? nullptr : logits.data())) {
    // Interrupted prefill: the resident tokens are exactly what was consumed, so they stay reusable.
    return finish(job, job.cancel.load() ? FinishReason::cancelled : FinishReason::length);
  }
  job.prompt_ms = ms_since(start);
  if (n > job.n_cached && job.prompt_ms > 0)
    metrics_.observe_prefill_rate(double(n - job.n_cached) / (job.prompt_ms / 1000.0));

  TokenEvent pending = dev ? backend_.sample_device() : TokenEvent{};  // device path: sampled, not consumed
  const auto gen_start = Clock::now();
  auto last = gen_start;
  FinishReason reason = FinishReason::length;
  // Device path: the step of id i + 1 is queued behind the step of id i once on_token has taken id i, before
  // this thread has seen id i + 1, so the device never waits for its turnaround. The step of a stop id (or of
  // the id a request ends at) has then run too: resident_ records every id a step consumed.
  const auto room = [&] { return backend_.position() + 1 < max_context_; };
  bool queued = dev && job.max_tokens > 1 && room();  // the step of the pending id is queued
  if (queued) backend_.decode_device_launch();
  // A look-ahead sample that is thrown away may be NaN (the step after the last token kept): the request still
  // ends as it would have, but the state after that step is not finite, so it is neither kept nor cached.
  bool poisoned = false;
  const auto wait_discard = [&] {
    try {
      backend_.decode_device_wait();
    } catch (const NanLogitsError& e) {
      log::warn("engine: a discarded look-ahead sample was NaN (", e.what(), "); the state is reset");
      poisoned = true;
    }
  };
  const auto forget_if_poisoned = [&] {
    if (poisoned) start_over();
  };
  const auto drain = [&](int32_t t) {  // the queued step consumed t; its sample is not used
    if (!queued) return;
    wait_discard();
    if (!poisoned) resident_.push_back(t);
    queued = false;
  };
  for (;;) {
    if (job.cancel.load()) { reason = FinishReason::cancelled; drain(pending.token); break; }
    if (Clock::now() > job.deadline) {
      log::warn("engine: request hit its time limit after ", job.n_generated, " tokens");
      reason = FinishReason::length;
      drain(pending.token);
      break;
    }
    const TokenEvent ev = dev ? pending : sampler.sample(logits.data());
    const auto now = Clock::now();
    if (job.n_generated == 0) metrics_.observe_ttft(std::chrono::duration<double>(now - job.arrival).count());
    else metrics_.observe_inter_token(std::chrono::duration<double>(now - last).count());
    last = now;
    if (std::find(job.stop_ids.begin(), job.stop_ids.end(), ev.token) != job.stop_ids.end()) {
      reason = FinishReason::stop;
      job.stopped_by_id = true;
      const bool consumed = queued;  // the stop id's step ran ahead
      drain(ev.token);
      job.gen_ms = ms_since(gen_start);
      finish(job, reason);
      forget_if_poisoned();
      // Put the state where the next turn of this conversation starts, then remember it.
      if (opt_.prefix_cache && !poisoned && !job.turn_tail.empty() && ev.token == job.turn_tail.front() &&
          backend_.position() + static_cast<int>(job.turn_tail.size()) < max_context_) {
        const std::span<const int32_t> tail(job.turn_tail.data() + (consumed ? 1 : 0),
                                            job.turn_tail.size() - (consumed ? 1 : 0));
        if (!tail.empty()) backend_.forward(tail, nullptr, false);
        resident_.insert(resident_.end(), tail.begin(), tail.end());
        cache_.insert(resident_, backend_.save_state());
      }
      return;
    }
    job.n_generated++;
    const int32_t t = ev.token;
    const bool keep = !job.on_token || job.on_token(ev);
    if (dev) {
      const bool stepped = queued;  // t's step ran: there is a next id
      queued = stepped && keep && job.n_generated + 1 < job.max_tokens && room();
      if (queued) backend_.decode_device_launch();  // the next id's step
      if (stepped) {
        if (keep) pending = backend_.decode_device_wait();  // used next: a NaN fails the request
        else wait_discard();
        if (!poisoned) resident_.push_back(t);
      }
      if (!keep) { reason = FinishReason::stop; break; }
      if (!stepped) { reason = FinishReason::length; break; }
      continue;
    }
    const bool at_end = job.n_generated >= job.max_tokens || !room();
    if (!keep) { reason = FinishReason::stop; break; }
    if (at_end) { reason = FinishReason::length; break; }
    backend_.forward(std::span(&t, 1), logits.data(), false);
    resident_.push_back(t);
  }
  job.gen_ms = ms_since(gen_start);
  finish(job, reason);
  forget_if_poisoned();
}

}  // namespace lily::server
