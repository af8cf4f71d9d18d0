// Tokenizer encode/decode and StreamDecoder (see tokenizer.h; loading is in load.cpp).
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstring>

#include "tokenizer/impl.h"
#include "tokenizer/unicode.h"
#include "util/check.h"

namespace lily {

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

void AddedMatcher::build() {
  for (auto& v : by_first) v.clear();
  std::vector<uint16_t> order(tokens.size());
  for (size_t k = 0; k < tokens.size(); ++k) order[k] = uint16_t(k);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint16_t a, uint16_t b) { return tokens[a].content.size() > tokens[b].content.size(); });
  for (uint16_t k : order) by_first[static_cast<unsigned char>(tokens[k].content[0])].push_back(k);
}

bool AddedMatcher::find(std::string_view s, size_t from, size_t& at, const AddedToken*& tok) const {
  for (size_t i = from; i < s.size(); ++i) {
    const auto& cands = by_first[static_cast<unsigned char>(s[i])];
    for (uint16_t k : cands) {
      const std::string& c = tokens[k].content;
      if (c.size() <= s.size() - i && std::memcmp(s.data() + i, c.data(), c.size()) == 0) {
        at = i;
        tok = &tokens[k];
        return true;
      }
    }
  }
  return false;
}

namespace {

// Splits `s` on the added tokens of `m` (HF AddedVocabulary::find_matches): calls on_text(b, e) for text
// between tokens and on_token(id) for each token. With parse_special false, special tokens are left as text.
template <typename T, typename K>
void split_added(const AddedMatcher& m, std::string_view s, bool parse_special, T&& on_text, K&& on_token) {
  size_t text_start = 0, search = 0, at;
  const AddedToken* tok;
  while (!m.empty() && m.find(s, search, at, tok)) {
    size_t stop = at + tok->content.size();
    if (tok->special && !parse_special) {
      search = stop;
      continue;
    }
    size_t start = at;
    if (tok->lstrip) {  // swallow White_Space before the token, not past the previous split
      size_t j = start;
      while (j > text_start) {
        size_t k = j - 1;
        while (k > text_start && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t q = k;
        if (!unicode::is_white_space(unicode::next_cp(s, q))) break;
        j = k;
      }
      start = j;
    }
    if (tok->rstrip) {
      while (stop < s.size()) {
        size_t q = stop;
        if (!unicode::is_white_space(unicode::next_cp(s, q))) break;
        stop = q;
      }
    }
    if (start > text_start) on_text(text_start, start);
    on_token(tok->id);
    text_start = search = stop;
  }
  if (text_start < s.size()) on_text(text_start, s.size());
}

}  // namespace

void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    int32_t id = bytes_to_id.find(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  int32_t small[64];
  std::vector<int32_t> big;
  int32_t* sym = small;
  if (piece.size() > 64) {
    big.resize(piece.size());
    sym = big.data();
  }
  for (size_t i = 0; i < piece.size(); ++i) sym[i] = byte_id[static_cast<unsigned char>(piece[i])];
  bpe_merge(merges, std::span<const int32_t>(sym, piece.size()), out);
}

void Tokenizer::Impl::encode_normalized(std::string_view text, bool parse_special, std::vector<int32_t>& out) const {
  auto pieces = [&](std::string_view seg) {
    splitter->split(seg, [&](size_t b, size_t e) { encode_piece(seg.substr(b, e - b), out); });
  };
  if (added_normalized.empty()) {
    pieces(text);
    return;
  }
  split_added(
      added_normalized, text, parse_special, [&](size_t b, size_t e) { pieces(text.substr(b, e - b)); },
      [&](int32_t id) { out.push_back(id); });
}

void Tokenizer::Impl::encode_text(std::string_view text, bool parse_special, std::vector<int32_t>& out) const {
  auto segment = [&](size_t b, size_t e) {
    std::string_view seg = text.substr(b, e - b);
    if (nfc && !unicode::nfc_quick_yes(seg)) {
      std::string norm = unicode::nfc(seg);
      encode_normalized(norm, parse_special, out);
    } else {
      encode_normalized(seg, parse_special, out);
    }
  };
  split_added(added_raw, text, parse_special, segment, [&](int32_t id) { out.push_back(id); });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  size_t bad = unicode::find_invalid_utf8(text);
  LILY_CHECK(bad == std::string_view::npos, "tokenizer: the text to encode is not valid UTF-8 (byte ", bad, " of ",
             text.size(), ")");
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  impl_->encode_text(text, parse_special, out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    LILY_CHECK(id >= 0 && size_t(id) < impl_->id_flags.size() && (impl_->id_flags[id] & kIdExists),
               "tokenizer: token id ", id, " is not in the vocabulary of ", impl_->source);
    bytes += impl_->bytes_of(id);
  }
  return unicode::utf8_lossy(bytes);
}

std::string Tokenizer::token_text(int32_t id) const {
  LILY_CHECK(id >= 0 && size_t(id) < impl_->id_flags.size() && (impl_->id_flags[id] & kIdExists),
             "tokenizer: token id ", id, " is not in the vocabulary of ", impl_->source);
  return std::string(impl_->bytes_of(id));
}

std::optional<int32_t> Tokenizer::token_id(std::string_view literal) const {
  auto a = impl_->added_to_id.find(std::string(literal));
  if (a != impl_->added_to_id.end()) return a->second;
  int32_t v = impl_->bytes_to_id.find(literal);
  if (v >= 0) return v;
  return std::nullopt;
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->id_flags.size()); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->id_flags.size() && (impl_->id_flags[id] & kIdSpecial);
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->id_flags.size() && (impl_->id_flags[id] & kIdAdded);
}

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tok_->is_special(id)) return {};
  pending_ += tok_->token_text(id);
  size_t tail = unicode::incomplete_utf8_tail(pending_);
  std::string out = unicode::utf8_lossy(std::string_view(pending_).substr(0, pending_.size() - tail));
  pending_.erase(0, pending_.size() - tail);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = unicode::utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace lily
