// GenResult and SSE helpers shared by the Responses and Messages endpoints (see api_format.h).
#include "server/api_format.h"

#include "server/api_error.h"
#include "server/responses.h"

namespace lily::server {

GenResult gen_result(const Session& s, const GenJob& job) {
  GenResult r;
  r.reasoning = s.reasoning;
  r.content = s.content;
  r.tool_calls = s.tool_calls;
  r.n_prompt = static_cast<int>(job.prompt.size());
  r.n_cached = job.n_cached;
  r.n_generated = job.n_generated + (job.stopped_by_id ? 1 : 0);  // as the chat path's usage counts
  r.reasoning_tokens = s.reasoning_tokens;
  r.length = job.finish == FinishReason::length;
  r.stop_string = s.stop_string;
  return r;
}

std::string sse_event(const std::string& name, const nlohmann::ordered_json& data) {
  return "event: " + name + "\ndata: " + dump_json(data) + "\n\n";
}

void apply_logit_bias_header(nlohmann::ordered_json& body, const std::string& header) {
  if (header.empty() || body.contains("logit_bias")) return;
  auto j = nlohmann::ordered_json::parse(header, nullptr, false);
  if (!j.is_object())
    throw invalid_value("X-Lily-Logit-Bias", "the X-Lily-Logit-Bias header must be a JSON object of token id -> bias");
  body["logit_bias"] = j;
}

void rethrow_renamed(const ApiError& e, const std::vector<std::pair<std::string, std::string>>& renames,
                     const std::string& messages_as) {
  ApiError out = e;
  if (out.param.rfind("messages", 0) == 0) out.param = messages_as;
  for (auto& [from, to] : renames) {
    if (out.param == from || out.param.rfind(from + ".", 0) == 0 || out.param.rfind(from + "[", 0) == 0) {
      out.param = to + out.param.substr(from.size());
      break;
    }
  }
  throw out;
}

}  // namespace lily::server
