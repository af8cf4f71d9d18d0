// The CUDA batch backend (see cuda_batch_backend.cuh).
#include "runtime/cuda_batch_backend.cuh"

#include <algorithm>
#include <cstring>

#include "kernels/common.cuh"
#include "kernels/sampling.h"
#include "runtime/device_sampler.cuh"
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
  if (eng_.config().vocab <= kSampleMaxVocab) {  // device draws
    counts_ = device_alloc<int>(static_cast<size_t>(max_seqs) * eng_.config().vocab);
    counts_key_.assign(static_cast<size_t>(max_seqs), 0);
    sample_scratch_ = device_alloc<uint8_t>(sampling_scratch_bytes(eng_.config().vocab));
    draw_scratch_ = device_alloc<uint8_t>(kDrawStreams * sampling_scratch_bytes(eng_.config().vocab));
    rows_scratch_ =
        device_alloc<uint8_t>(static_cast<size_t>(max_seqs) * sample_rows_scratch_bytes(eng_.config().vocab));
    for (int k = 0; k < kDrawStreams; ++k) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&draw_streams_[k], cudaStreamNonBlocking));
      CUDA_CHECK(cudaEventCreateWithFlags(&join_ev_[k], cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaEventCreateWithFlags(&fork_ev_, cudaEventDisableTiming));
    in_dev_ = device_alloc<DrawIn>(static_cast<size_t>(max_seqs));
    out_dev_ = device_alloc<DrawOut>(static_cast<size_t>(max_seqs));
    CUDA_CHECK(cudaMallocHost(&out_host_, sizeof(DrawOut) * static_cast<size_t>(max_seqs)));
    CUDA_CHECK(cudaMallocHost(&in_host_, sizeof(DrawIn) * static_cast<size_t>(max_seqs)));
  }
  CUDA_CHECK(cudaStreamSynchronize(eng_.stream()));
  // The KV budget: free memory less 2 GiB for the allocator and host-side needs, less the prefix-cache snapshots'
  // device budget (an eighth of the rest, at most 4 GiB: ~64 snapshots of the real model's 64 MB state), less a
  // page per slot (pages are allocated per slot in whole pages of page_tokens).
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t margin = size_t{2} << 30, per_token = std::max<size_t>(1, eng_.kv_page_bytes() / eng_.page_tokens());
  const size_t avail = free_b > margin ? free_b - margin : 0;
  const size_t snap_budget = std::min<size_t>(size_t{4} << 30, avail / 8);
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  pool_ = std::make_shared<SnapshotPool>(eng_.gdn_state_bytes(), snap_budget, device);
  const int64_t tokens = static_cast<int64_t>((avail - snap_budget) / per_token);
  kv_capacity_ = std::max<int64_t>(tokens - static_cast<int64_t>(max_seqs) * eng_.page_tokens(), eng_.page_tokens());
}

CudaBatchBackend::~CudaBatchBackend() {
  cudaStreamSynchronize(eng_.stream());
  for (cudaGraphExec_t g : graphs_)
    if (g) cudaGraphExecDestroy(g);
  for (SeqStateDev& st : slots_) eng_.seq_free(st);
  cudaFreeHost(step_host_);
  for (void* p : {(void*)counts_, sample_scratch_, (void*)draw_scratch_, (void*)rows_scratch_, (void*)in_dev_,
                  (void*)out_dev_, (void*)ids_dev_})
    if (p) cudaFree(p);
  for (int k = 0; k < kDrawStreams; ++k) {
    if (draw_streams_[k]) cudaStreamDestroy(draw_streams_[k]);
    if (join_ev_[k]) cudaEventDestroy(join_ev_[k]);
  }
  if (fork_ev_) cudaEventDestroy(fork_ev_);
  if (out_host_) cudaFreeHost(out_host_);
  if (in_host_) cudaFreeHost(in_host_);
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
  if (!counts_key_.empty()) counts_key_[slot] = 0;  // the next device draw rebuilds the counts
}

void CudaBatchBackend::step(std::span<const BatchEntry> batch) {
  step_begin(batch);
  step_end();
}

void CudaBatchBackend::step_end() {
  LILY_CHECK(is_open_, "CUDA batch backend: step_end without step_begin");
  is_open_ = false;
  finish_out(open_);
}

