// Structured output end to end through `lily serve --demo` (random weights, real Qwen3 tokenizer): the model
// emits noise, so every sampled token is a fuzz input to the grammar. Outputs that finish with "stop" must
// validate with ajv (tests/grammar/validate_ajv.js); "length" outputs are partial and may be invalid (counted,
// not validated). Node clients (the official `openai` package, the Vercel AI SDK) run from tests/server/*.mjs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "server_harness.h"

using namespace lily::test;
namespace fs = std::filesystem;

namespace {

class StructuredE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { srv_ = new ServerProcess({"--ctx", "2048", "--queue", "16"}); }
  static void TearDownTestSuite() {
    delete srv_;
    srv_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(srv_->ok()) << srv_->error(); }
  static ServerProcess* srv_;
};
ServerProcess* StructuredE2E::srv_ = nullptr;

ojson read_json(const std::string& path) {
  std::ifstream f(path);
  return ojson::parse(f);
}

// The id of a text that the tokenizer encodes as one token (special tokens parsed).
int one_token(const ServerProcess& s, const std::string& text) {
  int st = 0;
  ojson r = post_json(s, "/tokenize", {{"content", text}}, &st);
  if (st != 200 || !r.contains("tokens") || r["tokens"].size() != 1) return -1;
  return r["tokens"][0].get<int>();
}

// Pure random sampling at temperature 1 (no top-p/top-k/min-p truncation, no penalties).
ojson request(uint64_t seed, int max_tokens, bool thinking) {
  return {{"model", "m"},
          {"messages", ojson::array({{{"role", "user"}, {"content", "Reply with JSON."}}})},
          {"max_tokens", max_tokens},
          {"seed", seed},
          {"temperature", 1.0},
          {"top_p", 1.0},
          {"top_k", 0},
          {"min_p", 0.0},
          {"presence_penalty", 0.0},
          {"chat_template_kwargs", {{"enable_thinking", thinking}}}};
}

// Runs `cmd` (stderr merged), returns its exit status and output.
int run(const std::string& cmd, std::string& out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  return pclose(p);
}

struct CorpusStats {
  int stop = 0, length = 0;
  std::vector<std::string> reasoning;  // the reasoning texts of thinking runs
};

// Each schema of the grammar tests' corpus, for each seed, twice: with the noise as it comes, and "steered"
// (logit_bias toward closing tokens and <|im_end|>, so more outputs complete; the grammar still decides which
// tokens are allowed). Validates every "stop" content with ajv.
CorpusStats run_corpus(const ServerProcess& srv, const std::vector<uint64_t>& seeds, int max_tokens, bool thinking,
                       const std::string& tag) {
  const ojson schemas = read_json(std::string(LILY_SOURCE_DIR) + "/tests/grammar/schemas.json");
  ojson bias = ojson::object();
  for (const char* t : {"\"", "}", "]", "\"}", "\"]", "}]", "]}", "<|im_end|>"}) {
    int id = one_token(srv, t);
    EXPECT_GE(id, 0) << "'" << t << "' is not one token";
    if (id >= 0) bias[std::to_string(id)] = std::string(t) == "<|im_end|>" ? 20 : 6;
  }
  int think_end = one_token(srv, "</think>");
  EXPECT_GE(think_end, 0);
  CorpusStats st;
  ojson cases = ojson::array();
  for (size_t i = 0; i < schemas.size(); ++i) {
    ojson c = {{"schema", schemas[i]}, {"outputs", ojson::array()}};
    for (uint64_t seed : seeds)
      for (bool steer : {false, true}) {
        ojson b = request(seed * 100 + i, max_tokens, thinking);
        b["response_format"] = {{"type", "json_schema"},
                                {"json_schema", {{"name", "s" + std::to_string(i)}, {"schema", schemas[i]}, {"strict", true}}}};
        ojson lb = steer ? bias : ojson::object();
        // Thinking on: a bias toward </think> ends the (free) reasoning block after a few noise tokens.
        if (thinking) lb[std::to_string(think_end)] = 10;
        if (!lb.empty()) b["logit_bias"] = lb;
        int code = 0;
        ojson r = post_json(srv, "/v1/chat/completions", b, &code);
        EXPECT_EQ(code, 200) << r.dump();
        if (code != 200) continue;
        const ojson& ch = r["choices"][0];
        const ojson& m = ch["message"];
        std::string content = m["content"].is_string() ? m["content"].get<std::string>() : "";
        if (thinking && m.contains("reasoning_content")) st.reasoning.push_back(m["reasoning_content"]);
        std::string fr = ch["finish_reason"];
        if (fr == "stop") {
          ++st.stop;
          c["outputs"].push_back(content);
        } else {
          EXPECT_EQ(fr, "length") << r.dump();
          ++st.length;  // partial: may be an incomplete JSON value (docs/structured_output.md)
        }
      }
    cases.push_back(c);
  }
  const std::string file = std::string(LILY_BINARY_DIR) + "/so-e2e-" + tag + "-" + std::to_string(getpid()) + ".json";
  std::ofstream(file) << cases.dump();
  std::string out;
  int rc = run("timeout 60 node " + std::string(LILY_SOURCE_DIR) + "/tests/grammar/validate_ajv.js " + file, out);
  EXPECT_EQ(rc, 0) << out;
  fs::remove(file);
  std::string last = out.substr(0, out.find_last_not_of('\n') + 1);
  last = last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1);
  std::printf("[%s] %d stop (ajv: %s), %d length (partial, not validated)\n", tag.c_str(), st.stop, last.c_str(),
              st.length);
  return st;
}

