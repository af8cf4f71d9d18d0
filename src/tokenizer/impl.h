// Tokenizer internals shared by load.cpp (building from tokenizer.json) and tokenizer.cpp (encode/decode).
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "util/hash_table.h"

namespace lily {

enum : uint8_t { kIdExists = 1, kIdAdded = 2, kIdSpecial = 4 };

struct AddedToken {
  std::string content;  // literal matched in text (raw UTF-8)
  int32_t id = -1;
  bool special = false, normalized = false, lstrip = false, rstrip = false;
};

// Leftmost-longest literal matcher over the added tokens of one kind (normalized or not).
struct AddedMatcher {
  std::vector<AddedToken> tokens;
  std::array<std::vector<uint16_t>, 256> by_first;  // token indices by first byte, longest content first
  void build();
  bool empty() const { return tokens.empty(); }
  // Finds the leftmost position >= from where a token matches, preferring the longest; returns false if none.
  bool find(std::string_view s, size_t from, size_t& at, const AddedToken*& tok) const;
};

// Open-addressing map from byte strings (views into an arena owned by the caller) to ids.
class StrMap {
 public:
  void reserve(size_t n) { table_.reserve(n); }
  // Inserts key → id unless the key exists; returns the id stored for the key.
  int32_t insert(std::string_view key, int32_t id) {
    bool fresh;
    Slot& s = table_.insert(hash(key), [key](const Slot& s) { return s.view() == key; }, fresh);
    if (fresh) s = Slot{key.data(), uint32_t(key.size()), id};
    return s.id;
  }
  int32_t find(std::string_view key) const {  // -1 when absent
    const Slot* s = table_.find(hash(key), [key](const Slot& s) { return s.view() == key; });
    return s ? s->id : -1;
  }

 private:
  static uint64_t hash(std::string_view s) {  // FNV-1a, length folded in, high bits folded down
    uint64_t h = 0xcbf29ce484222325ULL ^ s.size();
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
    return h ^ (h >> 31);
  }
  struct Slot {
    const char* data = nullptr;  // key bytes (in the caller's arena)
    uint32_t len = 0;            // key length
    int32_t id = -1;             // -1: empty
    std::string_view view() const { return {data, len}; }
  };
  struct Hooks {
    static bool empty(const Slot& s) { return s.id < 0; }
    static uint64_t hash(const Slot& s) { return StrMap::hash(s.view()); }
  };
  OpenHashTable<Slot, Hooks> table_;
};

struct Tokenizer::Impl {
  std::string source;                 // path of tokenizer.json (for messages)
  std::string arena;                  // raw bytes of every vocabulary token, back to back
  std::string added_arena;            // raw bytes of every added token (kept apart so `arena` never moves)
  std::vector<uint32_t> id_start;     // [vocab_size] token id's bytes = arena[id_start[id], + id_len[id])
  std::vector<uint32_t> id_len;       // [vocab_size]
  std::vector<uint8_t> id_flags;      // [vocab_size] bit0: exists, bit1: added, bit2: special
  StrMap bytes_to_id;                 // vocabulary entries by raw bytes (views into arena)
  std::unordered_map<std::string, int32_t> added_to_id;  // added tokens by content
  std::array<int32_t, 256> byte_id{};  // id of the single-byte token for each byte
  MergeTable merges;
  bool ignore_merges = false;
  bool nfc = true;
  std::optional<Splitter> splitter;
  AddedMatcher added_raw;         // normalized: false — matched on the raw text
  AddedMatcher added_normalized;  // normalized: true — matched after NFC

  std::string_view bytes_of(int32_t id) const {
    return {((id_flags[id] & kIdAdded) ? added_arena : arena).data() + id_start[id], id_len[id]};
  }
  void encode_text(std::string_view text, bool parse_special, std::vector<int32_t>& out) const;
  void encode_normalized(std::string_view text, bool parse_special, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
};

}  // namespace lily
