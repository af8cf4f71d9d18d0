// JSON bodies of the generation endpoints (docs/api.md §4, §5, §8): non-streaming chat/completion responses and the
// SSE stream (`data: {json}\n\n` events, final chunk with finish_reason, optional usage chunk). Both are built
// from the same Session events, so streamed and non-streamed text are identical.
#pragma once
#include <span>
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

// One finished choice of a request (`n` samples of one prompt): the session with its text and the job with its
// counts. The choice's index is its position in the list.
struct ChoiceOut {
  const Session* session;
  const GenJob* job;
};

// Bodies with one entry in `choices` per ChoiceOut; usage counts the shared prompt once and sums the completion
// tokens of all choices (as OpenAI does for n > 1).
nlohmann::ordered_json chat_response(const ResponseInfo& info, std::span<const ChoiceOut> choices,
                                     const Tokenizer& tok);
nlohmann::ordered_json completion_response(const ResponseInfo& info, std::span<const ChoiceOut> choices,
                                           const Tokenizer& tok);
// A request with one choice.
nlohmann::ordered_json chat_response(const ResponseInfo& info, const Session& s, const GenJob& job,
                                     const Tokenizer& tok);
nlohmann::ordered_json completion_response(const ResponseInfo& info, const Session& s, const GenJob& job,
                                           const Tokenizer& tok);

// The SSE chunks of one choice (`index`); a request with n choices has n formatters writing into one stream.
class StreamFormatter {
 public:
  StreamFormatter(const ResponseInfo& info, const Tokenizer& tok, int index = 0)
      : info_(info), tok_(tok), index_(index) {}
  std::string start();                                                    // role chunk / echo
  std::string events(std::vector<OutEvent>& ev, std::vector<LogprobEntry>& lps);
  std::string finish_choice(const Session& s, const GenJob& job);         // this choice's finish chunk
  std::string usage_chunk(std::span<const ChoiceOut> choices);            // usage chunk ("" without include_usage)
  std::string finish(const Session& s, const GenJob& job);                // finish chunk (+ usage chunk), n = 1
  std::string error(const std::string& message, const std::string& code);  // error event (before [DONE])

 private:
  nlohmann::ordered_json chunk(nlohmann::ordered_json delta_or_text, const char* finish);
  std::string event(const nlohmann::ordered_json& j) { return "data: " + dump_json(j) + "\n\n"; }

  const ResponseInfo& info_;
  const Tokenizer& tok_;
  int index_ = 0;                   // the choice's index
  std::vector<LogprobEntry> lps_;   // not yet attached to a chunk
  size_t text_offset_ = info_.echo.size();  // completions: where the next logprobs entry starts in the text
};

}  // namespace lily::server
