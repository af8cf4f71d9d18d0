// Test harness for the output parser: turns a text with delimiter literals into simulated tokens (delimiters
// as their own ids, the text in between split by a chosen rule), runs the parser streaming and checks that the
// events rebuild the final result; compares results across tokenisations.
#pragma once
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "chat/output_parser.h"
#include "util/log.h"

namespace lily::chat::testing {

struct Tok {
  int32_t id;
  std::string text;
};

constexpr int32_t kTextId = 1000;  // any id that is not a delimiter

// Splits `s` at delimiter literals (<think>, </think>, <tool_call>, </tool_call>, <|im_end|>, <|endoftext|>);
// returns the segments in order, a delimiter segment carrying its id, a text segment kTextId.
inline std::vector<Tok> segments(std::string_view s, const DelimiterIds& ids) {
  const std::pair<std::string_view, int32_t> lits[] = {
      {"<think>", ids.think_open},        {"</think>", ids.think_close}, {"<tool_call>", ids.tool_open},
      {"</tool_call>", ids.tool_close},   {"<|im_end|>", ids.stop.at(0)}, {"<|endoftext|>", ids.stop.at(1)}};
  std::vector<Tok> out;
  std::string text;
  for (size_t i = 0; i < s.size();) {
    bool hit = false;
    for (const auto& [lit, id] : lits) {
      if (s.substr(i, lit.size()) == lit) {
        if (!text.empty()) out.push_back({kTextId, std::move(text)}), text.clear();
        out.push_back({id, std::string(lit)});
        i += lit.size();
        hit = true;
        break;
      }
    }
    if (!hit) text += s[i++];
  }
  if (!text.empty()) out.push_back({kTextId, text});
  return out;
}

// Word-like split of a text segment (letter/digit/UTF-8 runs, whitespace runs, single punctuation bytes).
inline void split_words(const std::string& t, std::vector<Tok>& out) {
  auto cls = [](unsigned char c) { return std::isalnum(c) || c >= 0x80 ? 0 : std::isspace(c) ? 1 : 2; };
  size_t i = 0;
  while (i < t.size()) {
    size_t j = i + 1;
    const int c = cls(static_cast<unsigned char>(t[i]));
    if (c != 2)
      while (j < t.size() && cls(static_cast<unsigned char>(t[j])) == c) ++j;
    out.push_back({kTextId, t.substr(i, j - i)});
    i = j;
  }
}

inline std::vector<Tok> tokens_words(std::string_view s, const DelimiterIds& ids = {}) {
  std::vector<Tok> out;
  for (auto& seg : segments(s, ids)) {
    if (seg.id == kTextId) split_words(seg.text, out);
    else out.push_back(seg);
  }
  return out;
}

// Every text byte its own token.
inline std::vector<Tok> tokens_bytes(std::string_view s, const DelimiterIds& ids = {}) {
  std::vector<Tok> out;
  for (auto& seg : segments(s, ids)) {
    if (seg.id != kTextId) out.push_back(seg);
    else
      for (char c : seg.text) out.push_back({kTextId, std::string(1, c)});
  }
  return out;
}

// Text segments cut at random byte positions (chunks of 1..max_len bytes).
inline std::vector<Tok> tokens_random(std::string_view s, std::mt19937& rng, int max_len, const DelimiterIds& ids = {}) {
  std::vector<Tok> out;
  for (auto& seg : segments(s, ids)) {
    if (seg.id != kTextId) {
      out.push_back(seg);
      continue;
    }
    for (size_t i = 0; i < seg.text.size();) {
      const size_t n = std::uniform_int_distribution<size_t>(1, static_cast<size_t>(max_len))(rng);
      out.push_back({kTextId, seg.text.substr(i, n)});
      i += n;
    }
  }
  return out;
}

// Word tokens with one extra cut at text byte `cut` (counted over the text bytes only). Returns false past the end.
inline bool tokens_cut_at(std::string_view s, size_t cut, std::vector<Tok>& out, const DelimiterIds& ids = {}) {
  out.clear();
  size_t pos = 0;
  bool done = false;
  for (auto& t : tokens_words(s, ids)) {
    if (t.id != kTextId) {
      out.push_back(t);
      continue;
    }
    if (!done && cut > pos && cut < pos + t.text.size()) {
      out.push_back({kTextId, t.text.substr(0, cut - pos)});
      out.push_back({kTextId, t.text.substr(cut - pos)});
      done = true;
    } else {
      out.push_back(t);
      if (cut == pos) done = true;
    }
    pos += t.text.size();
  }
  return cut <= pos;
}

struct StreamRun {
  ParseResult result;
  std::string reasoning, content;        // concatenated deltas
  std::vector<std::string> names, args;  // per header index
  std::vector<std::string> ids;
};

inline bool valid_utf8(const std::string& s) { return utf8_lossy(s) == s; }

// Feeds tokens one at a time; checks event well-formedness and that the deltas rebuild the final result.
inline StreamRun run_stream(const std::vector<Tok>& toks, ParserOptions opt, const ToolSet& tools) {
  if (!opt.id_seed) opt.id_seed = 42;
  log::set_level(log::Level::error);  // malformed-output warnings are expected here
  OutputParser parser(opt, tools);
  StreamRun r;
  std::vector<ParserEvent> ev;
  auto absorb = [&] {
    for (auto& e : ev) {
      EXPECT_TRUE(valid_utf8(e.text)) << "event text is not UTF-8";
      switch (e.kind) {
        case ParserEvent::Kind::reasoning: r.reasoning += e.text; break;
        case ParserEvent::Kind::content: r.content += e.text; break;
        case ParserEvent::Kind::tool_header:
          EXPECT_EQ(e.index, static_cast<int>(r.names.size()));
          r.names.push_back(e.name);
          r.ids.push_back(e.id);
          r.args.emplace_back();
          break;
        case ParserEvent::Kind::tool_args:
          EXPECT_EQ(e.index, static_cast<int>(r.names.size()) - 1) << "arguments for a call that is not the last";
          if (e.index >= 0 && e.index < static_cast<int>(r.args.size())) r.args[e.index] += e.text;
          break;
      }
    }
    ev.clear();
  };
  for (const auto& t : toks) {
    parser.feed(t.id, t.text, ev);
    absorb();
  }
  parser.finish(ev);
  absorb();
  r.result = parser.result();
  EXPECT_EQ(r.reasoning, r.result.reasoning);
  EXPECT_EQ(r.content, r.result.content);
  EXPECT_EQ(r.names.size(), r.result.tool_calls.size());
  for (size_t i = 0; i < r.result.tool_calls.size() && i < r.args.size(); ++i) {
    const auto& c = r.result.tool_calls[i];
    EXPECT_EQ(r.names[i], c.name);
    EXPECT_EQ(r.ids[i], c.id);
    EXPECT_EQ(r.args[i], c.arguments) << "streamed arguments differ from the final arguments";
    const auto parsed = nlohmann::ordered_json::parse(c.arguments, nullptr, false);
    EXPECT_FALSE(parsed.is_discarded()) << "arguments are not JSON: " << c.arguments;
    EXPECT_TRUE(parsed.is_object()) << c.arguments;
    EXPECT_EQ(c.id.size(), 29u);
    EXPECT_EQ(c.id.substr(0, 5), "call_");
  }
  EXPECT_TRUE(valid_utf8(r.result.reasoning));
  EXPECT_TRUE(valid_utf8(r.result.content));
  return r;
}

inline void expect_same(const ParseResult& a, const ParseResult& b, const std::string& what) {
  EXPECT_EQ(a.reasoning, b.reasoning) << what;
  EXPECT_EQ(a.content, b.content) << what;
  EXPECT_EQ(a.call_cut, b.call_cut) << what;
  EXPECT_EQ(a.reasoning_ended, b.reasoning_ended) << what;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << what;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << what;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << what;
  }
}

