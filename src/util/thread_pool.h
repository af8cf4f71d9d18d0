// A persistent pool of worker threads with one operation, parallel_for over an index range. The calling
// thread takes part in the work; a call from inside a worker (nested parallelism) runs serially. Work is
// handed out in contiguous chunks from an atomic counter, so callers must make each index's result
// independent of which thread computes it (the CPU forward relies on this for determinism).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace lily {

class ThreadPool {
 public:
  // n_threads <= 0: one per hardware thread. The pool has n_threads - 1 workers plus the caller.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(chunk_begin, chunk_end) over disjoint chunks covering [begin, end), each at least `grain`
  // long (except the last), and returns when all are done. fn must not throw.
  template <typename Fn>
  void parallel_for(int64_t begin, int64_t end, Fn&& fn, int64_t grain = 1) {
    auto call = [](void* ctx, int64_t b, int64_t e) { (*static_cast<Fn*>(ctx))(b, e); };
    run(begin, end, grain, call, &fn);
  }

  // The process-wide pool used by the CPU backend; set_global_threads rebuilds it (not while in use).
  static ThreadPool& global();
  static void set_global_threads(int n_threads);

 private:
  using Task = void (*)(void* ctx, int64_t begin, int64_t end);
  void run(int64_t begin, int64_t end, int64_t grain, Task task, void* ctx);
  void worker_loop();
  void work_on_job();

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex run_mu_;                  // one parallel_for at a time from outside
  std::mutex mu_;
  std::condition_variable wake_;       // workers wait for a new generation
  std::condition_variable done_;       // caller waits for the workers to finish
  uint64_t generation_ = 0;            // bumped per job (guarded by mu_)
  bool stop_ = false;
  int active_ = 0;                     // workers still inside the current job (guarded by mu_)
  // the current job
  Task task_ = nullptr;
  void* ctx_ = nullptr;
  int64_t end_ = 0, chunk_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace lily
