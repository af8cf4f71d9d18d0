// ThreadPool: every index visited exactly once, chunks respect the grain, nested calls run serially,
// and the pool can be rebuilt with another size.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "util/thread_pool.h"

using namespace lily;

TEST(ThreadPool, VisitsEveryIndexOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 2, 7, 100, 1001}) {
    std::vector<std::atomic<int>> hits(n);
    for (auto& h : hits) h = 0;
    pool.parallel_for(0, n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, OffsetRangeAndGrain) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  std::atomic<int> short_chunks{0};
  pool.parallel_for(
      10, 110,
      [&](int64_t b, int64_t e) {
        if (e - b < 7 && e != 110) short_chunks++;
        for (int64_t i = b; i < e; ++i) sum += i;
      },
      7);
  EXPECT_EQ(sum.load(), (10 + 109) * 100 / 2);
  EXPECT_EQ(short_chunks.load(), 0);
}

TEST(ThreadPool, NestedCallRunsInline) {
  ThreadPool pool(4);
  std::atomic<int64_t> total{0};
  pool.parallel_for(0, 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(0, 10, [&](int64_t b2, int64_t e2) { total += (e2 - b2) * (i + 1); });
  });
  EXPECT_EQ(total.load(), 10 * (1 + 2 + 3 + 4 + 5 + 6 + 7 + 8));
}

TEST(ThreadPool, ManyShortJobsAndResize) {
  ThreadPool::set_global_threads(2);
  EXPECT_EQ(ThreadPool::global().size(), 2);
  std::atomic<int64_t> total{0};
  for (int rep = 0; rep < 2000; ++rep)
    ThreadPool::global().parallel_for(0, 5, [&](int64_t b, int64_t e) { total += e - b; });
  EXPECT_EQ(total.load(), 10000);
  ThreadPool::set_global_threads(1);
  EXPECT_EQ(ThreadPool::global().size(), 1);
}
