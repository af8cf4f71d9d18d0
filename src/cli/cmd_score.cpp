// `lily score`: runs a token prompt through the model and writes the float32 logits of every position
// [T, vocab] as a .npy file (the input of the golden comparisons).
#include <chrono>
#include <cstdio>

#include "cli/command.h"
#include "runtime/generate.h"
#include "cli/token_args.h"
#include "util/npy.h"

namespace lily::cli {
namespace {

CommandRegistrar reg{Command{
    "score", "write the logits of every prompt position as a .npy file", [](CLI::App& sub) {
      struct Opts {
        std::string model, tokens, out, device = "auto";
        int threads = 0;
        bool check_tensors = false;
      };
      auto o = std::make_shared<Opts>();
      sub.add_option("--model", o->model, "model directory")->required();
      sub.add_option("--tokens", o->tokens, "prompt token ids, e.g. \"1 2 3\"")->required();
      sub.add_option("--out", o->out, "output .npy file (float32 [T, vocab])")->required();
      sub.add_option("--device", o->device, "cuda or cpu (default: cuda when a GPU is present)");
      sub.add_option("--threads", o->threads, "CPU worker threads (default: all cores)");
      sub.add_flag("--check-tensors", o->check_tensors, "scan the weights for NaN / Inf at load");
      return [o]() {
        const std::vector<int32_t> tokens = parse_token_list(o->tokens);
        auto t0 = std::chrono::steady_clock::now();
        LoadOptions load;
        load.check_tensors = o->check_tensors;
        apply_threads(o->threads);
        Model model = load_model(o->model, load);
        auto backend = make_device_backend(model, o->device, static_cast<int>(tokens.size()));
        auto t1 = std::chrono::steady_clock::now();
        const int64_t V = model.config.vocab;
        std::vector<float> logits(tokens.size() * V);
        GenerateOptions g;  // the generation loop, prompt only: every position's logits
        g.max_tokens = 0;
        g.prompt_logits = logits.data();
        generate(*backend, tokens, 0, g);
        auto t2 = std::chrono::steady_clock::now();
        write_npy_f32(o->out, logits.data(), {static_cast<int64_t>(tokens.size()), V});
        const double load_s = std::chrono::duration<double>(t1 - t0).count();
        const double run_s = std::chrono::duration<double>(t2 - t1).count();
        std::fprintf(stderr, "score: %zu tokens, load %.2f s, forward %.2f s (%.1f tok/s), wrote %s\n", tokens.size(),
                     load_s, run_s, tokens.size() / run_s, o->out.c_str());
        return 0;
      };
    }}};

}  // namespace
}  // namespace lily::cli
