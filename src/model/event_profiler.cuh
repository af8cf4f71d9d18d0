// The CUDA engine's PassProfiler (model/pass_profile.h): an event recorded on the stream at each mark, so a
// family's time is the device's from one mark to the next. finish() synchronises and returns the table.
#pragma once
#include <cuda_runtime_api.h>

#include <string>
#include <utility>
#include <vector>

#include "model/pass_profile.h"

namespace lily::cuda {

class EventProfiler : public PassProfiler {
 public:
  explicit EventProfiler(cudaStream_t s) : stream_(s) {}
  ~EventProfiler() override;
  EventProfiler(const EventProfiler&) = delete;
  EventProfiler& operator=(const EventProfiler&) = delete;

  void mark(const char* family, double flops = 0) override;
  // Closes the last family with an event now, waits for the stream and returns the table (then starts over;
  // the events are kept for reuse).
  std::vector<FamilyTime> finish();

 private:
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;                 // created on demand, reused
  std::vector<std::pair<std::string, double>> marks_;  // (family, flops) of events_[i]
};

}  // namespace lily::cuda