void CudaBatchBackend::step_begin(std::span<const BatchEntry> batch) {
  LILY_CHECK(!is_open_, "CUDA batch backend: step_begin while a step is open");
  const int V = eng_.config().vocab;
  std::vector<uint8_t> seen(slots_.size(), 0);
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
    LILY_CHECK(!b.sampler || (b.drawn && b.key != 0 && draws(b.sampler->params())), "CUDA batch backend: entry ", i,
               " asks for a draw the backend does not offer");
  }
  for (const BatchEntry& b : batch) eng_.seq_ensure_kv(slots_[b.slot], pos_[b.slot] + static_cast<int>(b.tokens.size()));
  prepare_draws(batch);
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
  if (n_draw_ > 0)
    CUDA_CHECK(cudaMemcpyAsync(out_host_, out_dev_, sizeof(DrawOut) * n_draw_, cudaMemcpyDeviceToHost, eng_.stream()));
  open_.assign(batch.begin(), batch.end());
  is_open_ = true;
}

void CudaBatchBackend::pass(std::span<const BatchEntry> batch, const std::vector<Piece>& pieces) {
  const int V = eng_.config().vocab;
  std::vector<int32_t> tokens;
  std::vector<SeqRows> seqs;
  std::vector<int> head_rows;           // rows whose logits are wanted
  std::vector<int> head_entry;          // their entries
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
    if ((b.logits || b.sampler) && p.first + p.n == static_cast<int>(b.tokens.size())) {
      head_rows.push_back(r.row0 + p.n - 1);
      head_entry.push_back(p.entry);
    }
  }
  eng_.prefill_rows(tokens.data(), static_cast<int>(tokens.size()), seqs.data(), static_cast<int>(seqs.size()));
  if (!head_rows.empty()) {  // (distinct slots: at most max_seqs rows, what logits_ holds)
    const int m = static_cast<int>(head_rows.size());
    eng_.head_rows(head_rows.data(), m, logits_);
    // the fast path's draws in one sample_rows; the others on the side streams (the j-th of them on stream
    // j % kDrawStreams, in row order there); logits copies stay
    rows_.clear();
    std::vector<int> rest;
    for (int j = 0; j < m; ++j) {
      cuda::SampleRow row;
      const BatchEntry& b = batch[head_entry[j]];
      if (!(b.sampler && rows_scratch_ && draw_row(b, logits_ + static_cast<size_t>(j) * V, head_entry[j], row)))
        rest.push_back(j);
      else
        rows_.push_back(row);
    }
    const int k_used = draw_scratch_ ? std::min<int>(kDrawStreams, static_cast<int>(rest.size())) : 0;
    if (k_used > 0) {  // (forked before sample_rows: the side streams' draws run beside it)
      CUDA_CHECK(cudaEventRecord(fork_ev_, eng_.stream()));
      for (int k = 0; k < k_used; ++k) CUDA_CHECK(cudaStreamWaitEvent(draw_streams_[k], fork_ev_, 0));
    }
    sample_rows(rows_.data(), static_cast<int>(rows_.size()), V, rows_scratch_, eng_.stream());
    const size_t scratch_bytes = draw_scratch_ ? sampling_scratch_bytes(V) : 0;
    for (size_t i = 0; i < rest.size(); ++i) {
      const int j = rest[i];
      const BatchEntry& b = batch[head_entry[j]];
      const int k = static_cast<int>(i % kDrawStreams);
      if (b.sampler && k_used > 0)
        enqueue_out(b, logits_ + static_cast<size_t>(j) * V, head_entry[j], draw_streams_[k],
                    draw_scratch_ + k * scratch_bytes);
      else
        enqueue_out(b, logits_ + static_cast<size_t>(j) * V, head_entry[j]);
    }
    for (int k = 0; k < k_used; ++k) {
      CUDA_CHECK(cudaEventRecord(join_ev_[k], draw_streams_[k]));
      CUDA_CHECK(cudaStreamWaitEvent(eng_.stream(), join_ev_[k], 0));
    }
  }
  for (const Piece& p : pieces) pos_[batch[p.entry].slot] += p.n;
}

