// Token masks over a tokenizer's vocabulary. The vocabulary's byte strings form a trie (DFS order); the mask
// of a matcher state is the set of tokens whose bytes the automaton can consume from there. Per grammar position
// (a byte-class element) the compile step walks the trie once with the position taken out of context (its rule's
// caller unknown) and sorts tokens into accepted (consumed inside the rule: valid in any context), rejected, and
// uncertain (they run past the end of the rule; their fate depends on the stack). An uncertain token is stored by
// the suffixes that would follow the rule's end (one per point where the rule can end inside the token and the
// next byte can follow the rule somewhere in the grammar). At decode time the mask is the union over the state's
// stacks of the accepted set plus the tokens of the suffixes that the stack's caller accepts: the distinct
// suffixes are few (",", "}", ": ", ...) and are walked in sorted order so that shared prefixes are stepped once. Added tokens (<|im_end|>, <tool_call>, ...) are
// not text: a grammar allows them only through `token` elements.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/pda.h"

namespace lily {
class Tokenizer;
}

namespace lily::grammar {

class Vocab {
 public:
  static std::shared_ptr<const Vocab> build(const Tokenizer& tok);
  // For tests: token i has bytes texts[i]; ids in `added` are special (not text).
  static std::shared_ptr<const Vocab> build(std::vector<std::string> texts, std::vector<int32_t> added);

  struct TrieNode {
    uint8_t byte;
    uint16_t depth;   // 1 for the root's children
    int32_t token;    // token ending here, -1 if none
    uint32_t end;     // one past this node's subtree
  };
  int32_t size() const { return int32_t(texts_.size()); }
  size_t mask_words() const { return (texts_.size() + 31) / 32; }
  const std::string& text(int32_t id) const { return texts_[size_t(id)]; }
  bool is_added(int32_t id) const { return added_[size_t(id)]; }
  const std::vector<TrieNode>& trie() const { return trie_; }  // [0] is the root
  // Tokens with the same bytes as another (the trie keeps one): pairs (kept token, duplicate).
  const std::vector<std::pair<int32_t, int32_t>>& duplicates() const { return dups_; }

 private:
  void build_trie();
  std::vector<std::string> texts_;
  std::vector<uint8_t> added_;
  std::vector<TrieNode> trie_;
  std::vector<std::pair<int32_t, int32_t>> dups_;
};

// The precomputed token classes of one grammar position.
struct PositionMask {
  std::vector<uint32_t> accepted_bits;   // bitset over the vocabulary when the accepted set is large, else empty
  std::vector<int32_t> accepted_ids;     // the accepted set when small
  std::vector<std::string> suffixes;     // [suffix] sorted, distinct: bytes after a possible end of the rule
  std::vector<uint16_t> suffix_lcp;      // [suffix] common prefix length with the previous suffix
  std::vector<uint32_t> suffix_begin;    // [suffix + 1] range of suffix_tokens
  std::vector<int32_t> suffix_tokens;    // uncertain tokens per suffix
};

class CompiledGrammar {
 public:
  // Throws GrammarError (invalid grammar) — see grammar.h.
  static std::shared_ptr<const CompiledGrammar> compile(const Grammar& g, std::shared_ptr<const Vocab> vocab);

  const Flat& flat() const { return flat_; }
  const Vocab& vocab() const { return *vocab_; }
  const PositionMask* position(uint32_t pos) const {
    auto it = index_.find(pos);
    return it == index_.end() ? nullptr : masks_[it->second].get();
  }
  // Memory held by this compiled grammar (vocabulary excluded; masks shared with other grammars counted too).
  size_t bytes() const { return bytes_; }
  size_t positions_shared() const { return shared_; }  // masks found in the process-wide cache
  double compile_ms() const { return compile_ms_; }
  size_t uncertain_total() const;  // (suffix, token) pairs over positions (diagnostics)

 private:
  Flat flat_;
  std::shared_ptr<const Vocab> vocab_;
  std::unordered_map<uint32_t, uint32_t> index_;  // position -> masks_ index
  std::vector<std::shared_ptr<const PositionMask>> masks_;  // some shared with other grammars (same context)
  size_t bytes_ = 0, shared_ = 0;
  double compile_ms_ = 0;
};

// One generation's walk through a compiled grammar. Not thread-safe; cheap to create.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> g);

  // Bits of the tokens the grammar allows next (end-of-output ids are the caller's: see accepting()).
  // mask.size() >= vocab().mask_words(); words past the vocabulary are zeroed.
  void fill_mask(std::span<uint32_t> mask);
  // Advances by one token; false (state unchanged) if the grammar does not allow it.
  bool accept_token(int32_t id);
  bool accept_bytes(std::string_view bytes);  // text only, for tests
  bool allows(int32_t id);  // accept_token without advancing (slow path, for tests)
  bool accepting() const;   // the output so far is a complete sentence (end of output allowed)
  bool can_continue() const;  // some byte or token can follow
  void reset();
  size_t bytes() const { return pda_.bytes(); }
  // The automaton caches every stack and state it meets; past this size it restarts from the current state.
  void set_max_bytes(size_t b) { max_bytes_ = b; }
  void set_memo_size(size_t n) { memo_size_ = n; memo_.clear(); }  // masks remembered by state (0: none)

 private:
  void compact();
  int64_t advance(int32_t id);  // the state after `id`, -1 if not allowed
  void check_uncertain(uint32_t leaf, const PositionMask& pm, std::span<uint32_t> mask);

  std::shared_ptr<const CompiledGrammar> g_;
  Pda pda_;
  uint32_t state_;
  std::vector<uint32_t> walk_;  // [depth] states while walking uncertain tokens
  // Last masks by state (a string body or a number repeats its state token after token).
  struct Memo {
    uint32_t state;
    uint64_t used;
    std::vector<uint32_t> mask;
  };
  std::vector<Memo> memo_;
  uint64_t tick_ = 0;
  size_t max_bytes_ = size_t(64) << 20;
  size_t memo_size_ = 8;
};

}  // namespace lily::grammar
