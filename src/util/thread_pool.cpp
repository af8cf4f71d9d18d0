// ThreadPool: workers sleep on a condition variable between jobs and pull chunks from an atomic counter.
#include "util/thread_pool.h"

#include <algorithm>
#include <memory>

namespace lily {
namespace {
thread_local bool t_in_pool_job = false;  // true while this thread executes chunks of a job
std::unique_ptr<ThreadPool> g_pool;
std::mutex g_pool_mu;
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::work_on_job() {
  const bool was_in = t_in_pool_job;
  t_in_pool_job = true;
  for (;;) {
    int64_t b = next_.fetch_add(chunk_, std::memory_order_relaxed);
    if (b >= end_) break;
    task_(ctx_, b, std::min(end_, b + chunk_));
  }
  t_in_pool_job = was_in;
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    work_on_job();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::run(int64_t begin, int64_t end, int64_t grain, Task task, void* ctx) {
  if (end <= begin) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t n = end - begin;
  // Serial: a single chunk's worth of work, a one-thread pool, or a nested call from inside a job.
  if (n <= grain || workers_.empty() || t_in_pool_job) {
    task(ctx, begin, end);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  // About four chunks per thread balances load without much counter traffic.
  const int64_t target_chunks = static_cast<int64_t>(n_threads_) * 4;
  const int64_t chunk = std::max(grain, (n + target_chunks - 1) / target_chunks);
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = task;
    ctx_ = ctx;
    end_ = end;
    chunk_ = chunk;
    next_.store(begin, std::memory_order_relaxed);
    active_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  work_on_job();
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return active_ == 0; });
}

ThreadPool& ThreadPool::global() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (!g_pool) g_pool = std::make_unique<ThreadPool>(0);
  return *g_pool;
}

void ThreadPool::set_global_threads(int n_threads) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  g_pool = std::make_unique<ThreadPool>(n_threads);
}

}  // namespace lily
