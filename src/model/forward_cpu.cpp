// CpuForward: the fp32 reference forward pass (docs/model.md §2), one function per block.
// note: every matrix product goes through matmul_rows, whose per-row results do not depend on how many
// tokens are processed together, and every other step is per token in a fixed order, so chunked prefill
// and token-by-token decode give bit-identical logits.
#include "model/forward_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

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

CpuForward::CpuForward(const Model& model, int max_context, ThreadPool* pool)
    : model_(model), cfg_(model.config), own_pool_(pool) {
  check_weights(model);
  max_context_ = max_context > 0 ? max_context : cfg_.max_position_embeddings;
  if (max_context_ <= 0) max_context_ = 1 << 18;
  state_.resize(cfg_.n_layers);
  reset();
}

void CpuForward::reset() {
  pos_ = 0;
  for (int i = 0; i < cfg_.n_layers; ++i) {
    LayerState& st = state_[i];
    st.k.clear();
    st.v.clear();
    if (!cfg_.is_attention(i)) {
      st.conv.assign(static_cast<size_t>(cfg_.conv_kernel - 1) * cfg_.conv_dim(), 0.0f);
      st.S.assign(static_cast<size_t>(cfg_.lin_v_heads) * cfg_.lin_k_dim * cfg_.lin_v_dim, 0.0f);
    }
  }
}

void CpuForward::forward(std::span<const int32_t> tokens, float* logits, bool all_logits) {
  const int64_t n_total = static_cast<int64_t>(tokens.size());
  if (n_total == 0) return;
  LILY_CHECK(pos_ + n_total <= max_context_, "cpu backend: ", pos_, " + ", n_total,
             " tokens exceed the context limit of ", max_context_);
  pool_ = own_pool_ ? own_pool_ : &ThreadPool::global();
  for (int32_t t : tokens)  // validate before any state changes
    LILY_CHECK(t >= 0 && t < cfg_.vocab, "token id ", t, " outside [0, ", cfg_.vocab, ")");
  for (int64_t off = 0; off < n_total; off += kPromptChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kPromptChunk, n_total - off));
    const bool last = off + n == n_total;
    float* out = nullptr;
    if (logits && all_logits) out = logits + off * cfg_.vocab;
    else if (logits && last) out = logits;
    forward_chunk(tokens.data() + off, n, out, all_logits);
  }
}

// h = embed; per layer: norm -> mixer -> residual -> norm -> MoE -> residual; final norm -> lm_head.
void CpuForward::forward_chunk(const int32_t* tokens, int n, float* logits, bool all_logits) {
  const int64_t H = cfg_.hidden;
  std::vector<float> x(n * H), r(n * H), mix(n * H);  // [n][H] residual stream, normed input, block output
  embed(tokens, n, x.data());
  for (int i = 0; i < cfg_.n_layers; ++i) {
    const LayerWeights& lw = model_.weights.layers[i];
    norm_rows(x.data(), lw.input_layernorm, n, r.data());
    if (cfg_.is_attention(i)) attention(i, r.data(), n, mix.data());
    else gdn(i, r.data(), n, mix.data());
    add_into(x.data(), mix.data(), n * H);
    norm_rows(x.data(), lw.post_attention_layernorm, n, r.data());
    moe(i, r.data(), n, mix.data());
    add_into(x.data(), mix.data(), n * H);
  }
  pos_ += n;
  if (!logits) return;
  if (all_logits) head(x.data(), n, logits);
  else head(x.data() + (n - 1) * H, 1, logits);
}

void CpuForward::embed(const int32_t* tokens, int n, float* x) {
  for (int t = 0; t < n; ++t)
    gather_row(model_.weights.embed_tokens, tokens[t], x + static_cast<int64_t>(t) * cfg_.hidden);
}

void CpuForward::norm_rows(const float* x, const std::vector<float>& w, int n, float* y) {
  const int64_t H = cfg_.hidden;
  for (int t = 0; t < n; ++t) rms_norm(x + t * H, w.data(), H, cfg_.eps, y + t * H);
}

void CpuForward::head(const float* x, int n, float* logits) {
  const int64_t H = cfg_.hidden;
  std::vector<float> xn(n * H);
  norm_rows(x, model_.weights.norm, n, xn.data());
  matmul_rows(model_.weights.lm_head, xn.data(), n, H, logits, cfg_.vocab, *pool_);
}

