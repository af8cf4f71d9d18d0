// CpuBatchForward: the fp32 reference forward pass (docs/model.md §2), one function per block, over the
// tokens of many sequences at once.
// note: every matrix product goes through matmul_rows, whose per-row results do not depend on how many
// rows are processed together; MoE sums each token's experts in ascending expert index; everything else
// (norms, conv, delta rule, attention) runs per token over that token's own sequence in a fixed order. So a
// sequence's logits are bit-identical whether it runs alone or batched, prefilled in one piece or token by
// token.
#include "model/forward_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <unordered_set>

#include "model/blocks_cpu.h"
#include "model/matmul_cpu.h"
#include "util/check.h"

namespace lily {
namespace {

void expect_shape(const Mat& m, int64_t rows, int64_t cols, const std::string& what) {
  check_mat(m, what.c_str());
  LILY_CHECK(m.rows == rows && m.cols == cols, "cpu backend: ", what, " is [", m.rows, ", ", m.cols,
             "], expected [", rows, ", ", cols, "]");
}

// Checks the matrix shapes the forward pass relies on, so a malformed Weights fails here, not in a product.
void check_weights(const Model& model) {
  const Config& c = model.config;
  const Weights& w = model.weights;
  const int H = c.hidden;
  LILY_CHECK(static_cast<int>(w.layers.size()) == c.n_layers, "cpu backend: ", w.layers.size(), " layers, config says ",
             c.n_layers);
  LILY_CHECK(c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0 && c.lin_k_heads > 0 &&
                 c.lin_v_heads % c.lin_k_heads == 0 && c.rope_dim % 2 == 0 && c.rope_dim <= c.head_dim && c.top_k >= 1 && c.top_k <= c.n_experts,
             "cpu backend: inconsistent head counts or top_k in the config");
  expect_shape(w.embed_tokens, c.vocab, H, "embed_tokens");
  expect_shape(w.lm_head, c.vocab, H, "lm_head");
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    if (c.is_attention(i)) {
      expect_shape(l.attn.q_proj, c.q_proj_rows(), H, p + "self_attn.q_proj");
      expect_shape(l.attn.k_proj, c.n_kv_heads * c.head_dim, H, p + "self_attn.k_proj");
      expect_shape(l.attn.v_proj, c.n_kv_heads * c.head_dim, H, p + "self_attn.v_proj");
      expect_shape(l.attn.o_proj, H, c.n_heads * c.head_dim, p + "self_attn.o_proj");
    } else {
      expect_shape(l.gdn.in_proj_qkv, c.conv_dim(), H, p + "linear_attn.in_proj_qkv");
      expect_shape(l.gdn.in_proj_z, c.value_dim(), H, p + "linear_attn.in_proj_z");
      expect_shape(l.gdn.in_proj_b, c.lin_v_heads, H, p + "linear_attn.in_proj_b");
      expect_shape(l.gdn.in_proj_a, c.lin_v_heads, H, p + "linear_attn.in_proj_a");
      expect_shape(l.gdn.out_proj, H, c.value_dim(), p + "linear_attn.out_proj");
      LILY_CHECK(l.gdn.conv1d.size() == static_cast<size_t>(c.conv_dim()) * c.conv_kernel, "cpu backend: ", p,
                 "linear_attn.conv1d has ", l.gdn.conv1d.size(), " values");
    }
    expect_shape(l.moe.gate, c.n_experts, H, p + "mlp.gate");
    LILY_CHECK(static_cast<int>(l.moe.experts_gate.size()) == c.n_experts &&
                   static_cast<int>(l.moe.experts_up.size()) == c.n_experts &&
                   static_cast<int>(l.moe.experts_down.size()) == c.n_experts,
               "cpu backend: ", p, "mlp experts: expected ", c.n_experts);
    expect_shape(l.moe.experts_gate[0], c.moe_ffn, H, p + "mlp.experts[0].gate");
    expect_shape(l.moe.experts_down[0], H, c.moe_ffn, p + "mlp.experts[0].down");
    expect_shape(l.moe.shared_gate, c.shared_ffn, H, p + "mlp.shared_expert.gate_proj");
    expect_shape(l.moe.shared_down, H, c.shared_ffn, p + "mlp.shared_expert.down_proj");
    expect_shape(l.moe.shared_expert_gate, 1, H, p + "mlp.shared_expert_gate");
  }
}

void add_into(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace

// One group's rows in one pass: rows [row0, row0 + n) of the activations, positions pos0 .. pos0 + n - 1.
struct CpuBatchForward::Segment {
  CpuSequenceState* st = nullptr;
  const int32_t* tokens = nullptr;  // [n]
  int n = 0;
  int row0 = 0;
  int pos0 = 0;
  float* logits = nullptr;          // [n][vocab] (all) or [vocab] (the last row's), or null
  bool all_logits = false;
};

struct CpuBatchForward::Pass {
  std::vector<Segment> segs;
  std::vector<int> seg_of_row;      // [rows]
  int rows = 0;
};

CpuBatchForward::CpuBatchForward(const Model& model, ThreadPool* pool)
    : model_(model), cfg_(model.config), own_pool_(pool), flops_(model.config) {
  check_weights(model);
}

CpuSequenceState CpuBatchForward::new_state() const {
  CpuSequenceState s;
  s.layers.resize(cfg_.n_layers);
  reset(s);
  return s;
}

void CpuBatchForward::reset(CpuSequenceState& s) const {
  s.position = 0;
  s.layers.resize(cfg_.n_layers);
  for (int i = 0; i < cfg_.n_layers; ++i) {
    CpuLayerState& st = s.layers[i];
    st.k.clear();
    st.v.clear();
    if (!cfg_.is_attention(i)) {
      st.conv.assign(static_cast<size_t>(cfg_.conv_kernel - 1) * cfg_.conv_dim(), 0.0f);
      st.S.assign(static_cast<size_t>(cfg_.lin_v_heads) * cfg_.lin_k_dim * cfg_.lin_v_dim, 0.0f);
    }
  }
}

void CpuBatchForward::forward(std::span<const CpuGroup> groups) {
  std::unordered_set<const CpuSequenceState*> seen;
  for (size_t g = 0; g < groups.size(); ++g) {  // validate before any state changes
    const CpuGroup& gr = groups[g];
    if (gr.tokens.empty()) continue;
    LILY_CHECK(gr.state && static_cast<int>(gr.state->layers.size()) == cfg_.n_layers, "cpu forward: group ", g,
               " has no sequence state");
    LILY_CHECK(seen.insert(gr.state).second, "cpu forward: group ", g, " repeats the state of an earlier group");
    for (int32_t t : gr.tokens)
      LILY_CHECK(t >= 0 && t < cfg_.vocab, "token id ", t, " outside [0, ", cfg_.vocab, ")");
  }
  pool_ = own_pool_ ? own_pool_ : &ThreadPool::global();
  const int64_t V = cfg_.vocab;
  std::vector<int> done(groups.size(), 0);  // tokens of each group consumed so far
  Pass p;
  for (;;) {
    p.segs.clear();
    p.seg_of_row.clear();
    p.rows = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      const CpuGroup& gr = groups[g];
      const int left = static_cast<int>(gr.tokens.size()) - done[g];
      if (left == 0) continue;
      const int n = std::min({left, kPromptChunk, std::max(1, kPassRows - p.rows)});
      Segment s;
      s.st = gr.state;
      s.tokens = gr.tokens.data() + done[g];
      s.n = n;
      s.row0 = p.rows;
      s.pos0 = gr.state->position;
      s.all_logits = gr.all_logits;
      if (gr.logits && gr.all_logits) s.logits = gr.logits + done[g] * V;
      else if (gr.logits && n == left) s.logits = gr.logits;
      p.seg_of_row.insert(p.seg_of_row.end(), n, static_cast<int>(p.segs.size()));
      p.segs.push_back(s);
      p.rows += n;
      done[g] += n;
    }
    if (p.segs.empty()) break;
    run_pass(p);
  }
}

// h = embed; per layer: norm -> mixer -> residual -> norm -> MoE -> residual; final norm -> lm_head.
void CpuBatchForward::run_pass(const Pass& p) {
  const int64_t H = cfg_.hidden;
  const int n = p.rows;
  std::vector<float> x(n * H), r(n * H), mix(n * H);  // [n][H] residual stream, normed input, block output
  mark("embed");
  embed(p, x.data());
  for (int i = 0; i < cfg_.n_layers; ++i) {
    const LayerWeights& lw = model_.weights.layers[i];
    mark("norm");
    norm_rows(x.data(), lw.input_layernorm, n, r.data());
    if (cfg_.is_attention(i)) attention(i, r.data(), p, mix.data());
    else gdn(i, r.data(), p, mix.data());
    add_into(x.data(), mix.data(), n * H);
    mark("norm");
    norm_rows(x.data(), lw.post_attention_layernorm, n, r.data());
    moe(i, r.data(), n, mix.data());
    add_into(x.data(), mix.data(), n * H);
  }
  for (const Segment& s : p.segs) s.st->position += s.n;
  head(x.data(), p);
  mark("host");
}

void CpuBatchForward::embed(const Pass& p, float* x) {
  for (const Segment& s : p.segs)
    for (int t = 0; t < s.n; ++t)
      gather_row(model_.weights.embed_tokens, s.tokens[t], x + static_cast<int64_t>(s.row0 + t) * cfg_.hidden);
}

void CpuBatchForward::norm_rows(const float* x, const std::vector<float>& w, int n, float* y) {
  const int64_t H = cfg_.hidden;
  for (int t = 0; t < n; ++t) rms_norm(x + t * H, w.data(), H, cfg_.eps, y + t * H);
}

// The rows that want logits go through lm_head together; one segment's rows are written in place, several
// segments' through a staging buffer.
void CpuBatchForward::head(const float* x, const Pass& p) {
  const int64_t H = cfg_.hidden, V = cfg_.vocab;
  std::vector<const Segment*> outs;
  int64_t rows = 0;
  for (const Segment& s : p.segs)
    if (s.logits) outs.push_back(&s), rows += s.all_logits ? s.n : 1;
  if (outs.empty()) return;
  mark("lm_head", rows * flops_.lm_head);
  std::vector<float> xn(rows * H);  // [rows][H] normed final hidden states of the rows that want logits
  int64_t r = 0;
  for (const Segment* s : outs) {
    const int first = s->all_logits ? 0 : s->n - 1;
    norm_rows(x + (s->row0 + first) * H, model_.weights.norm, s->n - first, xn.data() + r * H);
    r += s->n - first;
  }
  if (outs.size() == 1) {
    matmul_rows(model_.weights.lm_head, xn.data(), rows, H, outs[0]->logits, V, *pool_);
    return;
  }
  std::vector<float> logits(rows * V);  // [rows][V]
  matmul_rows(model_.weights.lm_head, xn.data(), rows, H, logits.data(), V, *pool_);
  r = 0;
  for (const Segment* s : outs) {
    const int64_t m = s->all_logits ? s->n : 1;
    std::copy(logits.begin() + r * V, logits.begin() + (r + m) * V, s->logits);
    r += m;
  }
}

// Gated DeltaNet (§2.2): projections, causal depthwise conv + SiLU, per-head delta rule, gated norm, out_proj.
void CpuBatchForward::gdn(int layer, const float* x, const Pass& p, float* out) {
  const GdnWeights& w = model_.weights.layers[layer].gdn;
  const int n = p.rows;
  const int64_t H = cfg_.hidden, C = cfg_.conv_dim(), kd = cfg_.key_dim(), vd = cfg_.value_dim();
  const int Kc = cfg_.conv_kernel, Hv = cfg_.lin_v_heads, Dk = cfg_.lin_k_dim, Dv = cfg_.lin_v_dim;
  const int v_per_k = cfg_.lin_v_heads / cfg_.lin_k_heads;
  std::vector<float> qkv(n * C), z(n * vd), b(n * Hv), a(n * Hv);  // [n][...] projections
  std::vector<float> u(n * C), y(n * vd);                            // [n][C] conv output, [n][vd] normed heads
  mark("gemm_gdn_in", n * flops_.gdn_in);
  matmul_rows(w.in_proj_qkv, x, n, H, qkv.data(), C, *pool_);
  matmul_rows(w.in_proj_z, x, n, H, z.data(), vd, *pool_);
  matmul_rows(w.in_proj_b, x, n, H, b.data(), Hv, *pool_);
  matmul_rows(w.in_proj_a, x, n, H, a.data(), Hv, *pool_);

  mark("gdn_core", n * flops_.gdn_core);
  // Causal conv per segment: tap j multiplies the input Kc-1-j steps back; inputs before the segment come from
  // its sequence's conv state.
  pool_->parallel_for(
      0, C,
      [&](int64_t c0, int64_t c1) {
        for (const Segment& s : p.segs) {
          const float* conv = s.st->layers[layer].conv.data();
          for (int64_t c = c0; c < c1; ++c)
            for (int t = 0; t < s.n; ++t) {
              float acc = 0;
              for (int j = 0; j < Kc; ++j) {
                const int src = t - (Kc - 1) + j;
                const float in = src >= 0 ? qkv[(s.row0 + src) * C + c] : conv[(Kc - 1 + src) * C + c];
                acc += w.conv1d[c * Kc + j] * in;
              }
              u[(s.row0 + t) * C + c] = silu(acc);
            }
        }
      },
      256);
  // New conv state: the last Kc-1 raw rows of [old state; the segment's qkv].
  std::vector<float> window;
  for (const Segment& s : p.segs) {
    std::vector<float>& conv = s.st->layers[layer].conv;
    window.resize((Kc - 1 + s.n) * C);
    std::copy(conv.begin(), conv.end(), window.begin());
    std::copy(qkv.begin() + s.row0 * C, qkv.begin() + (s.row0 + s.n) * C, window.begin() + (Kc - 1) * C);
    std::copy(window.end() - (Kc - 1) * C, window.end(), conv.begin());
  }

  // The delta rule per (segment, value head), each over its tokens in order.
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(Dk));
  const int64_t n_segs = static_cast<int64_t>(p.segs.size());
  pool_->parallel_for(0, n_segs * Hv, [&](int64_t i0, int64_t i1) {
    std::vector<float> qn(Dk), kn(Dk), o(Dv);
    for (int64_t i = i0; i < i1; ++i) {
      const Segment& s = p.segs[i / Hv];
      const int64_t h = i % Hv;
      const int64_t kh = h / v_per_k;  // value head h reads key head h / (Hv/Hk)
      float* S = s.st->layers[layer].S.data() + h * Dk * Dv;
      for (int64_t t = s.row0; t < s.row0 + s.n; ++t) {
        const float* ut = u.data() + t * C;
        std::copy(ut + kh * Dk, ut + (kh + 1) * Dk, qn.begin());
        std::copy(ut + kd + kh * Dk, ut + kd + (kh + 1) * Dk, kn.begin());
        l2_normalize(qn.data(), Dk, 1e-6f);
        l2_normalize(kn.data(), Dk, 1e-6f);
        for (float& q : qn) q *= q_scale;
        const float beta = sigmoid_f32(b[t * Hv + h]);
        const float g = -std::exp(w.A_log[h]) * softplus_f32(a[t * Hv + h] + w.dt_bias[h]);
        delta_rule_step(S, kn.data(), ut + 2 * kd + h * Dv, qn.data(), std::exp(g), beta, Dk, Dv, o.data());
        rms_norm_gated(o.data(), z.data() + t * vd + h * Dv, w.norm.data(), Dv, cfg_.eps, y.data() + t * vd + h * Dv);
      }
    }
  });
  mark("gemm_gdn_out", n * flops_.gdn_out);
  matmul_rows(w.out_proj, y.data(), n, vd, out, H, *pool_);
}

