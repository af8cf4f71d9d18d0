// Tokenizer::load: reads tokenizer.json (and, for a model directory, tokenizer_config.json's extra added
// tokens), checks that it is the kind of tokenizer lily reproduces exactly, and builds the tables.
// note: the vocabulary and merges (~250k entries each) are read by a small dedicated JSON scanner; the rest
// of the file is parsed with nlohmann::json. A full nlohmann DOM of the file takes ~0.5 s, the scanner ~0.05 s.
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tokenizer/impl.h"
#include "tokenizer/unicode.h"
#include "util/check.h"

namespace lily {

namespace {

using nlohmann::json;

std::string read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  LILY_CHECK(f, "cannot open ", path);
  std::string s;
  std::fseek(f, 0, SEEK_END);
  long n = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  // Token offsets are 32-bit and the whole file is held in memory: refuse absurd sizes before reading (Qwen's
  // tokenizer.json is 11 MB).
  constexpr long kMaxFile = 256L << 20;
  if (n > kMaxFile) {
    std::fclose(f);
    fail(path, ": ", n, " bytes is too large for a tokenizer file (at most ", kMaxFile, ")");
  }
  s.resize(size_t(n > 0 ? n : 0));
  size_t got = n > 0 ? std::fread(s.data(), 1, s.size(), f) : 0;
  std::fclose(f);
  LILY_CHECK(got == s.size(), "cannot read ", path);
  return s;
}

// Minimal JSON scanner over a complete document: skips values, decodes strings, walks objects and arrays.
struct Scanner {
  std::string_view s;
  std::string where;
  size_t i = 0;

  [[noreturn]] void bad(const char* what) const { fail(where, ": malformed JSON (", what, ") at byte ", i); }
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
  }
  char peek() {
    ws();
    if (i >= s.size()) bad("unexpected end");
    return s[i];
  }
  void expect(char c) {
    if (peek() != c) bad("unexpected character");
    ++i;
  }
  void skip_string() {
    ++i;  // opening quote
    while (true) {
      if (i >= s.size()) bad("unterminated string");
      char c = s[i++];
      if (c == '"') return;
      if (c == '\\') ++i;
    }
  }
  static void put_utf8(std::string& out, uint32_t cp) { unicode::append_utf8(out, cp); }
  uint32_t hex4() {
    if (i + 4 > s.size()) bad("short \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s[i++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f') v |= uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= uint32_t(c - 'A' + 10);
      else bad("bad \\u escape");
    }
    return v;
  }
  void read_string(std::string& out) {
    out.clear();
    expect('"');
    while (true) {
      size_t start = i;
      while (i < s.size() && s[i] != '"' && s[i] != '\\') ++i;
      out.append(s.data() + start, i - start);
      if (i >= s.size()) bad("unterminated string");
      if (s[i++] == '"') return;
      char e = s[i++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && i + 1 < s.size() && s[i] == '\\' && s[i + 1] == 'u') {
            i += 2;
            uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) bad("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xD800 && cp <= 0xDFFF) {
            bad("unpaired surrogate");
          }
          put_utf8(out, cp);
          break;
        }
        default: bad("bad escape");
      }
    }
  }
  // Skips one value and returns its raw text.
  std::string_view skip_value() {
    char c = peek();
    size_t start = i;
    if (c == '"') {
      skip_string();
    } else if (c == '{' || c == '[') {
      int depth = 0;
      do {
        char d = s[i];
        if (d == '"') {
          skip_string();
          continue;
        }
        if (d == '{' || d == '[') ++depth;
        else if (d == '}' || d == ']') --depth;
        ++i;
        if (i >= s.size() && depth) bad("unterminated container");
      } while (depth);
    } else {
      while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\n') ++i;
    }
    return s.substr(start, i - start);
  }
  // Calls f(key) for each member of the object at the cursor; f must consume the value.
  template <typename F>
  void object(F&& f) {
    expect('{');
    std::string key;
    if (peek() == '}') {
      ++i;
      return;
    }
    while (true) {
      read_string(key);
      expect(':');
      f(key);
      char c = peek();
      ++i;
      if (c == '}') return;
      if (c != ',') bad("expected , or }");
    }
  }
  template <typename F>
  void array(F&& f) {
    expect('[');
    if (peek() == ']') {
      ++i;
      return;
    }
    while (true) {
      f();
      char c = peek();
      ++i;
      if (c == ']') return;
      if (c != ',') bad("expected , or ]");
    }
  }
};