// Gated DeltaNet (§2.2): projections, causal depthwise conv + SiLU, per-head delta rule, gated norm, out_proj.
void CpuForward::gdn(int layer, const float* x, int n, float* out) {
  const GdnWeights& w = model_.weights.layers[layer].gdn;
  LayerState& st = state_[layer];
  const int64_t H = cfg_.hidden, C = cfg_.conv_dim(), kd = cfg_.key_dim(), vd = cfg_.value_dim();
  const int Kc = cfg_.conv_kernel, Hv = cfg_.lin_v_heads, Dk = cfg_.lin_k_dim, Dv = cfg_.lin_v_dim;
  const int v_per_k = cfg_.lin_v_heads / cfg_.lin_k_heads;
  std::vector<float> qkv(n * C), z(n * vd), b(n * Hv), a(n * Hv);  // [n][...] projections
  std::vector<float> u(n * C), y(n * vd);                            // [n][C] conv output, [n][vd] normed heads
  matmul_rows(w.in_proj_qkv, x, n, H, qkv.data(), C, *pool_);
  matmul_rows(w.in_proj_z, x, n, H, z.data(), vd, *pool_);
  matmul_rows(w.in_proj_b, x, n, H, b.data(), Hv, *pool_);
  matmul_rows(w.in_proj_a, x, n, H, a.data(), Hv, *pool_);

  // Causal conv: tap j multiplies the input Kc-1-j steps back; inputs before this chunk come from the state.
  pool_->parallel_for(
      0, C,
      [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c)
          for (int t = 0; t < n; ++t) {
            float acc = 0;
            for (int j = 0; j < Kc; ++j) {
              const int src = t - (Kc - 1) + j;
              const float in = src >= 0 ? qkv[src * C + c] : st.conv[(Kc - 1 + src) * C + c];
              acc += w.conv1d[c * Kc + j] * in;
            }
            u[t * C + c] = silu(acc);
          }
      },
      256);
  // New conv state: the last Kc-1 raw rows of [old state; this chunk's qkv].
  std::vector<float> window((Kc - 1 + n) * C);
  std::copy(st.conv.begin(), st.conv.end(), window.begin());
  std::copy(qkv.begin(), qkv.end(), window.begin() + (Kc - 1) * C);
  std::copy(window.end() - (Kc - 1) * C, window.end(), st.conv.begin());

  const float q_scale = 1.0f / std::sqrt(static_cast<float>(Dk));
  pool_->parallel_for(0, Hv, [&](int64_t h0, int64_t h1) {
    std::vector<float> qn(Dk), kn(Dk), o(Dv);
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = h / v_per_k;  // value head h reads key head h / (Hv/Hk)
      float* S = st.S.data() + h * Dk * Dv;
      for (int t = 0; t < n; ++t) {
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
  matmul_rows(w.out_proj, y.data(), n, vd, out, H, *pool_);
}

// Gated full attention (§2.3): per-head [query | gate] split, q/k norms, partial RoPE, causal softmax over
// the KV cache, sigmoid output gate, o_proj.
void CpuForward::attention(int layer, const float* x, int n, float* out) {
  const AttnWeights& w = model_.weights.layers[layer].attn;
  LayerState& st = state_[layer];
  const int64_t H = cfg_.hidden, Hq = cfg_.n_heads, d = cfg_.head_dim;
  const int64_t kvw = cfg_.n_kv_heads * d, group = cfg_.n_heads / cfg_.n_kv_heads;
  std::vector<float> qg(n * Hq * 2 * d), k(n * kvw), v(n * kvw);  // projections
  std::vector<float> q(n * Hq * d), att(n * Hq * d);                // [n][Hq][d] rotated queries, gated output
  matmul_rows(w.q_proj, x, n, H, qg.data(), Hq * 2 * d, *pool_);
  matmul_rows(w.k_proj, x, n, H, k.data(), kvw, *pool_);
  matmul_rows(w.v_proj, x, n, H, v.data(), kvw, *pool_);

  st.k.resize((pos_ + n) * kvw);
  st.v.resize((pos_ + n) * kvw);
  for (int t = 0; t < n; ++t) {
    const int64_t pos = pos_ + t;
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

  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  pool_->parallel_for(0, n * Hq, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(pos_ + n);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / Hq, h = i % Hq, g = h / group;
      float* o = att.data() + i * d;
      attend_head(q.data() + i * d, st.k.data() + g * d, st.v.data() + g * d, pos_ + t + 1, kvw, static_cast<int>(d),
                  scale, scores.data(), o);
      const float* gate = qg.data() + (t * Hq + h) * 2 * d + d;
      for (int64_t j = 0; j < d; ++j) o[j] *= sigmoid_f32(gate[j]);
    }
  });
  matmul_rows(w.o_proj, att.data(), n, Hq * d, out, H, *pool_);
}

// Sparse MoE (§2.4): softmax router over all experts, top-k renormalised, SwiGLU experts (tokens grouped by
// expert so each expert's weights are read once per chunk), plus the sigmoid-gated shared expert.
void CpuForward::moe(int layer, const float* x, int n, float* out) {
  const MoeWeights& w = model_.weights.layers[layer].moe;
  const int64_t H = cfg_.hidden, E = cfg_.n_experts, K = cfg_.top_k, F = cfg_.moe_ffn, Fs = cfg_.shared_ffn;
  std::vector<float> router(n * E);            // [n][E]
  std::vector<int> idx(n * K);                 // [n][K]
  std::vector<float> wt(n * K);                // [n][K]
  matmul_rows(w.gate, x, n, H, router.data(), E, *pool_);
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
    for (int64_t s = 0; s < m; ++s) std::copy(x + toks[s].first * H, x + (toks[s].first + 1) * H, xe.begin() + s * H);
    matmul_rows(w.experts_gate[e], xe.data(), m, H, ge.data(), F, *pool_);
    matmul_rows(w.experts_up[e], xe.data(), m, H, ue.data(), F, *pool_);
    for (int64_t i = 0; i < m * F; ++i) ge[i] = silu(ge[i]) * ue[i];
    matmul_rows(w.experts_down[e], ge.data(), m, F, de.data(), H, *pool_);
    for (int64_t s = 0; s < m; ++s) {
      float* o = out + toks[s].first * H;
      const float ws = toks[s].second;
      for (int64_t i = 0; i < H; ++i) o[i] += ws * de[s * H + i];
    }
  }

  std::vector<float> sg(n * Fs), su(n * Fs), sd(n * H), sgate(n);
  matmul_rows(w.shared_gate, x, n, H, sg.data(), Fs, *pool_);
  matmul_rows(w.shared_up, x, n, H, su.data(), Fs, *pool_);
  for (int64_t i = 0; i < n * Fs; ++i) sg[i] = silu(sg[i]) * su[i];
  matmul_rows(w.shared_down, sg.data(), n, Fs, sd.data(), H, *pool_);
  matmul_rows(w.shared_expert_gate, x, n, H, sgate.data(), 1, *pool_);
  for (int t = 0; t < n; ++t) {
    const float s = sigmoid_f32(sgate[t]);
    for (int64_t i = 0; i < H; ++i) out[t * H + i] += s * sd[t * H + i];
  }
}

