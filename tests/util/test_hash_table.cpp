// util/hash_table.h against std::unordered_map: seeded random inserts (with repeats and colliding low bits),
// lookups of present and absent keys, growth from empty.
#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

#include "util/hash_table.h"

using namespace lily;

namespace {
struct Slot {
  uint64_t key = 0;
  int64_t value = -1;  // -1: empty
};
struct Hooks {
  static bool empty(const Slot& s) { return s.value < 0; }
  static uint64_t hash(const Slot& s) { return s.key * 0x9E3779B97F4A7C15ull >> 7; }
};
using Table = OpenHashTable<Slot, Hooks>;

int64_t find(const Table& t, uint64_t key) {
  const Slot* s = t.find(Hooks::hash(Slot{key, 0}), [key](const Slot& s) { return s.key == key; });
  return s ? s->value : -1;
}
}  // namespace

TEST(HashTable, EmptyTableFindsNothing) {
  Table t;
  EXPECT_EQ(find(t, 0), -1);
  EXPECT_EQ(find(t, 42), -1);
  EXPECT_EQ(t.size(), 0u);
}

TEST(HashTable, MatchesUnorderedMap) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937_64 rng(seed);
    Table t;
    if (seed == 2) t.reserve(1000);
    std::unordered_map<uint64_t, int64_t> ref;
    const uint64_t range = seed == 3 ? 64 : 5000;  // seed 3: many repeats
    for (int i = 0; i < 3000; ++i) {
      const uint64_t key = (rng() % range) << (seed == 1 ? 20 : 0);  // seed 1: equal low bits
      const int64_t value = int64_t(rng() % 1000000);
      bool fresh;
      Slot& s = t.insert(Hooks::hash(Slot{key, 0}), [key](const Slot& s) { return s.key == key; }, fresh);
      ASSERT_EQ(fresh, !ref.count(key));
      if (fresh) s.key = key;
      s.value = value;  // overwrite, as the merge table does
      ref[key] = value;
      ASSERT_EQ(t.size(), ref.size());
    }
    for (uint64_t k = 0; k < range + 100; ++k) {
      const uint64_t key = k << (seed == 1 ? 20 : 0);
      auto it = ref.find(key);
      ASSERT_EQ(find(t, key), it == ref.end() ? -1 : it->second) << key;
    }
  }
}
