// Response and SSE chunk formatting (see responses.h).
#include "server/responses.h"

#include <algorithm>

namespace lily::server {
namespace {

using ojson = nlohmann::ordered_json;

ojson bytes_of(const std::string& s) {
  ojson b = ojson::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

ojson logprob_entry(const std::string& text, const LogprobEntry& e, const Tokenizer& tok) {
  ojson top = ojson::array();
  for (const auto& t : e.top) {
    std::string r = tok.token_text(t.token);
    top.push_back({{"token", utf8_lossy(r)}, {"logprob", t.logprob}, {"bytes", bytes_of(r)}});
  }
  return {{"token", text}, {"logprob", e.logprob}, {"bytes", bytes_of(text)}, {"top_logprobs", top}};
}

// content[]: every token generated outside reasoning (a tool call's tokens too), each with the part of `content`
// it produced, so the strings concatenate to message.content exactly. reasoning_content[] (lily): the same for
// the reasoning tokens and message.reasoning_content. top_logprobs list the alternatives as raw tokens.
ojson chat_logprobs(const std::vector<LogprobEntry>& lps, const Tokenizer& tok, bool include_reasoning) {
  ojson content = ojson::array(), reasoning = ojson::array();
  for (const auto& e : lps) {
    const bool in_reasoning = e.reasoning_token || !e.reasoning.empty();
    if (!in_reasoning || !e.text.empty()) content.push_back(logprob_entry(e.text, e, tok));
    if (in_reasoning && include_reasoning) reasoning.push_back(logprob_entry(e.reasoning, e, tok));
  }
  ojson out = {{"content", content}};
  if (include_reasoning && !reasoning.empty()) out["reasoning_content"] = reasoning;
  return out;
}

// tokens[]: each generated token's part of `text` (they concatenate to it); text_offset: where each starts in
// the returned text (after an echoed prompt). `offset` advances past the entries.
ojson completion_logprobs(const std::vector<LogprobEntry>& lps, const Tokenizer& tok, size_t& offset) {
  ojson tokens = ojson::array(), lp = ojson::array(), top = ojson::array(), offs = ojson::array();
  for (const auto& e : lps) {
    tokens.push_back(e.text);
    lp.push_back(e.logprob);
    ojson alt = ojson::object();
    for (const auto& a : e.top) alt[utf8_lossy(tok.token_text(a.token))] = a.logprob;
    top.push_back(alt);
    offs.push_back(offset);
    offset += e.text.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lp}, {"top_logprobs", top}, {"text_offset", offs}};
}

const char* finish_reason(const Session& s, const GenJob& job) {
  if (job.finish == FinishReason::length) return "length";
  return s.tool_calls.empty() ? "stop" : "tool_calls";
}

// The prompt is shared by the choices: counted once, with the cache hits of the choice that found the fewest.
ojson usage(std::span<const ChoiceOut> choices) {
  const int n_prompt = static_cast<int>(choices.front().job->prompt.size());
  int n_gen = 0, n_reasoning = 0, n_cached = n_prompt;
  for (const auto& c : choices) {
    n_gen += c.job->n_generated + (c.job->stopped_by_id ? 1 : 0);
    n_reasoning += c.session->reasoning_tokens;
    n_cached = std::min(n_cached, c.job->n_cached);
  }
  return {{"prompt_tokens", n_prompt},
          {"completion_tokens", n_gen},
          {"total_tokens", n_prompt + n_gen},
          {"prompt_tokens_details", {{"cached_tokens", n_cached}}},
          {"completion_tokens_details", {{"reasoning_tokens", n_reasoning}}}};
}

// Sums over the choices' jobs (their prompt and decode times add up on the engine).
ojson timings(std::span<const ChoiceOut> choices) {
  const int n_prompt = static_cast<int>(choices.front().job->prompt.size());
  int n_cached = n_prompt, n_gen = 0;
  double prompt_ms = 0, gen_ms = 0;
  for (const auto& c : choices) {
    n_cached = std::min(n_cached, c.job->n_cached);
    n_gen += c.job->n_generated;
    prompt_ms += c.job->prompt_ms;
    gen_ms += c.job->gen_ms;
  }
  return {{"cache_n", n_cached},
          {"prompt_n", n_prompt - n_cached},
          {"prompt_ms", prompt_ms},
          {"predicted_n", n_gen},
          {"predicted_ms", gen_ms}};
}

}  // namespace

std::string dump_json(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

ojson chat_response(const ResponseInfo& info, std::span<const ChoiceOut> choices, const Tokenizer& tok) {
  ojson list = ojson::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const Session& s = *choices[i].session;
    ojson msg = {{"role", "assistant"}};
    bool null_content = s.content.empty() && (!s.tool_calls.empty() || !s.reasoning.empty());
    msg["content"] = null_content ? ojson(nullptr) : ojson(s.content);
    if (info.include_reasoning && !s.reasoning.empty()) {
      msg["reasoning_content"] = s.reasoning;
      msg["reasoning"] = s.reasoning;
    }
    if (!s.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (const auto& c : s.tool_calls)
        calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      msg["tool_calls"] = calls;
    }
    list.push_back({{"index", i}, {"message", msg},
                    {"logprobs", info.logprobs ? chat_logprobs(s.all_logprobs, tok, info.include_reasoning) : ojson(nullptr)},
                    {"finish_reason", finish_reason(s, *choices[i].job)}});
  }
  return {{"id", info.id}, {"object", "chat.completion"}, {"created", info.created}, {"model", info.model},
          {"system_fingerprint", info.fingerprint}, {"choices", list},
          {"usage", usage(choices)}, {"timings", timings(choices)}};
}

ojson completion_response(const ResponseInfo& info, std::span<const ChoiceOut> choices, const Tokenizer& tok) {
  ojson list = ojson::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const Session& s = *choices[i].session;
    size_t offset = info.echo.size();
    list.push_back({{"index", i}, {"text", info.echo + s.text},
                    {"logprobs", info.logprobs ? completion_logprobs(s.all_logprobs, tok, offset) : ojson(nullptr)},
                    {"finish_reason", finish_reason(s, *choices[i].job)}});
  }
  return {{"id", info.id}, {"object", "text_completion"}, {"created", info.created}, {"model", info.model},
          {"system_fingerprint", info.fingerprint}, {"choices", list},
          {"usage", usage(choices)}, {"timings", timings(choices)}};
}