// Snapshot layout: for each GDN layer in order, conv [Kc-1][conv_dim] then S [Hv][Dk][Dv], all fp32.
std::vector<uint8_t> CpuForward::save_state() const {
  std::vector<uint8_t> bytes;
  for (int i = 0; i < cfg_.n_layers; ++i) {
    if (cfg_.is_attention(i)) continue;
    for (const auto* vec : {&state_[i].conv, &state_[i].S}) {
      const auto* p = reinterpret_cast<const uint8_t*>(vec->data());
      bytes.insert(bytes.end(), p, p + vec->size() * sizeof(float));
    }
  }
  return bytes;
}

void CpuForward::restore_state(int position, std::span<const uint8_t> bytes) {
  size_t expected = 0;
  for (int i = 0; i < cfg_.n_layers; ++i)
    if (!cfg_.is_attention(i)) expected += (state_[i].conv.size() + state_[i].S.size()) * sizeof(float);
  LILY_CHECK(bytes.size() == expected, "cpu backend: state snapshot has ", bytes.size(), " bytes, expected ",
             expected);
  LILY_CHECK(position >= 0 && position <= pos_, "cpu backend: snapshot position ", position,
             " is beyond the cached ", pos_, " tokens");
  const int64_t kvw = static_cast<int64_t>(cfg_.n_kv_heads) * cfg_.head_dim;
  size_t off = 0;
  for (int i = 0; i < cfg_.n_layers; ++i) {
    LayerState& st = state_[i];
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
  pos_ = position;
}

}  // namespace lily
