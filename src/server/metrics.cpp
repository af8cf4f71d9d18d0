// Prometheus text rendering of the server metrics (see metrics.h).
#include "server/metrics.h"

#include <algorithm>
#include <cstdio>

namespace lily::server {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void series(std::string& out, const std::string& name, const std::string& type, const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void scalar(std::string& out, const std::string& name, const std::string& type, const std::string& help,
            double v) {
  series(out, name, type, help);
  out += name + " " + num(v) + "\n";
}

std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

}  // namespace

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  counts_[i]++;
  sum_ += v;
  count_++;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  series(out, name, "histogram", help);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  out += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft_(latency_bounds()), inter_token_(latency_bounds()), e2e_(latency_bounds()), queue_wait_(latency_bounds()),
      prefill_rate_({10, 50, 100, 500, 1000, 2000, 5000, 10000, 20000, 50000}),
      batch_size_({1, 2, 4, 8, 16, 32, 64, 128}) {}

void Metrics::request_done(int status, const std::string& endpoint) {
  std::lock_guard l(mu_);
  requests_[{endpoint, status}]++;
}
void Metrics::add_tool_call_parse_failures(int64_t n) { std::lock_guard l(mu_); tool_call_parse_failures_ += n; }
void Metrics::request_rejected(const std::string& reason) { std::lock_guard l(mu_); rejected_[reason]++; }
void Metrics::client_disconnect() { std::lock_guard l(mu_); disconnects_++; }
void Metrics::add_prompt_tokens(int64_t n, int64_t cached) {
  std::lock_guard l(mu_);
  prompt_tokens_ += n;
  cached_tokens_ += cached;
}
void Metrics::add_generated_tokens(int64_t n, int64_t reasoning) {
  std::lock_guard l(mu_);
  generated_tokens_ += n;
  reasoning_tokens_ += reasoning;
}
void Metrics::observe_ttft(double s) { std::lock_guard l(mu_); ttft_.observe(s); }
void Metrics::observe_inter_token(double s) { std::lock_guard l(mu_); inter_token_.observe(s); }
void Metrics::observe_e2e(double s) { std::lock_guard l(mu_); e2e_.observe(s); }
void Metrics::observe_queue_wait(double s) { std::lock_guard l(mu_); queue_wait_.observe(s); }
void Metrics::observe_prefill_rate(double r) { std::lock_guard l(mu_); prefill_rate_.observe(r); }
void Metrics::set_queue(int queued, int running) {
  std::lock_guard l(mu_);
  queued_ = queued;
  running_ = running;
}
void Metrics::set_kv_tokens(int64_t n) { std::lock_guard l(mu_); kv_tokens_ = n; }
void Metrics::set_checkpoints(int64_t count, int64_t bytes) {
  std::lock_guard l(mu_);
  checkpoints_ = count;
  checkpoint_bytes_ = bytes;
}
void Metrics::set_capacity(int sequence_slots, int queue_capacity) {
  std::lock_guard l(mu_);
  sequence_slots_ = sequence_slots;
  queue_capacity_ = queue_capacity;
}
void Metrics::set_pools(int kv_pages_used, int kv_pages_total, int kv_page_tokens, int slots_used, int slots_total,
                        int64_t preemptions) {
  std::lock_guard l(mu_);
  pools_ = true;
  kv_pages_used_ = kv_pages_used;
  kv_pages_total_ = kv_pages_total;
  kv_page_tokens_ = kv_page_tokens;
  slots_used_ = slots_used;
  slots_total_ = slots_total;
  preemptions_ = preemptions;
}
void Metrics::observe_batch(int sequences) { std::lock_guard l(mu_); batch_size_.observe(sequences); }
int Metrics::running() const { std::lock_guard l(mu_); return running_; }
int Metrics::queued() const { std::lock_guard l(mu_); return queued_; }
uint64_t Metrics::disconnects() const { std::lock_guard l(mu_); return disconnects_; }

std::string Metrics::render() const {
  std::lock_guard l(mu_);
  std::string out;
  series(out, "lily_requests_total", "counter", "Finished HTTP requests on the generation endpoints by endpoint and status.");
  for (auto& [key, n] : requests_)
    out += "lily_requests_total{endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"} " +
           std::to_string(n) + "\n";
  series(out, "lily_requests_rejected_total", "counter", "Requests rejected before generation, by reason.");
  for (auto& [reason, n] : rejected_)
    out += "lily_requests_rejected_total{reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
  scalar(out, "lily_client_disconnects_total", "counter", "Requests cancelled because the client went away.",
         double(disconnects_));
  scalar(out, "lily_tool_call_parse_failures_total", "counter",
         "Generated <tool_call> blocks that did not parse (returned as content).", double(tool_call_parse_failures_));
  scalar(out, "lily_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", double(prompt_tokens_));
  scalar(out, "lily_prompt_tokens_cached_total", "counter", "Prompt tokens served from the prefix cache.",
         double(cached_tokens_));
  scalar(out, "lily_generation_tokens_total", "counter", "Generated tokens.", double(generated_tokens_));
  scalar(out, "lily_reasoning_tokens_total", "counter", "Generated tokens in the reasoning state.",
         double(reasoning_tokens_));
  scalar(out, "lily_requests_running", "gauge", "Requests the engine is working on (holding a sequence slot).",
         running_);
  scalar(out, "lily_requests_queued", "gauge", "Requests waiting for the engine.", queued_);
  // Free capacity for a balancer's least-load choice: a replica with a free slot starts a request at once; one
  // with no queue room left answers 429.
  scalar(out, "lily_sequence_slots", "gauge", "Sequences the engine runs at once.", sequence_slots_);
  scalar(out, "lily_sequence_slots_free", "gauge", "Sequence slots not running a request (slots - running).",
         std::max(0, sequence_slots_ - running_));
  scalar(out, "lily_queue_capacity", "gauge", "Requests that may wait for the engine before 429 queue_full.",
         queue_capacity_);
  scalar(out, "lily_queue_free", "gauge", "Queue places left before 429 queue_full (capacity - queued).",
         std::max(0, queue_capacity_ - queued_));
  scalar(out, "lily_kv_cache_tokens", "gauge", "Tokens held in the KV cache.", double(kv_tokens_));
  scalar(out, "lily_state_checkpoints", "gauge", "Recurrent-state checkpoints in the prefix cache.",
         double(checkpoints_));
  scalar(out, "lily_state_checkpoint_bytes", "gauge", "Host bytes held by prefix-cache checkpoints.",
         double(checkpoint_bytes_));
  if (pools_) {
    scalar(out, "lily_kv_pages_used", "gauge", "KV-cache pages held (running sequences and cached prefixes).",
           kv_pages_used_);
    scalar(out, "lily_kv_pages_total", "gauge", "KV-cache pages in the pool.", kv_pages_total_);
    scalar(out, "lily_kv_page_tokens", "gauge", "Tokens per KV-cache page.", kv_page_tokens_);
    scalar(out, "lily_state_slots_used", "gauge", "Recurrent-state slots held by running sequences.", slots_used_);
    scalar(out, "lily_state_slots_total", "gauge", "Recurrent-state slots (--max-seqs).", slots_total_);
    scalar(out, "lily_preemptions_total", "counter",
           "Running sequences dropped for KV pages and recomputed later.", double(preemptions_));
    batch_size_.render(out, "lily_batch_size", "Sequences in one forward step.");
  }
  ttft_.render(out, "lily_time_to_first_token_seconds", "From arrival to the first generated token.");
  inter_token_.render(out, "lily_inter_token_latency_seconds", "Time between consecutive generated tokens.");
  e2e_.render(out, "lily_e2e_request_latency_seconds", "From arrival to the end of generation.");
  queue_wait_.render(out, "lily_queue_wait_seconds", "Time spent waiting for the engine.");
  prefill_rate_.render(out, "lily_prefill_tokens_per_second", "Prompt tokens processed per second of prefill.");
  return out;
}

}  // namespace lily::server
