// Vocabulary trie, per-position token classes (compile time) and masks (decode time).
#include "grammar/token_mask.h"

#include <algorithm>
#include <chrono>
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

// Classifies every token for position `pos` taken out of context (parent = kEscape).
PositionMask precompute(Pda& pda, const Vocab& vocab, uint32_t pos) {
  const auto& trie = vocab.trie();
  std::vector<int32_t> accepted, uncertain;
  std::vector<uint32_t> st(64);
  std::vector<uint8_t> sticky(64);
  st[0] = pda.single(pda.node(pos, Pda::kEscape));
  sticky[0] = 0;
  auto add_subtree = [&](uint32_t from, uint32_t to, std::vector<int32_t>& out) {
    for (uint32_t j = from; j < to; ++j)
      if (trie[j].token >= 0) out.push_back(trie[j].token);
  };
  for (uint32_t k = 1; k < trie.size();) {
    const Vocab::TrieNode& n = trie[k];
    if (n.depth >= st.size()) {
      st.resize(n.depth * 2);
      sticky.resize(n.depth * 2);
    }
    uint32_t s = pda.step(st[n.depth - 1], n.byte);
    bool live = pda.live(s);
    bool esc_now = pda.flags(s) & Pda::kEscaped;
    bool sticky_after = sticky[n.depth - 1] || esc_now;
    if (!live && !sticky_after) {
      k = n.end;
      continue;
    }
    if (n.token >= 0) (live || esc_now ? accepted : uncertain).push_back(n.token);
    if (!live) {  // only the caller's context can continue: every longer token is uncertain
      add_subtree(k + 1, n.end, uncertain);
      k = n.end;
      continue;
    }
    st[n.depth] = s;
    sticky[n.depth] = sticky_after;
    ++k;
  }
  for (auto [kept, dup] : vocab.duplicates()) {
    if (std::find(accepted.begin(), accepted.end(), kept) != accepted.end()) accepted.push_back(dup);
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
  pm.uncertain = std::move(uncertain);
  pm.uncertain_lcp.resize(pm.uncertain.size(), 0);
  for (size_t i = 1; i < pm.uncertain.size(); ++i) {
    const std::string& a = vocab.text(pm.uncertain[i - 1]);
    const std::string& b = vocab.text(pm.uncertain[i]);
    size_t l = 0;
    while (l < a.size() && l < b.size() && a[l] == b[l] && l < 65535) ++l;
    pm.uncertain_lcp[i] = uint16_t(l);
  }
  return pm;
}

}  // namespace

std::shared_ptr<const CompiledGrammar> CompiledGrammar::compile(const Grammar& g, std::shared_ptr<const Vocab> vocab) {
  auto t0 = std::chrono::steady_clock::now();
  auto cg = std::make_shared<CompiledGrammar>();
  cg->flat_ = flatten(g);
  cg->vocab_ = std::move(vocab);
  Pda pda(cg->flat_);
  size_t bytes = cg->flat_.elems.capacity() * sizeof(Elem) + cg->flat_.sets.capacity() * sizeof(ByteSet) +
                 (cg->flat_.alt_begin.capacity() + cg->flat_.alt_start.capacity()) * 4;
  for (uint32_t pos = 0; pos < cg->flat_.elems.size(); ++pos) {
    Kind k = cg->flat_.elems[pos].kind;
    if (k != Kind::bytes && k != Kind::star && k != Kind::opt) continue;
    cg->index_[pos] = uint32_t(cg->masks_.size());
    cg->masks_.push_back(precompute(pda, *cg->vocab_, pos));
    const PositionMask& pm = cg->masks_.back();
    bytes += pm.accepted_bits.capacity() * 4 + pm.accepted_ids.capacity() * 4 + pm.uncertain.capacity() * 4 +
             pm.uncertain_lcp.capacity() * 2 + 16;
  }
  cg->bytes_ = bytes + cg->index_.size() * 16;
  cg->compile_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return cg;
}

size_t CompiledGrammar::uncertain_total() const {
  size_t n = 0;
  for (const auto& m : masks_) n += m.uncertain.size();
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
  return true;
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
  const Vocab& v = g_->vocab();
  if (walk_.size() < 64) walk_.resize(64);
  walk_[0] = pda_.single(leaf);
  size_t prev_len = 0, dead_at = SIZE_MAX;  // previous token: length walked, depth where it died
  for (size_t i = 0; i < pm.uncertain.size(); ++i) {
    int32_t id = pm.uncertain[i];
    size_t lcp = i == 0 ? 0 : pm.uncertain_lcp[i];
    if (lcp >= dead_at) continue;  // shares the prefix that already failed
    const std::string& t = v.text(id);
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
    if (dead_at == SIZE_MAX) set_bit(mask, id);
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
  constexpr size_t kMemo = 8;
  Memo* slot;
  if (memo_.size() < kMemo) {
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
