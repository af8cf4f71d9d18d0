// The CUDA model's public face, usable from code compiled without nvcc (the CLI): a device probe and the
// decode benchmark behind `lily bench` (the Backend's factories: runtime/cuda_backend.h). Only available when the build
// has CUDA (LILY_HAVE_CUDA); callers guard their use with #ifdef LILY_HAVE_CUDA.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/kernel_options.h"
#include "model/weights.h"

namespace lily {

// True when a CUDA device is present and usable.
bool cuda_device_available();
// "NVIDIA H200, 132 SMs, 139.8 GiB" (empty when none).
std::string cuda_device_description(int device = 0);

// ---- decode benchmark (`lily bench`) ----
struct BenchOptions {
  std::string model_dir;           // empty: synthetic full-size weights generated on the GPU (no disk)
  std::vector<int> contexts = {0, 4096, 32768, 131072};
  int steps = 128;                 // timed decode steps per context
  int warmup = 8;
  int device = 0;
  bool breakdown = true;           // per-kernel-family times (instrumented non-graph pass)
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

struct BenchReport {
  std::string device;
  std::string weights;             // "synthetic full (MLX 4-bit layout)" or the model dir
  double copy_gb_per_s = 0;        // measured device-to-device copy (read + write bytes)
  double weight_bytes = 0;         // bytes of weights resident on the GPU
  double load_s = 0;               // --model: opening the checkpoint + uploading it to the GPU (0 for synthetic)
  double file_bytes = 0;           // --model: matrix bytes read from the checkpoint files
  std::vector<BenchPoint> points;
};

BenchReport run_decode_bench(const BenchOptions& opt);

}  // namespace lily
