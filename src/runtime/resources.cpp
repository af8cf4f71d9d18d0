// IdPool and PageTable (see resources.h).
#include "runtime/resources.h"

#include "util/check.h"

namespace lily {

IdPool::IdPool(int count) {
  LILY_CHECK(count >= 0, "IdPool: negative capacity ", count);
  used_.assign(static_cast<size_t>(count), 0);
  for (int i = count - 1; i >= 0; --i) free_.push_back(i);
}

std::optional<int> IdPool::alloc() {
  if (free_.empty()) return std::nullopt;
  const int id = free_.back();
  free_.pop_back();
  used_[id] = 1;
  ++in_use_;
  return id;
}

void IdPool::free(int id) {
  LILY_CHECK(id >= 0 && id < capacity() && used_[id], "IdPool: id ", id, " is not in use");
  used_[id] = 0;
  --in_use_;
  // keep the free list sorted highest first, so alloc() hands out the lowest id (deterministic layouts)
  auto it = free_.begin();
  while (it != free_.end() && *it > id) ++it;
  free_.insert(it, id);
}

bool PageTable::reserve(IdPool& pool, int n_tokens) {
  const int need = pages_for(n_tokens, page_tokens_) - static_cast<int>(pages_.size());
  if (need <= 0) return true;
  if (pool.available() < need) return false;
  for (int i = 0; i < need; ++i) pages_.push_back(*pool.alloc());
  return true;
}

void PageTable::truncate(IdPool& pool, int n_tokens) {
  const size_t keep = static_cast<size_t>(pages_for(n_tokens, page_tokens_));
  while (pages_.size() > keep) {
    pool.free(pages_.back());
    pages_.pop_back();
  }
}

}  // namespace lily
