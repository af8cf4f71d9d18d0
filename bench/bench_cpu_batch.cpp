// CPU batched decode: one CpuBatchBackend step over N sequences (each weight read once) against N one-slot
// steps, after a short prompt per sequence. Reports the median step time and tokens/s per N. Without a model
// directory it synthesizes one with the real model's layer shapes (MLX 4-bit, few layers).
// Usage: bench_cpu_batch [model_dir|-] [threads] [layers]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "model/synth.h"
#include "runtime/cpu_batch_backend.h"

using namespace lily;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : "-";
  const int threads = argc > 2 ? std::atoi(argv[2]) : 0;
  const int layers = argc > 3 ? std::atoi(argv[3]) : 4;
  std::string tmp;
  if (dir == "-") {
    tmp = (std::filesystem::temp_directory_path() / "lily_bench_cpu_batch").string();
    SynthOptions opt;
    opt.preset = "full";
    opt.layout = CheckpointLayout::mlx_affine;
    opt.layers = layers;
    std::printf("synthesizing %d full-size layers (MLX 4-bit) in %s\n", layers, tmp.c_str());
    synth_checkpoint(tmp, opt);
    dir = tmp;
  }
  const Model model = load_model(dir);
  ThreadPool pool(threads);
  const int V = model.config.vocab;
  const int prompt = 32, reps = 5;
  std::printf("threads %d, %d layers, prompt %d tokens, median of %d decode steps\n", pool.size(),
              model.config.n_layers, prompt, reps);
  std::printf("%4s %14s %14s %10s %12s\n", "N", "batched ms", "looped ms", "speedup", "batched tok/s");
  std::mt19937_64 rng(1);
  for (int n : {1, 2, 4, 8, 16}) {
    CpuBatchBackend be(model, n, 0, &pool);
    std::vector<std::vector<int32_t>> prompts(n, std::vector<int32_t>(prompt));
    for (auto& p : prompts)
      for (auto& t : p) t = static_cast<int32_t>(rng() % V);
    std::vector<BatchEntry> batch;
    for (int s = 0; s < n; ++s) batch.push_back({s, prompts[s], nullptr});
    be.step(batch);
    std::vector<std::vector<float>> logits(n, std::vector<float>(V));
    std::vector<int32_t> next(n);
    std::vector<double> batched, looped;
    for (int r = -1; r < reps; ++r) {  // r = -1: a warm-up round, not timed
      for (int s = 0; s < n; ++s) {
        next[s] = static_cast<int32_t>(rng() % V);
        batch[s] = {s, std::span<const int32_t>(&next[s], 1), logits[s].data()};
      }
      double t0 = now_s();
      be.step(batch);
      if (r >= 0) batched.push_back(now_s() - t0);
      t0 = now_s();
      for (int s = 0; s < n; ++s) be.step(std::span<const BatchEntry>(&batch[s], 1));
      if (r >= 0) looped.push_back(now_s() - t0);
    }
    const double b = median(batched), l = median(looped);
    std::printf("%4d %14.2f %14.2f %9.2fx %12.1f\n", n, b * 1e3, l * 1e3, l / b, n / b);
  }
  if (!tmp.empty()) std::filesystem::remove_all(tmp);
  return 0;
}
