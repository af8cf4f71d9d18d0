// Pushdown automaton: hash-consed stack nodes, eager rule expansion (closure), interned states with cached
// byte transitions.
#include "grammar/pda.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

namespace lily::grammar {

namespace {
inline uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}
constexpr uint64_t kEmptyKey = ~uint64_t(0);
constexpr uint32_t kNone = UINT32_MAX;
}  // namespace

Pda::Pda(const Flat& g) : g_(&g) {
  node_keys_.assign(1024, kEmptyKey);
  node_vals_.assign(1024, 0);
  state_table_.assign(1024, kNone);
  nodes_.push_back({kNone, kNone});  // kRoot
  nodes_.push_back({kNone, kNone});  // kEscape
  stamp_.assign(2, 0);
  scratch_.clear();
  intern(0);  // kDead
}

uint32_t Pda::node(uint32_t pos, uint32_t parent) {
  uint64_t key = (uint64_t(pos) << 32) | parent;
  size_t mask = node_keys_.size() - 1;
  for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
    if (node_keys_[i] == key) return node_vals_[i];
    if (node_keys_[i] == kEmptyKey) {
      uint32_t id = uint32_t(nodes_.size());
      nodes_.push_back({pos, parent});
      stamp_.push_back(0);
      node_keys_[i] = key;
      node_vals_[i] = id;
      if (nodes_.size() * 2 > node_keys_.size()) {  // grow and rehash
        std::vector<uint64_t> keys(node_keys_.size() * 2, kEmptyKey);
        std::vector<uint32_t> vals(keys.size(), 0);
        size_t m2 = keys.size() - 1;
        for (size_t j = 0; j < node_keys_.size(); ++j) {
          if (node_keys_[j] == kEmptyKey) continue;
          size_t k = mix(node_keys_[j]) & m2;
          while (keys[k] != kEmptyKey) k = (k + 1) & m2;
          keys[k] = node_keys_[j];
          vals[k] = node_vals_[j];
        }
        node_keys_.swap(keys);
        node_vals_.swap(vals);
      }
      return id;
    }
  }
}

void Pda::closure(uint32_t start) {
  const auto& elems = g_->elems;
  work_.push_back(start);
  while (!work_.empty()) {
    uint32_t n = work_.back();
    work_.pop_back();
    if (n == kRoot) { scratch_flags_ |= kAccept; continue; }
    if (n == kEscape) { scratch_flags_ |= kEscaped; continue; }
    if (stamp_[n] == gen_) continue;
    stamp_[n] = gen_;
    uint32_t pos = nodes_[n].pos, parent = nodes_[n].parent;
    const Elem& e = elems[pos];
    switch (e.kind) {
      case Kind::bytes:
      case Kind::token:
        scratch_.push_back(n);
        break;
      case Kind::star:
        scratch_.push_back(n);
        work_.push_back(node(pos + 1, parent));
        break;
      case Kind::opt: {
        scratch_.push_back(n);
        uint32_t skip = pos + 1;
        while (elems[skip].kind == Kind::opt) ++skip;
        work_.push_back(node(skip, parent));
        break;
      }
      case Kind::rule: {
        uint32_t ret = elems[pos + 1].kind == Kind::end ? parent : node(pos + 1, parent);  // tail call
        for (uint32_t a = g_->alt_begin[e.arg]; a < g_->alt_begin[e.arg + 1]; ++a)
          work_.push_back(node(g_->alt_start[a], ret));
        break;
      }
      case Kind::end:
        work_.push_back(parent);
        break;
    }
  }
}

uint32_t Pda::intern(uint8_t flags) {
  std::sort(scratch_.begin(), scratch_.end());
  uint64_t h = mix(flags + 0x9e3779b97f4a7c15ULL * (scratch_.size() + 1));
  for (uint32_t x : scratch_) h = mix(h ^ x);
  size_t mask = state_table_.size() - 1;
  size_t i = h & mask;
  for (;; i = (i + 1) & mask) {
    uint32_t id = state_table_[i];
    if (id == kNone) break;
    const State& s = states_[id];
    if (s.hash == h && s.flags == flags && s.size == scratch_.size() &&
        std::equal(scratch_.begin(), scratch_.end(), leaf_arena_.begin() + s.begin))
      return id;
  }
  uint32_t id = uint32_t(states_.size());
  states_.push_back({uint32_t(leaf_arena_.size()), uint32_t(scratch_.size()), flags, h, -1});
  leaf_arena_.insert(leaf_arena_.end(), scratch_.begin(), scratch_.end());
  state_table_[i] = id;
  if (states_.size() * 2 > state_table_.size()) {
    std::vector<uint32_t> t(state_table_.size() * 2, kNone);
    size_t m2 = t.size() - 1;
    for (uint32_t sid = 0; sid < states_.size(); ++sid) {
      size_t k = states_[sid].hash & m2;
      while (t[k] != kNone) k = (k + 1) & m2;
      t[k] = sid;
    }
    state_table_.swap(t);
  }
  return id;
}

