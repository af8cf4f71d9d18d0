// The CUDA backend's public face, usable from code compiled without nvcc (the CLI, the server): a factory for
// the Backend, a device probe, and the decode benchmark behind `lily bench`. Only available when the build
// has CUDA (LILY_HAVE_CUDA); callers guard their use with #ifdef LILY_HAVE_CUDA.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/kernel_options.h"
#include "model/weights.h"
#include "runtime/backend.h"

namespace lily {

struct CudaOptions {
  int device = 0;            // CUDA device ordinal
  int max_context = 0;       // <= 0: config.max_position_embeddings (KV pages are allocated on demand)
  bool progress = true;      // progress bar on stderr while uploading weights
  bool quantize_bf16 = false;  // HF bf16 checkpoints: false = run bf16 GEMV (exact), true = MLX 4-bit on the GPU
  // Prefix-cache snapshots (save_state) kept in device memory up to this many bytes, beyond it in host memory.
  // -1: what is free once the weights, the engine and the full context's KV cache are counted, less 2 GiB.
  long long snapshot_device_bytes = -1;
  // Prompts of 16 tokens or more through the chunked prompt path (model/prefill_cuda.cu: GEMMs over up to 2048
  // tokens at a time); false, or kernels.prefill false: token by token through the decode step.
  bool chunked_prompts = true;
  // The kernels' options (kernels/options.h, docs/kernel-options.md); by default those of the environment.
  cuda::KernelOptions kernels = kernel_options_from_env();
};

// True when a CUDA device is present and usable.
bool cuda_device_available();
// "NVIDIA H200, 132 SMs, 139.8 GiB" (empty when none).
std::string cuda_device_description(int device = 0);

// Uploads the model's weights (repacked on the GPU) and captures the decode step as one CUDA graph.
// `model` must outlive the backend only during construction (weights are copied to the device).
std::unique_ptr<Backend> make_cuda_backend(const Model& model, const CudaOptions& opt = {});

// ---- decode benchmark (`lily bench`) ----
struct BenchOptions {
  std::string model_dir;           // empty: synthetic full-size weights generated on the GPU (no disk)
  std::vector<int> contexts = {0, 4096, 32768, 131072};
  int steps = 128;                 // timed decode steps per context
  int warmup = 8;
  int device = 0;
  bool breakdown = true;           // per-kernel-family times (instrumented non-graph pass)
  bool loops = true;               // the generation loop through the Backend (host vs device sampling)
};

struct BenchFamily {
  std::string name;                // e.g. "gdn", "moe", "lm_head"
  double us_per_token = 0;
};

struct BenchPoint {
  int context = 0;                 // tokens in the cache before the timed steps
  double us_per_token = 0;         // median over the timed steps (graph replay incl. greedy sampling)
  double tok_per_s = 0;
  double bytes_per_token = 0;      // docs/model.md §8 for this context
  double gb_per_s = 0;             // bytes_per_token / time
  double floor_us = 0;             // bytes_per_token / measured copy bandwidth
  double pct_of_floor = 0;         // floor_us / us_per_token * 100
  std::vector<BenchFamily> families;  // instrumented pass (sums a little above us_per_token: no graph)
};

// The generation loop as `lily serve` / `lily generate` run it (runtime/generate.cpp over the Backend, context
// ~0, 1-token prompt): decode time per token seen by the host, sampling included; and a prompt's time per token.
struct BenchLoop {
  std::string name;                // e.g. "greedy, device sampling"
  double us_per_token = 0;         // (last token time - first token time) / (tokens - 1)
};

struct BenchReport {
  std::string device;
  std::string weights;             // "synthetic full (MLX 4-bit layout)" or the model dir
  double copy_gb_per_s = 0;        // measured device-to-device copy (read + write bytes)
  double weight_bytes = 0;         // bytes of weights resident on the GPU
  double load_s = 0;               // --model: opening the checkpoint + uploading it to the GPU (0 for synthetic)
  double file_bytes = 0;           // --model: matrix bytes read from the checkpoint files
  std::vector<BenchPoint> points;
  std::vector<BenchLoop> loops;
  double sampler_setup_us = 0;     // begin_device_sampling with another configuration (decode graphs captured)
  double seed_setup_us = 0;        // begin_device_sampling with only another seed (no capture)
  double cached_setup_us = 0;      // begin_device_sampling back to a configuration used before (graphs kept)
};

BenchReport run_decode_bench(const BenchOptions& opt);

}  // namespace lily
