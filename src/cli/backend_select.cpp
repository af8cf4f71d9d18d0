// --device selection for CLI commands (see backend_select.h).
#include "cli/backend_select.h"

#include <cstdlib>
#include <sstream>
#include <vector>

#include "runtime/cpu_backend.h"
#include "util/check.h"
#ifdef LILY_HAVE_CUDA
#include "runtime/cuda_backend.h"
#endif

namespace lily::cli {

void add_device_option(CLI::App& sub, std::string& device) {
  device = "auto";
  sub.add_option("--device", device, "cuda or cpu (default: cuda when a GPU is present)")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
}

std::string pin_gpu(int ordinal) {
  LILY_CHECK(ordinal >= 0, "--gpu ", ordinal, ": expected a CUDA device ordinal >= 0");
  std::string value = std::to_string(ordinal);
  if (const char* cur = std::getenv("CUDA_VISIBLE_DEVICES"); cur && *cur) {
    std::vector<std::string> list;
    std::stringstream ss(cur);
    for (std::string item; std::getline(ss, item, ',');) list.push_back(item);
    LILY_CHECK(static_cast<size_t>(ordinal) < list.size(), "--gpu ", ordinal, ": CUDA_VISIBLE_DEVICES='", cur,
               "' lists ", list.size(), " device(s); --gpu counts within that list");
    value = list[static_cast<size_t>(ordinal)];
  }
  setenv("CUDA_VISIBLE_DEVICES", value.c_str(), 1);
  return value;
}

std::string resolve_device(const std::string& device) {
#ifdef LILY_HAVE_CUDA
  const bool gpu = cuda_device_available();
#else
  const bool gpu = false;
#endif
  if (device == "cpu") return "cpu";
  if (device == "cuda") {
    LILY_CHECK(gpu, "--device cuda: ",
#ifdef LILY_HAVE_CUDA
               "no CUDA device found"
#else
               "this binary was built without CUDA"
#endif
    );
    return "cuda";
  }
  LILY_CHECK(device == "auto", "--device ", device, ": expected cuda, cpu or auto");
  return gpu ? "cuda" : "cpu";
}

std::unique_ptr<BatchBackend> make_device_batch_backend(Backend& backend, int max_seqs) {
#ifdef LILY_HAVE_CUDA
  if (backend.name() == "cuda") return make_cuda_batch_backend(backend, max_seqs);
#endif
  (void)backend;
  (void)max_seqs;
  return nullptr;
}

std::unique_ptr<Backend> make_device_backend(const Model& model, const std::string& device, int max_context) {
  if (resolve_device(device) == "cuda") {
#ifdef LILY_HAVE_CUDA
    CudaOptions o;
    o.max_context = max_context;
    return make_cuda_backend(model, o);
#endif
  }
  return std::make_unique<CpuBackend>(model, max_context);
}

}  // namespace lily::cli