ojson chat_response(const ResponseInfo& info, const Session& s, const GenJob& job, const Tokenizer& tok) {
  const ChoiceOut one{&s, &job};
  return chat_response(info, std::span<const ChoiceOut>(&one, 1), tok);
}

ojson completion_response(const ResponseInfo& info, const Session& s, const GenJob& job, const Tokenizer& tok) {
  const ChoiceOut one{&s, &job};
  return completion_response(info, std::span<const ChoiceOut>(&one, 1), tok);
}

ojson StreamFormatter::chunk(ojson delta_or_text, const char* finish) {
  ojson choice = {{"index", index_}};
  if (info_.chat) choice["delta"] = std::move(delta_or_text);
  else choice["text"] = std::move(delta_or_text);
  if (info_.logprobs && !lps_.empty()) {
    choice["logprobs"] = info_.chat ? chat_logprobs(lps_, tok_, info_.include_reasoning)
                                    : completion_logprobs(lps_, tok_, text_offset_);
    lps_.clear();
  } else {
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = finish ? ojson(finish) : ojson(nullptr);
  ojson c = {{"id", info_.id}, {"object", info_.chat ? "chat.completion.chunk" : "text_completion"},
             {"created", info_.created}, {"model", info_.model}, {"system_fingerprint", info_.fingerprint},
             {"choices", ojson::array({choice})}};
  if (info_.include_usage) c["usage"] = nullptr;
  return c;
}

std::string StreamFormatter::start() {
  if (info_.chat) return event(chunk({{"role", "assistant"}, {"content", nullptr}}, nullptr));
  if (!info_.echo.empty()) return event(chunk(info_.echo, nullptr));
  return {};
}

std::string StreamFormatter::events(std::vector<OutEvent>& ev, std::vector<LogprobEntry>& lps) {
  if (info_.logprobs) lps_.insert(lps_.end(), lps.begin(), lps.end());
  std::string out;
  if (!info_.chat) {
    std::string text;
    for (auto& e : ev) text += e.text;
    if (!text.empty()) out += event(chunk(text, nullptr));
    return out;
  }
  // Consecutive text events share one delta; each tool-call event is its own chunk.
  ojson delta = ojson::object();
  auto flush = [&] {
    if (!delta.empty()) out += event(chunk(delta, nullptr));
    delta = ojson::object();
  };
  for (auto& e : ev) {
    switch (e.kind) {
      case OutEvent::Kind::reasoning:
        if (!info_.include_reasoning || e.text.empty()) break;
        if (delta.contains("content") || delta.contains("tool_calls")) flush();
        delta["reasoning_content"] = delta.value("reasoning_content", "") + e.text;
        delta["reasoning"] = delta["reasoning_content"];
        break;
      case OutEvent::Kind::content:
      case OutEvent::Kind::text:
        if (e.text.empty()) break;
        if (delta.contains("tool_calls")) flush();
        delta["content"] = delta.value("content", "") + e.text;
        break;
      case OutEvent::Kind::tool_header:
        flush();
        delta["tool_calls"] = ojson::array(
            {{{"index", e.index}, {"id", e.id}, {"type", "function"}, {"function", {{"name", e.name}, {"arguments", ""}}}}});
        flush();
        break;
      case OutEvent::Kind::tool_args:
        if (e.text.empty()) break;
        flush();
        delta["tool_calls"] = ojson::array({{{"index", e.index}, {"function", {{"arguments", e.text}}}}});
        flush();
        break;
    }
  }
  flush();
  return out;
}

std::string StreamFormatter::finish_choice(const Session& s, const GenJob& job) {
  return event(chunk(info_.chat ? ojson::object() : ojson(""), finish_reason(s, job)));
}

std::string StreamFormatter::usage_chunk(std::span<const ChoiceOut> choices) {
  if (!info_.include_usage) return {};
  ojson u = {{"id", info_.id}, {"object", info_.chat ? "chat.completion.chunk" : "text_completion"},
             {"created", info_.created}, {"model", info_.model}, {"system_fingerprint", info_.fingerprint},
             {"choices", ojson::array()}, {"usage", usage(choices)}};
  return event(u);
}

std::string StreamFormatter::finish(const Session& s, const GenJob& job) {
  const ChoiceOut one{&s, &job};
  return finish_choice(s, job) + usage_chunk(std::span<const ChoiceOut>(&one, 1));
}

std::string StreamFormatter::error(const std::string& message, const std::string& code) {
  return event({{"error", {{"message", message}, {"type", "server_error"}, {"code", code}}}});
}

}  // namespace lily::server
