// Vocabulary trie, per-position token classes (compile time) and masks (decode time).
#include "grammar/token_mask.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>

#include "tokenizer/tokenizer.h"
#include "util/log.h"

namespace lily::grammar {

std::shared_ptr<const Vocab> Vocab::build(const Tokenizer& tok) {
  std::vector<std::string> texts(size_t(tok.vocab_size()));
  std::vector<int32_t> added;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.is_added(id)) {
      added.push_back(id);
      continue;
    }
    try {
      texts[size_t(id)] = tok.token_text(id);
    } catch (const lily::Error&) {  // a hole in the id space: no text, never allowed
    }
  }
  return build(std::move(texts), std::move(added));
}

std::shared_ptr<const Vocab> Vocab::build(std::vector<std::string> texts, std::vector<int32_t> added) {
  auto v = std::make_shared<Vocab>();
  v->texts_ = std::move(texts);
  v->added_.assign(v->texts_.size(), 0);
  for (int32_t id : added)
    if (id >= 0 && size_t(id) < v->texts_.size()) v->added_[size_t(id)] = 1;
  v->build_trie();
  return v;
}

void Vocab::build_trie() {
  std::vector<int32_t> order;
  for (int32_t id = 0; id < size(); ++id)
    if (!added_[size_t(id)] && !texts_[size_t(id)].empty()) order.push_back(id);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return texts_[size_t(a)] != texts_[size_t(b)] ? texts_[size_t(a)] < texts_[size_t(b)] : a < b;
  });
  trie_.clear();
  trie_.push_back({0, 0, -1, 0});
  std::vector<uint32_t> path{0};  // node index per depth
  std::string_view prev;
  for (int32_t id : order) {
    std::string_view s = texts_[size_t(id)];
    if (s == prev) {
      dups_.push_back({trie_[path.back()].token, id});
      continue;
    }
    size_t l = 0;
    while (l < s.size() && l < prev.size() && s[l] == prev[l]) ++l;
    while (path.size() > l + 1) {
      trie_[path.back()].end = uint32_t(trie_.size());
      path.pop_back();
    }
    for (size_t d = l; d < s.size(); ++d) {
      path.push_back(uint32_t(trie_.size()));
      trie_.push_back({uint8_t(s[d]), uint16_t(d + 1), -1, 0});
    }
    trie_[path.back()].token = id;
    prev = s;
  }
  while (!path.empty()) {
    trie_[path.back()].end = uint32_t(trie_.size());
    path.pop_back();
  }
}

namespace {

inline void set_bit(std::span<uint32_t> m, int32_t id) { m[size_t(id) >> 5] |= 1u << (id & 31); }

// Byte-level FIRST of the element sequence starting at `p` (up to its alternative's end); `nullable` = the whole
// rest can match nothing.
ByteSet seq_first(const Flat& f, uint32_t p, const std::vector<ByteSet>& first, const std::vector<char>& null_rule,
                  bool& nullable) {
  ByteSet acc{};
  for (;; ++p) {
    const Elem& e = f.elems[p];
    switch (e.kind) {
      case Kind::end: nullable = true; return acc;
      case Kind::token: nullable = false; return acc;
      case Kind::bytes:
        for (int w = 0; w < 4; ++w) acc[size_t(w)] |= f.sets[e.arg][size_t(w)];
        nullable = false;
        return acc;
      case Kind::star:
      case Kind::opt:
        for (int w = 0; w < 4; ++w) acc[size_t(w)] |= f.sets[e.arg][size_t(w)];
        break;
      case Kind::rule:
        for (int w = 0; w < 4; ++w) acc[size_t(w)] |= first[e.arg][size_t(w)];
        if (!null_rule[e.arg]) { nullable = false; return acc; }
        break;
    }
  }
}

bool merge(ByteSet& into, const ByteSet& from) {
  bool changed = false;
  for (int w = 0; w < 4; ++w) {
    uint64_t v = into[size_t(w)] | from[size_t(w)];
    changed |= v != into[size_t(w)];
    into[size_t(w)] = v;
  }
  return changed;
}

// FOLLOW(rule): the bytes that can come right after the rule in any context (fixpoints over FIRST and FOLLOW).
std::vector<ByteSet> follow_sets(const Flat& f, std::vector<uint32_t>& rule_of) {
  size_t nr = f.alt_begin.size() - 1;
  rule_of.assign(f.elems.size(), 0);
  for (uint32_t r = 0; r < nr; ++r)
    for (uint32_t a = f.alt_begin[r]; a < f.alt_begin[r + 1]; ++a)
      for (uint32_t p = f.alt_start[a];; ++p) {
        rule_of[p] = r;
        if (f.elems[p].kind == Kind::end) break;
      }
  std::vector<ByteSet> first(nr, ByteSet{}), follow(nr, ByteSet{});
  std::vector<char> null_rule(nr, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t r = 0; r < nr; ++r)
      for (uint32_t a = f.alt_begin[r]; a < f.alt_begin[r + 1]; ++a) {
        bool nul;
        changed |= merge(first[r], seq_first(f, f.alt_start[a], first, null_rule, nul));
        if (nul && !null_rule[r]) { null_rule[r] = 1; changed = true; }
      }
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t p = 0; p < f.elems.size(); ++p) {
      if (f.elems[p].kind != Kind::rule) continue;
      bool nul;
      uint32_t callee = f.elems[p].arg;
      changed |= merge(follow[callee], seq_first(f, p + 1, first, null_rule, nul));
      if (nul) changed |= merge(follow[callee], follow[rule_of[p]]);
    }
  }
  return follow;
}

