// Open-addressing hash table (linear probing, power-of-two capacity, load <= 1/2, no deletion) for the
// tokenizer's large read-mostly maps: vocabulary bytes → id and merge pair → rank. One flat array of small
// slots keeps a lookup to one or two cache lines, which std::unordered_map's node per entry does not.
// The caller owns the slot type and the hash; the table only places and finds slots.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace lily {

// Hooks: `static bool empty(const Slot&)` (a value-initialised Slot must be empty) and
// `static uint64_t hash(const Slot&)` (the hash of the key stored in a full slot, used when growing).
template <class Slot, class Hooks>
class OpenHashTable {
 public:
  // Room for n entries at load <= 1/2 (capacity at least 16); rehashes what is stored.
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    if (cap <= slots_.size()) return;
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    for (Slot& s : old) {
      if (Hooks::empty(s)) continue;
      size_t i = Hooks::hash(s) & mask_;
      while (!Hooks::empty(slots_[i])) i = (i + 1) & mask_;
      slots_[i] = std::move(s);
    }
  }

  // The slot whose key `match(slot)` accepts, or nullptr; `h` is the key's hash.
  template <class Match>
  const Slot* find(uint64_t h, Match&& match) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (Hooks::empty(s)) return nullptr;
      if (match(s)) return &s;
    }
  }

  // The slot for a key: the full one `match` accepts (`fresh` = false), or the empty one where the key goes
  // (`fresh` = true, counted as an entry: the caller fills it before the next call). Grows first if needed.
  template <class Match>
  Slot& insert(uint64_t h, Match&& match, bool& fresh) {
    if (2 * (count_ + 1) > slots_.size()) reserve(count_ + 1 > 8 ? 2 * count_ : 8);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (Hooks::empty(s)) {
        fresh = true;
        ++count_;
        return s;
      }
      if (match(s)) {
        fresh = false;
        return s;
      }
    }
  }

  size_t size() const { return count_; }

 private:
  std::vector<Slot> slots_;  // [capacity], capacity 0 or a power of two
  size_t mask_ = 0, count_ = 0;
};

}  // namespace lily
