// The CUDA batch backend (see cuda_batch_backend.cuh).
#include "runtime/cuda_batch_backend.cuh"

#include <algorithm>
#include <cstring>

#include "kernels/common.cuh"
#include "util/check.h"
#include "util/thread_pool.h"

namespace lily::cuda {

CudaBatchBackend::CudaBatchBackend(CudaEngine& engine, int max_seqs, int graph_rows)
    : eng_(engine), graph_rows_(graph_rows >= 0 ? graph_rows : engine.options().batch_graph_rows) {
  LILY_CHECK(max_seqs >= 1, "CUDA batch backend: max_seqs ", max_seqs, " (at least 1)");
  LILY_CHECK(eng_.prefill_supported(), "CUDA batch backend: the prompt path does not take this model's shapes");
  eng_.prefill_alloc();
  for (int i = 0; i < max_seqs; ++i) slots_.push_back(eng_.seq_alloc());
  pos_.assign(static_cast<size_t>(max_seqs), 0);
  logits_ = device_alloc<float>(static_cast<size_t>(max_seqs) * eng_.config().vocab);
  CUDA_CHECK(cudaMallocHost(&staged_, sizeof(float) * static_cast<size_t>(max_seqs) * eng_.config().vocab));
  CUDA_CHECK(cudaMallocHost(&step_host_, sizeof(StepDev) * static_cast<size_t>(max_seqs)));
  graphs_.assign(static_cast<size_t>(max_seqs), nullptr);
  CUDA_CHECK(cudaStreamSynchronize(eng_.stream()));
  // The KV budget: free memory less 2 GiB for the allocator and snapshots, less a page per slot (pages are
  // allocated per slot in whole pages of page_tokens).
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t margin = size_t{2} << 30, per_token = std::max<size_t>(1, eng_.kv_page_bytes() / eng_.page_tokens());
  const int64_t tokens = free_b > margin ? static_cast<int64_t>((free_b - margin) / per_token) : 0;
  kv_capacity_ = std::max<int64_t>(tokens - static_cast<int64_t>(max_seqs) * eng_.page_tokens(), eng_.page_tokens());
}

CudaBatchBackend::~CudaBatchBackend() {
  cudaStreamSynchronize(eng_.stream());
  for (cudaGraphExec_t g : graphs_)
    if (g) cudaGraphExecDestroy(g);
  for (SeqStateDev& st : slots_) eng_.seq_free(st);
  cudaFreeHost(step_host_);
  cudaFree(logits_);
  cudaFreeHost(staged_);
}

int CudaBatchBackend::check(int slot) const {
  LILY_CHECK(slot >= 0 && slot < static_cast<int>(slots_.size()), "CUDA batch backend: slot ", slot, " outside [0, ",
             slots_.size(), ")");
  return slot;
}

void CudaBatchBackend::reset(int slot) {
  SeqStateDev& st = slots_[check(slot)];
  CUDA_CHECK(cudaMemsetAsync(st.gdn, 0, eng_.gdn_state_bytes(), eng_.stream()));
  eng_.seq_shrink_kv(st, 0);  // device memory follows the scheduler's page accounting
  pos_[slot] = 0;
}

void CudaBatchBackend::step(std::span<const BatchEntry> batch) {
  const int V = eng_.config().vocab;
  std::vector<uint8_t> seen(slots_.size(), 0);
  int n_logits = 0;
  for (size_t i = 0; i < batch.size(); ++i) {  // everything checked before any state changes
    const BatchEntry& b = batch[i];
    check(b.slot);
    LILY_CHECK(!seen[b.slot], "CUDA batch backend: slot ", b.slot, " twice in one step");
    seen[b.slot] = 1;
    const int n = static_cast<int>(b.tokens.size());
    LILY_CHECK(n >= 1, "CUDA batch backend: entry ", i, " (slot ", b.slot, ") has no token");
    LILY_CHECK(pos_[b.slot] + n <= eng_.max_context(), "CUDA batch backend: slot ", b.slot, ": ", pos_[b.slot] + n,
               " tokens exceed the context of ", eng_.max_context());
    for (int32_t t : b.tokens)
      LILY_CHECK(t >= 0 && t < V, "CUDA batch backend: token id ", t, " (slot ", b.slot, ") outside [0, ", V, ")");
    n_logits += b.logits ? 1 : 0;
  }
  for (const BatchEntry& b : batch) eng_.seq_ensure_kv(slots_[b.slot], pos_[b.slot] + static_cast<int>(b.tokens.size()));
  std::vector<int> ones;  // the one-token entries
  for (size_t i = 0; i < batch.size(); ++i)
    if (batch[i].tokens.size() == 1) ones.push_back(static_cast<int>(i));
  std::vector<int> done(batch.size(), 0);
  if (!ones.empty() && static_cast<int>(ones.size()) <= graph_rows_) {
    decode_graphs(batch, ones);
    for (int i : ones) done[i] = 1;
  }
  // Passes of at most kPrefillChunk rows; an entry longer than what is left of a pass continues in the next.
  for (;;) {
    std::vector<Piece> pieces;
    int rows = 0;
    for (size_t i = 0; i < batch.size() && rows < CudaEngine::kPrefillChunk; ++i) {
      const int left = static_cast<int>(batch[i].tokens.size()) - done[i];
      if (left == 0) continue;
      const int n = std::min(left, CudaEngine::kPrefillChunk - rows);
      pieces.push_back({static_cast<int>(i), done[i], n});
      rows += n;
    }
    if (pieces.empty()) break;
    pass(batch, pieces);
    for (const Piece& p : pieces) done[p.entry] += p.n;
  }
}

void CudaBatchBackend::pass(std::span<const BatchEntry> batch, const std::vector<Piece>& pieces) {
  const int V = eng_.config().vocab;
  std::vector<int32_t> tokens;
  std::vector<SeqRows> seqs;
  std::vector<int> head_rows;           // rows whose logits are wanted
  std::vector<float*> head_dst;         // their host destinations
  for (const Piece& p : pieces) {
    const BatchEntry& b = batch[p.entry];
    SeqStateDev& st = slots_[b.slot];
    SeqRows r;
    r.row0 = static_cast<int>(tokens.size());
    r.n = p.n;
    r.pos0 = pos_[b.slot];
    r.ring = &st.ring;
    r.S = &st.S;
    r.page_table = &st.page_table;
    seqs.push_back(r);
    tokens.insert(tokens.end(), b.tokens.begin() + p.first, b.tokens.begin() + p.first + p.n);
    if (b.logits && p.first + p.n == static_cast<int>(b.tokens.size())) {
      head_rows.push_back(r.row0 + p.n - 1);
      head_dst.push_back(b.logits);
    }
  }
  eng_.prefill_rows(tokens.data(), static_cast<int>(tokens.size()), seqs.data(), static_cast<int>(seqs.size()));
  for (size_t i = 0; i < head_rows.size(); i += slots_.size()) {  // the logits buffer holds max_seqs rows
    const int m = static_cast<int>(std::min(slots_.size(), head_rows.size() - i));
    eng_.head_rows(head_rows.data() + i, m, logits_);
    CUDA_CHECK(cudaMemcpyAsync(staged_, logits_, sizeof(float) * V * static_cast<size_t>(m), cudaMemcpyDeviceToHost,
                               eng_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(eng_.stream()));
    // out of the pinned staging into the scheduler's buffers on the host's threads (one thread copies ~5-10 GB/s;
    // 64 rows are 64 MB)
    ThreadPool::global().parallel_for(0, m, [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j)
        std::memcpy(head_dst[i + j], staged_ + static_cast<size_t>(j) * V, sizeof(float) * V);
    });
  }
  for (const Piece& p : pieces) pos_[batch[p.entry].slot] += p.n;
  CUDA_CHECK(cudaStreamSynchronize(eng_.stream()));
}

void CudaBatchBackend::decode_graphs(std::span<const BatchEntry> batch, const std::vector<int>& which) {
  const int V = eng_.config().vocab;
  std::vector<float*> dst;
  for (size_t j = 0; j < which.size(); ++j) {
    const BatchEntry& b = batch[which[j]];
    cudaGraphExec_t& g = graphs_[b.slot];
    if (!g) g = eng_.capture_for(slots_[b.slot]);
    step_host_[j].token = b.tokens[0];
    step_host_[j].pos = pos_[b.slot];
    CUDA_CHECK(cudaMemcpyAsync(eng_.step(), &step_host_[j], sizeof(StepDev), cudaMemcpyHostToDevice, eng_.stream()));
    CUDA_CHECK(cudaGraphLaunch(g, eng_.stream()));
    if (b.logits) {
      CUDA_CHECK(cudaMemcpyAsync(staged_ + j * static_cast<size_t>(V), eng_.logits(), sizeof(float) * V,
                                 cudaMemcpyDeviceToHost, eng_.stream()));
    }
    dst.push_back(b.logits);
  }
  CUDA_CHECK(cudaStreamSynchronize(eng_.stream()));
  ThreadPool::global().parallel_for(0, static_cast<int64_t>(dst.size()), [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j)
      if (dst[j]) std::memcpy(dst[j], staged_ + static_cast<size_t>(j) * V, sizeof(float) * V);
  });
  for (int i : which) pos_[batch[i].slot] += 1;
}

