// BPE merge loop (see bpe.h).
#include "tokenizer/bpe.h"

#include <queue>

namespace lily {

void MergeTable::insert(int32_t a, int32_t b, int32_t rank, int32_t merged) {
  const uint64_t key = uint64_t(uint32_t(a)) << 32 | uint32_t(b);
  bool fresh;
  Slot& s = table_.insert(hash(key), [key](const Slot& s) { return s.key == key; }, fresh);
  s = Slot{key, rank, merged};  // a repeated pair overwrites the earlier one
}

namespace {

constexpr size_t kSmall = 128;  // pieces up to this many symbols use the array scan

void merge_small(const MergeTable& merges, std::span<const int32_t> symbols, std::vector<int32_t>& out) {
  int32_t ids[kSmall], ranks[kSmall], merged[kSmall];  // ranks[i], merged[i]: the pair (ids[i], ids[i+1])
  size_t n = symbols.size();
  for (size_t i = 0; i < n; ++i) ids[i] = symbols[i];
  for (size_t i = 0; i + 1 < n; ++i) ranks[i] = merges.find(ids[i], ids[i + 1], merged[i]);
  while (n > 1) {
    size_t best = n;
    int32_t best_rank = INT32_MAX;
    for (size_t i = 0; i + 1 < n; ++i)
      if (ranks[i] >= 0 && ranks[i] < best_rank) best_rank = ranks[i], best = i;
    if (best == n) break;
    ids[best] = merged[best];
    for (size_t i = best + 1; i + 1 < n; ++i) ids[i] = ids[i + 1], ranks[i] = ranks[i + 1], merged[i] = merged[i + 1];
    --n;
    if (best > 0) ranks[best - 1] = merges.find(ids[best - 1], ids[best], merged[best - 1]);
    if (best + 1 < n) ranks[best] = merges.find(ids[best], ids[best + 1], merged[best]);
  }
  out.insert(out.end(), ids, ids + n);
}

void merge_large(const MergeTable& merges, std::span<const int32_t> symbols, std::vector<int32_t>& out) {
  const int32_t n = int32_t(symbols.size());
  std::vector<int32_t> ids(symbols.begin(), symbols.end()), prev(n), next(n);  // linked list over positions
  for (int32_t i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  struct Cand {
    int32_t rank, pos;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  int32_t m;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    int32_t r = merges.find(ids[pos], ids[next[pos]], m);
    if (r >= 0) heap.push({r, pos});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    int32_t right = next[c.pos];
    if (ids[c.pos] < 0 || right < 0) continue;
    if (merges.find(ids[c.pos], ids[right], m) != c.rank) continue;  // stale entry
    ids[c.pos] = m;
    ids[right] = -1;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
}

}  // namespace

void bpe_merge(const MergeTable& merges, std::span<const int32_t> symbols, std::vector<int32_t>& out) {
  if (symbols.size() <= 1) {
    out.insert(out.end(), symbols.begin(), symbols.end());
    return;
  }
  if (symbols.size() <= kSmall) merge_small(merges, symbols, out);
  else merge_large(merges, symbols, out);
}

}  // namespace lily
