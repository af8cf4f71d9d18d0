// Prefix cache for the hybrid model (docs/api.md §11): snapshots of the recurrent state (GDN S + conv state,
// Backend::save_state) keyed by the exact token prefix that produced them, in a byte-capped LRU (host memory,
// or device memory where the backend keeps them: StateSnapshot). Matching is on token ids only. The KV part
// of a prefix is not stored here: the engine keeps the resident sequence's KV and only uses a snapshot whose
// position lies within the prefix it shares with the resident tokens (see Engine::prepare_prefix). Owned and
// used by the engine thread only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <vector>

#include "runtime/backend.h"

namespace lily {

// A prompt checkpoint at `pos` moved down to the backend's prompt grid (Backend::prompt_grid; 0: none left).
inline int prompt_cut(int pos, int grid) { return grid > 1 ? pos / grid * grid : pos; }
// The checkpoints of a prompt of n tokens: the requested positions and every `interval` tokens (0: none), each
// moved down to the grid, ascending and distinct, inside (0, n).
std::vector<int> prompt_checkpoints(std::vector<int> requested, int n, int interval, int grid);

class PrefixCache {
 public:
  explicit PrefixCache(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Stores `snap`, taken after consuming `tokens` (tokens.size() == snap.position). An entry for the same
  // prefix is replaced. Evicts least-recently-used entries until the pool fits in max_bytes; a snapshot
  // larger than the whole pool is dropped.
  void insert(std::span<const int32_t> tokens, StateSnapshot snap);

  // The snapshot with the largest position <= limit whose token prefix equals prompt[0, position), or
  // null. Marks it most recently used. The pointer stays valid until the next insert or clear.
  const StateSnapshot* lookup(std::span<const int32_t> prompt, int limit);

  void clear();
  size_t bytes() const { return bytes_; }
  size_t count() const { return entries_.size(); }
  size_t max_bytes() const { return max_bytes_; }

 private:
  struct Entry {
    std::vector<int32_t> tokens;  // [snap.position] the prefix
    uint64_t hash = 0;            // prefix_hash(tokens)
    StateSnapshot snap;
    size_t bytes = 0;             // tokens + snapshot bytes
  };
  static uint64_t hash_step(uint64_t h, int32_t token);

  size_t max_bytes_;
  size_t bytes_ = 0;
  std::list<Entry> entries_;  // front = most recently used
};

}  // namespace lily
