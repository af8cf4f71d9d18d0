// JSON bodies of the generation endpoints (docs/api.md §4, §5, §8): non-streaming chat/completion responses and the
// SSE stream (`data: {json}\n\n` events, final chunk with finish_reason, optional usage chunk). Both are built
// from the same Session events, so streamed and non-streamed text are identical.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/session.h"
#include "tokenizer/tokenizer.h"

namespace lily::server {

struct ResponseInfo {
  bool chat = true;
  bool stream = false;
  bool include_usage = false;
  bool include_reasoning = true;
  bool logprobs = false;
  std::string echo;          // completions with echo: the prompt text
  std::string id, model, fingerprint;
  int64_t created = 0;
};

// Serialises without ever throwing: invalid UTF-8 in a string is replaced with U+FFFD.
std::string dump_json(const nlohmann::ordered_json& j);

nlohmann::ordered_json chat_response(const ResponseInfo& info, const Session& s, const GenJob& job,
                                     const Tokenizer& tok);
nlohmann::ordered_json completion_response(const ResponseInfo& info, const Session& s, const GenJob& job,
                                           const Tokenizer& tok);

class StreamFormatter {
 public:
  StreamFormatter(const ResponseInfo& info, const Tokenizer& tok) : info_(info), tok_(tok) {}
  std::string start();                                                    // role chunk / echo
  std::string events(std::vector<OutEvent>& ev, std::vector<LogprobEntry>& lps);
  std::string finish(const Session& s, const GenJob& job);                // finish chunk (+ usage chunk)
  std::string error(const std::string& message, const std::string& code);  // error event (before [DONE])

 private:
  nlohmann::ordered_json chunk(nlohmann::ordered_json delta_or_text, const char* finish);
  std::string event(const nlohmann::ordered_json& j) { return "data: " + dump_json(j) + "\n\n"; }

  const ResponseInfo& info_;
  const Tokenizer& tok_;
  std::vector<LogprobEntry> lps_;   // not yet attached to a chunk
  size_t text_offset_ = info_.echo.size();  // completions: where the next logprobs entry starts in the text
};

}  // namespace lily::server
