// Byte-capped LRU of recurrent-state snapshots keyed by token prefix (see prefix_cache.h).
#include "runtime/prefix_cache.h"

#include <algorithm>
#include <cstring>

namespace lily {

std::vector<int> prompt_checkpoints(std::vector<int> requested, int n, int interval, int grid) {
  for (int c = interval; interval > 0 && c < n; c += interval) requested.push_back(c);
  std::vector<int> cuts;
  for (int c : requested)
    if (const int k = prompt_cut(c, grid); k > 0 && k < n) cuts.push_back(k);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

uint64_t PrefixCache::hash_step(uint64_t h, int32_t token) {
  // FNV-1a over the token's 4 bytes, then a multiply-xorshift to spread the bits.
  uint32_t t = static_cast<uint32_t>(token);
  for (int i = 0; i < 4; ++i) {
    h ^= (t >> (8 * i)) & 0xff;
    h *= 0x100000001b3ULL;
  }
  return h ^ (h >> 29);
}

void PrefixCache::insert(std::span<const int32_t> tokens, StateSnapshot snap) {
  Entry e;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.hash = 0xcbf29ce484222325ULL;
  for (int32_t t : tokens) e.hash = hash_step(e.hash, t);
  e.bytes = snap.size() + tokens.size() * sizeof(int32_t) + sizeof(Entry);
  e.snap = std::move(snap);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->hash == e.hash && it->tokens == e.tokens) {
      bytes_ -= it->bytes;
      entries_.erase(it);
      break;
    }
  }
  if (e.bytes > max_bytes_) return;
  while (!entries_.empty() && bytes_ + e.bytes > max_bytes_) {
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
  bytes_ += e.bytes;
  entries_.push_front(std::move(e));
}

const StateSnapshot* PrefixCache::lookup(std::span<const int32_t> prompt, int limit) {
  limit = std::min<int>(limit, static_cast<int>(prompt.size()));
  if (limit <= 0 || entries_.empty()) return nullptr;
  // prefix hashes of the prompt: ph[i] = hash of prompt[0, i)
  std::vector<uint64_t> ph(static_cast<size_t>(limit) + 1);
  ph[0] = 0xcbf29ce484222325ULL;
  for (int i = 0; i < limit; ++i) ph[i + 1] = hash_step(ph[i], prompt[i]);
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    int p = it->snap.position;
    if (p <= 0 || p > limit) continue;
    if (best != entries_.end() && p <= best->snap.position) continue;
    if (it->hash != ph[p]) continue;
    if (std::memcmp(it->tokens.data(), prompt.data(), sizeof(int32_t) * p) != 0) continue;
    best = it;
  }
  if (best == entries_.end()) return nullptr;
  entries_.splice(entries_.begin(), entries_, best);
  return &entries_.front().snap;
}

void PrefixCache::clear() {
  entries_.clear();
  bytes_ = 0;
}

}  // namespace lily