// Classifies every token for position `pos` taken out of context (parent = kEscape). When the position's rule
// can end inside a token, the token's next byte must be in FOLLOW(rule) for the caller's context to have a chance;
// such tokens are uncertain, the rest rejected.
PositionMask precompute(Pda& pda, const Vocab& vocab, uint32_t pos, const ByteSet& follow) {
  const auto& trie = vocab.trie();
  std::vector<int32_t> accepted;
  std::vector<std::pair<std::string, int32_t>> uncertain;  // (suffix after a possible rule end, token)
  std::vector<uint32_t> st(64);
  std::vector<uint8_t> esc_now(64), esc_ok(64);  // [depth] the rule can end here / ended earlier (viable)
  st[0] = pda.single(pda.node(pos, Pda::kEscape));
  // Records token `id` as uncertain for every viable rule end at depth e < limit.
  auto add_uncertain = [&](int32_t id, size_t limit) {
    const std::string& t = vocab.text(id);
    for (size_t e = 1; e < std::min(limit, t.size()); ++e)
      if (esc_now[e] && has(follow, uint8_t(t[e]))) uncertain.push_back({t.substr(e), id});
  };
  for (uint32_t k = 1; k < trie.size();) {
    const Vocab::TrieNode& n = trie[k];
    size_t d = n.depth;
    if (d + 1 >= st.size()) {
      st.resize(d * 2 + 2);
      esc_now.resize(d * 2 + 2);
      esc_ok.resize(d * 2 + 2);
    }
    bool via_caller = esc_ok[d - 1] || (esc_now[d - 1] && has(follow, n.byte));
    uint32_t s = pda.step(st[d - 1], n.byte);
    bool live = pda.live(s);
    bool en = pda.flags(s) & Pda::kEscaped;
    if (!live && !en && !via_caller) {
      k = n.end;
      continue;
    }
    esc_now[d] = en;
    if (n.token >= 0) {
      if (live || en) accepted.push_back(n.token);
      else add_uncertain(n.token, d);
    }
    if (!live && !en) {  // only the caller's context can continue: every longer token is uncertain
      for (uint32_t j = k + 1; j < n.end; ++j)
        if (trie[j].token >= 0) add_uncertain(trie[j].token, d);
      k = n.end;
      continue;
    }
    st[d] = s;
    esc_ok[d] = via_caller;
    ++k;
  }
  for (auto [kept, dup] : vocab.duplicates()) {
    if (std::find(accepted.begin(), accepted.end(), kept) != accepted.end()) accepted.push_back(dup);
    for (size_t i = 0, n = uncertain.size(); i < n; ++i)
      if (uncertain[i].second == kept) uncertain.push_back({uncertain[i].first, dup});
  }
  PositionMask pm;
  size_t words = vocab.mask_words();
  if (accepted.size() > words) {
    pm.accepted_bits.assign(words, 0);
    for (int32_t id : accepted) set_bit(pm.accepted_bits, id);
  } else {
    pm.accepted_ids = std::move(accepted);
    std::sort(pm.accepted_ids.begin(), pm.accepted_ids.end());
  }
  std::sort(uncertain.begin(), uncertain.end());
  pm.suffix_begin.push_back(0);
  for (size_t i = 0; i < uncertain.size(); ++i) {
    if (i == 0 || uncertain[i].first != uncertain[i - 1].first) {
      if (i > 0) pm.suffix_begin.push_back(uint32_t(pm.suffix_tokens.size()));
      size_t l = 0;
      if (!pm.suffixes.empty()) {
        const std::string& prev = pm.suffixes.back();
        while (l < prev.size() && l < uncertain[i].first.size() && prev[l] == uncertain[i].first[l] && l < 65535) ++l;
      }
      pm.suffixes.push_back(uncertain[i].first);
      pm.suffix_lcp.push_back(uint16_t(l));
    }
    pm.suffix_tokens.push_back(uncertain[i].second);
  }
  if (!pm.suffixes.empty()) pm.suffix_begin.push_back(uint32_t(pm.suffix_tokens.size()));
  return pm;
}

