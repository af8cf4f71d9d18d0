// /v1/responses and /v1/messages on the real `lily serve --demo` binary: the official OpenAI, Anthropic and
// Vercel AI SDKs (tests/server/agent_clients.mjs), both auth headers with each API's error shape, and the
// `endpoint` label on the request counter (checked by the script, after its requests).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>

#include "server_harness.h"

using namespace lily::test;

namespace {

std::string run_node(const std::string& script, const std::string& args) {
  std::string cmd = "timeout 240 node " + std::string(LILY_SOURCE_DIR) + "/tests/server/" + script + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "popen failed";
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  int rc = pclose(p);
  return rc == 0 ? out : "exit " + std::to_string(rc) + ":\n" + out;
}

}  // namespace

TEST(ServerAgentApis, OfficialSdksAuthErrorsAndMetrics) {
  for (const char* pkg : {"openai", "@anthropic-ai/sdk", "ai", "@ai-sdk/openai"}) {
    const std::string f = std::string(LILY_SOURCE_DIR) + "/tests/oracle/node_modules/" + pkg + "/package.json";
    ASSERT_EQ(access(f.c_str(), R_OK), 0) << "run (cd tests/oracle && npm ci) first: " << f << " is missing";
  }
  ServerProcess srv({"--api-key", "sekret"});
  ASSERT_TRUE(srv.ok()) << srv.error();
  const ojson msg = {{"max_tokens", 2}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  int st = 0;
  // x-api-key and Bearer both authenticate; a wrong key is a 401 in each API's own error shape
  ojson ok = post_json(srv, "/v1/messages", msg, &st, {{"x-api-key", "sekret"}, {"anthropic-version", "2023-06-01"}});
  EXPECT_EQ(st, 200) << ok.dump();
  EXPECT_EQ(ok["type"], "message");
  post_json(srv, "/v1/messages", msg, &st, {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(st, 200);
  ojson bad = post_json(srv, "/v1/messages", msg, &st, {{"x-api-key", "nope"}});
  EXPECT_EQ(st, 401);
  EXPECT_EQ(bad, ojson::parse(R"({"type":"error","error":{"type":"authentication_error","message":"invalid or missing API key"}})"));
  bad = post_json(srv, "/v1/responses", {{"input", "hi"}}, &st, {{"x-api-key", "nope"}});
  EXPECT_EQ(st, 401);
  EXPECT_EQ(bad["error"]["type"], "authentication_error");
  // a validation error on /v1/messages is Anthropic-shaped too, with the field named in the message
  bad = post_json(srv, "/v1/messages", {{"messages", msg["messages"]}}, &st, {{"x-api-key", "sekret"}});
  EXPECT_EQ(st, 400);
  EXPECT_EQ(bad["type"], "error");
  EXPECT_EQ(bad["error"]["type"], "invalid_request_error");
  EXPECT_NE(bad["error"]["message"].get<std::string>().find("max_tokens"), std::string::npos) << bad.dump();
  ojson nf = post_json(srv, "/v1/messages/nope", msg, &st, {{"x-api-key", "sekret"}});  // router errors too
  EXPECT_EQ(st, 404);
  EXPECT_EQ(nf["type"], "error") << nf.dump();
  EXPECT_EQ(nf["error"]["type"], "not_found_error") << nf.dump();
  post_json(srv, "/v1/chat/completions", msg, &st, {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(st, 200);

  const std::string out = run_node("agent_clients.mjs", "http://127.0.0.1:" + std::to_string(srv.port()) + " sekret");
  EXPECT_NE(out.find("agent clients: all checks passed"), std::string::npos) << out;

}

// Claude Code (pinned npm package) runs headless against `lily serve --demo`, offline (ANTHROPIC_BASE_URL,
// telemetry and updates off, a private HOME). The lily test header X-Lily-Logit-Bias (sent through
// ANTHROPIC_CUSTOM_HEADERS) forces <|im_end|>, so each reply ends at once and the turn must complete without error.
TEST(ServerAgentApis, ClaudeCodeHeadlessTurn) {
  const std::string bin = std::string(LILY_SOURCE_DIR) + "/tests/oracle/node_modules/.bin/claude";
  ASSERT_EQ(access(bin.c_str(), X_OK), 0) << "run (cd tests/oracle && npm ci) first: " << bin << " is missing";
  ServerProcess srv({});
  ASSERT_TRUE(srv.ok()) << srv.error();
  ojson tok = post_json(srv, "/tokenize", {{"content", "<|im_end|>"}});
  ASSERT_EQ(tok["tokens"].size(), 1u);
  const std::string home = std::string(LILY_BINARY_DIR) + "/test-claude-home-" + std::to_string(getpid());
  const std::string cmd = "mkdir -p " + home + " && cd " + home + " && HOME=" + home +
      " ANTHROPIC_BASE_URL=http://127.0.0.1:" + std::to_string(srv.port()) + " ANTHROPIC_API_KEY=test" +
      " ANTHROPIC_CUSTOM_HEADERS='X-Lily-Logit-Bias: {\"" + std::to_string(tok["tokens"][0].get<int>()) + "\": 100}'" +
      " DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1" +
      " CLAUDE_CODE_MAX_OUTPUT_TOKENS=16 timeout 240 " + bin +
      " -p 'Say hi' --model lily-demo --max-turns 1 --system-prompt 'Be brief.' --tools '' --output-format json"
      " 2>/dev/null | tail -1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  std::system(("rm -rf " + home).c_str());
  ojson r = ojson::parse(out, nullptr, false);
  ASSERT_TRUE(r.is_object()) << out;
  EXPECT_EQ(r["is_error"], false) << out;
  EXPECT_EQ(r["subtype"], "success") << out;
  EXPECT_EQ(r["stop_reason"], "end_turn") << out;
  EXPECT_GT(r["usage"]["input_tokens"].get<int>(), 100) << out;  // Claude Code read lily's usage
}