TEST_F(StructuredE2E, SchemaCorpusThinkingOffValidatesWithAjv) {
  CorpusStats st = run_corpus(*srv_, {1, 2}, 96, false, "off");
  // The steered runs must complete often enough for the validation to mean something.
  EXPECT_GE(st.stop, 10) << "too few outputs finished with 'stop'";
}

TEST_F(StructuredE2E, SchemaCorpusThinkingOnReasoningFreeContentValidates) {
  CorpusStats st = run_corpus(*srv_, {3, 4}, 96, true, "on");
  EXPECT_GE(st.stop, 8) << "too few outputs finished with 'stop'";
  // The reasoning block is not constrained: noise there is not a JSON value's start.
  int free_text = 0;
  for (const auto& r : st.reasoning) {
    size_t p = r.find_first_not_of(" \t\r\n");
    if (p != std::string::npos && std::string("{[\"-0123456789tfn").find(r[p]) == std::string::npos) ++free_text;
  }
  EXPECT_GT(free_text, 0) << "every reasoning text looked JSON-constrained";
}

// A node client script against the server; exit 0 and its final line = pass.
void run_client(const ServerProcess& srv, const std::string& script, const std::string& pass_line) {
  const std::string oracle = std::string(LILY_SOURCE_DIR) + "/tests/oracle/node_modules/ai/package.json";
  ASSERT_EQ(access(oracle.c_str(), R_OK), 0) << "run (cd tests/oracle && npm ci) first: " << oracle << " is missing";
  std::string out;
  int rc = run("timeout 55 node " + std::string(LILY_SOURCE_DIR) + "/tests/server/" + script + " http://127.0.0.1:" +
                   std::to_string(srv.port()) + "/v1",
               out);
  std::printf("%s", out.c_str());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(pass_line), std::string::npos) << out;
}

TEST_F(StructuredE2E, OpenAiClientForcedToolsParseAndErrors) {
  run_client(*srv_, "structured_openai.mjs", "structured openai client: all checks passed");
}

TEST_F(StructuredE2E, VercelAiSdkGenerateObjectAndRequiredTools) {
  run_client(*srv_, "structured_ai_sdk.mjs", "structured ai sdk: all checks passed");
}

