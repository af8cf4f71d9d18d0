// `lily generate`: greedy or sampled continuation of a prompt given as token ids (--tokens), as text
// (--prompt), or as a one-message chat rendered with the model's template (--prompt TEXT --chat). Prints the
// generated ids on one line with --print-ids, else streams the decoded text.
// Sampling options left unset take the model's generation_config.json values (temperature, top_k, top_p).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "cli/command.h"
#include "cli/token_args.h"
#include "chat/template.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

namespace lily::cli {
namespace {

CommandRegistrar reg{Command{
    "generate", "continue a prompt (token ids, text, or a one-message chat)", [](CLI::App& sub) {
      struct Opts {
        std::string model, tokens, prompt, device = "auto";
        int max_tokens = 16, threads = 0, top_k = 0, n_valid = 0, max_context = 0;
        float temperature = 1, top_p = 1, min_p = 0, presence = 0, frequency = 0, repetition = 1;
        uint64_t seed = 0;
        bool ignore_eos = false, print_ids = false, chat = false, no_think = false, check_tensors = false;
      };
      auto o = std::make_shared<Opts>();
      sub.add_option("--model", o->model, "model directory")->required();
      auto* tokens_opt = sub.add_option("--tokens", o->tokens, "prompt token ids, e.g. \"1 2 3\"");
      auto* prompt_opt = sub.add_option("--prompt", o->prompt, "prompt text (tokenized with the model's tokenizer)");
      tokens_opt->excludes(prompt_opt);
      sub.add_flag("--chat", o->chat, "render --prompt as one user message with the model's chat template");
      sub.add_flag("--no-think", o->no_think, "with --chat: enable_thinking=false");
      sub.add_option("--max-tokens", o->max_tokens, "tokens to generate at most (default 16)");
      auto* temp = sub.add_option("--temperature", o->temperature, "0: greedy (default: generation_config)");
      auto* topk = sub.add_option("--top-k", o->top_k, "0: off (default: generation_config)");
      auto* topp = sub.add_option("--top-p", o->top_p, "1: off (default: generation_config)");
      sub.add_option("--min-p", o->min_p, "0: off");
      sub.add_option("--presence-penalty", o->presence, "OpenAI presence penalty");
      sub.add_option("--frequency-penalty", o->frequency, "OpenAI frequency penalty");
      sub.add_option("--repetition-penalty", o->repetition, "HF repetition penalty (1: off)");
      sub.add_option("--seed", o->seed, "sampling seed");
      sub.add_option("--n-valid", o->n_valid, "ids >= this are padding (default: the tokenizer's size, else vocab)");
      sub.add_option("--max-context", o->max_context, "context limit (default: max_position_embeddings)");
      sub.add_flag("--ignore-eos", o->ignore_eos, "do not stop on the end-of-sequence ids");
      sub.add_flag("--print-ids", o->print_ids, "print the generated ids instead of the text");
      sub.add_option("--device", o->device, "cuda or cpu (default: cuda when a GPU is present)");
      sub.add_option("--threads", o->threads, "CPU worker threads (default: all cores)");
      sub.add_flag("--check-tensors", o->check_tensors, "scan the weights for NaN / Inf at load");
      return [o, temp, topk, topp]() {
        if (o->tokens.empty() == o->prompt.empty()) fail("generate: give exactly one of --tokens and --prompt");
        if (o->chat && o->prompt.empty()) fail("generate: --chat needs --prompt");
        std::optional<Tokenizer> tok;
        if (!o->prompt.empty() || !o->print_ids) tok = Tokenizer::load(o->model);
        std::vector<int32_t> prompt;
        if (!o->tokens.empty()) {
          prompt = parse_token_list(o->tokens);
        } else if (o->chat) {
          nlohmann::ordered_json messages = nlohmann::ordered_json::array();
          messages.push_back({{"role", "user"}, {"content", o->prompt}});
          nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
          if (o->no_think) kwargs["enable_thinking"] = false;
          const std::string text = chat::ChatTemplate::load_from_dir(o->model).render(
              messages, nlohmann::ordered_json(), true, kwargs);
          prompt = tok->encode(text);
        } else {
          prompt = tok->encode(o->prompt);
        }
        if (prompt.empty()) fail("generate: the prompt is empty");
        LoadOptions load;
        load.check_tensors = o->check_tensors;
        apply_threads(o->threads);
        Model model = load_model(o->model, load);
        const Config& cfg = model.config;
        GenerateOptions g;
        g.max_tokens = o->max_tokens;
        if (!o->ignore_eos) g.stop_ids = cfg.eos_token_ids;
        SamplingParams& s = g.sampling.params;
        s.temperature = temp->count() ? o->temperature : cfg.gen_temperature;
        s.top_k = topk->count() ? o->top_k : cfg.gen_top_k;
        s.top_p = topp->count() ? o->top_p : cfg.gen_top_p;
        s.min_p = o->min_p;
        s.presence_penalty = o->presence;
        s.frequency_penalty = o->frequency;
        s.repetition_penalty = o->repetition;
        s.seed = o->seed;
        s.n_valid = o->n_valid;
        if (s.n_valid <= 0 && tok) s.n_valid = tok->vocab_size();
        if (s.n_valid <= 0 && std::filesystem::exists(std::filesystem::path(o->model) / "tokenizer.json")) {
          try {
            s.n_valid = Tokenizer::load(o->model).vocab_size();
          } catch (const Error& e) {
            log::warn("generate: tokenizer not loaded (", e.what(), "); no padding mask");
          }
        }
        auto backend = make_device_backend(model, o->device, o->max_context);
        using clock = std::chrono::steady_clock;
        const auto t0 = clock::now();
        auto t_first = t0;
        std::optional<StreamDecoder> stream;
        if (!o->print_ids) stream.emplace(*tok, /*skip_special=*/true);
        g.on_token = [&t_first, &stream](const SampledToken& r, int index, bool) {
          if (index == 0) t_first = clock::now();
          if (stream) {
            std::fputs(stream->push(r.token).c_str(), stdout);
            std::fflush(stdout);
          }
          return FinishReason::none;
        };
        GenerateResult r = generate(*backend, prompt, g);
        const auto t_end = clock::now();
        const double ttft = std::chrono::duration<double>(t_first - t0).count();
        const double decode = std::chrono::duration<double>(t_end - t_first).count();
        if (stream) {
          std::printf("%s\n", stream->flush().c_str());
        } else {
          std::string line;
          for (size_t i = 0; i < r.tokens.size(); ++i) line += (i ? " " : "") + std::to_string(r.tokens[i].token);
          std::printf("%s\n", line.c_str());
        }
        std::fprintf(stderr,
                     "generate: %d prompt tokens, first token after %.2f s (%.1f prompt tok/s); %zu generated, "
                     "%.2f tok/s decode; finish: %s\n",
                     r.prompt_tokens, ttft, r.prompt_tokens / ttft, r.tokens.size(),
                     r.tokens.size() > 1 ? (r.tokens.size() - 1) / decode : 0.0, finish_reason_name(r.finish));
        return 0;
      };
    }}};

}  // namespace
}  // namespace lily::cli