// Gated full attention (§2.3): per-head [query | gate] split, q/k norms, partial RoPE, causal softmax over
// each sequence's KV cache, sigmoid output gate, o_proj.
void CpuBatchForward::attention(int layer, const float* x, const Pass& p, float* out) {
  const AttnWeights& w = model_.weights.layers[layer].attn;
  const int n = p.rows;
  const int64_t H = cfg_.hidden, Hq = cfg_.n_heads, d = cfg_.head_dim;
  const int64_t kvw = cfg_.n_kv_heads * d, group = cfg_.n_heads / cfg_.n_kv_heads;
  std::vector<float> qg(n * Hq * 2 * d), k(n * kvw), v(n * kvw);  // projections
  std::vector<float> q(n * Hq * d), att(n * Hq * d);                // [n][Hq][d] rotated queries, gated output
  mark("gemm_attn_in", n * flops_.attn_in);
  matmul_rows(w.q_proj, x, n, H, qg.data(), Hq * 2 * d, *pool_);
  matmul_rows(w.k_proj, x, n, H, k.data(), kvw, *pool_);
  matmul_rows(w.v_proj, x, n, H, v.data(), kvw, *pool_);

  if (prof_) {
    double pairs = 0;
    for (const Segment& s : p.segs) pairs += FamilyFlops::causal_pairs(s.n, s.pos0);
    mark("attn_core", pairs * flops_.attn_pair);
  }
  int64_t max_ctx = 0;
  for (const Segment& s : p.segs) {
    CpuLayerState& st = s.st->layers[layer];
    st.k.resize((s.pos0 + s.n) * kvw);
    st.v.resize((s.pos0 + s.n) * kvw);
    max_ctx = std::max<int64_t>(max_ctx, s.pos0 + s.n);
    for (int64_t t = s.row0; t < s.row0 + s.n; ++t) {
      const int64_t pos = s.pos0 + (t - s.row0);
      for (int64_t h = 0; h < Hq; ++h) {
        float* qh = q.data() + (t * Hq + h) * d;
        rms_norm(qg.data() + (t * Hq + h) * 2 * d, w.q_norm.data(), d, cfg_.eps, qh);
        rope_neox(qh, cfg_.rope_dim, pos, cfg_.rope_theta);
      }
      for (int64_t g = 0; g < cfg_.n_kv_heads; ++g) {
        float* kc = st.k.data() + pos * kvw + g * d;
        rms_norm(k.data() + t * kvw + g * d, w.k_norm.data(), d, cfg_.eps, kc);
        rope_neox(kc, cfg_.rope_dim, pos, cfg_.rope_theta);
      }
      std::copy(v.begin() + t * kvw, v.begin() + (t + 1) * kvw, st.v.begin() + pos * kvw);
    }
  }

  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  pool_->parallel_for(0, n * Hq, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(max_ctx);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / Hq, h = i % Hq, g = h / group;
      const Segment& s = p.segs[p.seg_of_row[t]];
      const CpuLayerState& st = s.st->layers[layer];
      float* o = att.data() + i * d;
      attend_head(q.data() + i * d, st.k.data() + g * d, st.v.data() + g * d, s.pos0 + (t - s.row0) + 1, kvw,
                  static_cast<int>(d), scale, scores.data(), o);
      const float* gate = qg.data() + (t * Hq + h) * 2 * d + d;
      for (int64_t j = 0; j < d; ++j) o[j] *= sigmoid_f32(gate[j]);
    }
  });
  mark("gemm_attn_out", n * flops_.attn_out);
  matmul_rows(w.o_proj, att.data(), n, Hq * d, out, H, *pool_);
}
// Sparse MoE (§2.4): softmax router over all experts, top-k renormalised, SwiGLU experts (tokens grouped by
// expert so each expert's weights are read once per pass), plus the sigmoid-gated shared expert.
void CpuBatchForward::moe(int layer, const float* x, int n, float* out) {
  const MoeWeights& w = model_.weights.layers[layer].moe;
  const int64_t H = cfg_.hidden, E = cfg_.n_experts, K = cfg_.top_k, F = cfg_.moe_ffn, Fs = cfg_.shared_ffn;
  std::vector<float> router(n * E);            // [n][E]
  std::vector<int> idx(n * K);                 // [n][K]
  std::vector<float> wt(n * K);                // [n][K]
  std::vector<float> sgate(n);                 // [n] shared expert gate logit
  mark("gemm_router", n * flops_.router);
  matmul_rows(w.gate, x, n, H, router.data(), E, *pool_);
  matmul_rows(w.shared_expert_gate, x, n, H, sgate.data(), 1, *pool_);
  mark("routing");
  for (int t = 0; t < n; ++t) route_top_k(router.data() + t * E, E, K, idx.data() + t * K, wt.data() + t * K);

  // Tokens per expert, visited in expert order, so each token's sum runs in ascending expert index.
  std::vector<std::vector<std::pair<int, float>>> by_expert(E);
  for (int t = 0; t < n; ++t)
    for (int64_t j = 0; j < K; ++j) by_expert[idx[t * K + j]].push_back({t, wt[t * K + j]});
  std::fill(out, out + n * H, 0.0f);
  std::vector<float> xe, ge, ue, de;
  for (int64_t e = 0; e < E; ++e) {
    const auto& toks = by_expert[e];
    const int64_t m = static_cast<int64_t>(toks.size());
    if (m == 0) continue;
    xe.resize(m * H);
    ge.resize(m * F);
    ue.resize(m * F);
    de.resize(m * H);
    mark("gemm_experts_gate_up", m * flops_.expert_gate_up);
    for (int64_t s = 0; s < m; ++s) std::copy(x + toks[s].first * H, x + (toks[s].first + 1) * H, xe.begin() + s * H);
    matmul_rows(w.experts_gate[e], xe.data(), m, H, ge.data(), F, *pool_);
    matmul_rows(w.experts_up[e], xe.data(), m, H, ue.data(), F, *pool_);
    for (int64_t i = 0; i < m * F; ++i) ge[i] = silu(ge[i]) * ue[i];
    mark("gemm_experts_down", m * flops_.expert_down);
    matmul_rows(w.experts_down[e], ge.data(), m, F, de.data(), H, *pool_);
    for (int64_t s = 0; s < m; ++s) {
      float* o = out + toks[s].first * H;
      const float ws = toks[s].second;
      for (int64_t i = 0; i < H; ++i) o[i] += ws * de[s * H + i];
    }
  }

  std::vector<float> sg(n * Fs), su(n * Fs), sd(n * H);
  mark("gemm_shared", n * (flops_.shared_gate_up + flops_.shared_down));
  matmul_rows(w.shared_gate, x, n, H, sg.data(), Fs, *pool_);
  matmul_rows(w.shared_up, x, n, H, su.data(), Fs, *pool_);
  for (int64_t i = 0; i < n * Fs; ++i) sg[i] = silu(sg[i]) * su[i];
  matmul_rows(w.shared_down, sg.data(), n, Fs, sd.data(), H, *pool_);
  mark("combine");
  for (int t = 0; t < n; ++t) {
    const float s = sigmoid_f32(sgate[t]);
    for (int64_t i = 0; i < H; ++i) out[t * H + i] += s * sd[t * H + i];
  }
}