uint32_t Pda::initial() {
  ++gen_;
  scratch_.clear();
  scratch_flags_ = 0;
  for (uint32_t a = g_->alt_begin[g_->root]; a < g_->alt_begin[g_->root + 1]; ++a)
    closure(node(g_->alt_start[a], kRoot));
  return intern(scratch_flags_);
}

uint32_t Pda::expand(uint32_t n) {
  ++gen_;
  scratch_.clear();
  scratch_flags_ = 0;
  closure(n);
  return intern(scratch_flags_);
}

uint32_t Pda::single(uint32_t leaf) {
  scratch_.assign(1, leaf);
  return intern(0);
}

uint32_t Pda::step(uint32_t state, uint8_t byte) {
  int32_t t = states_[state].trans;
  if (t >= 0 && trans_[size_t(t) + byte] >= 0) return uint32_t(trans_[size_t(t) + byte]);
  ++gen_;
  scratch_.clear();
  scratch_flags_ = 0;
  const auto& elems = g_->elems;
  const State s = states_[state];
  for (uint32_t i = 0; i < s.size; ++i) {
    uint32_t leaf = leaf_arena_[s.begin + i];
    uint32_t pos = nodes_[leaf].pos;
    const Elem& e = elems[pos];
    if ((e.kind == Kind::bytes || e.kind == Kind::opt) && has(g_->sets[e.arg], byte)) closure(node(pos + 1, nodes_[leaf].parent));
    else if (e.kind == Kind::star && has(g_->sets[e.arg], byte)) closure(leaf);
  }
  uint32_t next = intern(scratch_flags_);
  if (states_[state].trans < 0) {
    states_[state].trans = int32_t(trans_.size());
    trans_.resize(trans_.size() + 256, -1);
  }
  trans_[size_t(states_[state].trans) + byte] = int32_t(next);
  return next;
}

uint32_t Pda::step_token(uint32_t state, int32_t token) {
  ++gen_;
  scratch_.clear();
  scratch_flags_ = 0;
  const State s = states_[state];
  for (uint32_t i = 0; i < s.size; ++i) {
    uint32_t leaf = leaf_arena_[s.begin + i];
    const Elem& e = g_->elems[nodes_[leaf].pos];
    if (e.kind == Kind::token && int32_t(e.arg) == token) closure(node(nodes_[leaf].pos + 1, nodes_[leaf].parent));
  }
  return intern(scratch_flags_);
}

uint32_t Pda::import(const Pda& other, uint32_t state) {
  std::unordered_map<uint32_t, uint32_t> copied{{kRoot, kRoot}, {kEscape, kEscape}};
  std::vector<uint32_t> leaves, chain;
  for (uint32_t leaf : other.leaves(state)) {
    chain.clear();
    for (uint32_t n = leaf; !copied.count(n); n = other.nodes_[n].parent) chain.push_back(n);
    for (size_t i = chain.size(); i-- > 0;) {
      uint32_t n = chain[i];
      copied[n] = node(other.nodes_[n].pos, copied.at(other.nodes_[n].parent));
    }
    leaves.push_back(copied.at(leaf));
  }
  scratch_ = std::move(leaves);
  return intern(other.flags(state));
}

size_t Pda::bytes() const {
  return nodes_.capacity() * sizeof(Node) + node_keys_.capacity() * 8 + node_vals_.capacity() * 4 +
         states_.capacity() * sizeof(State) + leaf_arena_.capacity() * 4 + state_table_.capacity() * 4 +
         trans_.capacity() * 4 + stamp_.capacity() * 4;
}

}  // namespace lily::grammar