void CudaBatchBackend::decode_graphs(std::span<const BatchEntry> batch, const std::vector<int>& which) {
  for (size_t j = 0; j < which.size(); ++j) {
    const BatchEntry& b = batch[which[j]];
    cudaGraphExec_t& g = graphs_[b.slot];
    if (!g) g = eng_.capture_for(slots_[b.slot]);
    step_host_[j].token = b.tokens[0];
    step_host_[j].pos = pos_[b.slot];
    CUDA_CHECK(cudaMemcpyAsync(eng_.step(), &step_host_[j], sizeof(StepDev), cudaMemcpyHostToDevice, eng_.stream()));
    CUDA_CHECK(cudaGraphLaunch(g, eng_.stream()));
    enqueue_out(b, eng_.logits(), which[j]);  // before the next graph rewrites the logits
  }
  for (int i : which) pos_[batch[i].slot] += 1;
}

bool CudaBatchBackend::profile_begin() {
  if (!prof_) prof_ = std::make_unique<EventProfiler>(eng_.stream());
  prof_->finish();  // (starts over)
  eng_.set_profiler(prof_.get());
  return true;
}

std::vector<FamilyTime> CudaBatchBackend::profile_end() {
  eng_.set_profiler(nullptr);
  return prof_ ? prof_->finish() : std::vector<FamilyTime>{};
}

bool CudaBatchBackend::draws(const ::lily::SamplingParams& p) const {
  return counts_ != nullptr && p.logit_bias.size() <= static_cast<size_t>(kMaxBias) &&
         p.top_logprobs <= kMaxTopLogprobs;
}

void CudaBatchBackend::sync_counts(const BatchEntry& b) {
  const int V = eng_.config().vocab;
  const Sampler& smp = *b.sampler;
  int* counts = counts_ + static_cast<size_t>(b.slot) * V;
  std::vector<int32_t> ids = smp.context_ids();  // then each generated id once per time it was generated
  const size_t n_ctx = ids.size();
  for (size_t k = 0; k < n_ctx; ++k)
    for (int c = smp.generated_count(ids[k]); c > 0; --c) ids.push_back(ids[k]);
  CUDA_CHECK(cudaStreamSynchronize(eng_.stream()));  // (the id buffer may be in use or replaced)
  if (ids.size() > ids_cap_) {
    if (ids_dev_) CUDA_CHECK(cudaFree(ids_dev_));
    ids_cap_ = std::max(ids.size(), 2 * ids_cap_);
    ids_dev_ = device_alloc<int>(ids_cap_);
  }
  CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int) * V, eng_.stream()));
  if (!ids.empty()) {
    CUDA_CHECK(cudaMemcpyAsync(ids_dev_, ids.data(), sizeof(int) * ids.size(), cudaMemcpyHostToDevice, eng_.stream()));
    mark_context(counts, V, ids_dev_, static_cast<int>(n_ctx), eng_.stream());
    count_tokens(counts, V, ids_dev_ + n_ctx, static_cast<int>(ids.size() - n_ctx), eng_.stream());
  }
  CUDA_CHECK(cudaStreamSynchronize(eng_.stream()));
  counts_key_[b.slot] = b.key;
}

void CudaBatchBackend::prepare_draws(std::span<const BatchEntry> batch) {
  const int V = eng_.config().vocab;
  row_of_.assign(batch.size(), -1);
  n_draw_ = n_staged_ = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchEntry& b = batch[i];
    if (!b.sampler) continue;
    const int r = n_draw_++;
    const ::lily::SamplingParams& p = b.sampler->params();
    if (device_params(p, V).update_counts && counts_key_[b.slot] != b.key) sync_counts(b);
    DrawIn& in = in_host_[r];
    in.rng[0] = b.sampler->draws();
    in.rng[1] = p.seed;
    device_logit_bias(p, V, bias_ids_host_, bias_vals_host_);
    in.n_bias = static_cast<int>(bias_ids_host_.size());
    std::copy(bias_ids_host_.begin(), bias_ids_host_.end(), in.bias_ids);
    std::copy(bias_vals_host_.begin(), bias_vals_host_.end(), in.bias_vals);
    row_of_[i] = r;
  }
  if (n_draw_ > 0)  // (the stream is past the previous step's copies: finish_out synchronised)
    CUDA_CHECK(cudaMemcpyAsync(in_dev_, in_host_, sizeof(DrawIn) * n_draw_, cudaMemcpyHostToDevice, eng_.stream()));
}