// Snapshot layout: for each GDN layer in order, conv [Kc-1][conv_dim] then S [Hv][Dk][Dv], all fp32.
std::vector<uint8_t> CpuBatchForward::save_state(const CpuSequenceState& s) const {
  std::vector<uint8_t> bytes;
  for (int i = 0; i < cfg_.n_layers; ++i) {
    if (cfg_.is_attention(i)) continue;
    for (const auto* vec : {&s.layers[i].conv, &s.layers[i].S}) {
      const auto* p = reinterpret_cast<const uint8_t*>(vec->data());
      bytes.insert(bytes.end(), p, p + vec->size() * sizeof(float));
    }
  }
  return bytes;
}

void CpuBatchForward::restore_state(CpuSequenceState& s, int position, std::span<const uint8_t> bytes) const {
  size_t expected = 0;
  for (int i = 0; i < cfg_.n_layers; ++i)
    if (!cfg_.is_attention(i)) expected += (s.layers[i].conv.size() + s.layers[i].S.size()) * sizeof(float);
  LILY_CHECK(bytes.size() == expected, "cpu backend: state snapshot has ", bytes.size(), " bytes, expected ",
             expected);
  LILY_CHECK(position >= 0 && position <= s.position, "cpu backend: snapshot position ", position,
             " is beyond the cached ", s.position, " tokens");
  const int64_t kvw = static_cast<int64_t>(cfg_.n_kv_heads) * cfg_.head_dim;
  size_t off = 0;
  for (int i = 0; i < cfg_.n_layers; ++i) {
    CpuLayerState& st = s.layers[i];
    if (cfg_.is_attention(i)) {
      st.k.resize(position * kvw);
      st.v.resize(position * kvw);
      continue;
    }
    for (auto* vec : {&st.conv, &st.S}) {
      std::memcpy(vec->data(), bytes.data() + off, vec->size() * sizeof(float));
      off += vec->size() * sizeof(float);
    }
  }
  s.position = position;
}

