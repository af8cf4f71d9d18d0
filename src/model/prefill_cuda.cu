// The CUDA backend's prompt path: a chunk of up to kPrefillChunk tokens goes through each layer together. The
// weight-heavy parts (every projection, the router, the routed experts grouped by expert, the shared expert)
// are tensor-core GEMMs over the chunk (kernels/gemm.cu), so each weight is read once per chunk instead of once
// per token; the sequence mixers take the chunk in a few launches each (kernels/gdn_chunk.cu: the recurrence
// token after token with the state in registers; kernels/attention_chunk.cu: causal flash attention over the
// cache).
// Same structure as record_step: norm -> mixer -> residual -> norm -> MoE -> residual per layer.
#include <algorithm>

#include "kernels/batched.h"
#include "kernels/common.cuh"
#include "kernels/mixers.h"
#include "model/cuda_engine.h"

namespace lily::cuda {

namespace {
// A GemmX of width K over a buffer allocated for a larger width (rows are K apart once prepared at K), for the
// matrices `readers`: the prep writes x's fp16 form only where the GEMMs take it (use_f16), and then skips the two
// bf16 terms where every reader is 4-bit.
GemmXBuf at_width(GemmXBuf b, int K, std::initializer_list<const QMat*> readers) {
  b.K = K;
  if (!b.use_f16) b.f16hi = b.f16lo = nullptr, b.f16inv = nullptr;
  bool all_q4 = b.f16hi != nullptr;
  for (const QMat* m : readers) all_q4 = all_q4 && m->format == QFormat::q4;
  if (all_q4) b.hi = b.lo = nullptr;
  return b;
}
// Whether the comma-separated option `list` names `family` (KernelOptions::skip, prompt_x_one_term).
bool names(const std::string& list, const char* family) {
  return !list.empty() && ("," + list + ",").find("," + std::string(family) + ",") != std::string::npos;
}
}  // namespace

struct PrefillBuffers {
  // A pass's inputs from the host, uploaded in one copy (prefill_rows packs them for the pass's sizes, so a graph
  // keyed by its row count finds them at the same places): views into `in`.
  int* tokens = nullptr;        // [n] device
  int* pos = nullptr;           // [n_seqs] device: each sequence's first position in a pass
  // the pass's one-token rows (decode rows of the batched step), whose GDN steps run as one launch per layer
  int n_dec = 0;                // how many
  int* dec = nullptr;           // [2][n_dec] device: their rows, then their positions
  float** dec_ptrs = nullptr;   // [n_layers][2][n_dec] device: per GDN layer their conv rings, then their states
  uint16_t*** dec_pages = nullptr;  // [n_attn][n_dec] device: per attention layer their page tables
  uint8_t* in = nullptr;        // [in_bytes] device: the five above, packed
  uint8_t* in_host = nullptr;   // [in_bytes] pinned staging of `in`
  size_t in_bytes = 0;
  cudaEvent_t in_ev = nullptr;  // after the last upload: the staging is free again once it has completed
  int dec_splits = 0;           // the most attention splits of one of them (attention_row_splits)
  float* dec_attn = nullptr;    // [n_dec][n_kv][dec_splits][group][head_dim + 2] their attention's split partials
  size_t dec_attn_floats = 0;   // allocated (grows with the rows and their lengths)
  float* h = nullptr;           // [n][H] residual stream of the chunk
  GemmXBuf x;                   // GEMM inputs: [n][<= max(H, mixer width)] or [n * top_k][F]
  float* proj = nullptr;        // [n][max(gdn proj, attn proj)] projections, one matrix after the other
  float* mix = nullptr;         // [n][max(Hv*Dv, Hq*d)] mixer outputs
  void* scratch = nullptr;      // max(attention_chunk_scratch_bytes(n, Hq, d), gdn_chunk_scratch_bytes(n, dims, wy))
  float* logits = nullptr;      // [n][E + 1] router | shared gate
  int* idx = nullptr;           // [n][top_k]
  float* w = nullptr;           // [n][top_k]
  float* sh = nullptr;          // [n] sigmoid(shared gate)
  int* offsets = nullptr;       // [E + 1]
  int* tiles = nullptr;         // [1 + gemm_grouped_max_tiles(n * top_k, E)] the grouped GEMMs' work list
  int* x_row = nullptr;         // [n * top_k] token of each slot
  float* w_slot = nullptr;      // [n * top_k]
  int* slot_of = nullptr;       // [n][top_k]
  float* act = nullptr;         // [n][Fs] shared expert's SwiGLU, then [n * top_k][F] the routed experts'
                                // (F, Fs <= max(F, Fs))
  float* yd = nullptr;          // [n * top_k][H] routed experts' outputs (before: gate / up scratch if their
                                // formats differ, 2 x [n * top_k][F])
  float* ysh = nullptr;         // [n][H] shared expert's output
  cudaEvent_t stop_ev[2] = {};  // prefill's stop checks: the end of the last two layer groups queued
  // a pass of at most kMoeRowsMaxTokens one-token rows streams its routed experts (kernels/moe_rows.cu) through
  // staged rows: the tokens' normed x [n] at width H, then the slots' activations [n * top_k] at width F
  static constexpr int kMoeRowsMaxTokens = 64;
  bool moe_rows = false;
  void* srows = nullptr;
  // a pass of at most KernelOptions::moe_fused_rows one-token rows runs each MoE block as one launch
  // (kernels/moe_fused_rows.cu)
  bool moe_fused = false;
  MoeRowsScratch mfr;           // its scratch (allocated where every layer's MoE block is supported)
  // a pass that streams its routed experts runs the shared expert on a second stream beside the routing and the
  // routed experts (forked after the router, joined before the combine)
  cudaStream_t side = nullptr;
  cudaEvent_t fork_ev = nullptr, join_ev = nullptr;
  bool sums_added = false;      // the layer's out projection added that launch's router sums (gemm_i8)
  bool i8 = false;              // a pass of at most kI8MaxTokens one-token rows: project_i8 may apply
  void* i8x = nullptr;          // [kI8MaxTokens][i8x_row_bytes(i8_width)] its staged x
  int i8_width = 0;             // the widest projection input it stages (0: none)
  // Decode passes' graphs (KernelOptions::batch_pass_graphs): what a pass of one-token rows launches depends only
  // on its row count and attention splits (everything else is read from the buffers above), captured at a key's
  // second pass (a row count seen once, as requests start and end, is not worth a capture), least recently used
  // dropped beyond kMaxPassGraphs; all dropped when dec_attn moves.
  struct PassGraph {
    int n, splits;
    cudaGraphExec_t exec;  // null until the key's second pass
    uint64_t used;
  };
  static constexpr size_t kMaxPassGraphs = 32;
  std::vector<PassGraph> graphs;
  uint64_t clock = 0;
  void drop_graphs() {
    for (PassGraph& g : graphs)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    graphs.clear();
  }
};

void CudaEngine::prefill_alloc() {
  if (pf_) return;
  const Config& c = cfg_;
  auto* b = new PrefillBuffers;
  const int n = kPrefillChunk, H = c.hidden, d = c.head_dim, k = c.top_k;
  const int F = std::max(c.moe_ffn, c.shared_ffn);
  const int gdn_proj = c.conv_dim() + c.value_dim() + 2 * c.lin_v_heads;
  const int attn_proj = c.q_proj_rows() + 2 * c.n_kv_heads * d;
  const int mix = std::max(c.value_dim(), c.n_heads * d);
  for (cudaEvent_t& e : b->stop_ev) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  // tokens, positions, the decode rows' rows and positions (4 n ints), their pointers (3 n_layers n), alignment
  b->in_bytes = sizeof(int) * 4 * (size_t)n + sizeof(void*) * (3 * (size_t)c.n_layers * n + 1);
  b->in = device_alloc<uint8_t>(b->in_bytes);
  CUDA_CHECK(cudaMallocHost(&b->in_host, b->in_bytes));
  CUDA_CHECK(cudaEventCreateWithFlags(&b->in_ev, cudaEventDisableTiming));
  b->h = device_alloc<float>((size_t)n * H);
  // rows of width <= max(H, mix) for the chunk's tokens, or of width F for their n * k expert slots: one
  // allocation of x_elems values (and x_elems / 64 group sums), viewed at each width (at_width)
  const size_t x_elems = std::max((size_t)n * std::max(H, mix), (size_t)n * k * F);
  b->x = gemm_x_alloc((int)(x_elems / 64), 64, opts_.prompt_gemm_f16);
  b->proj = device_alloc<float>((size_t)n * std::max(gdn_proj, attn_proj));
  b->mix = device_alloc<float>((size_t)n * mix);
  const GdnDims dims{c.lin_k_heads, c.lin_v_heads, c.lin_k_dim, c.lin_v_dim};
  b->scratch = device_alloc<uint8_t>(
      std::max(attention_chunk_scratch_bytes(n, c.n_heads, d), gdn_chunk_scratch_bytes(n, dims, opts_.gdn_wy)));
  b->logits = device_alloc<float>((size_t)n * (c.n_experts + 1));
  b->idx = device_alloc<int>((size_t)n * k);
  b->w = device_alloc<float>((size_t)n * k);
  b->sh = device_alloc<float>(n);
  b->offsets = device_alloc<int>(c.n_experts + 2);  // (+ 1: the shared expert's slots, MoeRowsShared)
  b->tiles = device_alloc<int>(1 + gemm_grouped_max_tiles(n * k, c.n_experts) + (n + 63) / 64);
  b->x_row = device_alloc<int>((size_t)n * (k + 1));
  b->w_slot = device_alloc<float>((size_t)n * (k + 1));
  b->slot_of = device_alloc<int>((size_t)n * k);
  b->act = device_alloc<float>((size_t)n * (k + 1) * F);
  b->yd = device_alloc<float>((size_t)n * (k + 1) * std::max(H, 2 * F));  // (2 F: the unpaired gate / up scratch)
  b->ysh = device_alloc<float>((size_t)n * H);
  const int in_w = opts_.gemm_i8_in_rows > 0 && H <= kI8MaxK ? H : 0;  // (project_i8 checks each projection)
  const int out_w = opts_.gemm_i8_out_rows > 0 && mix <= kI8MaxK ? mix : 0;
  b->i8_width = opts_.gemm_i8 ? std::max(in_w, out_w) : 0;
  if (b->i8_width > 0) b->i8x = device_alloc<uint8_t>(kI8MaxTokens * i8x_row_bytes(b->i8_width));
  const int nr = PrefillBuffers::kMoeRowsMaxTokens;
  bool fused_rows = opts_.moe_fused_rows > 0;
  for (const LayerDev& l : w_.layers) fused_rows = fused_rows && moe_fused_rows_supported(l.moe, c.top_k);
  if (fused_rows) b->mfr = moe_fused_rows_alloc(c.n_experts);
  if (moe_rows_ok()) {
    b->srows =
        device_alloc<uint8_t>(std::max(nr * stream_row_bytes(H), (size_t)nr * (k + 1) * stream_row_bytes(c.moe_ffn)));
    int lo = 0, hi = 0;  // (the side stream's blocks first: its short branch then ends before the routed launches)
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    CUDA_CHECK(cudaStreamCreateWithPriority(&b->side, cudaStreamNonBlocking, hi));
    for (cudaEvent_t* e : {&b->fork_ev, &b->join_ev}) CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  pf_ = b;
}

bool CudaEngine::moe_rows_ok() const {
  if (!opts_.moe_rows) return false;
  for (const LayerDev& l : w_.layers)
    if (!moe_rows_supported(l.moe.experts_gate, l.moe.experts_up, l.moe.experts_down)) return false;
  return true;
}

void CudaEngine::prefill_free() {
  if (!pf_) return;
  PrefillBuffers& b = *pf_;
  for (void* p : {(void*)b.in, (void*)b.dec_attn, (void*)b.h, (void*)b.proj, (void*)b.mix, b.scratch,
                  (void*)b.logits, (void*)b.idx, (void*)b.w, (void*)b.sh, (void*)b.offsets, (void*)b.tiles,
                  (void*)b.x_row, (void*)b.w_slot, (void*)b.slot_of, (void*)b.act, (void*)b.yd, (void*)b.ysh, b.srows,
                  b.i8x})
    if (p) cudaFree(p);
  if (b.in_host) cudaFreeHost(b.in_host);
  for (cudaEvent_t e : {b.stop_ev[0], b.stop_ev[1], b.fork_ev, b.join_ev, b.in_ev})
    if (e) cudaEventDestroy(e);
  if (b.side) cudaStreamDestroy(b.side);
  gemm_x_free(b.x);
  if (b.mfr.act) moe_fused_rows_free(b.mfr);
  b.drop_graphs();
  delete pf_;
  pf_ = nullptr;
}

bool CudaEngine::prefill_supported() const {
  const Config& c = cfg_;
  const bool heads = c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0 && c.n_heads / c.n_kv_heads <= 8;
  const bool head_dim = c.head_dim == 32 || c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256;
  // the GEMM inputs gemm_x_prep splits
  const bool widths =
      std::max({c.hidden, c.value_dim(), c.n_heads * c.head_dim, c.moe_ffn, c.shared_ffn}) <= kXPrepMaxK;
  return heads && head_dim && widths && page_tokens_ % 32 == 0 && c.lin_k_dim <= 128 && c.top_k >= 1 &&
         c.top_k <= 8 && kPrefillChunk * c.top_k <= kMoeGroupMaxPairs;
}

// The prompt path's mixer cores left out (KernelOptions::skip, benchmarks: their marginal cost).
bool CudaEngine::prefill_skips(const char* family) const { return names(opts_.skip, family); }

GemmX CudaEngine::prompt_x(const GemmXBuf& b, const char* family) const {
  GemmX x = b.view();
  if (names(opts_.prompt_x_one_term, family)) x.f16lo = nullptr;
  x.ws = names(opts_.prompt_gemm_ws, family) && x.f16hi;
  return x;
}

struct CudaEngine::FamilyX {
  GemmXBuf buf;  // what gemm_x_prep writes
  GemmX x;       // what the family's GEMMs read
};
// The prep skips x's second fp16 term where the family takes the first alone (no GEMM reads it then).
CudaEngine::FamilyX CudaEngine::family_x(int K, std::initializer_list<const QMat*> readers,
                                         const char* family) const {
  FamilyX f{at_width(pf_->x, K, readers), {}};
  f.x = prompt_x(f.buf, family);
  if (!f.x.f16lo) f.buf.f16lo = nullptr;
  return f;
}

int CudaEngine::prompt_grid() const {
  const Config& c = cfg_;
  return opts_.gdn_wy && gdn_wy_supported(GdnDims{c.lin_k_heads, c.lin_v_heads, c.lin_k_dim, c.lin_v_dim})
             ? gdn_wy_grid()
             : 1;
}

int CudaEngine::prefill_chunk() const {
  return std::clamp(opts_.prefill_chunk > 0 ? opts_.prefill_chunk : kPrefillChunk, 16, kPrefillChunk);
}

const float* CudaEngine::prefill_h(int t) const { return pf_->h + (size_t)t * cfg_.hidden; }

bool CudaEngine::prefill(const int32_t* tokens, int pos0, int n, const std::function<bool()>* stop) {
  LILY_CHECK(n >= 1 && n <= kPrefillChunk, "prefill: ", n, " tokens in one chunk (1..", kPrefillChunk, ")");
  ensure_kv(pos0 + n);
  const SeqRows own{0, n, pos0, &own_.ring, &own_.S, &own_.page_table};
  stop_ = stop;
  struct Clear {
    const std::function<bool()>*& p;
    ~Clear() { p = nullptr; }
  } clear{stop_};
  return prefill_rows(tokens, n, &own, 1);
}

bool CudaEngine::prefill_rows(const int32_t* tokens, int n, const SeqRows* seqs, int n_seqs) {
  LILY_CHECK(n >= 1 && n <= kPrefillChunk && n_seqs >= 1 && n_seqs <= n, "prefill: ", n, " rows of ", n_seqs,
             " sequences in one pass (1..", kPrefillChunk, " rows)");
  prefill_alloc();
  PrefillBuffers& b = *pf_;
  const Config& c = cfg_;
  // the pinned staging is free again once the last upload is done; a stoppable prompt also waits for the last
  // piece, so nothing of it is left queued when the stop is checked
  if (stop_) CUDA_CHECK(cudaStreamSynchronize(stream_));
  else CUDA_CHECK(cudaEventSynchronize(b.in_ev));
  pmark("embed");
  const int n_attn = static_cast<int>(seqs[0].page_table->size());
  int m = 0;
  for (int q = 0; q < n_seqs; ++q) m += seqs[q].n == 1;
  // The pass's inputs packed for its sizes: tokens, positions, then for the one-token rows their rows and
  // positions, per-layer GDN ring and state pointers (the rows launch) and page tables.
  size_t at = 0;
  auto take = [&](size_t bytes, size_t align) {
    at = (at + align - 1) / align * align;
    const size_t from = at;
    at += bytes;
    return from;
  };
  const size_t o_tok = take(sizeof(int) * n, 4), o_pos = take(sizeof(int) * n_seqs, 4);
  const size_t o_dec = take(sizeof(int) * 2 * m, 4), o_ptr = take(sizeof(float*) * c.n_layers * 2 * m, 8);
  const size_t o_pg = take(sizeof(uint16_t**) * n_attn * m, 8);
  int* tok_h = reinterpret_cast<int*>(b.in_host + o_tok);
  int* pos_h = reinterpret_cast<int*>(b.in_host + o_pos);
  int* dec_i = reinterpret_cast<int*>(b.in_host + o_dec);
  float** dec_p = reinterpret_cast<float**>(b.in_host + o_ptr);
  uint16_t*** dec_pg = reinterpret_cast<uint16_t***>(b.in_host + o_pg);
  b.tokens = reinterpret_cast<int*>(b.in + o_tok);
  b.pos = reinterpret_cast<int*>(b.in + o_pos);
  b.dec = reinterpret_cast<int*>(b.in + o_dec);
  b.dec_ptrs = reinterpret_cast<float**>(b.in + o_ptr);
  b.dec_pages = reinterpret_cast<uint16_t***>(b.in + o_pg);
  for (int t = 0; t < n; ++t) tok_h[t] = tokens[t];
  for (int q = 0; q < n_seqs; ++q) pos_h[q] = seqs[q].pos0;
  b.n_dec = m;
  b.dec_splits = 0;
  // a decode pass: its rows' results must not depend on one another's count, so the few-token GEMMs, the int8
  // GEMMs and the streamed experts only when all rows are one-token rows (a prompt's chunk gives the same bits
  // whatever its size; kernels/batched.h). The one exception: a pass of at most moe_fused_rows rows takes the MoE
  // block in one launch with the decode step's arithmetic, other bits than a larger pass's (both within issue
  // 28's bound of the decode step: FullStep.DecodePassWithinTheBound).
  b.x.few = opts_.gemm_rows && m == n;
  b.x.use_f16 = m < n;  // (a prompt's piece in the pass)
  b.moe_rows = m == n && n <= PrefillBuffers::kMoeRowsMaxTokens && b.srows;
  b.i8 = m == n && n <= kI8MaxTokens && b.i8x;
  b.moe_fused = m == n && n <= std::min(opts_.moe_fused_rows, kMoeFusedMaxRows) && b.mfr.act;
  if (m > 0) {
    for (int q = 0, j = 0; q < n_seqs; ++q)
      if (seqs[q].n == 1) {
        dec_i[j] = seqs[q].row0;
        dec_i[m + j] = seqs[q].pos0;
        b.dec_splits = std::max(b.dec_splits, attention_row_splits(seqs[q].pos0 + 1));
        for (int l = 0; l < c.n_layers; ++l) {
          dec_p[((size_t)l * 2 + 0) * m + j] = (*seqs[q].ring)[l];
          dec_p[((size_t)l * 2 + 1) * m + j] = (*seqs[q].S)[l];
        }
        for (int l = 0; l < n_attn; ++l) dec_pg[(size_t)l * m + j] = (*seqs[q].page_table)[l];
        ++j;
      }
    const size_t need = (size_t)m * attn_scratch_floats(c.n_kv_heads, b.dec_splits, c.n_heads / c.n_kv_heads,
                                                        c.head_dim);
    if (n_attn > 0 && need > b.dec_attn_floats) {
      CUDA_CHECK(cudaStreamSynchronize(stream_));  // (an earlier pass of the step may still use the old buffer)
      b.drop_graphs();  // (they name the old buffer)
      if (b.dec_attn) CUDA_CHECK(cudaFree(b.dec_attn));
      b.dec_attn_floats = std::max(need, 2 * b.dec_attn_floats);
      b.dec_attn = device_alloc<float>(b.dec_attn_floats);
    }
  }
  CUDA_CHECK(cudaMemcpyAsync(b.in, b.in_host, at, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaEventRecord(b.in_ev, stream_));

  // (a profiled pass marks its families, a debug run synchronises after each launch: no graph)
  if (m < n || stop_ || !opts_.batch_pass_graphs || prof_ || opts_.debug_sync) return prefill_layers(seqs, n_seqs, n);
  auto it = std::find_if(b.graphs.begin(), b.graphs.end(),
                         [&](const PrefillBuffers::PassGraph& g) { return g.n == n && g.splits == b.dec_splits; });
  if (it == b.graphs.end()) {  // the key's first pass: remembered, run directly
    if (b.graphs.size() >= PrefillBuffers::kMaxPassGraphs) {
      auto lru = std::min_element(b.graphs.begin(), b.graphs.end(),
                                  [](const auto& x, const auto& y) { return x.used < y.used; });
      if (lru->exec) CUDA_CHECK(cudaGraphExecDestroy(lru->exec));
      b.graphs.erase(lru);
    }
    b.graphs.push_back({n, b.dec_splits, nullptr, ++b.clock});
    return prefill_layers(seqs, n_seqs, n);
  }
  if (!it->exec) it->exec = capture_fn([&] { prefill_layers(seqs, n_seqs, n); });
  it->used = ++b.clock;
  CUDA_CHECK(cudaGraphLaunch(it->exec, stream_));
  return true;
}

bool CudaEngine::prefill_layers(const SeqRows* seqs, int n_seqs, int n) {
  PrefillBuffers& b = *pf_;
  const Config& c = cfg_;
  embed_rows(w_.embed_tokens, b.tokens, n, b.h, stream_);
  for (int i = 0, group = 0; i < c.n_layers; ++i) {
    if (c.is_attention(i))
      prefill_attention(i, seqs, n_seqs, n);  // h += o_proj(attention(norm(h)))
    else
      prefill_gdn(i, seqs, n_seqs, n);  // h += out_proj(gdn(norm(h)))
    prefill_moe(i, n);                  // h += MoE(norm(h))
    if (stop_ && (i + 1) % kStopLayers == 0 && i + 1 < c.n_layers) {  // (a pass with a stop is never captured)
      CUDA_CHECK(cudaEventRecord(b.stop_ev[group & 1], stream_));
      if (group > 0) {
        CUDA_CHECK(cudaEventSynchronize(b.stop_ev[(group - 1) & 1]));
        if ((*stop_)()) return false;
      }
      ++group;
    }
  }
  pmark("host");
  return true;
}

void CudaEngine::head_rows(const int* rows, int n, float* logits) {
  LILY_CHECK(pf_ && n >= 1 && n <= kPrefillChunk, "head_rows: ", n, " rows without a pass before");
  PrefillBuffers& b = *pf_;
  const Config& c = cfg_;
  const int H = c.hidden;
  bool in_order = true;  // rows 0 .. n - 1 (a decode pass): no gather
  for (int i = 0; i < n; ++i) in_order = in_order && rows[i] == i;
  float* gathered = in_order ? b.h : b.ysh;  // b.ysh [n][H]: free once the last layer's MoE has combined
  for (int i = 0; i < n && !in_order; ++i)
    CUDA_CHECK(cudaMemcpyAsync(gathered + (size_t)i * H, b.h + (size_t)rows[i] * H, sizeof(float) * H,
                               cudaMemcpyDeviceToDevice, stream_));
  if (project_i8({{&w_.lm_head, logits, c.vocab}}, gathered, H, w_.norm, n, false, "lm_head", n * flops_.lm_head))
    return;
  const FamilyX xh = family_x(H, {&w_.lm_head}, "lm_head");
  pmark("lm_head", n * flops_.lm_head);
  gemm_x_prep(gathered, H, n, w_.norm, c.eps, xh.buf, nullptr, stream_);
  gemm(w_.lm_head, 0, xh.x, n, logits, c.vocab, false, stream_);
}

bool CudaEngine::project_i8(std::initializer_list<PrefillOut> outs, const float* x, int K, const float* norm_w, int n,
                            bool accumulate, const char* family, double flops, int moe_layer) {
  PrefillBuffers& b = *pf_;
  const int max_rows = accumulate ? opts_.gemm_i8_out_rows : opts_.gemm_i8_in_rows;  // (out_proj, o_proj: +=)
  if (!b.i8 || n > max_rows || K > b.i8_width || K % 512 != 0 || outs.size() > static_cast<size_t>(kMaxGemmParts))
    return false;  // (b.i8: n <= kI8MaxTokens)
  for (const PrefillOut& o : outs)
    if (o.W->format != QFormat::q4 || o.W->cols != K || o.W->n_mats != 1) return false;
  pmark("norm");
  i8x_prep(x, K, n, K, norm_w, cfg_.eps, b.i8x, stream_);
  GemmBatch gb;
  for (const PrefillOut& o : outs) gb.W[gb.n] = *o.W, gb.y[gb.n] = o.y, gb.ldy[gb.n++] = o.ldy;
  RouterSums router;
  bool sums = false;
  if (moe_layer >= 0 && b.moe_fused && n <= kI8RouterMaxTokens) {
    const LayerDev& l = w_.layers[moe_layer];
    router = moe_fused_rows_sums(l.moe, l.post_attention_layernorm, b.mfr);
    sums = gemm_i8_router_ok(gb, router);
  }
  pmark(family, flops + (sums ? n * flops_.router : 0.0));  // (the router's products, added here)
  gemm_i8(gb, b.i8x, n, accumulate, stream_, 0, sums ? &router : nullptr);
  b.sums_added = sums;
  return true;
}

// y = W x for matrices sharing x: one launch per run of matrices of the same format and width.
void CudaEngine::project(std::initializer_list<PrefillOut> outs, const GemmX& x, int n) {
  GemmBatch b;
  for (const PrefillOut& o : outs) {
    if (b.n == kMaxGemmParts || (b.n > 0 && (o.W->format != b.W[0].format || o.W->cols != b.W[0].cols))) {
      gemm_multi(b, x, n, false, stream_);
      b.n = 0;
    }
    b.W[b.n] = *o.W, b.y[b.n] = o.y, b.ldy[b.n++] = o.ldy;
  }
  if (b.n > 0) gemm_multi(b, x, n, false, stream_);
}

void CudaEngine::prefill_gdn(int layer, const SeqRows* seqs, int n_seqs, int n) {
  PrefillBuffers& b = *pf_;
  const Config& c = cfg_;
  const GdnMixerDev& g = w_.layers[layer].gdn;
  const GdnDims dims{c.lin_k_heads, c.lin_v_heads, c.lin_k_dim, c.lin_v_dim};
  const int H = c.hidden, Hv = c.lin_v_heads, cd = c.conv_dim(), vd = c.value_dim();
  float* qkv = b.proj;
  float* z = qkv + (size_t)n * cd;
  float* bb = z + (size_t)n * vd;
  float* a = bb + (size_t)n * Hv;
  if (!project_i8({{&g.in_proj_qkv, qkv, cd}, {&g.in_proj_z, z, vd}, {&g.in_proj_b, bb, Hv}, {&g.in_proj_a, a, Hv}},
                  b.h, H, w_.layers[layer].input_layernorm, n, false, "gemm_gdn_in", n * flops_.gdn_in)) {
    const FamilyX xh = family_x(H, {&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_b, &g.in_proj_a}, "gdn_in");
    pmark("norm");
    gemm_x_prep(b.h, H, n, w_.layers[layer].input_layernorm, c.eps, xh.buf, nullptr, stream_);
    pmark("gemm_gdn_in", n * flops_.gdn_in);
    project({{&g.in_proj_qkv, qkv, cd}, {&g.in_proj_z, z, vd}, {&g.in_proj_b, bb, Hv}, {&g.in_proj_a, a, Hv}},
            xh.x, n);
  }
  // the one-token rows' steps together (also a single one: a row's result must not depend on the batch)
  const bool rows_launch = b.n_dec > 0;
  pmark("gdn_core", n * flops_.gdn_core);
  if (!prefill_skips("gdn_core") && rows_launch) {
    const int m = b.n_dec;
    float* const* ptrs = b.dec_ptrs + (size_t)layer * 2 * m;
    launch_gdn_step_rows(qkv, z, a, bb, g.conv1d, g.A_log, g.dt_bias, g.norm,
                         GdnStepRows{b.dec, b.dec + m, ptrs, ptrs + m}, m, b.mix, dims, c.eps, stream_);
  }
  if (!prefill_skips("gdn_core"))
    for (int q = 0; q < n_seqs; ++q) {  // each sequence's rows over its own ring and state, one after another
      const SeqRows& r = seqs[q];
      const size_t t = (size_t)r.row0;
      if (r.n == 1 && rows_launch) continue;
      if (r.n == 1)  // a decode row: the one-token step, one launch instead of the chunk's four
        launch_gdn_step(qkv + t * cd, z + t * vd, a + t * Hv, bb + t * Hv, g.conv1d, g.A_log, g.dt_bias, g.norm,
                        (*r.ring)[layer], (*r.S)[layer], b.mix + t * vd, b.pos + q, dims, c.eps, stream_);
      else
        launch_gdn_chunk(qkv + t * cd, z + t * vd, a + t * Hv, bb + t * Hv, g.conv1d, g.A_log, g.dt_bias, g.norm,
                         (*r.ring)[layer], (*r.S)[layer], b.mix + t * vd, b.scratch, r.pos0, r.n, dims, c.eps,
                         opts_.gdn_wy, stream_);
    }
  if (project_i8({{&g.out_proj, b.h, H}}, b.mix, vd, nullptr, n, true, "gemm_gdn_out", n * flops_.gdn_out, layer))
    return;
  const FamilyX xm = family_x(vd, {&g.out_proj}, "gdn_out");
  pmark("norm");
  gemm_x_prep(b.mix, vd, n, nullptr, 0.f, xm.buf, nullptr, stream_);
  pmark("gemm_gdn_out", n * flops_.gdn_out);
  gemm(g.out_proj, 0, xm.x, n, b.h, H, true, stream_);
}

void CudaEngine::prefill_attention(int layer, const SeqRows* seqs, int n_seqs, int n) {
  PrefillBuffers& b = *pf_;
  const Config& c = cfg_;
  const AttnDev& at = w_.layers[layer].attn;
  const int H = c.hidden, d = c.head_dim, qr = c.q_proj_rows(), kvd = c.n_kv_heads * d, od = c.n_heads * d;
  float* qg = b.proj;
  float* k = qg + (size_t)n * qr;
  float* v = k + (size_t)n * kvd;
  if (!project_i8({{&at.q_proj, qg, qr}, {&at.k_proj, k, kvd}, {&at.v_proj, v, kvd}}, b.h, H,
                  w_.layers[layer].input_layernorm, n, false, "gemm_attn_in", n * flops_.attn_in)) {
    const FamilyX xh = family_x(H, {&at.q_proj, &at.k_proj, &at.v_proj}, "attn_in");
    pmark("norm");
    gemm_x_prep(b.h, H, n, w_.layers[layer].input_layernorm, c.eps, xh.buf, nullptr, stream_);
    pmark("gemm_attn_in", n * flops_.attn_in);
    project({{&at.q_proj, qg, qr}, {&at.k_proj, k, kvd}, {&at.v_proj, v, kvd}}, xh.x, n);
  }
  KvPages kv;
  kv.page_tokens = page_tokens_;
  kv.n_kv = c.n_kv_heads;
  kv.head_dim = d;
  AttnIn in;
  in.q_norm = at.q_norm, in.k_norm = at.k_norm, in.eps = c.eps;
  attn_in_rope(in, c.rope_dim, c.rope_theta);
  if (prof_) {
    double pairs = 0;
    for (int q = 0; q < n_seqs; ++q) pairs += FamilyFlops::causal_pairs(seqs[q].n, seqs[q].pos0);
    pmark("attn_core", pairs * flops_.attn_pair);
  }
  const bool rows_launch = b.n_dec > 0;  // the one-token rows' attention together
  if (!prefill_skips("attn_core") && rows_launch) {
    const int m = b.n_dec, splits = b.dec_splits;
    in.qg = qg, in.k = k, in.v = v;
    const AttnRows rows{b.dec, b.dec + m, b.dec_pages + (size_t)attn_index_[layer] * m};
    AttnScratch sc;
    sc.partial = b.dec_attn;
    sc.max_splits = splits;
    launch_attention_decode_rows(in, kv, rows, m, b.mix, sc, splits, c.n_heads, stream_);
  }
  if (!prefill_skips("attn_core"))
    for (int q = 0; q < n_seqs; ++q) {  // each sequence's rows over its own KV pages
      const SeqRows& r = seqs[q];
      const size_t t = (size_t)r.row0;
      if (r.n == 1 && rows_launch) continue;
      kv.pages = (*r.page_table)[attn_index_[layer]];
      in.qg = qg + t * qr, in.k = k + t * kvd, in.v = v + t * kvd;
      launch_attention_chunk(in, kv, r.pos0, r.n, c.n_heads, b.scratch, b.mix + t * od, stream_,
                             opts_.prompt_attn_one_term, opts_.prompt_attn_wgmma);
    }
  if (project_i8({{&at.o_proj, b.h, H}}, b.mix, od, nullptr, n, true, "gemm_attn_out", n * flops_.attn_out, layer))
    return;
  const FamilyX xm = family_x(od, {&at.o_proj}, "attn_out");
  pmark("norm");
  gemm_x_prep(b.mix, od, n, nullptr, 0.f, xm.buf, nullptr, stream_);
  pmark("gemm_attn_out", n * flops_.attn_out);
  gemm(at.o_proj, 0, xm.x, n, b.h, H, true, stream_);
}

void CudaEngine::prefill_moe(int layer, int n) {
  PrefillBuffers& b = *pf_;
  const Config& c = cfg_;
  const MoeWeightsDev& m = w_.layers[layer].moe;
  const int H = c.hidden, E = c.n_experts, k = c.top_k, F = c.moe_ffn, Fs = c.shared_ffn;
  if (b.moe_fused) {  // the whole block, one launch (a decode pass of a few rows)
    pmark("moe_fused", n * ((b.sums_added ? 0.0 : flops_.router) + flops_.shared_gate_up + flops_.shared_down +
                            k * (flops_.expert_gate_up + flops_.expert_down)));
    const float* norm_w = w_.layers[layer].post_attention_layernorm;
    if (!b.sums_added) moe_router_sums_rows(moe_fused_rows_sums(m, norm_w, b.mfr), b.h, n, stream_);
    b.sums_added = false;
    moe_fused_rows(m, b.h, n, norm_w, c.eps, b.mfr, stream_);
    return;
  }
  const GemmXBuf xh = at_width(b.x, H, {&m.gate, &m.shared_expert_gate, &m.shared_gate, &m.shared_up,
                                        &m.experts_gate, &m.experts_up});
  pmark("norm");
  // the streamed experts read the normed rows staged (b.ysh holds them in fp32 until the shared expert's down)
  gemm_x_prep(b.h, H, n, w_.layers[layer].post_attention_layernorm, c.eps, xh, b.moe_rows ? b.ysh : nullptr, stream_);
  if (b.moe_rows) stream_rows_prep(b.ysh, H, n, H, b.srows, stream_);
  pmark("gemm_router", n * flops_.router);
  if (!b.x.few && gemm_one_row_supported(m.shared_expert_gate)) {  // (a decode pass of one-token rows: one launch)
    project({{&m.gate, b.logits, E + 1}}, xh.view(), n);
    gemm_one_row(m.shared_expert_gate, xh.view(), n, b.logits + E, E + 1, stream_);
  } else {
    project({{&m.gate, b.logits, E + 1}, {&m.shared_expert_gate, b.logits + E, E + 1}}, xh.view(), n);
  }
  // a decode pass that streams its routed experts takes the shared expert in their launches where it has their
  // shape (matrix E of the work list) up to opts_.moe_fold_rows rows, else runs it on the side stream from here
  // (the routed launches read the staged rows, not x; the shared GEMMs' are small and overlap theirs in part)
  const MoeRowsShared fold{E, &m.shared_gate, &m.shared_up, &m.shared_down};
  const bool folded = b.moe_rows && n <= opts_.moe_fold_rows && moe_rows_shared_ok(m.experts_gate, fold);
  const int n_sh = folded ? n : 0;
  const bool side = b.moe_rows && !folded && b.side && !prof_ && m.shared_gate.format == m.shared_up.format;
  if (side) {
    CUDA_CHECK(cudaEventRecord(b.fork_ev, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(b.side, b.fork_ev, 0));
    shared_gate_up(layer, xh, n, b.side);
    shared_down(layer, n, b.side);
    CUDA_CHECK(cudaEventRecord(b.join_ev, b.side));
  }
  pmark("routing");
  // the grouped GEMMs' work list in their tile's slots: the warp-specialised tile's where every routed launch
  // takes it (both families named, 4-bit weights; the streamed experts take 64, as does the bound below)
  GemmX xe = prompt_x(xh, "experts_gate_up");
  xe.ws = xe.ws && names(opts_.prompt_gemm_ws, "experts_down") && !b.moe_rows &&
          m.experts_gate.format == QFormat::q4 && m.experts_up.format == QFormat::q4 &&
          m.experts_down.format == QFormat::q4;
  if (b.moe_rows && n <= kMoeRouteMaxRows) {  // (selection, grouping and work list in one launch)
    moe_route_rows(b.logits, E + 1, n, E, k, b.idx, b.w, b.sh, b.offsets, b.x_row, b.w_slot, b.slot_of, b.tiles, 64,
                   stream_, n_sh);
  } else {
    moe_select_rows(b.logits, E + 1, n, E, k, b.idx, b.w, b.sh, stream_);
    moe_group(b.idx, b.w, n, k, E, b.offsets, b.x_row, b.w_slot, b.slot_of, stream_, n_sh);
    gemm_grouped_tiles(b.offsets, E + (folded ? 1 : 0), b.tiles, stream_, xe.ws ? kGemmWsTok : 64, folded);
  }
  const int max_tiles = gemm_grouped_max_tiles(n * k, E) + (n_sh + 63) / 64;
  // the shared expert first: its GEMMs read x before the routed experts' down projection reuses the buffer
  if (!side && !folded) shared_gate_up(layer, xh, n, stream_);
  // routed experts: each token's rows go to its 8 experts' slots (x_row), weighted by the routing weight (folded:
  // the shared expert's n slots after them)
  float* g = b.yd;
  float* u = b.yd + (size_t)n * k * std::max(F, Fs);
  float* act = folded ? b.act : b.act + (size_t)n * Fs;
  pmark("gemm_experts_gate_up", (n * k + n_sh) * flops_.expert_gate_up);
  if (b.moe_rows) {
    moe_rows_swiglu(m.experts_gate, m.experts_up, b.srows, b.x_row, b.offsets, b.tiles, max_tiles, b.w_slot, act, F,
                    stream_, folded ? &fold : nullptr);
  } else if (m.experts_gate.format == m.experts_up.format) {
    gemm_grouped_swiglu(m.experts_gate, m.experts_up, xe, b.x_row, b.offsets, b.tiles, max_tiles, b.w_slot, act, F,
                        stream_, n);
  } else {
    gemm_grouped(m.experts_gate, xe, b.x_row, b.offsets, b.tiles, max_tiles, g, F, stream_, n);
    gemm_grouped(m.experts_up, xe, b.x_row, b.offsets, b.tiles, max_tiles, u, F, stream_, n);
    swiglu_rows(g, u, b.w_slot, n * k, F, act, stream_);
  }
  if (!side && !folded) shared_down(layer, n, stream_);
  pmark("norm");
  if (b.moe_rows) {
    stream_rows_prep(act, F, n * k + n_sh, F, b.srows, stream_);
    pmark("gemm_experts_down", (n * k + n_sh) * flops_.expert_down);
    moe_rows_down(m.experts_down, b.srows, b.offsets, b.tiles, max_tiles, b.yd, H, stream_,
                  folded ? &fold : nullptr);
  } else {
    FamilyX xr = family_x(F, {&m.experts_down}, "experts_down");
    gemm_x_prep(act, F, n * k, nullptr, 0.f, xr.buf, nullptr, stream_);
    pmark("gemm_experts_down", n * k * flops_.expert_down);
    xr.x.ws = xe.ws;  // (the work list's tiles)
    gemm_grouped(m.experts_down, xr.x, nullptr, b.offsets, b.tiles, max_tiles, b.yd, H, stream_, n);
  }
  if (side) CUDA_CHECK(cudaStreamWaitEvent(stream_, b.join_ev, 0));
  pmark("combine");
  moe_combine(b.yd, b.slot_of, k, folded ? b.yd + (size_t)n * k * H : b.ysh, b.sh, n, H, b.h, stream_);
}

// The shared expert's SwiGLU of the normed rows xh into act[0, n * Fs): gate and up in one launch where their
// formats agree, else two GEMMs into the yd scratch (on the engine's stream only).
void CudaEngine::shared_gate_up(int layer, const GemmXBuf& xh, int n, cudaStream_t s) {
  PrefillBuffers& b = *pf_;
  const MoeWeightsDev& m = w_.layers[layer].moe;
  const int Fs = cfg_.shared_ffn;
  pmark("gemm_shared", n * flops_.shared_gate_up);
  if (m.shared_gate.format == m.shared_up.format) {
    gemm_swiglu(m.shared_gate, m.shared_up, prompt_x(xh, "shared"), n, b.act, Fs, s);
  } else {
    float* g = b.yd;
    float* u = b.yd + (size_t)n * cfg_.top_k * std::max(cfg_.moe_ffn, Fs);
    project({{&m.shared_gate, g, Fs}, {&m.shared_up, u, Fs}}, prompt_x(xh, "shared"), n);
    swiglu_rows(g, u, nullptr, n, Fs, b.act, stream_);
  }
}

// The shared expert's down projection of act[0, n * Fs) into ysh (x at width Fs in the shared GEMM input).
void CudaEngine::shared_down(int layer, int n, cudaStream_t s) {
  PrefillBuffers& b = *pf_;
  const MoeWeightsDev& m = w_.layers[layer].moe;
  const int Fs = cfg_.shared_ffn;
  const FamilyX xs = family_x(Fs, {&m.shared_down}, "shared");
  pmark("norm");
  gemm_x_prep(b.act, Fs, n, nullptr, 0.f, xs.buf, nullptr, s);
  pmark("gemm_shared", n * flops_.shared_down);
  gemm(m.shared_down, 0, xs.x, n, b.ysh, cfg_.hidden, false, s);
}

}  // namespace lily::cuda
