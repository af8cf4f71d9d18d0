// Structured output (docs/api.md rows response_format, tool_choice; docs/structured_output.md): the request fields
// that constrain generation — response_format json_object / json_schema, the `grammar` (GBNF) and `regex`
// extensions, tool_choice "required" or a named function — become a grammar, and per request a TokenFilter that
// leaves the reasoning block free, then allows only tokens the grammar accepts, and the end-of-output ids only
// where the grammar is complete.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/output_parser.h"
#include "grammar/cache.h"
#include "grammar/grammar.h"
#include "runtime/token_filter.h"

namespace lily {
class Tokenizer;
}

namespace lily::server {

// The constraint of one request, as parsed (vocabulary-independent; compiled per served model in the cache).
struct StructuredSpec {
  std::string kind;                                  // json_object | json_schema | grammar | regex | tool_call
  std::string key;                                   // cache key: kind + canonical source
  std::shared_ptr<const grammar::Grammar> grammar;   // the IR (built at parse time, so errors are 400s)
  bool triggered = false;  // tool_strict: the grammar applies to each call the model opens (<tool_call>), not from
                           // the start; text outside calls is free
};

// Reads response_format, grammar, regex, and tool_choice (with the request's tools and parallel_tool_calls)
// from the chat request body. Returns null when nothing constrains the output. With tool_choice "auto" and a tool
// marked `strict: true` (and no other constraint), the calls the model chooses to make are constrained
// (kind tool_strict). Throws ApiError 400 naming the
// field; schema problems name the keyword and its schema path in the message. `tool_choice` is "auto", "none",
// "required" or "function" (with `tool_choice_name`); `tools` is the validated tools array or null.
std::shared_ptr<const StructuredSpec> parse_structured_output(const nlohmann::ordered_json& body,
                                                              const nlohmann::ordered_json& tools,
                                                              const std::string& tool_choice,
                                                              const std::string& tool_choice_name,
                                                              bool parallel_tool_calls);

// One cache per served tokenizer (compiled grammars keep a reference to its vocabulary).
std::shared_ptr<grammar::GrammarCache> make_grammar_cache(const Tokenizer& tok, size_t capacity = 64);

// The per-request filter. Phases: reasoning (everything allowed, until ids.think_close is accepted; skipped
// when the prompt does not open a reasoning block) → grammar (its tokens; ids.stop only where the grammar is
// complete) → done (only ids.stop). A token the grammar refuses (the sampler ignored the mask) switches the
// filter off for the rest of the request and is logged. Triggered (tool_strict): after reasoning, text is free
// until the model samples ids.tool_open; the call's body then follows the grammar up to </tool_call>.
class StructuredFilter : public TokenFilter {
 public:
  StructuredFilter(std::shared_ptr<const grammar::CompiledGrammar> g, chat::DelimiterIds ids, bool start_in_reasoning,
                   bool triggered = false);
  bool allowed(std::span<uint32_t> mask) override;
  void accept(int32_t token) override;

  bool in_reasoning() const { return reasoning_; }
  bool complete() const { return matcher_.accepting(); }  // the grammar's output is complete here
  bool failed() const { return failed_; }

 private:
  std::shared_ptr<const grammar::CompiledGrammar> g_;
  grammar::Matcher matcher_;
  chat::DelimiterIds ids_;
  bool reasoning_;
  bool failed_ = false;
  bool ended_ = false;
  bool triggered_ = false;
  bool in_call_ = false;
};

// Compiles (or finds in `cache`) the spec's grammar and makes the request's filter. `start_in_reasoning` is
// chat::initial_reasoning_state(prompt). Throws ApiError 400 when the grammar uses a token id outside the vocabulary.
std::shared_ptr<TokenFilter> make_token_filter(const StructuredSpec& spec, grammar::GrammarCache& cache,
                                               const chat::DelimiterIds& ids, bool start_in_reasoning);

}  // namespace lily::server
