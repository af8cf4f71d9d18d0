// The byte-level pushdown automaton over a Flat grammar. A stack is a chain of hash-consed nodes
// (position, parent): the leaf's position is the element to match next, each parent's position the return
// address after a rule reference. A rule referenced as the last element of an alternative is a tail call (no
// return node), so loops written as right recursion keep a constant stack. The automaton's state is the set of
// leaf nodes (all stacks alive after the bytes so far), interned so that a state seen again reuses its cached
// byte transitions — a lazily built DFA over the stacks actually reached.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "grammar/grammar.h"

namespace lily::grammar {

class Pda {
 public:
  static constexpr uint32_t kRoot = 0;    // parent of the root rule's frame: popping to it = grammar complete
  static constexpr uint32_t kEscape = 1;  // parent used when precomputing one position out of context
  static constexpr uint32_t kDead = 0;    // the state with no stacks
  enum Flags : uint8_t { kAccept = 1, kEscaped = 2 };

  explicit Pda(const Flat& g);

  uint32_t node(uint32_t pos, uint32_t parent);
  uint32_t pos(uint32_t node) const { return nodes_[node].pos; }
  uint32_t parent(uint32_t node) const { return nodes_[node].parent; }

  uint32_t initial();                  // the root rule expanded
  uint32_t single(uint32_t leaf);      // a state holding exactly this leaf (not expanded further)
  uint32_t expand(uint32_t node);      // the state reached by continuing at `node` (a return address)
  uint32_t step(uint32_t state, uint8_t byte);  // cached
  uint32_t step_token(uint32_t state, int32_t token);  // through `token` elements (uncached)
  std::span<const uint32_t> leaves(uint32_t state) const {
    const State& s = states_[state];
    return {leaf_arena_.data() + s.begin, s.size};
  }
  uint8_t flags(uint32_t state) const { return states_[state].flags; }
  bool live(uint32_t state) const { return states_[state].size > 0; }

  // The state of `other` (same grammar) rebuilt in this automaton: its stacks copied node by node.
  uint32_t import(const Pda& other, uint32_t state);

  size_t node_count() const { return nodes_.size(); }
  size_t state_count() const { return states_.size(); }
  size_t bytes() const;
  const Flat& flat() const { return *g_; }

 private:
  struct Node {
    uint32_t pos, parent;
  };
  struct State {
    uint32_t begin, size;  // leaves in leaf_arena_
    uint8_t flags;
    uint64_t hash;
    int32_t trans = -1;    // offset of this state's 256 cached transitions in trans_, -1 until first step
  };
  void closure(uint32_t node);
  uint32_t intern(uint8_t flags);  // interns scratch_ (sorted, unique) with flags

  const Flat* g_;
  std::vector<Node> nodes_;
  std::vector<uint64_t> node_keys_;  // open addressing: key = pos << 32 | parent, ~0 = empty
  std::vector<uint32_t> node_vals_;
  std::vector<State> states_;
  std::vector<uint32_t> leaf_arena_;
  std::vector<uint32_t> state_table_;  // open addressing over state ids, UINT32_MAX = empty
  std::vector<int32_t> trans_;         // [256 per stepped state] next state, -1 unknown
  // closure scratch
  std::vector<uint32_t> stamp_;        // [node] generation of the last visit
  uint32_t gen_ = 0;
  std::vector<uint32_t> work_, scratch_;
  uint8_t scratch_flags_ = 0;
};

}  // namespace lily::grammar
