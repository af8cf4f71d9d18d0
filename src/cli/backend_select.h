// `--device cuda|cpu` for the CLI commands that run the model (score, generate, ...): one option helper and
// one factory, so each command adds a single line. Default: cuda when this binary has CUDA and a GPU is
// present, else cpu.
#pragma once
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "model/weights.h"
#include "runtime/backend.h"
#include "runtime/batch_backend.h"

namespace lily::cli {

// Adds --device to `sub`, storing the choice in `device` ("auto" until given).
void add_device_option(CLI::App& sub, std::string& device);

// `--gpu N` (serve): runs this process on CUDA device N only, by narrowing CUDA_VISIBLE_DEVICES to that device
// before CUDA initialises (no context is created on the other GPUs; inside the process it is device 0). With
// CUDA_VISIBLE_DEVICES already set, N indexes that list. Throws lily::Error naming --gpu when N is out of range.
// Returns the CUDA_VISIBLE_DEVICES value set.
std::string pin_gpu(int ordinal);

// "cuda" or "cpu" for a --device value ("auto" picks cuda when available). Throws lily::Error when cuda is
// asked for but unavailable (no CUDA build, or no GPU).
std::string resolve_device(const std::string& device);

// The backend for `device` ("auto", "cuda", "cpu"); max_context <= 0: the model's maximum.
// `model` must outlive the returned backend.
std::unique_ptr<Backend> make_device_backend(const Model& model, const std::string& device, int max_context = 0);
// The batch backend over a device backend (CUDA: runtime/cuda_batch_backend), or null (CPU: the server makes its own).
std::unique_ptr<BatchBackend> make_device_batch_backend(Backend& backend, int max_seqs);

}  // namespace lily::cli
