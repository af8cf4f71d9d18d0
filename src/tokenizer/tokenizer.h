// Byte-level BPE tokenizer with Hugging Face `tokenizers` semantics for Qwen3 / Qwen3.5 / Qwen3.6
// (docs/chat.md §1). Encode: added tokens matched verbatim on the raw text (longest first) → NFC →
// Split pre-tokenizer (the regex from tokenizer.json, "Isolated") → ByteLevel byte map → BPE merges by rank.
// Decode: ByteLevel inverse, invalid UTF-8 replaced with U+FFFD. StreamDecoder emits only whole code points.
#pragma once
#include "util/utf8.h"  // utf8_lossy: token_text() bytes as displayable text
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lily {

class Tokenizer {
 public:
  // `path` is a model directory (reads tokenizer.json and, when present, the extra added tokens that only
  // tokenizer_config.json's added_tokens_decoder declares) or a tokenizer.json file. Throws lily::Error
  // naming the file and field on anything lily does not implement exactly.
  static Tokenizer load(const std::string& path);
  // Token ids (vocabulary and added) must be below this (2^24; Qwen3.6 uses 248077): the id tables are sized
  // by the largest id, so a bigger one is refused at load rather than allocated.
  static constexpr int32_t kMaxVocab = 1 << 24;

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // parse_special = true: every added token literal in `text` becomes its id (HF semantics).
  // parse_special = false: literals of added tokens marked special (<|im_start|>, ...) are encoded as plain
  // text; non-special added tokens (<think>, <tool_call>, ...) are still matched (HF split_special_tokens).
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // Concatenated token bytes, decoded as UTF-8 with U+FFFD for invalid sequences. skip_special drops the
  // added tokens marked special (not <think>/<tool_call>, which are special: false).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The raw bytes of one token (byte map undone; may be a partial UTF-8 sequence). Throws on a bad id.
  std::string token_text(int32_t id) const;
  // Id of a token whose raw text is exactly `literal` (a vocabulary entry or an added token).
  std::optional<int32_t> token_id(std::string_view literal) const;
  // 1 + the largest id (vocabulary and added tokens); not the model's padded vocab_size.
  int32_t vocab_size() const;
  // True for added tokens marked special: true.
  bool is_special(int32_t id) const;
  bool is_added(int32_t id) const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer: push ids one at a time and receive the text completed so far. A token may end
// inside a UTF-8 sequence (🎉 is two tokens); those bytes are held until the code point completes. An
// invalid sequence is emitted as U+FFFD as soon as it is known invalid; flush() emits what remains (an
// incomplete tail as U+FFFD). push() output concatenated with flush() == Tokenizer::decode of the same ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false) : tok_(&tok), skip_special_(skip_special) {}
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence (at most 3)
};

}  // namespace lily
