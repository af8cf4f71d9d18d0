// The device pool behind prefix-cache snapshots of the recurrent state (one StateSnapshot = one block of a state
// slot's bytes). CUDA only: the one-sequence backend (runtime/cuda_backend.cu) and the batch backend
// (runtime/cuda_batch_backend.cuh) each keep one.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/common.cuh"
#include "runtime/backend.h"

namespace lily::cuda {

// Device memory for prefix-cache snapshots (every snapshot is one GDN state, gdn_state_bytes): blocks are
// allocated up to a byte budget and recycled, never freed while the pool lives (cudaFree would synchronise the
// device). A snapshot holds its block through a shared_ptr whose deleter returns it here; the pool lives until
// the last one is gone. Saving and restoring are device-to-device copies on the engine's stream (~30 us for the
// real model's 64 MB), where a host snapshot cost tens of ms per prompt (pageable copies of the whole state).
class SnapshotPool {
 public:
  SnapshotPool(size_t block, size_t budget, int device) : block_(block), budget_(budget), device_(device) {}
  ~SnapshotPool() {
    cudaSetDevice(device_);
    for (void* p : free_) cudaFree(p);  // errors ignored: may run at exit, after the runtime is gone
  }
  // A block, or null when the budget is spent or the device has no memory left (then: a host snapshot).
  void* get() {
    std::lock_guard<std::mutex> lk(mu_);
    if (!free_.empty()) {
      void* p = free_.back();
      free_.pop_back();
      return p;
    }
    if (allocated_ + block_ > budget_) return nullptr;
    void* p = nullptr;
    CUDA_CHECK(cudaSetDevice(device_));
    if (cudaMalloc(&p, block_) != cudaSuccess) {
      cudaGetLastError();  // clear the allocation error; the caller falls back to host memory
      budget_ = allocated_;
      return nullptr;
    }
    allocated_ += block_;
    return p;
  }
  void put(void* p) {
    std::lock_guard<std::mutex> lk(mu_);
    free_.push_back(p);
  }

 private:
  std::mutex mu_;
  size_t block_, budget_, allocated_ = 0;
  int device_;
  std::vector<void*> free_;
};

// The n bytes of device state at `state` as a snapshot at `position`: in a block of the pool, by a copy on the
// stream ordered before the state's next change (no synchronisation), or, the budget spent, in host memory (the
// copy waited for).
inline StateSnapshot take_snapshot(const std::shared_ptr<SnapshotPool>& pool, const void* state, size_t n,
                                   int position, cudaStream_t s) {
  StateSnapshot snap;
  snap.position = position;
  if (void* p = pool->get()) {
    snap.device = std::shared_ptr<void>(p, [pool](void* q) { pool->put(q); });  // (back to the pool on a throw)
    snap.device_bytes = n;
    CUDA_CHECK(cudaMemcpyAsync(p, state, n, cudaMemcpyDeviceToDevice, s));
    return snap;
  }
  snap.bytes.resize(n);
  CUDA_CHECK(cudaMemcpyAsync(snap.bytes.data(), state, n, cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  return snap;
}
// The snapshot's bytes back into `state` (snap.size() of them) on the stream, before the state's next use; a host
// snapshot's copy is waited for. A block is reused only by a later copy on the same stream.
inline void put_snapshot(const StateSnapshot& snap, void* state, cudaStream_t s) {
  if (snap.device) {
    CUDA_CHECK(cudaMemcpyAsync(state, snap.device.get(), snap.device_bytes, cudaMemcpyDeviceToDevice, s));
  } else {
    CUDA_CHECK(cudaMemcpyAsync(state, snap.bytes.data(), snap.bytes.size(), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
  }
}

}  // namespace lily::cuda