// GPT-2 ByteLevel alphabet: byte → code point, and code point → byte (-1 when not in the alphabet).
struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> to_byte{};
  ByteMap() {
    to_byte.fill(-1);
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      to_cp[b] = keep ? b : 256 + n++;
      to_byte[to_cp[b]] = int16_t(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

std::string dump(const json& j) { return j.dump(); }

void check_field(bool ok, const std::string& file, const std::string& field, const json& value, const char* want) {
  if (!ok) fail(file, ": field ", field, " is ", dump(value), "; lily supports only ", want);
}

bool null_or_empty(const json& j) { return j.is_null() || (j.is_string() && j.get<std::string>().empty()); }

AddedToken parse_added(const json& t, const std::string& file, const std::string& field) {
  AddedToken a;
  LILY_CHECK(t.contains("content") && t["content"].is_string(), file, ": ", field, " has no string content");
  a.content = t["content"].get<std::string>();
  LILY_CHECK(!a.content.empty(), file, ": ", field, " has an empty content");
  auto flag = [&](const char* k, bool def) { return t.contains(k) && t[k].is_boolean() ? t[k].get<bool>() : def; };
  a.special = flag("special", false);
  a.normalized = flag("normalized", !a.special);
  a.lstrip = flag("lstrip", false);
  a.rstrip = flag("rstrip", false);
  check_field(!flag("single_word", false), file, field + ".single_word", true, "false");
  return a;
}

void check_pretokenizer(const json& p, Tokenizer::Impl& t, const std::string& file) {
  const std::string f = "pre_tokenizer";
  const char* want = R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":...},)"
                     R"("behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,)"
                     R"("use_regex":false}]})";
  check_field(p.is_object() && p.value("type", "") == "Sequence" && p.contains("pretokenizers") &&
                  p["pretokenizers"].is_array() && p["pretokenizers"].size() == 2,
              file, f, p, want);
  const json& split = p["pretokenizers"][0];
  const json& bl = p["pretokenizers"][1];
  check_field(split.value("type", "") == "Split", file, f + ".pretokenizers[0].type", split.value("type", json()),
              "\"Split\"");
  check_field(split.contains("pattern") && split["pattern"].is_object() && split["pattern"].contains("Regex") &&
                  split["pattern"]["Regex"].is_string(),
              file, f + ".pretokenizers[0].pattern", split.value("pattern", json()), "{\"Regex\": \"...\"}");
  check_field(split.value("behavior", "") == "Isolated", file, f + ".pretokenizers[0].behavior",
              split.value("behavior", json()), "\"Isolated\"");
  check_field(split.value("invert", false) == false, file, f + ".pretokenizers[0].invert", split.value("invert", json()), "false");
  check_field(bl.value("type", "") == "ByteLevel", file, f + ".pretokenizers[1].type", bl.value("type", json()),
              "\"ByteLevel\"");
  check_field(bl.value("add_prefix_space", false) == false, file, f + ".pretokenizers[1].add_prefix_space",
              bl.value("add_prefix_space", json()), "false");
  check_field(bl.value("use_regex", true) == false, file, f + ".pretokenizers[1].use_regex",
              bl.value("use_regex", json()), "false");
  t.splitter.emplace(split["pattern"]["Regex"].get<std::string>(), file + ": " + f + ".pretokenizers[0].pattern");
}

// Appends the HF ByteLevel decoding of one token string to `out`: mapped bytes if every character is in the
// alphabet, else the token's own UTF-8.
void append_token_bytes(std::string& out, std::string_view s) {
  const ByteMap& m = byte_map();
  size_t start = out.size();
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = unicode::next_cp(s, i);
    if (cp >= m.to_byte.size() || m.to_byte[cp] < 0) {
      out.resize(start);
      out.append(s);
      return;
    }
    out.push_back(char(m.to_byte[cp]));
  }
}

struct Span {
  uint32_t start, len;
};

