// The concurrency benchmark (see bench_concurrency.h).
#include "runtime/bench_concurrency.h"

#include <algorithm>
#include <chrono>

#include "runtime/scheduler.h"

namespace lily {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times the backend's passes (step_begin to step_end; the scheduler reports the previous ids in between): the
// forward's share of a scheduler step.
class TimedBackend : public ForwardingBatchBackend {
 public:
  using ForwardingBatchBackend::ForwardingBatchBackend;
  void step_begin(std::span<const BatchEntry> batch) override {
    t0_ = Clock::now();
    inner_.step_begin(batch);
    begin_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0_).count());
  }
  void step_end() override {
    inner_.step_end();
    forward_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0_).count());
  }
  std::vector<double> forward_ms, begin_ms;

 private:
  Clock::time_point t0_;
};

}  // namespace

std::vector<ConcurrencyPoint> run_concurrency_bench(BatchBackend& be, const ConcurrencyBenchOptions& opt) {
  std::vector<ConcurrencyPoint> out;
  const int V = be.config().vocab;
  for (int c : opt.concurrency) {
    if (c < 1 || c > be.max_seqs()) continue;
    SchedulerOptions so;
    so.prefix_cache = false;  // distinct prompts; nothing to reuse
    TimedBackend timed(be);
    Scheduler sch(timed, so);
    struct Stream {
      Clock::time_point first, last;
      int ids = 0;
    };
    std::vector<Stream> streams(static_cast<size_t>(c));
    int steps = 0, seqs = 0;
    sch.on_step = [&](int n, int) {
      ++steps;
      seqs += n;
    };
    const auto t0 = Clock::now();
    for (int i = 0; i < c; ++i) {
      SeqSpec s;
      for (int t = 0; t < opt.prompt_tokens; ++t) s.prompt.push_back(static_cast<int32_t>((1009 * (i + 1) + 31 * t) % V));
      s.max_tokens = opt.gen_tokens;
      s.sampling.params.temperature = 0.7f;  // the chat defaults without thinking (model card)
      s.sampling.params.top_p = 0.8f;
      s.sampling.params.top_k = 20;
      s.sampling.params.presence_penalty = 1.5f;
      s.sampling.params.seed = static_cast<uint64_t>(i);
      Stream* st = &streams[static_cast<size_t>(i)];
      s.on_token = [st](const SampledToken&, int index, bool) {
        const auto now = Clock::now();
        if (index == 0) st->first = now;
        st->last = now;
        st->ids++;
        return FinishReason::none;
      };
      sch.add(std::move(s));
    }
    std::vector<double> step_ms;
    // the profiled steps: from the middle of the run, when every sequence decodes
    const int prof_from = std::max(1, opt.gen_tokens / 2);
    int prof_steps = 0;
    bool profiling = false;
    std::vector<FamilyTime> families;
    while (!sch.idle()) {
      if (opt.profile_steps > 0 && static_cast<int>(step_ms.size()) == prof_from) profiling = be.profile_begin();
      const auto s0 = Clock::now();
      if (sch.step() == 0) continue;  // (only reports were due)
      step_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - s0).count());
      if (profiling && ++prof_steps == opt.profile_steps) families = be.profile_end(), profiling = false;
    }
    if (profiling) families = be.profile_end();
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    ConcurrencyPoint p;
    p.clients = c;
    std::vector<double> rates, ttfts;
    int64_t total = 0;
    for (const Stream& st : streams) {
      total += st.ids;
      ttfts.push_back(std::chrono::duration<double, std::milli>(st.first - t0).count());
      const double span = std::chrono::duration<double>(st.last - st.first).count();
      if (st.ids > 1 && span > 0) rates.push_back((st.ids - 1) / span);
    }
    p.total_tok_per_s = wall > 0 ? static_cast<double>(total) / wall : 0;
    p.stream_tok_per_s = median(rates);
    p.ttft_ms = median(ttfts);
    p.steps = steps;
    p.mean_batch = steps > 0 ? static_cast<double>(seqs) / steps : 0;
    p.step_ms = median(step_ms);
    p.forward_ms = median(timed.forward_ms);
    p.begin_ms = median(timed.begin_ms);
    p.profiled_steps = families.empty() ? 0 : prof_steps;
    p.families = std::move(families);
    out.push_back(p);
  }
  return out;
}

}  // namespace lily