void CpuBatchForward::copy_prefix(CpuSequenceState& dst, const CpuSequenceState& src, int n) const {
  LILY_CHECK(n >= 0 && n <= src.position, "cpu backend: prefix of ", n, " tokens, the source holds ",
             src.position);
  const int64_t kvw = static_cast<int64_t>(cfg_.n_kv_heads) * cfg_.head_dim;
  if (dst.layers.size() != src.layers.size()) dst = new_state();
  for (int i = 0; i < cfg_.n_layers; ++i) {
    if (!cfg_.is_attention(i)) continue;
    CpuLayerState& d = dst.layers[i];
    const CpuLayerState& s = src.layers[i];
    if (&d == &s) {  // the same sequence: a truncation
      d.k.resize(n * kvw);
      d.v.resize(n * kvw);
      continue;
    }
    d.k.assign(s.k.begin(), s.k.begin() + n * kvw);
    d.v.assign(s.v.begin(), s.v.begin() + n * kvw);
  }
  dst.position = n;
}

CpuForward::CpuForward(const Model& model, int max_context, ThreadPool* pool)
    : f_(model, pool), state_(f_.new_state()) {
  max_context_ = max_context > 0 ? max_context : f_.config().max_position_embeddings;
  if (max_context_ <= 0) max_context_ = 1 << 18;
}

void CpuForward::forward(std::span<const int32_t> tokens, float* logits, bool all_logits) {
  const int64_t n_total = static_cast<int64_t>(tokens.size());
  if (n_total == 0) return;
  LILY_CHECK(state_.position + n_total <= max_context_, "cpu backend: ", state_.position, " + ", n_total,
             " tokens exceed the context limit of ", max_context_);
  const CpuGroup g{&state_, tokens, logits, all_logits};
  f_.forward(std::span<const CpuGroup>(&g, 1));
}

}  // namespace lily