void read_model(Scanner& sc, Tokenizer::Impl& t, const std::string& file) {
  std::vector<std::pair<int32_t, Span>> vocab;  // id, raw bytes in t.arena
  std::string merge_arena;                      // raw bytes of each merge's left then right token
  std::vector<std::pair<Span, Span>> merges;
  std::string tok, tok2;
  sc.object([&](const std::string& key) {
    if (key == "vocab") {
      vocab.reserve(262144);
      t.arena.reserve(4 << 20);
      sc.object([&](const std::string& k) {
        std::string_view v = sc.skip_value();
        int64_t id = 0;
        for (char c : v) {
          if (c < '0' || c > '9') fail(file, ": model.vocab[\"", k, "\"] is not a non-negative integer id");
          id = id * 10 + (c - '0');
          if (id >= Tokenizer::kMaxVocab)
            fail(file, ": model.vocab[\"", k, "\"] id ", v, " is too large (ids must be below ", Tokenizer::kMaxVocab,
                 ")");
        }
        uint32_t start = uint32_t(t.arena.size());
        append_token_bytes(t.arena, k);
        vocab.emplace_back(int32_t(id), Span{start, uint32_t(t.arena.size() - start)});
      });
    } else if (key == "merges") {
      merges.reserve(262144);
      merge_arena.reserve(4 << 20);
      sc.array([&]() {
        if (sc.peek() == '"') {
          sc.read_string(tok);
          size_t sp = tok.find(' ');
          if (sp == std::string::npos || tok.find(' ', sp + 1) != std::string::npos)
            fail(file, ": model.merges[", merges.size(), "] = \"", tok, "\" is not two tokens separated by one space");
          tok2 = tok.substr(sp + 1);
          tok.resize(sp);
        } else {
          sc.expect('[');
          sc.read_string(tok);
          sc.expect(',');
          sc.read_string(tok2);
          sc.expect(']');
        }
        uint32_t a = uint32_t(merge_arena.size());
        append_token_bytes(merge_arena, tok);
        uint32_t b = uint32_t(merge_arena.size());
        append_token_bytes(merge_arena, tok2);
        merges.emplace_back(Span{a, b - a}, Span{b, uint32_t(merge_arena.size() - b)});
      });
    } else {
      json v = json::parse(sc.skip_value());
      std::string f = "model." + key;
      if (key == "type") check_field(v == "BPE", file, f, v, "\"BPE\"");
      else if (key == "dropout") check_field(v.is_null(), file, f, v, "null");
      else if (key == "unk_token") check_field(v.is_null(), file, f, v, "null");
      else if (key == "continuing_subword_prefix" || key == "end_of_word_suffix")
        check_field(null_or_empty(v), file, f, v, "null or \"\"");
      else if (key == "byte_fallback") check_field(v == false, file, f, v, "false");
      else if (key == "ignore_merges") t.ignore_merges = v.is_boolean() && v.get<bool>();
    }
  });
  LILY_CHECK(!vocab.empty(), file, ": model.vocab is missing or empty");
  int32_t max_id = 0;
  for (const auto& [id, sp] : vocab) max_id = std::max(max_id, id);
  t.id_start.assign(size_t(max_id) + 1, 0);
  t.id_len.assign(size_t(max_id) + 1, 0);
  t.id_flags.assign(size_t(max_id) + 1, 0);
  t.bytes_to_id.reserve(vocab.size());
  for (const auto& [id, sp] : vocab) {
    LILY_CHECK(!(t.id_flags[id] & kIdExists), file, ": model.vocab has id ", id, " twice");
    int32_t have = t.bytes_to_id.insert(std::string_view(t.arena).substr(sp.start, sp.len), id);
    LILY_CHECK(have == id, file, ": model.vocab entries ", have, " and ", id,
               " decode to the same bytes (not a byte-level vocabulary)");
    t.id_start[id] = sp.start;
    t.id_len[id] = sp.len;
    t.id_flags[id] = kIdExists;
  }
  for (int b = 0; b < 256; ++b) {
    char c = char(b);
    t.byte_id[b] = t.bytes_to_id.find(std::string_view(&c, 1));
    LILY_CHECK(t.byte_id[b] >= 0, file, ": model.vocab lacks the ByteLevel token for byte ", b,
               " (not a byte-level BPE vocabulary)");
  }
  t.merges.reserve(merges.size());
  std::string_view ma(merge_arena);
  for (size_t r = 0; r < merges.size(); ++r) {
    auto [a, b] = merges[r];
    auto find = [&](uint32_t start, uint32_t len) {
      int32_t id = t.bytes_to_id.find(ma.substr(start, len));
      if (id < 0)
        fail(file, ": model.merges[", r, "] uses a token that is not in model.vocab (bytes \"",
             utf8_lossy(ma.substr(start, len)), "\")");
      return id;
    };
    t.merges.insert(find(a.start, a.len), find(b.start, b.len), int32_t(r), find(a.start, a.len + b.len));
  }
}

