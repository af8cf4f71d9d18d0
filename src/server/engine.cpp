// The engine thread: queue, prefix reuse, chunked prefill with checkpoints, decode loop (see engine.h).
#include "server/engine.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "runtime/generate.h"
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
    : backend_(&backend), metrics_(metrics), opt_(options), cache_(options.cache_bytes) {
  max_context_ = backend_->max_context();
  start_over();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(Clock::now()); }

void Engine::submit(std::shared_ptr<GenJob> job) { submit_all({std::move(job)}); }

void Engine::submit_all(const std::vector<std::shared_ptr<GenJob>>& jobs) {
  if (jobs.empty()) return;
  std::lock_guard l(mu_);
  if (!accepting_.load() || stop_) {
    ApiError e(503, "unavailable_error", "shutting_down", "", "the server is shutting down");
    e.retry_after = 1;
    throw e;
  }
  // queue_size requests may wait behind the running one; while no request runs, the first in the queue is about
  // to start (the engine thread has not yet taken it), so it does not count as waiting
  // Batched: max_seqs jobs may run and queue_size wait, counting every job handed to the scheduler and not done
  // (its own running / waiting split is only known after its next step).
  const int running = batch_ ? 0 : running_ ? 1 : 0;
  const int waiting = static_cast<int>(queue_.size() + in_scheduler_.size());
  const int room = opt_.queue_size + std::max(0, max_seqs_ - running);
  if (waiting + static_cast<int>(jobs.size()) > room) {
    metrics_.request_rejected("queue_full");
    ApiError e(429, "rate_limit_error", "queue_full", "",
               "the server is busy: " + std::to_string(queue_.size()) + " requests are waiting; retry later");
    double wait = avg_job_s_ * double(waiting + 1) / max_seqs_;
    e.retry_after = std::max(1, static_cast<int>(std::ceil(wait)));
    throw e;
  }
  queue_.insert(queue_.end(), jobs.begin(), jobs.end());
  update_gauges();
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
      update_gauges();
    }
  }
  if (removed) finish(*removed, FinishReason::cancelled);
}

int Engine::estimated_wait_s() const {
  std::lock_guard l(mu_);
  const double waiting = double(queue_.size() + static_cast<size_t>(sched_waiting_) + 1);
  return std::max(1, static_cast<int>(std::ceil(avg_job_s_ * waiting / max_seqs_)));
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
      for (auto& j : in_scheduler_) j->cancel.store(true);
      cancelled = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  thread_.join();
}

void Engine::start_over() {
  if (!backend_) return;
  backend_->reset();
  resident_.clear();
}

void Engine::update_gauges() {
  if (batch_) {  // every job handed to the scheduler and not done runs or waits (the split: its last step's)
    const int held = static_cast<int>(in_scheduler_.size()), running = std::min(sched_running_, held);
    metrics_.set_queue(static_cast<int>(queue_.size()) + held - running, running);
  }
  else metrics_.set_queue(static_cast<int>(queue_.size()), running_ ? 1 : 0);
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
  if (lcp == r && r <= n - 1 && backend_->position() == r) return r;  // continue the live sequence
  if (const StateSnapshot* s = cache_.lookup(p, limit)) {
    backend_->restore_state(*s);
    resident_.resize(s->position);
    return s->position;
  }
  start_over();
  return 0;
}

void Engine::run(GenJob& job) {
  const auto start = Clock::now();
  job.queue_ms = std::chrono::duration<double, std::milli>(start - job.arrival).count();
  metrics_.observe_queue_wait(job.queue_ms / 1000.0);
  if (job.cancel.load()) return finish(job, FinishReason::cancelled);
  const int n = static_cast<int>(job.prompt.size());
  LILY_CHECK(n >= 1 && n < max_context_, "prompt of ", n, " tokens does not fit the context of ", max_context_);

  GenerateOptions g;
  g.max_tokens = std::min(job.max_tokens, max_context_ - n);  // the context's last KV slot stays free
  g.stop_ids = job.stop_ids;
  g.sampling.params = job.sampling;
  g.sampling.logprobs = job.logprobs;
  g.sampling.filter = job.filter.get();
  g.prefill_chunk = opt_.prefill_chunk;
  g.checkpoints = prompt_checkpoints(job.checkpoints, n, opt_.checkpoint_interval, backend_->prompt_grid());
  if (opt_.prefix_cache)
    g.on_checkpoint = [&](int pos) { cache_.insert(std::span(job.prompt.data(), static_cast<size_t>(pos)), backend_->save_state()); };
  g.on_prefilled = [&] {
    job.prompt_ms = ms_since(start);
    if (n > job.n_cached && job.prompt_ms > 0)
      metrics_.observe_prefill_rate(double(n - job.n_cached) / (job.prompt_ms / 1000.0));
  };
  g.interrupt = [&] {
    if (job.cancel.load()) return FinishReason::cancelled;
    if (Clock::now() > job.deadline) {
      log::warn("engine: request hit its time limit after ", job.n_generated, " tokens");
      return FinishReason::length;
    }
    return FinishReason::none;
  };
  Clock::time_point gen_start, last;
  g.on_token = [&](const SampledToken& t, int index, bool stop_id) {
    const auto now = Clock::now();
    if (index == 0) {
      gen_start = now;
      metrics_.observe_ttft(std::chrono::duration<double>(now - job.arrival).count());
    } else {
      metrics_.observe_inter_token(std::chrono::duration<double>(now - last).count());
    }
    last = now;
    if (stop_id) return FinishReason::none;  // not emitted; the loop ends on it
    job.n_generated++;
    return !job.on_token || job.on_token(t) ? FinishReason::none : FinishReason::stop;
  };

  job.n_cached = prepare_prefix(job);
  GenerateResult r;
  try {
    r = generate(*backend_, job.prompt, job.n_cached, g);
  } catch (...) {
    resident_.clear();  // the backend state is unknown: run() fails and start_over() follows
    throw;
  }
  // What the backend consumed: the prompt, then the generated ids whose steps ran (look-ahead steps included).
  std::vector<int32_t> seq = job.prompt;
  for (const SampledToken& t : r.tokens) seq.push_back(t.token);
  seq.resize(static_cast<size_t>(backend_->position()));
  resident_ = std::move(seq);
  if (!r.prefilled) {
    // Interrupted prefill: between pieces the resident tokens are exactly what was consumed, so they stay
    // reusable; inside a piece the state is partway through it.
    finish(job, r.finish);
    if (!r.state_valid) start_over();
    return;
  }
  job.gen_ms = ms_since(r.tokens.empty() ? start : gen_start);
  job.stopped_by_id = r.stopped_by_id;
  finish(job, r.finish);
  if (!r.state_valid) {
    log::warn("engine: a discarded look-ahead sample was NaN; the state is reset");
    start_over();
    return;
  }
  // After a stop id, put the state where the next turn of this conversation starts, then remember it.
  if (r.stopped_by_id && opt_.prefix_cache && !job.turn_tail.empty() && r.tokens.back().token == job.turn_tail.front()) {
    const bool consumed = backend_->position() == n + static_cast<int>(r.tokens.size());  // the stop id's step ran
    const std::span<const int32_t> tail(job.turn_tail.data() + (consumed ? 1 : 0),
                                        job.turn_tail.size() - (consumed ? 1 : 0));
    if (backend_->position() + static_cast<int>(tail.size()) < max_context_) {
      if (!tail.empty()) backend_->forward(tail, nullptr, false);
      resident_.insert(resident_.end(), tail.begin(), tail.end());
      cache_.insert(resident_, backend_->save_state());
    }
  }
}

}  // namespace lily::server
