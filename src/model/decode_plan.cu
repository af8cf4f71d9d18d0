// make_decode_plan: the per-layer launch plan of the decode step (model/decode_plan.h).
#include "model/decode_plan.h"

#include <algorithm>
#include <sstream>

#include "kernels/gdn_fused.h"
#include "kernels/mixers.h"
#include "kernels/qmat.h"
#include "model/cuda_engine.h"

namespace lily::cuda {

DecodePlan make_decode_plan(const Config& c, const DeviceWeights& w, const MoeScratch& moe, const KernelOptions& o,
                            int sms, bool fused) {
  DecodePlan p;
  p.options = o;
  p.attn_splits = std::clamp(o.attn_splits > 0 ? o.attn_splits : sms / std::max(c.n_kv_heads, 1), 1, kAttnMaxSplits);
  const GdnDims dims{c.lin_k_heads, c.lin_v_heads, c.lin_k_dim, c.lin_v_dim};
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerDev& l = w.layers[i];
    LayerPlan lp;
    lp.moe = fused && o.moe_fused && moe_block_is_fused(l.moe, moe) ? MoePath::fused : MoePath::split;
    if (c.is_attention(i)) {
      lp.mixer = MixerPath::attention;
      const AttnDev& a = l.attn;
      lp.qkv_one_launch = a.q_proj.format == a.k_proj.format && a.k_proj.format == a.v_proj.format && a.q_proj.cols == a.k_proj.cols &&
                          a.k_proj.cols == a.v_proj.cols;
      ResidualProj o_proj;
      o_proj.W = a.o_proj;
      lp.moe_runs_o_proj = lp.moe == MoePath::fused && moe_block_is_fused(l.moe, moe, &o_proj);
    } else {
      lp.mixer = fused && o.gdn_fused && gdn_mixer_fused_supported(l.gdn, dims) ? MixerPath::gdn_fused
                                                                                : MixerPath::gdn_split;
      lp.gdn_adds_router_sums = lp.mixer == MixerPath::gdn_fused && lp.moe == MoePath::fused;
    }
    p.layers.push_back(lp);
  }
  return p;
}

namespace {
std::string layer_line(const LayerPlan& l) {
  std::string s;
  switch (l.mixer) {
    case MixerPath::gdn_fused: s = "gdn fused"; break;
    case MixerPath::gdn_split: s = "gdn split (3 launches)"; break;
    case MixerPath::attention:
      s = l.qkv_one_launch ? "attention (q|k|v one launch, split, combine)" : "attention (q, k, v, split, combine)";
      break;
  }
  s += l.moe == MoePath::fused ? " -> moe fused" : " -> moe split (3 launches)";
  if (l.gdn_adds_router_sums) s += "; the gdn launch adds the router sums";
  if (l.mixer == MixerPath::attention) s += l.moe_runs_o_proj ? "; o_proj in the moe launch" : "; o_proj own launch";
  return s;
}
}  // namespace

std::string describe(const DecodePlan& p) {
  std::ostringstream out;
  out << "decode plan: attention splits per KV head " << p.attn_splits << "\n";
  // runs of identical layer lines, grouped by line (e.g. every GDN layer, every attention layer)
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int i = 0; i < (int)p.layers.size(); ++i) {
    const std::string line = layer_line(p.layers[i]);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == line; });
    if (it == groups.end()) groups.push_back({line, {i}});
    else it->second.push_back(i);
  }
  for (const auto& [line, idx] : groups) {
    out << "  " << idx.size() << " layer" << (idx.size() == 1 ? "" : "s") << " (";
    for (size_t j = 0; j < idx.size(); ++j) out << (j ? "," : "") << idx[j];
    out << "): " << line << "\n";
  }
  return out.str();
}

}  // namespace lily::cuda