void add_token(Tokenizer::Impl& t, AddedToken a, const std::string& file) {
  if (size_t(a.id) >= t.id_flags.size()) {
    t.id_start.resize(size_t(a.id) + 1, 0);
    t.id_len.resize(size_t(a.id) + 1, 0);
    t.id_flags.resize(size_t(a.id) + 1, 0);
  }
  // Added tokens decode through the same ByteLevel rule as vocabulary entries (HF decoder behaviour).
  t.id_start[a.id] = uint32_t(t.added_arena.size());
  append_token_bytes(t.added_arena, a.content);
  t.id_len[a.id] = uint32_t(t.added_arena.size() - t.id_start[a.id]);
  t.id_flags[a.id] = kIdExists | kIdAdded | (a.special ? kIdSpecial : 0);
  t.added_to_id[a.content] = a.id;
  (a.normalized ? t.added_normalized : t.added_raw).tokens.push_back(std::move(a));
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::string file = path, config;
  if (fs::is_directory(path)) {
    file = (fs::path(path) / "tokenizer.json").string();
    config = (fs::path(path) / "tokenizer_config.json").string();
    LILY_CHECK(fs::exists(file), "no tokenizer.json in model directory ", path);
    if (!fs::exists(config)) config.clear();
  }
  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  t.source = file;
  std::string text = read_file(file);
  Scanner sc{text, file};
  json added = json::array();
  bool have_model = false, have_pre = false;
  sc.object([&](const std::string& key) {
    if (key == "model") {
      read_model(sc, t, file);
      have_model = true;
      return;
    }
    json v = json::parse(sc.skip_value());
    if (key == "added_tokens") added = v;
    else if (key == "truncation" || key == "padding") check_field(v.is_null(), file, key, v, "null");
    else if (key == "normalizer") {
      check_field(v.is_null() || (v.is_object() && v.value("type", "") == "NFC"), file, key, v,
                  "{\"type\": \"NFC\"} or null");
      t.nfc = !v.is_null();
    } else if (key == "pre_tokenizer") {
      check_pretokenizer(v, t, file);
      have_pre = true;
    } else if (key == "post_processor") {
      check_field(v.is_null() || (v.is_object() && v.value("type", "") == "ByteLevel"), file, key, v,
                  "null or {\"type\": \"ByteLevel\", ...} (no added BOS/EOS)");
    } else if (key == "decoder") {
      check_field(v.is_object() && v.value("type", "") == "ByteLevel", file, key, v, "{\"type\": \"ByteLevel\", ...}");
    }
  });
  LILY_CHECK(have_model, file, ": no model");
  LILY_CHECK(have_pre, file, ": no pre_tokenizer");
  check_field(added.is_array(), file, "added_tokens", added, "an array");
  for (size_t k = 0; k < added.size(); ++k) {
    std::string f = "added_tokens[" + std::to_string(k) + "]";
    AddedToken a = parse_added(added[k], file, f);
    const json* id = added[k].is_object() && added[k].contains("id") ? &added[k]["id"] : nullptr;
    if (!id || !id->is_number_integer() || (!id->is_number_unsigned() && id->get<int64_t>() < 0))
      fail(file, ": ", f, ".id is not a non-negative integer");
    if (id->get<uint64_t>() >= uint64_t(Tokenizer::kMaxVocab))
      fail(file, ": ", f, ".id = ", id->dump(), " is too large (ids must be below ", Tokenizer::kMaxVocab, ")");
    a.id = static_cast<int32_t>(id->get<uint64_t>());
    add_token(t, std::move(a), file);
  }
  if (!config.empty()) {
    json c = json::parse(read_file(config), nullptr, false);
    LILY_CHECK(!c.is_discarded(), config, ": not valid JSON");
    if (c.contains("added_tokens_decoder") && c["added_tokens_decoder"].is_object()) {
      for (const auto& [k, v] : c["added_tokens_decoder"].items()) {
        std::string f = "added_tokens_decoder[" + k + "]";
        int64_t id = 0;
        auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), id);
        if (ec == std::errc::result_out_of_range || (ec == std::errc() && end == k.data() + k.size() && id >= 0 &&
                                                    id >= Tokenizer::kMaxVocab))
          fail(config, ": ", f, " id is too large (ids must be below ", Tokenizer::kMaxVocab, ")");
        if (ec != std::errc() || end != k.data() + k.size() || k.empty() || id < 0)
          fail(config, ": ", f, " key is not a non-negative integer id");
        if (size_t(id) < t.id_flags.size() && (t.id_flags[id] & kIdExists)) continue;  // already declared
        AddedToken a = parse_added(v, config, f);
        a.id = static_cast<int32_t>(id);
        add_token(t, std::move(a), config);
      }
    }
  }
  // The literal matcher indexes its tokens with 16 bits (Qwen3.6 has 33 added tokens).
  constexpr size_t kMaxAdded = 65536;
  if (t.added_raw.tokens.size() > kMaxAdded || t.added_normalized.tokens.size() > kMaxAdded)
    fail(file, ": added_tokens has ", t.added_raw.tokens.size() + t.added_normalized.tokens.size(),
         " entries; lily supports at most ", kMaxAdded, " of each kind (normalized or not)");
  t.added_raw.build();
  if (t.nfc)
    for (auto& a : t.added_normalized.tokens) a.content = unicode::nfc(a.content);
  t.added_normalized.build();
  return Tokenizer(std::move(impl));
}

}  // namespace lily
