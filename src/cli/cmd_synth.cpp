// `lily synth`: writes a random-weight checkpoint of this architecture (tiny or full sizes, HF bf16 or
// MLX 4-bit layout), deterministic from --seed. Used to build test fixtures and to exercise the loader.
#include <chrono>
#include <cstdio>

#include "cli/command.h"
#include "model/synth.h"
#include "util/check.h"

namespace lily::cli {
namespace {

CommandRegistrar reg{Command{
    "synth", "write a random-weight checkpoint of this architecture", [](CLI::App& sub) {
      struct Opts {
        std::string out, preset = "tiny", layout = "hf-bf16";
        uint64_t seed = 1, shard_mb = 0;
        int vocab = 0, layers = 0, threads = 0;
        bool tie = false;
      };
      auto o = std::make_shared<Opts>();
      sub.add_option("--out", o->out, "output directory")->required();
      sub.add_option("--preset", o->preset, "tiny | full")->check(CLI::IsMember({"tiny", "full"}));
      sub.add_option("--layout", o->layout, "hf-bf16 | mlx-4bit")->check(CLI::IsMember({"hf-bf16", "mlx-4bit"}));
      sub.add_option("--seed", o->seed, "random seed");
      sub.add_option("--vocab", o->vocab, "override vocab_size");
      sub.add_option("--layers", o->layers, "override num_hidden_layers");
      sub.add_option("--threads", o->threads, "worker threads (default: all)");
      sub.add_option("--shard-mb", o->shard_mb, "shard size in MB (default: one file for tiny, 4000 for full)");
      sub.add_flag("--tie", o->tie, "tie_word_embeddings (no lm_head tensor)");
      return [o]() {
        SynthOptions opt;
        opt.preset = o->preset;
        opt.layout = o->layout == "hf-bf16" ? CheckpointLayout::hf_bf16 : CheckpointLayout::mlx_affine;
        opt.seed = o->seed;
        opt.vocab = o->vocab;
        opt.layers = o->layers;
        opt.threads = o->threads;
        opt.shard_bytes = o->shard_mb * 1000000ull;
        opt.tie_word_embeddings = o->tie;
        auto t0 = std::chrono::steady_clock::now();
        uint64_t bytes = synth_checkpoint(o->out, opt);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("wrote %s: %llu tensor bytes in %.1f s (%.2f GB/s)\n", o->out.c_str(),
                    static_cast<unsigned long long>(bytes), s, bytes / s / 1e9);
        return 0;
      };
    }}};

}  // namespace
}  // namespace lily::cli