StateSnapshot CudaBatchBackend::save_state(int slot) const {
  const SeqStateDev& st = slots_[check(slot)];
  StateSnapshot s;
  s.position = pos_[slot];
  s.bytes.resize(eng_.gdn_state_bytes());
  CUDA_CHECK(cudaMemcpyAsync(s.bytes.data(), st.gdn, s.bytes.size(), cudaMemcpyDeviceToHost, eng_.stream()));
  CUDA_CHECK(cudaStreamSynchronize(eng_.stream()));
  return s;
}

void CudaBatchBackend::restore_state(int slot, const StateSnapshot& s) {
  SeqStateDev& st = slots_[check(slot)];
  LILY_CHECK(s.bytes.size() == eng_.gdn_state_bytes(), "CUDA batch backend: a snapshot of ", s.bytes.size(),
             " bytes (", s.device ? "a device snapshot of the one-sequence backend" : "another layout",
             "), expected ", eng_.gdn_state_bytes());
  LILY_CHECK(s.position >= 0 && s.position <= pos_[slot], "CUDA batch backend: snapshot position ", s.position,
             " is beyond slot ", slot, "'s ", pos_[slot], " tokens");
  CUDA_CHECK(cudaMemcpyAsync(st.gdn, s.bytes.data(), s.bytes.size(), cudaMemcpyHostToDevice, eng_.stream()));
  CUDA_CHECK(cudaStreamSynchronize(eng_.stream()));
  eng_.seq_shrink_kv(st, s.position);
  pos_[slot] = s.position;
}

void CudaBatchBackend::copy_prefix(int dst, int src, int n_tokens) {
  check(dst);
  check(src);
  LILY_CHECK(n_tokens >= 0 && n_tokens <= pos_[src], "CUDA batch backend: copy_prefix of ", n_tokens,
             " tokens from slot ", src, " which holds ", pos_[src]);
  if (dst != src && n_tokens > 0 && !slots_[dst].page_table.empty()) {
    SeqStateDev& d = slots_[dst];
    const SeqStateDev& s = slots_[src];
    eng_.seq_ensure_kv(d, n_tokens);
    const int pages = (n_tokens + eng_.page_tokens() - 1) / eng_.page_tokens();
    for (int p = 0; p < pages; ++p)  // a page index's block holds that page of every attention layer
      CUDA_CHECK(cudaMemcpyAsync(d.page_blocks[p], s.page_blocks[p], eng_.kv_page_bytes(), cudaMemcpyDeviceToDevice,
                                 eng_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(eng_.stream()));
  }
  eng_.seq_shrink_kv(slots_[dst], n_tokens);
  pos_[dst] = n_tokens;
}

}  // namespace lily::cuda