// A position's token classes depend only on what the automaton can reach from it out of context: the rest of
// its alternative, the rules reachable from there, and FOLLOW of its rule. This key serialises exactly that
// (rules renumbered by first reach), so equal contexts in different grammars share one precomputed mask.
// Empty when the reachable part is too large to be worth keying.
std::string position_key(const Flat& f, uint32_t pos, const ByteSet& follow, const Vocab* vocab) {
  constexpr size_t kLimit = 1 << 16;
  std::string key(reinterpret_cast<const char*>(&vocab), sizeof(vocab));
  key.append(reinterpret_cast<const char*>(follow.data()), sizeof(ByteSet));
  std::unordered_map<uint32_t, uint32_t> local;
  std::vector<uint32_t> queue;
  auto put = [&](uint32_t v) { key.append(reinterpret_cast<const char*>(&v), 4); };
  auto run = [&](uint32_t p) {
    for (;; ++p) {
      const Elem& e = f.elems[p];
      key.push_back(char(e.kind));
      if (e.kind == Kind::end) return;
      if (e.kind == Kind::rule) {
        auto [it, fresh] = local.emplace(e.arg, uint32_t(local.size()));
        if (fresh) queue.push_back(e.arg);
        put(it->second);
      } else if (e.kind == Kind::token) {
        put(e.arg);
      } else {
        key.append(reinterpret_cast<const char*>(f.sets[e.arg].data()), sizeof(ByteSet));
      }
    }
  };
  run(pos);
  for (size_t q = 0; q < queue.size(); ++q) {
    uint32_t r = queue[q];
    put(f.alt_begin[r + 1] - f.alt_begin[r]);
    for (uint32_t a = f.alt_begin[r]; a < f.alt_begin[r + 1]; ++a) {
      run(f.alt_start[a]);
      if (key.size() > kLimit) return {};
    }
  }
  return key;
}

// Process-wide: position masks by key, held weakly (alive while some compiled grammar uses them).
class SharedMasks {
 public:
  std::shared_ptr<const PositionMask> find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second.lock();
  }
  void put(const std::string& key, const std::shared_ptr<const PositionMask>& pm) {
    std::lock_guard<std::mutex> lock(mu_);
    map_[key] = pm;
    if (map_.size() > 2 * live_after_sweep_ + 1024) {  // drop the expired entries now and then
      for (auto it = map_.begin(); it != map_.end();) it = it->second.expired() ? map_.erase(it) : std::next(it);
      live_after_sweep_ = map_.size();
    }
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::weak_ptr<const PositionMask>> map_;
  size_t live_after_sweep_ = 0;
};

SharedMasks& shared_masks() {
  static SharedMasks m;
  return m;
}

}  // namespace

