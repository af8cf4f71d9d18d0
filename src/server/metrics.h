// Server metrics in the Prometheus text exposition format (docs/api.md §8, `lily_` prefix): request counters by
// status, token counters, running/queued gauges, capacity gauges (free sequence slots, queue room),
// prefix-cache pool gauges, and latency histograms.
// All members are updated from the HTTP threads and the engine thread; one mutex guards everything.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace lily::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Appends the `_bucket`, `_sum` and `_count` series for `name`.
  void render(std::string& out, const std::string& name, const std::string& help) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;    // upper bounds, ascending
  std::vector<uint64_t> counts_;  // [bounds + 1] non-cumulative; last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();

  // requests_total{endpoint, status}; endpoint: chat, completions, responses, messages.
  void request_done(int status, const std::string& endpoint = "chat");
  void add_tool_call_parse_failures(int64_t n);         // tool_call_parse_failures_total
  void request_rejected(const std::string& reason);     // requests_rejected_total{reason}
  void client_disconnect();
  void add_prompt_tokens(int64_t n, int64_t cached);
  void add_generated_tokens(int64_t n, int64_t reasoning);
  void observe_ttft(double s);
  void observe_inter_token(double s);
  void observe_e2e(double s);
  void observe_queue_wait(double s);
  void observe_prefill_rate(double tokens_per_s);
  void set_queue(int queued, int running);
  void set_kv_tokens(int64_t n);
  void set_checkpoints(int64_t count, int64_t bytes);
  // Capacity, for least-load routing by a balancer: sequences the engine runs at once, waiting requests before 429.
  void set_capacity(int sequence_slots, int queue_capacity);
  // The scheduler's pools (continuous batching): KV pages and recurrent-state slots in use, preemptions so far.
  void set_pools(int kv_pages_used, int kv_pages_total, int kv_page_tokens, int slots_used, int slots_total,
                 int64_t preemptions);
  void observe_batch(int sequences);                    // sequences in one forward step

  int running() const;
  int queued() const;
  uint64_t disconnects() const;
  std::string render() const;   // text/plain; version=0.0.4

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // (endpoint, status) -> count
  uint64_t tool_call_parse_failures_ = 0;
  std::map<std::string, uint64_t> rejected_;     // reason -> count
  uint64_t disconnects_ = 0;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0, generated_tokens_ = 0, reasoning_tokens_ = 0;
  int running_ = 0, queued_ = 0;
  int sequence_slots_ = 1, queue_capacity_ = 0;  // set_capacity
  int64_t kv_tokens_ = 0, checkpoints_ = 0, checkpoint_bytes_ = 0;
  int kv_pages_used_ = 0, kv_pages_total_ = 0, kv_page_tokens_ = 0, slots_used_ = 0, slots_total_ = 0;
  int64_t preemptions_ = 0;
  bool pools_ = false;                          // set_pools was called (the scheduler runs)
  Histogram ttft_, inter_token_, e2e_, queue_wait_, prefill_rate_, batch_size_;
};

}  // namespace lily::server
