// `lily bench`: batch-1 decode speed of the CUDA backend at several context lengths — µs and tokens per
// second, achieved GB/s, % of the bandwidth floor (bytes per token / measured copy bandwidth) and time per
// kernel family — as a terminal table or JSON. Weights: `--synthetic full` (random full-size weights made
// on the GPU, no disk) or `--model DIR`. Needs the CUDA build; otherwise it says so and fails.
// `--concurrency 1,4,8` measures the continuous-batching scheduler instead (runtime/bench_concurrency.h): total and
// per-stream tok/s with that many sequences at once. `--prompts 1k,8k` measures prompts to their first token as
// the server runs them, with time and TFLOP/s per kernel family (runtime/bench_prompt.h), on CUDA or the CPU.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "runtime/bench_concurrency.h"
#include "runtime/bench_loop.h"
#include "runtime/bench_prompt.h"
#include "runtime/cpu_backend.h"
#include "runtime/cpu_batch_backend.h"
#include "util/thread_pool.h"
#include "server/engine.h"
#ifdef LILY_HAVE_CUDA
#include "model/forward_cuda.h"
#include "runtime/cuda_backend.h"
#endif

namespace lily::cli {
namespace {

struct BenchArgs {
  std::string synthetic;
  std::string model_dir;
  std::string contexts = "0,4096,32768,131072";
  int steps = 128;
  bool json = false;
  bool no_breakdown = false;
  bool no_loops = false;
  std::string concurrency;              // comma-separated client counts: the scheduler benchmark
  int gen_tokens = 256;
  int prompt_tokens = 100;
  int profile_steps = 0;
  std::string device = "cpu";           // --concurrency / --prompts with --model: cpu or cuda
  std::string prompts;                  // comma-separated prompt lengths: the prompt benchmark
  int prompt_runs = 3;
  int prompt_piece = 0;  // --prompt-piece: tokens per prefill call (0: the server's EngineOptions::prefill_chunk)
};

// A comma-separated list of counts (suffix k = 1024): contexts, client counts.
std::vector<int> parse_counts(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    int mult = 1;
    if (item.back() == 'k' || item.back() == 'K') {
      mult = 1024;
      item.pop_back();
    }
    v.push_back(std::stoi(item) * mult);
  }
  return v;
}

double tflops(double flops, double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; }

// A profile's family table, largest first: ms, share, TFLOP/s and microseconds per unit (units of them: a
// prompt's tokens, or the rows of the profiled steps), then all gemm_* families together.
void print_families(std::vector<FamilyTime> fams, double units) {
  double sum = 0;
  for (const FamilyTime& f : fams) sum += f.ms;
  const FamilyTime g = gemm_total(fams);
  std::printf("  %-22s %10s %7s %9s %11s\n", "family", "ms", "%", "TFLOP/s", "us/unit");
  std::stable_sort(fams.begin(), fams.end(), [](const FamilyTime& x, const FamilyTime& y) { return x.ms > y.ms; });
  for (const FamilyTime& f : fams) {
    std::printf("  %-22s %10.2f %6.1f%% ", f.name.c_str(), f.ms, 100 * f.ms / sum);
    if (f.flops > 0) std::printf("%9.2f", tflops(f.flops, f.ms));
    else std::printf("%9s", "");
    std::printf(" %11.2f\n", 1e3 * f.ms / units);
  }
  std::printf("  %-22s %10.2f %6.1f%% %9.2f %11.2f\n", g.name.c_str(), g.ms, 100 * g.ms / sum, tflops(g.flops, g.ms),
              1e3 * g.ms / units);
}

// The weights of --concurrency / --prompts: --model DIR (CPU, or CUDA with --device cuda) or --synthetic full
// (CUDA); false (said on stderr) when neither or both are given.
bool one_weights_source(const BenchArgs& a, const char* mode) {
  if (a.model_dir.empty() != a.synthetic.empty()) return true;
  std::fprintf(stderr, "lily bench %s: give --model DIR (CPU, or CUDA with --device cuda) or --synthetic full (CUDA)\n",
               mode);
  return false;
}

// The scheduler with C sequences at once: on the CUDA batch backend (--synthetic full, or --model DIR --device
// cuda), else on the CPU batch backend (--model DIR).
int run_concurrency(const BenchArgs& a) {
  if (!one_weights_source(a, "--concurrency")) return 2;
  ConcurrencyBenchOptions o;
  o.concurrency = parse_counts(a.concurrency);
  o.gen_tokens = a.gen_tokens;
  o.prompt_tokens = a.prompt_tokens;
  o.profile_steps = a.profile_steps;
  if (o.concurrency.empty()) {
    std::fprintf(stderr, "lily bench --concurrency: expected a list such as 1,4,8\n");
    return 2;
  }
  const int slots = *std::max_element(o.concurrency.begin(), o.concurrency.end());
  const int ctx = o.prompt_tokens + o.gen_tokens + 16;
  std::unique_ptr<Backend> single;       // the CUDA backend whose engine the batch backend runs on
  std::unique_ptr<BatchBackend> batch;
  std::unique_ptr<Model> model;
  if (!a.synthetic.empty() || a.device == "cuda") {
#ifdef LILY_HAVE_CUDA
    single = make_bench_cuda_backend(a.model_dir, ctx, 0);
    batch = make_cuda_batch_backend(*single, slots);
#endif
    if (!batch) {
      std::fprintf(stderr, "lily bench --concurrency: no CUDA batch backend (a build without CUDA, or shapes the "
                           "prompt path does not take)\n");
      return 1;
    }
  } else {
    model = std::make_unique<Model>(load_model(a.model_dir));
    batch = std::make_unique<CpuBatchBackend>(*model, slots, ctx);
  }
  BatchBackend& be = *batch;
  const std::vector<ConcurrencyPoint> pts = run_concurrency_bench(be, o);
  if (a.json) {
    nlohmann::json j;
    j["backend"] = be.name();
    j["prompt_tokens"] = o.prompt_tokens;
    j["gen_tokens"] = o.gen_tokens;
    for (const ConcurrencyPoint& p : pts)
      j["points"].push_back({{"clients", p.clients}, {"total_tok_per_s", p.total_tok_per_s},
                             {"stream_tok_per_s", p.stream_tok_per_s}, {"ttft_ms", p.ttft_ms},
                             {"mean_batch", p.mean_batch}, {"steps", p.steps},
                             {"step_ms", p.step_ms}, {"forward_ms", p.forward_ms},
                             {"begin_ms", p.begin_ms}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("scheduler on the %s batch backend (%d host threads): %d-token prompts, %d ids each, chat sampling\n",
              be.name().c_str(), ThreadPool::global().size(), o.prompt_tokens, o.gen_tokens);
  std::printf("%8s %12s %13s %10s %11s %7s %8s %11s %9s\n", "clients", "total tok/s", "stream tok/s", "TTFT ms",
              "mean batch", "steps", "step ms", "forward ms", "begin ms");
  for (const ConcurrencyPoint& p : pts)
    std::printf("%8d %12.1f %13.1f %10.1f %11.2f %7d %8.2f %11.2f %9.3f\n", p.clients, p.total_tok_per_s,
                p.stream_tok_per_s, p.ttft_ms, p.mean_batch, p.steps, p.step_ms, p.forward_ms, p.begin_ms);
  for (const ConcurrencyPoint& p : pts) {
    if (p.families.empty()) continue;
    double sum = 0;
    for (const FamilyTime& f : p.families) sum += f.ms;
    std::printf("\n%d clients, %d profiled steps (launched one by one): %.2f ms a step; us/unit per row of a step\n",
                p.clients, p.profiled_steps, sum / p.profiled_steps);
    print_families(p.families, static_cast<double>(p.profiled_steps) * p.clients);
  }
  return 0;
}

// Prompts to their first token through the server's loop, on CUDA (--synthetic full, or --model DIR --device
// cuda) or the CPU (--model DIR).
int run_prompts(const BenchArgs& a) {
  if (!one_weights_source(a, "--prompts")) return 2;
  PromptBenchOptions o;
  o.prompts = parse_counts(a.prompts);
  o.runs = a.prompt_runs;
  const server::EngineOptions server_defaults;
  o.piece = a.prompt_piece > 0 ? a.prompt_piece : server_defaults.prefill_chunk;
  o.checkpoint_interval = server_defaults.checkpoint_interval;
  if (o.prompts.empty()) {
    std::fprintf(stderr, "lily bench --prompts: expected a list such as 1k,8k,32k\n");
    return 2;
  }
  const int ctx = *std::max_element(o.prompts.begin(), o.prompts.end()) + 64;
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> be;
  if (!a.synthetic.empty() || a.device == "cuda") {
#ifdef LILY_HAVE_CUDA
    be = make_bench_cuda_backend(a.model_dir, ctx, 0);
#endif
    if (!be) {
      std::fprintf(stderr, "lily bench --prompts: this build has no CUDA\n");
      return 1;
    }
  } else {
    model = std::make_unique<Model>(load_model(a.model_dir));
    be = std::make_unique<CpuBackend>(*model, ctx);
  }
  const std::vector<PromptPoint> pts = run_prompt_bench(*be, o);
  if (a.json) {
    nlohmann::json j;
    j["backend"] = be->name();
    j["piece_tokens"] = o.piece;
    j["checkpoint_interval"] = o.checkpoint_interval;
    for (const PromptPoint& p : pts) {
      nlohmann::json q = {{"tokens", p.tokens},           {"ttft_ms", p.ttft_ms},
                          {"tok_per_s", p.tok_per_s},     {"runs", p.runs},
                          {"profiled_ms", p.profiled_ms}, {"gemm_ms", p.gemm_ms},
                          {"gemm_tflops", tflops(p.gemm_flops, p.gemm_ms)}};
      for (const FamilyTime& f : p.families)
        q["families"][f.name] = {{"ms", f.ms}, {"flops", f.flops}, {"tflops", tflops(f.flops, f.ms)}};
      j["points"].push_back(q);
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("prompts on the %s backend through generate() as `lily serve` runs a fresh one: pieces of %d tokens, "
              "a snapshot every %d\n", be->name().c_str(), o.piece, o.checkpoint_interval);
  std::printf("%9s %11s %11s %5s\n", "tokens", "TTFT ms", "tok/s", "runs");
  for (const PromptPoint& p : pts) std::printf("%9d %11.1f %11.0f %5d\n", p.tokens, p.ttft_ms, p.tok_per_s, p.runs);
  for (const PromptPoint& p : pts) {
    if (p.families.empty()) continue;
    double sum = 0;
    for (const FamilyTime& f : p.families) sum += f.ms;
    std::printf("\n%d tokens, one profiled run: %.1f ms to the first id, families sum to %.1f ms\n", p.tokens,
                p.profiled_ms, sum);
    print_families(p.families, p.tokens);
  }
  return 0;
}

#ifdef LILY_HAVE_CUDA
void print_table(const BenchReport& r, const LoopBenchReport& lr) {
  std::printf("device  : %s\nweights : %s (%.2f GB resident)\ncopy bw : %.0f GB/s (device-to-device, read+write)\n",
              r.device.c_str(), r.weights.c_str(), r.weight_bytes / 1e9, r.copy_gb_per_s);
  if (r.load_s > 0)
    std::printf("load    : %.2f s (checkpoint opened and %.2f GB of matrices uploaded + repacked: %.2f GB/s)\n",
                r.load_s, r.file_bytes / 1e9, r.file_bytes / 1e9 / r.load_s);
  std::printf("\n");
  std::printf("%9s %10s %9s %12s %9s %10s %8s\n", "context", "us/token", "tok/s", "bytes/token", "GB/s", "floor us",
              "% floor");
  for (const BenchPoint& p : r.points)
    std::printf("%9d %10.1f %9.1f %12.3e %9.0f %10.1f %7.1f%%\n", p.context, p.us_per_token, p.tok_per_s,
                p.bytes_per_token, p.gb_per_s, p.floor_us, p.pct_of_floor);
  for (const BenchPoint& p : r.points) {
    if (p.families.empty()) continue;
    double total = 0;
    for (const BenchFamily& f : p.families) total += f.us_per_token;
    std::printf("\nper kernel family at context %d (instrumented pass, no graph; total %.1f us):\n", p.context, total);
    for (const BenchFamily& f : p.families)
      std::printf("  %-14s %9.1f us  %5.1f%%\n", f.name.c_str(), f.us_per_token, 100 * f.us_per_token / total);
  }
  if (!lr.loops.empty()) {
    std::printf("\ngeneration loop (runtime/generate.h, as `lily serve` runs it; context ~0, sampling included):\n");
    for (const BenchLoop& l : lr.loops)
      std::printf("  %-82s %8.1f us/token %7.1f tok/s\n", l.name.c_str(), l.us_per_token, 1e6 / l.us_per_token);
    std::printf("  sampler set up: a new configuration (two decode graphs captured) %.0f us, another seed "
                "only %.0f us, a configuration used before (graphs kept) %.0f us\n", lr.sampler_setup_us,
                lr.seed_setup_us, lr.cached_setup_us);
  }
}

nlohmann::json to_json(const BenchReport& r, const LoopBenchReport& lr) {
  nlohmann::json j;
  j["device"] = r.device;
  j["weights"] = r.weights;
  j["weight_bytes"] = r.weight_bytes;
  j["copy_gb_per_s"] = r.copy_gb_per_s;
  if (r.load_s > 0) {
    j["load_s"] = r.load_s;
    j["file_bytes"] = r.file_bytes;
  }
  for (const BenchPoint& p : r.points) {
    nlohmann::json q = {{"context", p.context},           {"us_per_token", p.us_per_token},
                        {"tok_per_s", p.tok_per_s},       {"bytes_per_token", p.bytes_per_token},
                        {"gb_per_s", p.gb_per_s},         {"floor_us", p.floor_us},
                        {"pct_of_floor", p.pct_of_floor}};
    for (const BenchFamily& f : p.families) q["families_us"][f.name] = f.us_per_token;
    j["points"].push_back(q);
  }
  for (const BenchLoop& l : lr.loops) j["loops_us"][l.name] = l.us_per_token;
  if (!lr.loops.empty()) {
    j["sampler_setup_us"] = lr.sampler_setup_us;
    j["seed_setup_us"] = lr.seed_setup_us;
    j["cached_setup_us"] = lr.cached_setup_us;
  }
  return j;
}
#endif

int run_bench(const BenchArgs& a) {
  if (!a.concurrency.empty()) return run_concurrency(a);
  if (!a.prompts.empty()) return run_prompts(a);
#ifdef LILY_HAVE_CUDA
  if (a.synthetic.empty() == a.model_dir.empty()) {
    std::fprintf(stderr, "lily bench: give exactly one of --synthetic full or --model DIR\n");
    return 2;
  }
  if (!a.synthetic.empty() && a.synthetic != "full") {
    std::fprintf(stderr, "lily bench: --synthetic supports only 'full'\n");
    return 2;
  }
  BenchOptions o;
  o.model_dir = a.model_dir;
  o.contexts = parse_counts(a.contexts);
  o.steps = a.steps;
  o.breakdown = !a.no_breakdown;
  const BenchReport r = run_decode_bench(o);
  LoopBenchReport lr;
  if (!a.no_loops) {  // the loop on a backend of its own (the engine above and its weights are gone)
    LoopBenchOptions lo;
    lo.steps = o.steps;
    lo.warmup = o.warmup;
    lo.prefill_chunks = {0, server::EngineOptions{}.prefill_chunk};
    std::unique_ptr<Backend> be = make_bench_cuda_backend(a.model_dir, 131072 + 64, o.device);
    lr = run_loop_bench(*be, lo);
  }
  if (a.json)
    std::printf("%s\n", to_json(r, lr).dump(2).c_str());
  else
    print_table(r, lr);
  return 0;
#else
  (void)a;
  std::fprintf(stderr, "lily bench: needs the CUDA build (this binary was built without CUDA)\n");
  return 1;
#endif
}

const CommandRegistrar reg{Command{
    "bench", "decode speed of the CUDA backend (tok/s, GB/s, % of the bandwidth floor) at several contexts",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<BenchArgs>();
      sub.add_option("--synthetic", a->synthetic, "random full-size weights generated on the GPU: 'full'");
      sub.add_option("--model", a->model_dir, "checkpoint directory");
      sub.add_option("--contexts", a->contexts, "comma-separated context lengths (suffix k = 1024)");
      sub.add_option("--steps", a->steps, "timed decode steps per context (>= 128 recommended)");
      sub.add_flag("--json", a->json, "print JSON instead of a table");
      sub.add_flag("--no-breakdown", a->no_breakdown, "skip the per-kernel-family pass");
      sub.add_flag("--no-loops", a->no_loops, "skip the generation-loop measurement");
      sub.add_option("--concurrency", a->concurrency,
                     "comma-separated client counts (e.g. 1,4,8,16,64): total and per-stream tok/s through the "
                     "continuous-batching scheduler (--model DIR on the CPU or --device cuda; --synthetic full on CUDA)");
      sub.add_option("--prompts", a->prompts,
                     "comma-separated prompt lengths (e.g. 1k,8k,32k,128k): time to the first id as `lily serve` "
                     "runs a fresh prompt, and time and TFLOP/s per kernel family (--synthetic full or --model DIR)");
      sub.add_option("--prompt-runs", a->prompt_runs, "--prompts: timed runs per length (one from 32K tokens)")
          ->capture_default_str();
      sub.add_option("--prompt-piece", a->prompt_piece,
                     "--prompts: tokens per prefill call instead of the server's piece size (an A/B of piece sizes)");
      sub.add_option("--device", a->device, "--concurrency / --prompts with --model: cpu or cuda")
          ->capture_default_str();
      sub.add_option("--gen-tokens", a->gen_tokens, "--concurrency: ids generated per sequence")->capture_default_str();
      sub.add_option("--prompt-tokens", a->prompt_tokens, "--concurrency: prompt tokens per sequence")->capture_default_str();
      sub.add_option("--profile-steps", a->profile_steps,
                     "--concurrency: profile this many steps from the middle of each run (per kernel family)");
      return [a] { return run_bench(*a); };
    }}};

}  // namespace
}  // namespace lily::cli
