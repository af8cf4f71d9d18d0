// BPE merges by rank (HF `tokenizers` BPE model, no dropout/unk/byte fallback): repeatedly merge the
// adjacent pair with the lowest rank, leftmost first. Short pieces use an array scan, long ones a heap
// over a linked list (O(n log n), no recursion).
#pragma once
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace lily {

class MergeTable {
 public:
  void reserve(size_t n);
  // Later insertions of the same pair overwrite earlier ones (as HF's HashMap collect does).
  void insert(int32_t a, int32_t b, int32_t rank, int32_t merged);
  // Rank of the pair (a, b), or -1 when absent; `merged` receives the id of the merged token.
  int32_t find(int32_t a, int32_t b, int32_t& merged) const {
    uint64_t key = uint64_t(uint32_t(a)) << 32 | uint32_t(b);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.rank < 0) return -1;
      if (s.key == key) {
        merged = s.merged;
        return s.rank;
      }
    }
  }
  size_t size() const { return count_; }

 private:
  struct Slot {
    uint64_t key;
    int32_t rank = -1;  // -1: empty slot
    int32_t merged;
  };
  static size_t hash(uint64_t k) {
    k ^= k >> 29;
    k *= 0xbf58476d1ce4e5b9ULL;
    k ^= k >> 32;
    return size_t(k);
  }
  void grow();
  std::vector<Slot> slots_;  // [capacity], capacity a power of two, load <= 1/2
  size_t mask_ = 0, count_ = 0;
};

// Appends the BPE ids of one pre-tokenized piece, given its initial symbol ids (one per byte).
void bpe_merge(const MergeTable& merges, std::span<const int32_t> symbols, std::vector<int32_t>& out);

}  // namespace lily
