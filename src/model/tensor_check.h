// `--check-tensors` (docs/api.md §10.1): a scan of the checkpoint tensors the model reads for NaN and ±Inf at
// load, so a corrupt checkpoint fails with the file and tensor named instead of answering every request with
// 500 nan_logits. Optional: it reads every floating-point byte once (the MLX 4-bit checkpoint's scales, biases
// and vectors, ~2.2 GB; all ~70 GB of the bf16 release), spread over the CPU thread pool.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "util/safetensors.h"

namespace lily {

// The non-finite elements among n values of dtype dt (F16, BF16, F32, F64; other dtypes have none).
struct NonFinite {
  int64_t count = 0;
  int64_t first = -1;  // index of the first one, -1 when count == 0
  bool first_nan = false;
  bool first_negative = false;  // the first one is -Inf (when not NaN)
};
NonFinite find_non_finite(Dtype dt, const uint8_t* data, int64_t n);

// Scans the tensors `names` of `store`; throws lily::Error naming the file and tensor of the first one (in name
// order) with a non-finite value: how many, and the index and kind of the first.
void check_finite_tensors(const TensorStore& store, const std::vector<std::string>& names);

}  // namespace lily
