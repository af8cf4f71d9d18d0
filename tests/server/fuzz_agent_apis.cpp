// libFuzzer target for the /v1/responses and /v1/messages request mappings (scripts/fuzz.sh builds it with
// ASan + UBSan). Input: a JSON body (invalid JSON is skipped). Checks (abort on failure): every mapping either
// succeeds or throws ApiError with a 4xx status (never another exception: that would be a 500), and a body that
// maps yields a non-empty message list the chat parser accepted.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/api_error.h"
#include "server/messages_api.h"
#include "server/responses_api.h"

namespace {

using namespace lily::server;

template <class F>
void expect_4xx_or_ok(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    if (e.status < 400 || e.status >= 500) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ojson body = ojson::parse(std::string(reinterpret_cast<const char*>(data), size), nullptr, false);
  if (!body.is_object()) return 0;
  const RequestLimits lim{1000};
  expect_4xx_or_ok([&] {
    ResponsesRequest r = parse_responses_request(body, lim);
    if (!r.chat_req.messages.is_array() || r.chat_req.messages.empty()) std::abort();
  });
  for (bool count_only : {false, true})
    expect_4xx_or_ok([&] {
      ChatRequest c = parse_messages_request(body, lim, count_only);
      if (!c.messages.is_array() || c.messages.empty()) std::abort();
    });
  return 0;
}
