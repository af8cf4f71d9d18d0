#include "kernels/common.cuh"
#include "model/event_profiler.cuh"

namespace lily::cuda {

EventProfiler::~EventProfiler() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void EventProfiler::mark(const char* family, double flops) {
  if (marks_.size() == events_.size()) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  CUDA_CHECK(cudaEventRecord(events_[marks_.size()], stream_));
  marks_.emplace_back(family, flops);
}

std::vector<FamilyTime> EventProfiler::finish() {
  FamilyTable t;
  if (!marks_.empty()) {
    mark("");  // closes the last family
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i + 1 < marks_.size(); ++i) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
      t.count(marks_[i].first, marks_[i].second);
      t.add(marks_[i].first, ms, 0);
    }
  }
  marks_.clear();
  return t.rows();
}

}  // namespace lily::cuda