std::shared_ptr<const CompiledGrammar> CompiledGrammar::compile(const Grammar& g, std::shared_ptr<const Vocab> vocab) {
  auto t0 = std::chrono::steady_clock::now();
  auto cg = std::make_shared<CompiledGrammar>();
  cg->flat_ = flatten(g);
  cg->vocab_ = std::move(vocab);
  Pda pda(cg->flat_);
  std::vector<uint32_t> rule_of;
  std::vector<ByteSet> follow = follow_sets(cg->flat_, rule_of);
  size_t bytes = cg->flat_.elems.capacity() * sizeof(Elem) + cg->flat_.sets.capacity() * sizeof(ByteSet) +
                 (cg->flat_.alt_begin.capacity() + cg->flat_.alt_start.capacity()) * 4;
  // Longest run of bytes from a set at the start of any token (positions deep inside a long optional run whose
  // remaining length exceeds it classify tokens identically, so they share one mask).
  std::map<uint32_t, size_t> class_depth;
  auto max_class_prefix = [&](uint32_t set) {
    auto it = class_depth.find(set);
    if (it != class_depth.end()) return it->second;
    const auto& trie = cg->vocab_->trie();
    size_t best = 0;
    for (uint32_t k = 1; k < trie.size();) {
      if (!has(cg->flat_.sets[set], trie[k].byte)) { k = trie[k].end; continue; }
      best = std::max<size_t>(best, trie[k].depth);
      ++k;
    }
    return class_depth[set] = best;
  };
  const auto& elems = cg->flat_.elems;
  std::function<uint32_t(uint32_t)> mask_of = [&](uint32_t pos) -> uint32_t {
    auto it = cg->index_.find(pos);
    if (it != cg->index_.end()) return it->second;
    if (elems[pos].kind == Kind::opt) {
      uint32_t run_end = pos;
      while (elems[run_end].kind == Kind::opt && elems[run_end].arg == elems[pos].arg) ++run_end;
      size_t depth = max_class_prefix(elems[pos].arg);
      if (elems[run_end].kind != Kind::opt && run_end - pos > depth + 1) {
        uint32_t shared = mask_of(run_end - uint32_t(depth + 1));
        return cg->index_[pos] = shared;
      }
    }
    uint32_t idx = uint32_t(cg->masks_.size());
    const ByteSet& fol = follow[rule_of[pos]];
    std::string key = position_key(cg->flat_, pos, fol, cg->vocab_.get());
    std::shared_ptr<const PositionMask> pm = key.empty() ? nullptr : shared_masks().find(key);
    if (pm) {
      ++cg->shared_;
    } else {
      pm = std::make_shared<const PositionMask>(precompute(pda, *cg->vocab_, pos, fol));
      if (!key.empty()) shared_masks().put(key, pm);
    }
    cg->masks_.push_back(pm);
    bytes += pm->accepted_bits.capacity() * 4 + pm->accepted_ids.capacity() * 4 + pm->suffix_tokens.capacity() * 4 +
             pm->suffix_begin.capacity() * 4 + pm->suffix_lcp.capacity() * 2 + 16;
    for (const auto& sfx : pm->suffixes) bytes += sizeof(std::string) + (sfx.size() > 15 ? sfx.capacity() : 0);
    return cg->index_[pos] = idx;
  };
  for (uint32_t pos = 0; pos < elems.size(); ++pos) {
    Kind k = elems[pos].kind;
    if (k == Kind::bytes || k == Kind::star || k == Kind::opt) mask_of(pos);
  }
  cg->bytes_ = bytes + cg->index_.size() * 16;
  cg->compile_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return cg;
}

size_t CompiledGrammar::uncertain_total() const {
  size_t n = 0;
  for (const auto& m : masks_) n += m->suffix_tokens.size();
  return n;
}

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> g) : g_(std::move(g)), pda_(g_->flat()) {
  state_ = pda_.initial();
}

void Matcher::reset() {
  pda_ = Pda(g_->flat());
  state_ = pda_.initial();
  memo_.clear();
}

bool Matcher::accepting() const { return pda_.flags(state_) & Pda::kAccept; }
bool Matcher::can_continue() const { return pda_.live(state_); }

int64_t Matcher::advance(int32_t id) {
  const Vocab& v = g_->vocab();
  if (id < 0 || id >= v.size()) return -1;
  uint32_t s;
  if (v.is_added(id)) {
    s = pda_.step_token(state_, id);
  } else {
    const std::string& t = v.text(id);
    if (t.empty()) return -1;
    s = state_;
    for (size_t i = 0; i < t.size(); ++i) {
      s = pda_.step(s, uint8_t(t[i]));
      if (!pda_.live(s) && (i + 1 < t.size() || !(pda_.flags(s) & Pda::kAccept))) return -1;
    }
  }
  if (!pda_.live(s) && !(pda_.flags(s) & Pda::kAccept)) return -1;
  return s;
}