// Runs `text` under every tokenisation (words, bytes, one token per text run, each single extra cut, random
// chunks) and checks that all give the word-tokenised result, streaming and non-streaming. Returns the
// word-tokenised result.
inline ParseResult parse_all_ways(std::string_view text, const ParserOptions& opt, const ToolSet& tools) {
  const auto words = tokens_words(text, opt.ids);
  const StreamRun ref = run_stream(words, opt, tools);
  {
    std::vector<int32_t> ids;
    std::vector<std::string> texts;
    for (auto& t : words) ids.push_back(t.id), texts.push_back(t.text);
    ParserOptions o = opt;
    if (!o.id_seed) o.id_seed = 42;
    const ParseResult direct = parse_output(ids, texts, o, tools);
    expect_same(ref.result, direct, "parse_output vs streaming");
    EXPECT_EQ(ref.result.reasoning_tokens, direct.reasoning_tokens);
    for (size_t i = 0; i < direct.tool_calls.size(); ++i)
      EXPECT_EQ(ref.result.tool_calls[i].id, direct.tool_calls[i].id) << "seeded ids differ";
  }
  expect_same(ref.result, run_stream(tokens_bytes(text, opt.ids), opt, tools).result, "byte tokens");
  expect_same(ref.result, run_stream(segments(text, opt.ids), opt, tools).result, "one token per text run");
  std::vector<Tok> cut;
  for (size_t c = 1; tokens_cut_at(text, c, cut, opt.ids); ++c) {
    expect_same(ref.result, run_stream(cut, opt, tools).result, "cut at byte " + std::to_string(c));
    if (::testing::Test::HasFailure()) break;
  }
  std::mt19937 rng(7);
  for (int k = 0; k < 20; ++k)
    expect_same(ref.result, run_stream(tokens_random(text, rng, 1 + k % 6, opt.ids), opt, tools).result,
                "random chunks " + std::to_string(k));
  return ref.result;
}

}  // namespace lily::chat::testing
