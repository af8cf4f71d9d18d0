// libFuzzer target for the Jinja interpreter (scripts/fuzz.sh builds it with ASan + UBSan and runs it for a
// bounded time). Input: a template source. It is parsed and rendered with a chat-like context under small
// limits; the only acceptable failure is lily::jinja::TemplateError — any other exception, crash, hang, UB or
// leak is a bug. Seeds: tests/chat/corpus/jinja/ (the Qwen templates and construct snippets).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "chat/jinja.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "  sys  "},
      {"role": "user", "content": "hi <think>x</think> 中文"},
      {"role": "assistant", "content": "", "reasoning_content": "r",
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [true, null, 1.5]}}}]},
      {"role": "tool", "content": "<tool_response>ok</tool_response>"},
      {"role": "user", "content": [{"type": "text", "text": "t"}, {"type": "image"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}],
    "documents": null, "add_generation_prompt": true, "enable_thinking": false, "bos_token": "<s>"
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  lily::jinja::Limits limits;
  limits.max_output_bytes = 1 << 20;
  limits.max_steps = 200'000;
  limits.max_call_depth = 16;
  try {
    lily::jinja::Template t(source);
    std::string out = t.render(context(), limits);
    if (out.size() > limits.max_output_bytes) {
      std::fprintf(stderr, "fuzz_jinja: output over the limit (%zu bytes)\n", out.size());
      std::abort();
    }
  } catch (const lily::jinja::TemplateError&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_jinja: non-template exception: %s\n", e.what());
    std::abort();
  }
  return 0;
}
