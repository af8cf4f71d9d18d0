// Parsing and validation of OpenAI request bodies (docs/api.md §2, §3, §8, §10.1 rows 1, 2, 14): the raw body is
// checked for UTF-8 validity and nesting depth before the JSON parser sees it, every known field is type- and
// range-checked (ApiError with `param` naming the field), unknown fields are ignored. JSON objects keep their
// key order (ordered_json) so tool schemas and arguments render byte-stably.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace lily::server {

using ojson = nlohmann::ordered_json;
struct StructuredSpec;  // server/structured_output.h

// Sampling fields as sent; absent ones are filled from the server defaults for the thinking mode.
struct SamplingRequest {
  std::optional<float> temperature;         // [0, 2]
  std::optional<float> top_p;               // (0, 1]
  std::optional<int> top_k;                 // 0 / -1 = off, <= vocab
  std::optional<float> min_p;               // [0, 1]
  std::optional<float> presence_penalty;    // [-2, 2]
  std::optional<float> frequency_penalty;   // [-2, 2]
  std::optional<float> repetition_penalty;  // (0, 10]
  std::optional<uint64_t> seed;
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> bias in [-100, 100]
};

// `n`: samples of one prompt per request (docs/api.md §2); more are 400 (unbounded n is a known OOM, vLLM
// CVE-2026-34756).
constexpr int kMaxChoices = 16;

struct ChatRequest {
  ojson messages;                      // array of message objects, as sent (normalised by the chat layer)
  ojson tools;                         // array or null (null also when tool_choice is "none")
  std::string tool_choice = "auto";    // auto | none | required | function
  std::string tool_choice_name;        // tool_choice = function
  bool parallel_tool_calls = true;
  std::optional<int> max_tokens;       // max_completion_tokens wins over max_tokens
  int n = 1;                           // choices, 1..kMaxChoices
  SamplingRequest sampling;
  std::vector<std::string> stop;       // <= 16 entries, 1..256 bytes
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  int top_logprobs = 0;                // 0..20
  ojson chat_template_kwargs = ojson::object();  // with reasoning_effort folded in
  bool include_reasoning = true;
  std::shared_ptr<const StructuredSpec> structured;  // response_format / grammar / regex / forced tool calls; null: free
};

struct CompletionRequest {
  std::string prompt_text;             // when the prompt is a string
  std::vector<int32_t> prompt_tokens;  // when the prompt is token ids (non-empty)
  bool prompt_is_tokens = false;
  std::optional<int> max_tokens;
  int n = 1;                           // choices, 1..kMaxChoices
  SamplingRequest sampling;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  int logprobs = -1;                   // -1: none; 0..5
};

// Limits the parser enforces that depend on the served model.
struct RequestLimits {
  int32_t n_vocab = 0;        // tokenizer ids are < n_vocab (token ids, logit_bias keys)
  int max_nesting = 128;      // JSON nesting depth
};

// Raw body -> JSON object. Throws ApiError 400 (invalid_utf8, invalid_json, or a non-object body).
ojson parse_body(const std::string& body, const RequestLimits& limits);

ChatRequest parse_chat_request(const ojson& body, const RequestLimits& limits);
CompletionRequest parse_completion_request(const ojson& body, const RequestLimits& limits);

// True when `s` is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool valid_utf8(std::string_view s);

}  // namespace lily::server
