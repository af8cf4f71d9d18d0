// Per-sequence resources a backend lends to the sequences it runs, as types a scheduler can allocate, free and
// count: KV pages (a pool of fixed-size pages and each sequence's page table) and recurrent-state slots (a pool
// of equal slots, one per running sequence). They hold indices only; the backend owns the memory behind them
// (device pages and state buffers on the GPU, vectors on the CPU). Engine-thread only: not thread-safe.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

namespace lily {

// A pool of `count` interchangeable ids [0, count): KV pages or state slots.
class IdPool {
 public:
  explicit IdPool(int count);
  std::optional<int> alloc();           // the lowest free id, or none when every id is taken
  void free(int id);                    // an id alloc() returned and not yet freed
  int capacity() const { return static_cast<int>(used_.size()); }
  int in_use() const { return in_use_; }
  int available() const { return capacity() - in_use_; }

 private:
  std::vector<uint8_t> used_;           // [capacity]
  std::vector<int> free_;               // free ids, highest first (alloc pops the lowest)
  int in_use_ = 0;
};

// The KV pages of one sequence: page i of the table holds its tokens [i * page_tokens, (i + 1) * page_tokens).
class PageTable {
 public:
  explicit PageTable(int page_tokens) : page_tokens_(page_tokens) {}
  // Makes room for tokens [0, n_tokens) with pages from `pool`; false (and nothing taken) when the pool has too
  // few free pages.
  bool reserve(IdPool& pool, int n_tokens);
  // Keeps the pages that hold tokens [0, n_tokens) and returns the rest to `pool` (a rewind).
  void truncate(IdPool& pool, int n_tokens);
  void release(IdPool& pool) { truncate(pool, 0); }
  const std::vector<int>& pages() const { return pages_; }
  int page_tokens() const { return page_tokens_; }
  int capacity_tokens() const { return static_cast<int>(pages_.size()) * page_tokens_; }
  static int pages_for(int n_tokens, int page_tokens) { return (n_tokens + page_tokens - 1) / page_tokens; }

 private:
  int page_tokens_;
  std::vector<int> pages_;              // [pages held] pool ids
};

}  // namespace lily
