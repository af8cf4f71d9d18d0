// BPE merges by rank (HF `tokenizers` BPE model, no dropout/unk/byte fallback): repeatedly merge the
// adjacent pair with the lowest rank, leftmost first. Short pieces use an array scan, long ones a heap
// over a linked list (O(n log n), no recursion).
#pragma once
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "util/hash_table.h"

namespace lily {

class MergeTable {
 public:
  void reserve(size_t n) { table_.reserve(n); }
  // Later insertions of the same pair overwrite earlier ones (as HF's HashMap collect does).
  void insert(int32_t a, int32_t b, int32_t rank, int32_t merged);
  // Rank of the pair (a, b), or -1 when absent; `merged` receives the id of the merged token.
  int32_t find(int32_t a, int32_t b, int32_t& merged) const {
    const uint64_t key = uint64_t(uint32_t(a)) << 32 | uint32_t(b);
    const Slot* s = table_.find(hash(key), [key](const Slot& s) { return s.key == key; });
    if (!s) return -1;
    merged = s->merged;
    return s->rank;
  }
  size_t size() const { return table_.size(); }

 private:
  struct Slot {
    uint64_t key = 0;     // a << 32 | b
    int32_t rank = -1;    // -1: empty slot
    int32_t merged = -1;  // id of the merged token
  };
  static uint64_t hash(uint64_t k) {
    k ^= k >> 29;
    k *= 0xbf58476d1ce4e5b9ULL;
    k ^= k >> 32;
    return k;
  }
  struct Hooks {
    static bool empty(const Slot& s) { return s.rank < 0; }
    static uint64_t hash(const Slot& s) { return MergeTable::hash(s.key); }
  };
  OpenHashTable<Slot, Hooks> table_;
};

// Appends the BPE ids of one pre-tokenized piece, given its initial symbol ids (one per byte).
void bpe_merge(const MergeTable& merges, std::span<const int32_t> symbols, std::vector<int32_t>& out);

}  // namespace lily
