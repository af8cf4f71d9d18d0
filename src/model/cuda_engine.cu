// CudaEngine: the device weights, one sequence's state (GDN conv rings and recurrent states, a paged bf16 KV
// cache grown on demand) and the decode step captured once as a CUDA graph. The step reads its token and
// position from device memory (StepDev), so the graph replays unchanged. For the real model the step is 102
// launches: embed, per GDN layer 2 (mixer, MoE), per attention layer 4 (q/k/v with the input norm, attention
// split with the q/k norm + RoPE + KV append, combine, o_proj + MoE), lm_head with the final norm.
// The CUDA Backend over it is runtime/cuda_backend.cu; the prompt path model/prefill_cuda.cu.
#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/common.cuh"
#include "kernels/gdn_fused.h"
#include "model/cuda_engine.h"
#include "model/forward_cuda.h"

namespace lily::cuda {

namespace {

constexpr int kPageTokens = 1024;   // KV tokens per page (2 MiB per attention layer for the real model)

}  // namespace

CudaEngine::CudaEngine(const Config& c, DeviceWeights w, int max_context, int device, bool fused,
                       const KernelOptions& opts)
    : cfg_(c), flops_(c), w_(std::move(w)), fused_(fused), opts_(opts), max_context_(max_context) {
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  gdn_scratch_ = device_alloc<float>(gdn_mixer_scratch_floats());
  gdn_barrier_ = device_alloc<unsigned>(kGridBarrierWords);
  CUDA_CHECK(cudaMemsetAsync(gdn_barrier_, 0, kGridBarrierWords * sizeof(unsigned), stream_));
  const int H = c.hidden, d = c.head_dim;
  const int gdn_proj = c.conv_dim() + c.value_dim() + 2 * c.lin_v_heads;
  const int attn_proj = c.q_proj_rows() + 2 * c.n_kv_heads * d;
  step_ = device_alloc<StepDev>(1);
  h_ = device_alloc<float>(H);
  x_ = device_alloc<float>(H);
  proj_ = device_alloc<float>(std::max(gdn_proj, attn_proj));
  mix_ = device_alloc<float>(std::max(c.value_dim(), c.n_heads * d));
  logits_ = device_alloc<float>(c.vocab);
  moe_ = moe_scratch_alloc(c.n_experts, c.top_k, c.moe_ffn);

  attn_index_.assign(c.n_layers, -1);
  const size_t ring_floats = (size_t)4 * c.conv_dim();
  const size_t s_floats = (size_t)c.lin_v_heads * c.lin_k_dim * c.lin_v_dim;
  int n_gdn = 0, n_attn = 0;
  for (int i = 0; i < c.n_layers; ++i) {
    if (c.is_attention(i)) attn_index_[i] = n_attn++;
    else n_gdn++;
  }
  gdn_state_bytes_ = (size_t)n_gdn * (ring_floats + s_floats) * sizeof(float);
  page_tokens_ = kPageTokens;
  own_ = seq_alloc();
  if (n_attn > 0) {
    attn_.max_splits = kAttnMaxSplits;
    attn_.partial = device_alloc<float>(attn_scratch_floats(c.n_kv_heads, kAttnMaxSplits, c.n_heads / c.n_kv_heads, d));
  }
  // one attention split block per SM by default (the split kernel holds a whole SM: 192 KB of K/V rings)
  plan_ = make_decode_plan(c, w_, moe_, opts_, sm_count(), fused_);
  reset_state();
  ensure_kv(1);
  // Capture the plain decode step once.
  graph_ = capture({});
  graph_nohead_ = capture({}, false);
}

CudaEngine::~CudaEngine() {
  cudaStreamSynchronize(stream_);
  prefill_free();
  if (graph_) cudaGraphExecDestroy(graph_);
  if (graph_nohead_) cudaGraphExecDestroy(graph_nohead_);
  seq_free(own_);
  for (void* p : {(void*)step_, (void*)h_, (void*)x_, (void*)proj_, (void*)mix_, (void*)logits_,
                  (void*)attn_.partial, (void*)gdn_scratch_, (void*)gdn_barrier_})
    if (p) cudaFree(p);
  moe_scratch_free(moe_);
  free_weights(w_);
  cudaStreamDestroy(stream_);
}

void CudaEngine::reset_state() {
  CUDA_CHECK(cudaMemsetAsync(own_.gdn, 0, gdn_state_bytes_, stream_));
}

void CudaEngine::ensure_kv(int n_tokens) { seq_ensure_kv(own_, n_tokens); }

size_t CudaEngine::kv_page_bytes() const {
  return kv_page_elems(page_tokens_, cfg_.n_kv_heads, cfg_.head_dim) * own_.page_table.size() * sizeof(uint16_t);
}

// A sequence's state (the engine's own, or the batch backend's slots): GDN rings + states in one buffer (zeroed),
// a page table per attention layer, pages on demand (seq_ensure_kv: one allocation per page index, cut into the
// attention layers' pages).
SeqStateDev CudaEngine::seq_alloc() {
  const Config& c = cfg_;
  SeqStateDev st;
  st.gdn = device_alloc<uint8_t>(gdn_state_bytes_);
  CUDA_CHECK(cudaMemsetAsync(st.gdn, 0, gdn_state_bytes_, stream_));
  st.ring.assign(c.n_layers, nullptr);
  st.S.assign(c.n_layers, nullptr);
  const size_t ring_floats = (size_t)4 * c.conv_dim();
  const size_t s_floats = (size_t)c.lin_v_heads * c.lin_k_dim * c.lin_v_dim;
  float* p = static_cast<float*>(st.gdn);
  const int max_pages = (max_context_ + page_tokens_ - 1) / page_tokens_;
  for (int i = 0; i < c.n_layers; ++i) {
    if (c.is_attention(i)) {
      uint16_t** t = device_alloc<uint16_t*>(max_pages);
      CUDA_CHECK(cudaMemsetAsync(t, 0, max_pages * sizeof(uint16_t*), stream_));
      st.page_table.push_back(t);
      continue;
    }
    st.ring[i] = p;
    st.S[i] = p + ring_floats;
    p += ring_floats + s_floats;
  }
  return st;
}

void CudaEngine::seq_free(SeqStateDev& st) {
  cudaStreamSynchronize(stream_);
  if (st.gdn) cudaFree(st.gdn);
  for (auto* t : st.page_table) cudaFree(t);
  for (void* b : st.page_blocks) cudaFree(b);
  st = SeqStateDev{};
}

void CudaEngine::seq_ensure_kv(SeqStateDev& st, int n_tokens) {
  if (st.page_table.empty()) return;
  LILY_CHECK(n_tokens <= max_context_, "CUDA backend: context of ", n_tokens, " tokens exceeds the maximum ",
             max_context_);
  const size_t elems = kv_page_elems(page_tokens_, cfg_.n_kv_heads, cfg_.head_dim);
  const int need = (n_tokens + page_tokens_ - 1) / page_tokens_;
  while (st.pages < need) {  // pages are added rarely: a sync each
    uint16_t* block = device_alloc<uint16_t>(elems * st.page_table.size());
    st.page_blocks.push_back(block);
    std::vector<uint16_t*> ptrs(st.page_table.size());  // host copies, alive until the sync below
    for (size_t a = 0; a < st.page_table.size(); ++a) {
      ptrs[a] = block + a * elems;
      CUDA_CHECK(cudaMemcpyAsync(st.page_table[a] + st.pages, &ptrs[a], sizeof(uint16_t*), cudaMemcpyHostToDevice,
                                 stream_));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    st.pages++;
  }
}

void CudaEngine::seq_shrink_kv(SeqStateDev& st, int n_tokens) {
  const int keep = (std::max(n_tokens, 0) + page_tokens_ - 1) / page_tokens_;
  if (st.pages <= keep) return;
  CUDA_CHECK(cudaStreamSynchronize(stream_));  // no queued work reads them
  while (st.pages > keep) {
    CUDA_CHECK(cudaFree(st.page_blocks.back()));
    st.page_blocks.pop_back();
    st.pages--;
  }
}

size_t CudaEngine::kv_bytes_to_come() const {
  const int max_pages = (max_context_ + page_tokens_ - 1) / page_tokens_;
  return static_cast<size_t>(max_pages - own_.pages) * kv_page_bytes();
}

void CudaEngine::fill_kv_random(int n_tokens, uint64_t seed) {
  ensure_kv(n_tokens);
  const size_t elems = kv_page_elems(page_tokens_, cfg_.n_kv_heads, cfg_.head_dim) * own_.page_table.size();
  const int used = (n_tokens + page_tokens_ - 1) / page_tokens_;
  for (int p = 0; p < used; ++p) fill_random_bf16(static_cast<uint16_t*>(own_.page_blocks[p]), elems, seed + p, stream_);
}

// ---- the decode step, in the order of docs/model.md §2.0 ----
// Every launch goes through family(): the recorder marks it (the instrumented pass) and may leave it out
// (LILY_SKIP in `lily bench`: the step then computes garbage, but its time without a family is the family's
// marginal cost).
bool CudaEngine::family(const char* name) {
  rec_->mark(name);
  return !rec_->skips(name);
}

// Per layer: norm -> mixer -> residual -> norm -> MoE -> residual. Every RMSNorm is fused into the prologue of
// the launch that consumes it and every residual add into the launch that produces the update; which launch
// that is, is plan_'s (model/decode_plan.h).
void CudaEngine::record_step(StepRecorder* rec, bool head) {
  StepRecorder none;
  rec_ = rec ? rec : &none;
  rec_->begin_step();
  const Config& c = cfg_;
  if (family("embed")) embed_row(w_.embed_tokens, &step_->token, h_, stream_);
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerDev& l = w_.layers[i];
    const LayerPlan& p = plan_.layers[i];
    bool sums_added = false;  // the mixer's launch added the MoE block's router sums
    ResidualProj o_proj;      // attention: h += o_proj(mix_)
    const ResidualProj* pre = nullptr;
    if (p.mixer == MixerPath::attention) {
      attention(i, l.input_layernorm);
      o_proj.W = l.attn.o_proj;
      o_proj.x = mix_;
      if (family("attn_out_proj")) {
        if (p.moe_runs_o_proj) pre = &o_proj;
        else gemv(o_proj.W, o_proj.x, h_, true, stream_);
      }
    } else {
      sums_added = gdn(i, l.input_layernorm);
    }
    if (family("moe"))
      moe_block(l.moe, h_, l.post_attention_layernorm, c.eps, x_, moe_, stream_, p.moe == MoePath::fused, pre,
                sums_added, rec_->trace());
    else if (pre)
      gemv(pre->W, pre->x, h_, true, stream_);
  }
  if (head && family("lm_head")) lm_head(h_);
  family("end");
  rec_ = nullptr;
}

// Projections that share the normed input: the first launch normalises h (and stores x_), later ones (another
// format) read x_.
void CudaEngine::project(const GemvBatch& b, const float* norm_w, bool& normed) {
  if (normed) {
    gemv_multi(b, x_, false, stream_);
  } else {
    gemv_multi_rmsnorm(b, h_, norm_w, cfg_.eps, x_, stream_);
    normed = true;
  }
}

bool CudaEngine::gdn(int layer, const float* norm_w) {
  const Config& c = cfg_;
  const GdnMixerDev& g = w_.layers[layer].gdn;
  const LayerPlan& p = plan_.layers[layer];
  const GdnDims dims{c.lin_k_heads, c.lin_v_heads, c.lin_k_dim, c.lin_v_dim};
  if (p.mixer == MixerPath::gdn_fused) {  // one persistent launch (kernels/gdn_fused.cu)
    if (!family("gdn")) return false;
    // the router sums only when the MoE launch will run and read them
    const bool sums = p.gdn_adds_router_sums && !rec_->skips("moe");
    const RouterSums next =
        sums ? moe_router_sums(w_.layers[layer].moe, w_.layers[layer].post_attention_layernorm, moe_) : RouterSums{};
    launch_gdn_mixer_fused(g, dims, h_, norm_w, c.eps, nullptr, proj_, gdn_scratch_, gdn_barrier_, seq().ring[layer],
                           seq().S[layer], &step_->pos, stream_, &next, rec_->trace());
    return next.acc != nullptr;
  }
  const int Hv = c.lin_v_heads;
  float* qkv = proj_;
  float* z = qkv + c.conv_dim();
  float* b = z + c.value_dim();
  float* a = b + Hv;
  GemvBatch batch;
  batch.n = 0;
  bool normed = false;
  auto add = [&](const QMat& W, float* y) {
    if (batch.n > 0 && (W.format != batch.W[0].format || W.cols != batch.W[0].cols)) {
      project(batch, norm_w, normed);
      batch.n = 0;
    }
    batch.W[batch.n] = W;
    batch.y[batch.n++] = y;
  };
  add(g.in_proj_qkv, qkv);
  add(g.in_proj_z, z);
  add(g.in_proj_b, b);
  add(g.in_proj_a, a);
  if (family("gdn_in_proj")) project(batch, norm_w, normed);
  if (family("gdn_core"))
    launch_gdn_step(qkv, z, a, b, g.conv1d, g.A_log, g.dt_bias, g.norm, seq().ring[layer], seq().S[layer], mix_,
                    &step_->pos, dims, c.eps, stream_);
  if (family("gdn_out_proj")) gemv(g.out_proj, mix_, h_, true, stream_);
  return false;
}

// Attention up to the heads' outputs in mix_.
void CudaEngine::attention(int layer, const float* norm_w) {
  const Config& c = cfg_;
  const AttnDev& at = w_.layers[layer].attn;
  const int d = c.head_dim;
  float* qg = proj_;
  float* k = qg + c.q_proj_rows();
  float* v = k + c.n_kv_heads * d;
  GemvBatch batch;
  batch.n = 3;
  batch.W[0] = at.q_proj, batch.W[1] = at.k_proj, batch.W[2] = at.v_proj;
  batch.y[0] = qg, batch.y[1] = k, batch.y[2] = v;
  bool normed = false;
  if (!family("attn_in_proj")) {
  } else if (plan_.layers[layer].qkv_one_launch) {
    project(batch, norm_w, normed);
  } else {
    for (int j = 0; j < 3; ++j) {
      GemvBatch one;
      one.n = 1;
      one.W[0] = batch.W[j];
      one.y[0] = batch.y[j];
      project(one, norm_w, normed);
    }
  }
  KvPages kv;
  kv.pages = seq().page_table[attn_index_[layer]];
  kv.page_tokens = page_tokens_;
  kv.n_kv = c.n_kv_heads;
  kv.head_dim = d;
  AttnIn in;  // the split kernel normalises and rotates q and k itself and appends k, v to the cache
  in.qg = qg, in.k = k, in.v = v, in.q_norm = at.q_norm, in.k_norm = at.k_norm, in.eps = c.eps;
  attn_in_rope(in, c.rope_dim, c.rope_theta);
  if (family("attn_core"))
    launch_attention_decode(in, kv, &step_->pos, mix_, attn_, plan_.attn_splits, c.n_heads, stream_, rec_->trace());
}

cudaGraphExec_t CudaEngine::capture(const std::function<void()>& tail, bool head, StepRecorder* rec) {
  return capture_fn([&] {
    record_step(rec, head);
    if (tail) tail();
  });
}

cudaGraphExec_t CudaEngine::capture_fn(const std::function<void()>& fn) {
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    fn();
  } catch (...) {  // a launcher rejected a shape: end the capture so this thread can use CUDA again
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaGraphDestroy(graph));
  return exec;
}

cudaGraphExec_t CudaEngine::capture_for(const SeqStateDev& st) {
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  cur_ = &st;
  cudaGraphExec_t g = nullptr;
  try {
    g = capture(nullptr, true, nullptr);
  } catch (...) {
    cur_ = nullptr;
    throw;
  }
  cur_ = nullptr;
  return g;
}

void CudaEngine::lm_head(const float* h) {
  GemvBatch lm;
  lm.n = 1;
  lm.W[0] = w_.lm_head;
  lm.y[0] = logits_;
  gemv_multi_rmsnorm(lm, h, w_.norm, cfg_.eps, x_, stream_);
}

void CudaEngine::launch_step(bool head) { CUDA_CHECK(cudaGraphLaunch(head ? graph_ : graph_nohead_, stream_)); }

}  // namespace lily::cuda

namespace lily {

bool cuda_device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string cuda_device_description(int device) {
  cudaDeviceProp p{};
  if (!cuda_device_available() || cudaGetDeviceProperties(&p, device) != cudaSuccess) return "";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s, %d SMs, %.1f GiB", p.name, p.multiProcessorCount,
                p.totalGlobalMem / (1024.0 * 1024 * 1024));
  return buf;
}

}  // namespace lily
