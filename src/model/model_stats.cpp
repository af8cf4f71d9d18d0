// Parameter counts and per-token decode bytes; see model_stats.h.
#include "model/model_stats.h"

namespace lily {

namespace {

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

}  // namespace

ParamCounts count_parameters(const Config& c) {
  ParamCounts p;
  const int64_t H = c.hidden;
  p.gdn_mixer = static_cast<int64_t>(c.conv_dim()) * H + static_cast<int64_t>(c.value_dim()) * H +
                2 * static_cast<int64_t>(c.lin_v_heads) * H + H * static_cast<int64_t>(c.value_dim()) +
                static_cast<int64_t>(c.conv_dim()) * c.conv_kernel + 2 * c.lin_v_heads + c.lin_v_dim;
  p.attn_mixer = static_cast<int64_t>(c.q_proj_rows()) * H + 2 * static_cast<int64_t>(c.n_kv_heads) * c.head_dim * H +
                 H * static_cast<int64_t>(c.n_heads) * c.head_dim + 2 * c.head_dim;
  p.expert = 3 * static_cast<int64_t>(c.moe_ffn) * H;
  const int64_t router = static_cast<int64_t>(c.n_experts) * H, shared = 3 * static_cast<int64_t>(c.shared_ffn) * H;
  p.moe_block = c.n_experts * p.expert + router + shared + H;
  p.embed = static_cast<int64_t>(c.vocab) * H;
  const int64_t n_attn = c.n_attention_layers(), n_gdn = c.n_layers - n_attn;
  const int64_t mixers = n_gdn * p.gdn_mixer + n_attn * p.attn_mixer;
  const int64_t head = c.tie_word_embeddings ? 0 : p.embed;
  p.text_total = mixers + c.n_layers * (p.moe_block + 2 * H) + p.embed + head + H;
  p.active = mixers + c.n_layers * (router + c.top_k * p.expert + shared + H + 2 * H) + p.embed + H;
  return p;
}

DecodeBytes decode_bytes(const Model& m, const TensorStore& store) {
  const Config& c = m.config;
  const Weights& w = m.weights;
  DecodeBytes b;
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerWeights& l = w.layers[i];
    if (c.is_attention(i)) {
      b.attn += l.attn.q_proj.bytes() + l.attn.k_proj.bytes() + l.attn.v_proj.bytes() + l.attn.o_proj.bytes();
    } else {
      b.gdn += l.gdn.in_proj_qkv.bytes() + l.gdn.in_proj_z.bytes() + l.gdn.in_proj_a.bytes() +
               l.gdn.in_proj_b.bytes() + l.gdn.out_proj.bytes();
    }
    b.experts += static_cast<uint64_t>(c.top_k) *
                 (l.moe.experts_gate[0].bytes() + l.moe.experts_up[0].bytes() + l.moe.experts_down[0].bytes());
    b.shared += l.moe.shared_gate.bytes() + l.moe.shared_up.bytes() + l.moe.shared_down.bytes();
    b.routers += l.moe.gate.bytes() + l.moe.shared_expert_gate.bytes();
  }
  // Small vectors at their stored size.
  const std::string final_norm = w.layout == CheckpointLayout::hf_bf16 ? "model.language_model.norm.weight"
                                                                        : "language_model.model.norm.weight";
  for (const auto& name : store.names()) {
    if (name.rfind("mtp.", 0) == 0 || name.rfind("model.visual.", 0) == 0 || name.rfind("vision_tower.", 0) == 0)
      continue;
    uint64_t n = store.get(name).nbytes;
    if (name == final_norm || ends_with(name, "input_layernorm.weight") ||
        ends_with(name, "post_attention_layernorm.weight")) {
      b.norms += n;
    } else if (ends_with(name, "q_norm.weight") || ends_with(name, "k_norm.weight")) {
      b.attn += n;
    } else if (ends_with(name, "linear_attn.conv1d.weight") || ends_with(name, "linear_attn.A_log") ||
               ends_with(name, "linear_attn.dt_bias") || ends_with(name, "linear_attn.norm.weight")) {
      b.gdn += n;
    }
  }
  b.lm_head = w.lm_head.bytes();
  b.embed_row = w.embed_tokens.row_slice(0, 1).bytes();
  b.weights_total = b.gdn + b.experts + b.lm_head + b.attn + b.shared + b.routers + b.norms + b.embed_row;
  const uint64_t n_attn = c.n_attention_layers(), n_gdn = c.n_layers - n_attn;
  b.gdn_state = n_gdn * 2 * static_cast<uint64_t>(c.lin_v_heads) * c.lin_k_dim * c.lin_v_dim * 4;
  b.conv_state = n_gdn * 2 * static_cast<uint64_t>(c.conv_kernel - 1) * c.conv_dim() * 2;
  b.kv_per_token = n_attn * 2 * static_cast<uint64_t>(c.n_kv_heads) * c.head_dim * 2;
  return b;
}

}  // namespace lily