bool CudaBatchBackend::draw_row(const BatchEntry& b, float* logits, int entry, cuda::SampleRow& row) {
  const int V = eng_.config().vocab;
  const ::lily::SamplingParams& p = b.sampler->params();
  const cuda::SamplingParams d = device_params(p, V);
  if (!sample_rows_supported(d)) return false;
  const int r = row_of_[entry];
  DrawIn* in = in_dev_ + r;
  if (in_host_[r].n_bias > 0) add_logit_bias(logits, V, in->bias_ids, in->bias_vals, in_host_[r].n_bias, eng_.stream());
  DrawOut* o = out_dev_ + r;
  row = {logits, d, d.update_counts ? counts_ + static_cast<size_t>(b.slot) * V : nullptr, in->rng, &o->token,
         &o->logprob, p.top_logprobs, o->top_ids, o->top_logprobs};
  return true;
}

void CudaBatchBackend::enqueue_out(const BatchEntry& b, float* logits, int entry, cudaStream_t s, void* scratch) {
  const int V = eng_.config().vocab;
  if (!s) s = eng_.stream();
  if (!scratch) scratch = sample_scratch_;
  if (b.sampler) {
    const int r = row_of_[entry];
    const ::lily::SamplingParams& p = b.sampler->params();
    const cuda::SamplingParams d = device_params(p, V);
    int* counts = counts_ + static_cast<size_t>(b.slot) * V;
    DrawIn* in = in_dev_ + r;
    if (in_host_[r].n_bias > 0) add_logit_bias(logits, V, in->bias_ids, in->bias_vals, in_host_[r].n_bias, s);
    DrawOut* o = out_dev_ + r;
    sample(logits, V, d, d.update_counts ? counts : nullptr, in->rng, &o->token, scratch, s, &o->logprob,
           nullptr, p.top_logprobs, o->top_ids, o->top_logprobs);
  } else if (b.logits) {
    const int j = n_staged_++;
    CUDA_CHECK(cudaMemcpyAsync(staged_ + static_cast<size_t>(j) * V, logits, sizeof(float) * V, cudaMemcpyDeviceToHost,
                               s));
    row_of_[entry] = j;
  }
}

void CudaBatchBackend::finish_out(std::span<const BatchEntry> batch) {
  const int V = eng_.config().vocab;
  CUDA_CHECK(cudaStreamSynchronize(eng_.stream()));
  // staged logits out of the pinned buffer on the host's threads (one thread copies ~5-10 GB/s; 64 rows: 64 MB);
  // none staged (every row drawn on the device): the pool's threads are not woken
  if (n_staged_ > 0)
    ThreadPool::global().parallel_for(0, static_cast<int64_t>(batch.size()), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        if (!batch[i].sampler && batch[i].logits && row_of_[i] >= 0)
          std::memcpy(batch[i].logits, staged_ + static_cast<size_t>(row_of_[i]) * V, sizeof(float) * V);
    });
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchEntry& b = batch[i];
    if (!b.sampler || row_of_[i] < 0) continue;
    const DrawOut& o = out_host_[row_of_[i]];
    SampledToken& t = *b.drawn;
    t = SampledToken{};
    t.token = o.token;  // < 0: a NaN logit (kSampleNanToken); the sampler records nothing
    if (o.token < 0) continue;
    t.logprob = o.logprob;
    for (int k = 0; k < b.sampler->params().top_logprobs; ++k)
      if (o.top_ids[k] >= 0) t.top.push_back({o.top_ids[k], o.top_logprobs[k]});
    b.sampler->record_drawn(o.token);
  }
}

StateSnapshot CudaBatchBackend::save_state(int slot) const {
  return take_snapshot(pool_, slots_[check(slot)].gdn, eng_.gdn_state_bytes(), pos_[slot], eng_.stream());
}

void CudaBatchBackend::restore_state(int slot, const StateSnapshot& s) {
  SeqStateDev& st = slots_[check(slot)];
  LILY_CHECK(s.size() == eng_.gdn_state_bytes(), "CUDA batch backend: a snapshot of ", s.size(),
             " bytes (another layout), expected ", eng_.gdn_state_bytes());
  LILY_CHECK(s.position >= 0 && s.position <= pos_[slot], "CUDA batch backend: snapshot position ", s.position,
             " is beyond slot ", slot, "'s ", pos_[slot], " tokens");
  put_snapshot(s, st.gdn, eng_.stream());
  eng_.seq_shrink_kv(st, s.position);
  pos_[slot] = s.position;
  if (!counts_key_.empty()) counts_key_[slot] = 0;
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
  if (!counts_key_.empty()) counts_key_[dst] = 0;
}

}  // namespace lily::cuda
