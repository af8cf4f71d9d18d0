// `lily tokenize` and `lily detokenize`: the tokenizer on stdin/stdout (docs/chat.md §1).
//   lily tokenize --tokenizer DIR_OR_FILE --jsonl       stdin: one JSON string per line; stdout: a JSON id array per line
//   lily tokenize --tokenizer DIR_OR_FILE               stdin: raw text (all of it); stdout: ids separated by spaces
//   lily detokenize --tokenizer DIR_OR_FILE             stdin: ids (whitespace/comma separated, or a JSON array
//                                                        per line); stdout: the text (one line per JSON array)
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace lily::cli {
namespace {

struct TokenizeOpts {
  std::string tokenizer;
  bool jsonl = false;
  bool no_parse_special = false;
  bool skip_special = false;
};

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

int run_tokenize(const TokenizeOpts& o) {
  Tokenizer tok = Tokenizer::load(o.tokenizer);
  const bool parse_special = !o.no_parse_special;
  std::ios::sync_with_stdio(false);
  if (!o.jsonl) {
    std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    std::vector<int32_t> ids = tok.encode(text, parse_special);
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
    std::cout << out << "\n";
    return 0;
  }
  std::string line;
  size_t n = 0;
  while (std::getline(std::cin, line)) {
    ++n;
    if (line.empty() || line == "\r") continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_string()) fail("tokenize: stdin line ", n, " is not a JSON string");
    std::cout << ids_json(tok.encode(j.get<std::string>(), parse_special)) << "\n";
  }
  return 0;
}

std::vector<int32_t> parse_ids(const std::string& text, size_t line) {
  std::vector<int32_t> ids;
  std::string s = text;
  for (char& c : s)
    if (c == ',' || c == '\t' || c == '\r' || c == '\n') c = ' ';
  std::istringstream is(s);
  std::string w;
  while (is >> w) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(w, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != w.size() || v < 0 || v > INT32_MAX) fail("detokenize: line ", line, ": \"", w, "\" is not a token id");
    ids.push_back(int32_t(v));
  }
  return ids;
}

int run_detokenize(const TokenizeOpts& o) {
  Tokenizer tok = Tokenizer::load(o.tokenizer);
  std::ios::sync_with_stdio(false);
  std::string line, pending;
  size_t n = 0;
  // Lines holding a JSON array are decoded one per line; any other lines are gathered into one id list.
  std::vector<int32_t> loose;
  while (std::getline(std::cin, line)) {
    ++n;
    size_t first = line.find_first_not_of(" \t\r");
    if (first != std::string::npos && line[first] == '[') {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_array()) fail("detokenize: stdin line ", n, " is not a JSON array of ids");
      std::vector<int32_t> ids;
      for (const auto& v : j) {
        if (!v.is_number_integer()) fail("detokenize: stdin line ", n, " has a non-integer id ", v.dump());
        ids.push_back(v.get<int32_t>());
      }
      std::cout << tok.decode(ids, o.skip_special) << "\n";
      continue;
    }
    std::vector<int32_t> ids = parse_ids(line, n);
    loose.insert(loose.end(), ids.begin(), ids.end());
  }
  if (!loose.empty()) std::cout << tok.decode(loose, o.skip_special);
  return 0;
}

CommandRegistrar reg_tok({"tokenize", "Encode text into token ids (HF tokenizers semantics)", [](CLI::App& sub) {
                            auto o = std::make_shared<TokenizeOpts>();
                            sub.add_option("--tokenizer", o->tokenizer, "model directory or tokenizer.json")
                                ->required();
                            sub.add_flag("--jsonl", o->jsonl,
                                         "stdin: one JSON string per line; stdout: one JSON array of ids per line");
                            sub.add_flag("--no-parse-special", o->no_parse_special,
                                         "encode literals of special added tokens (<|im_start|>...) as plain text");
                            return std::function<int()>([o] { return run_tokenize(*o); });
                          }});

CommandRegistrar reg_detok({"detokenize", "Decode token ids into text", [](CLI::App& sub) {
                              auto o = std::make_shared<TokenizeOpts>();
                              sub.add_option("--tokenizer", o->tokenizer, "model directory or tokenizer.json")
                                  ->required();
                              sub.add_flag("--skip-special", o->skip_special, "drop special added tokens");
                              return std::function<int()>([o] { return run_detokenize(*o); });
                            }});

}  // namespace
}  // namespace lily::cli