// Raw HTTP: the 400 bodies name the field, the keyword and the schema path; text and GBNF outputs.
TEST_F(StructuredE2E, ErrorsAndPlainFormatsOverHttp) {
  int code = 0;
  ojson b = request(1, 4, false);
  b["response_format"] = ojson::parse(R"({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
      "properties": {"deep": {"type": "object", "properties": {"n": {"type": "number", "not": {"type": "integer"}}}}}}}})");
  ojson r = post_json(*srv_, "/v1/chat/completions", b, &code);
  EXPECT_EQ(code, 400);
  EXPECT_EQ(r["error"]["param"], "response_format.json_schema.schema") << r.dump();
  std::string msg = r["error"]["message"];
  EXPECT_NE(msg.find("'not'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("#/properties/deep/properties/n"), std::string::npos) << msg;

  b = request(1, 4, false);
  b["grammar"] = "root ::= [a-";
  r = post_json(*srv_, "/v1/chat/completions", b, &code);
  EXPECT_EQ(code, 400) << r.dump();
  EXPECT_EQ(r["error"]["param"], "grammar") << r.dump();
  b["grammar"] = "root ::= root \"a\" | \"b\"";  // left recursion
  r = post_json(*srv_, "/v1/chat/completions", b, &code);
  EXPECT_EQ(code, 400) << r.dump();
  EXPECT_NE(r.dump().find("root"), std::string::npos) << r.dump();
  b.erase("grammar");
  b["response_format"] = {{"type", "json_object"}};
  b["regex"] = "a+";
  r = post_json(*srv_, "/v1/chat/completions", b, &code);
  EXPECT_EQ(code, 400) << r.dump();

  b = request(2, 6, false);
  b["response_format"] = {{"type", "text"}};
  r = post_json(*srv_, "/v1/chat/completions", b, &code);
  ASSERT_EQ(code, 200) << r.dump();
  EXPECT_TRUE(r["choices"][0]["message"]["content"].is_string()) << r.dump();

  // A GBNF grammar: every output stops (nothing can follow a complete match) and is one of the alternatives.
  for (uint64_t seed : {3, 4, 5}) {
    b = request(seed, 16, false);
    b["grammar"] = "root ::= \"A\" [0-9]{2} | \"none\"";
    r = post_json(*srv_, "/v1/chat/completions", b, &code);
    ASSERT_EQ(code, 200) << r.dump();
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << r.dump();
    std::string c = r["choices"][0]["message"]["content"];
    EXPECT_TRUE(std::regex_match(c, std::regex("A[0-9]{2}|none"))) << c;
  }
}

// Recorded, not asserted: median time per generated token (the server's own `timings`), with and without a
// schema, on the demo model (CPU). Numbers go to bench/RESULTS.md by hand.
TEST_F(StructuredE2E, TimingPerTokenWithAndWithoutSchema) {
  const ojson schemas = read_json(std::string(LILY_SOURCE_DIR) + "/tests/grammar/schemas.json");
  // Requests alternate (free, schema) so that load from other processes hits both alike.
  auto one = [&](int i, bool schema, std::vector<double>& per, int& tokens) {
    ojson b = request(1000 + i, 32, false);
    if (schema)
      b["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", schemas[i % schemas.size()]}}}};
    int code = 0;
    ojson r = post_json(*srv_, "/v1/chat/completions", b, &code);
    EXPECT_EQ(code, 200) << r.dump();
    if (code != 200 || !r.contains("timings")) return;
    int n = r["timings"]["predicted_n"];
    if (n == 0) return;
    tokens += n;
    per.push_back(r["timings"]["predicted_ms"].get<double>() / n);
  };
  std::vector<double> warm, free_ms, schema_ms;
  int n_warm = 0, n_free = 0, n_schema = 0;
  for (int i = 0; i < int(schemas.size()); ++i) one(i, true, warm, n_warm);  // first use: compiled, then cached
  for (int i = 0; i < 20; ++i) {
    one(i, false, free_ms, n_free);
    one(i, true, schema_ms, n_schema);
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return -1.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  EXPECT_GT(median(free_ms), 0);
  EXPECT_GT(median(schema_ms), 0);
  std::printf("[timing] demo model, CPU, 20 requests each: median %.3f ms/token without a schema (%d tokens), %.3f "
              "ms/token with the corpus schemas (%d tokens; %.3f on each schema's first use)\n",
              median(free_ms), n_free, median(schema_ms), n_schema, median(warm));
}

}  // namespace
