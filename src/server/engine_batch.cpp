// The engine over a BatchBackend: jobs become scheduler sequences (runtime/scheduler.h); the engine thread moves
// submitted jobs into the scheduler and steps it while anything runs or waits (see engine.h).
#include <algorithm>
#include <cmath>

#include "server/engine.h"
#include "util/check.h"
#include "util/log.h"

namespace lily::server {
namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

Engine::Engine(BatchBackend& backend, Metrics& metrics, EngineOptions options)
    : batch_(&backend), metrics_(metrics), opt_(options), cache_(0) {
  max_context_ = batch_->max_context();
  max_seqs_ = batch_->max_seqs();
  LILY_CHECK(opt_.kv_tokens <= 0 || opt_.kv_tokens >= max_context_, "--kv-tokens ", opt_.kv_tokens,
             " is below the context of ", max_context_, " tokens: a request of the full context could never run");
  SchedulerOptions so;
  so.prefill_chunk = std::max(1, opt_.prefill_chunk);
  so.max_step_tokens = so.prefill_chunk;
  so.decode_step_tokens = opt_.decode_step_tokens;
  // The KV budget: --kv-tokens, else what the backend's memory holds (when that is less than every slot's context).
  int64_t kv_tokens = opt_.kv_tokens;
  const int64_t fits = batch_->kv_capacity_tokens();
  if (kv_tokens <= 0 && fits > 0 && fits < int64_t{max_seqs_} * max_context_) {
    kv_tokens = std::max<int64_t>(fits, max_context_);
    log::info("engine: KV budget ", kv_tokens, " tokens (what free device memory holds; --kv-tokens sets it)");
  }
  so.kv_pages = kv_tokens > 0 ? PageTable::pages_for(static_cast<int>(std::min<int64_t>(kv_tokens, 1 << 30)),
                                                     so.kv_page_tokens)
                              : 0;
  so.prefix_cache = opt_.prefix_cache;
  so.cache_bytes = opt_.cache_bytes;
  so.checkpoint_interval = opt_.checkpoint_interval;
  sched_ = std::make_unique<Scheduler>(*batch_, so);
  sched_->on_step = [this](int seqs, int) { metrics_.observe_batch(seqs); };
  thread_ = std::thread([this] { loop_batched(); });
}

// The job's callbacks as the scheduler calls them: timings, metrics, the job's own on_token and on_done.
SeqSpec Engine::spec_for(const std::shared_ptr<GenJob>& job) {
  struct Times {
    Clock::time_point admitted, first, last;
  };
  auto times = std::make_shared<Times>();
  const int n = static_cast<int>(job->prompt.size());
  SeqSpec s;
  s.prompt = job->prompt;
  s.max_tokens = std::max(1, std::min(job->max_tokens, max_context_ - n));  // the context's last slot stays free
  s.stop_ids = job->stop_ids;
  s.sampling.params = job->sampling;
  s.sampling.logprobs = job->logprobs;
  s.sampling.filter = job->filter.get();
  s.checkpoints = job->checkpoints;
  s.turn_tail = job->turn_tail;
  GenJob* j = job.get();
  s.interrupt = [j] {
    if (j->cancel.load()) return FinishReason::cancelled;
    if (Clock::now() > j->deadline) {
      log::warn("engine: request hit its time limit after ", j->n_generated, " tokens");
      return FinishReason::length;
    }
    return FinishReason::none;
  };
  s.on_admitted = [this, j, times](int n_cached) {
    times->admitted = Clock::now();
    j->n_cached = n_cached;
    j->queue_ms = ms_between(j->arrival, times->admitted);
    metrics_.observe_queue_wait(j->queue_ms / 1000.0);
    std::lock_guard l(mu_);  // running from now (the step's end sets the exact split again)
    sched_running_++;
    sched_waiting_ = std::max(0, sched_waiting_ - 1);
    update_gauges();
  };
  s.on_prefilled = [this, j, times, n] {
    j->prompt_ms = ms_between(times->admitted, Clock::now());
    if (n > j->n_cached && j->prompt_ms > 0)
      metrics_.observe_prefill_rate(double(n - j->n_cached) / (j->prompt_ms / 1000.0));
  };
  s.on_token = [this, j, times](const SampledToken& t, int index, bool stop_id) {
    const auto now = Clock::now();
    if (index == 0) {
      times->first = now;
      metrics_.observe_ttft(std::chrono::duration<double>(now - j->arrival).count());
    } else {
      metrics_.observe_inter_token(std::chrono::duration<double>(now - times->last).count());
    }
    times->last = now;
    if (stop_id) return FinishReason::none;  // not emitted; the sequence ends on it
    j->n_generated++;
    return !j->on_token || j->on_token(t) ? FinishReason::none : FinishReason::stop;
  };
  s.on_done = [this, job, times](const SeqResult& r) {
    job->stopped_by_id = r.stopped_by_id;
    if (r.finish == FinishReason::error) {
      job->error = r.error;
      job->error_code = r.nan_logits ? "nan_logits" : "internal_error";
      log::error("engine: request failed: ", r.error);
    }
    if (r.n_generated > 0) job->gen_ms = ms_between(times->first, Clock::now());
    finish(*job, r.finish);
    std::lock_guard l(mu_);
    std::erase(in_scheduler_, job);
    update_gauges();
    if (r.n_generated > 0)  // for Retry-After: how long a job holds its slot
      avg_job_s_ = 0.8 * avg_job_s_ + 0.2 * std::chrono::duration<double>(Clock::now() - times->admitted).count();
  };
  return s;
}

void Engine::loop_batched() {
  for (;;) {
    std::deque<std::shared_ptr<GenJob>> arrived;
    {
      std::unique_lock l(mu_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty() || !sched_->idle(); });
      if (stop_ && queue_.empty() && sched_->idle()) break;
      arrived.swap(queue_);
      in_scheduler_.insert(in_scheduler_.end(), arrived.begin(), arrived.end());
    }
    for (auto& job : arrived) {
      if (job->cancel.load()) {
        std::lock_guard l(mu_);
        std::erase(in_scheduler_, job);
        update_gauges();
      } else {
        try {
          sched_->add(spec_for(job));
          continue;
        } catch (const std::exception& e) {
          job->error = e.what();
          job->error_code = "internal_error";
          {
            std::lock_guard l(mu_);
            std::erase(in_scheduler_, job);
            update_gauges();
          }
          finish(*job, FinishReason::error);
          continue;
        }
      }
      finish(*job, FinishReason::cancelled);
    }
    try {
      sched_->step();
    } catch (const std::exception& e) {  // outside a forward pass (a restore, a copy): the slots are unknown
      log::error("engine: scheduler step failed: ", e.what());
      sched_->abort_all(FinishReason::error, e.what());
    }
    const SchedulerStats st = sched_->stats();
    {
      std::lock_guard l(mu_);
      sched_running_ = st.running;
      sched_waiting_ = st.waiting;
      update_gauges();
    }
    metrics_.set_pools(st.kv_pages_used, st.kv_pages_total, st.kv_page_tokens, st.slots_used, st.slots_total,
                       st.preemptions);
    metrics_.set_kv_tokens(static_cast<int64_t>(st.kv_pages_used) * st.kv_page_tokens);
    metrics_.set_checkpoints(static_cast<int64_t>(st.cache_entries), static_cast<int64_t>(st.cache_bytes));
  }
  exited_.store(true);
}

}  // namespace lily::server
