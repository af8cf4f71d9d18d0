// The CUDA backend's public face, usable from code compiled without nvcc (the CLI, the server): factories for
// the Backend over CudaEngine (model/cuda_engine.h). Only available when the build has CUDA (LILY_HAVE_CUDA);
// callers guard their use with #ifdef LILY_HAVE_CUDA.
#pragma once
#include <memory>
#include <string>

#include "model/forward_cuda.h"
#include "model/kernel_options.h"
#include "model/weights.h"
#include "runtime/backend.h"
#include "runtime/batch_backend.h"

namespace lily {

struct CudaOptions {
  int device = 0;            // CUDA device ordinal
  int max_context = 0;       // <= 0: config.max_position_embeddings (KV pages are allocated on demand)
  bool progress = true;      // progress bar on stderr while uploading weights
  bool quantize_bf16 = false;  // HF bf16 checkpoints: false = run bf16 GEMV (exact), true = MLX 4-bit on the GPU
  // Prefix-cache snapshots (save_state) kept in device memory up to this many bytes, beyond it in host memory.
  // -1: what is free once the weights, the engine and the full context's KV cache are counted, less 2 GiB.
  long long snapshot_device_bytes = -1;
  // Prompts of 16 tokens or more through the chunked prompt path (model/prefill_cuda.cu: GEMMs over up to
  // CudaEngine::kPrefillChunk tokens at a time); false, or kernels.prefill false: token by token through the
  // decode step.
  bool chunked_prompts = true;
  // The kernels' options (kernels/options.h, docs/kernel-options.md); by default those of the environment.
  cuda::KernelOptions kernels = kernel_options_from_env();
};

// Uploads the model's weights (repacked on the GPU) and captures the decode step as one CUDA graph.
// `model` must outlive the backend only during construction (weights are copied to the device).
std::unique_ptr<Backend> make_cuda_backend(const Model& model, const CudaOptions& opt = {});

namespace cuda {
struct DeviceWeights;
// The CUDA Backend on weights already on the device (the engine takes them), e.g. synthetic ones (benchmarks).
std::unique_ptr<Backend> make_cuda_backend(const Config& c, DeviceWeights w, int max_context, int device,
                                           long long snapshot_device_bytes = -1);
}  // namespace cuda

// Continuous batching on the GPU: `max_seqs` more sequence states over the engine of `cuda_backend` (one
// made by make_cuda_backend; it must outlive the result, and the two are not used at the same time). Each
// step is one pass of the chunked prompt path over every sequence's tokens, or, with at most graph_rows
// one-token rows (< 0: KernelOptions::batch_graph_rows), those through each slot's decode graph
// (runtime/cuda_batch_backend.cuh). Null when `cuda_backend` is not a CUDA backend or its prompt path does not
// take the model's shapes.
std::unique_ptr<BatchBackend> make_cuda_batch_backend(Backend& cuda_backend, int max_seqs, int graph_rows = -1);

// For `lily bench`: the CUDA Backend over the checkpoint in `model_dir`, or (empty) over synthetic full-size
// weights in the MLX 4-bit layout generated on the GPU.
std::unique_ptr<Backend> make_bench_cuda_backend(const std::string& model_dir, int max_context, int device);

}  // namespace lily