bool Matcher::allows(int32_t id) { return advance(id) >= 0; }

bool Matcher::accept_token(int32_t id) {
  int64_t s = advance(id);
  if (s < 0) return false;
  state_ = uint32_t(s);
  if (pda_.bytes() > max_bytes_) compact();
  return true;
}

void Matcher::compact() {
  Pda fresh(g_->flat());
  state_ = fresh.import(pda_, state_);
  pda_ = std::move(fresh);
  memo_.clear();
}

bool Matcher::accept_bytes(std::string_view bytes) {
  uint32_t s = state_;
  for (size_t i = 0; i < bytes.size(); ++i) {
    s = pda_.step(s, uint8_t(bytes[i]));
    if (!pda_.live(s) && (i + 1 < bytes.size() || !(pda_.flags(s) & Pda::kAccept))) return false;
  }
  state_ = s;
  return true;
}

void Matcher::check_uncertain(uint32_t leaf, const PositionMask& pm, std::span<uint32_t> mask) {
  if (pm.suffixes.empty()) return;
  if (walk_.size() < 64) walk_.resize(64);
  walk_[0] = pda_.expand(pda_.parent(leaf));  // the caller's continuation after the leaf's rule ends
  size_t prev_len = 0, dead_at = SIZE_MAX;     // previous suffix: length walked, depth where it died
  for (size_t i = 0; i < pm.suffixes.size(); ++i) {
    size_t lcp = pm.suffix_lcp[i];
    if (lcp >= dead_at) continue;  // shares the prefix that already failed
    const std::string& t = pm.suffixes[i];
    if (t.size() >= walk_.size()) walk_.resize(t.size() * 2);
    size_t d = std::min(lcp, prev_len);
    dead_at = SIZE_MAX;
    uint32_t s = walk_[d];
    for (; d < t.size(); ++d) {
      s = pda_.step(s, uint8_t(t[d]));
      walk_[d + 1] = s;
      if (!pda_.live(s)) {
        if (d + 1 < t.size() || !(pda_.flags(s) & Pda::kAccept)) dead_at = d + 1;
        break;
      }
    }
    prev_len = dead_at == SIZE_MAX ? t.size() : dead_at - 1;
    if (dead_at == SIZE_MAX)
      for (uint32_t j = pm.suffix_begin[i]; j < pm.suffix_begin[i + 1]; ++j) set_bit(mask, pm.suffix_tokens[j]);
  }
}

void Matcher::fill_mask(std::span<uint32_t> mask) {
  const Vocab& v = g_->vocab();
  size_t words = v.mask_words();
  for (Memo& m : memo_)
    if (m.state == state_) {
      m.used = ++tick_;
      std::copy(m.mask.begin(), m.mask.end(), mask.begin());
      std::fill(mask.begin() + long(words), mask.end(), 0);
      return;
    }
  std::fill(mask.begin(), mask.end(), 0);
  for (uint32_t leaf : std::vector<uint32_t>(pda_.leaves(state_).begin(), pda_.leaves(state_).end())) {
    uint32_t pos = pda_.pos(leaf);
    const Elem& e = g_->flat().elems[pos];
    if (e.kind == Kind::token) {
      if (int32_t(e.arg) < v.size()) set_bit(mask, int32_t(e.arg));
      continue;
    }
    const PositionMask* pm = g_->position(pos);
    if (!pm) continue;
    if (!pm->accepted_bits.empty()) {
      for (size_t w = 0; w < words; ++w) mask[w] |= pm->accepted_bits[w];
    } else {
      for (int32_t id : pm->accepted_ids) set_bit(mask, id);
    }
    check_uncertain(leaf, *pm, mask);
  }
  for (auto [kept, dup] : v.duplicates())
    if ((mask[size_t(kept) >> 5] >> (kept & 31)) & 1) set_bit(mask, dup);
  // Remember it (small LRU).
  if (memo_size_ == 0) return;
  Memo* slot;
  if (memo_.size() < memo_size_) {
    memo_.push_back({});
    slot = &memo_.back();
  } else {
    slot = &*std::min_element(memo_.begin(), memo_.end(), [](const Memo& a, const Memo& b) { return a.used < b.used; });
  }
  slot->state = state_;
  slot->used = ++tick_;
  slot->mask.assign(mask.begin(), mask.begin() + long(words));
}

}  // namespace lily::grammar
