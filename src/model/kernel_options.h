// The CUDA path's options (kernels/options.h) from the LILY_* environment variables, read once per process,
// and their one-line description (`lily bench` prints it). Compiled without nvcc.
#pragma once
#include <functional>
#include <string>

#include "kernels/options.h"

namespace lily {

// The options in force: defaults, overridden by the environment; read on the first call, the same afterwards.
const cuda::KernelOptions& kernel_options_from_env();
// The defaults overridden by the LILY_* variables that `env` returns (null: unset). On/off switches: "0" turns a
// default-on one off, "1" a default-off one on, anything else leaves the default; numbers: atoi, unset or empty
// leaves the default.
cuda::KernelOptions parse_kernel_options(const std::function<const char*(const char*)>& env);
// "gdn_fused=1 moe_fused=1 attn_splits=auto ..." with each field's value.
std::string describe(const cuda::KernelOptions& o);

}  // namespace lily
