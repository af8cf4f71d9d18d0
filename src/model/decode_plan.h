// The decode step as data: which path each layer's mixer and MoE block take and which launch carries work that
// crosses a block boundary, decided once at load from the shapes, the weights' formats, the kernel options and
// the GPU (make_decode_plan). CudaEngine::record_step only follows it. `lily bench` prints it.
#pragma once
#include <string>
#include <vector>

#include "kernels/options.h"
#include "model/config.h"

namespace lily::cuda {

struct DeviceWeights;
struct MoeScratch;

enum class MixerPath {
  gdn_fused,   // linear attention in one persistent launch (kernels/gdn_fused.cu): norm, in_proj, step, out_proj
  gdn_split,   // linear attention as in_proj (norm fused) + GDN step + out_proj (residual fused): three launches
  attention,   // full attention: q|k|v (norm fused), split + combine; o_proj per LayerPlan::moe_runs_o_proj
};
enum class MoePath {
  fused,       // the MoE block in one persistent launch (kernels/moe_fused.cu)
  split,       // router (norm fused) + gate/up + down (residual fused): three launches
};

struct LayerPlan {
  MixerPath mixer = MixerPath::gdn_split;
  MoePath moe = MoePath::split;
  // The fused GDN launch also adds this layer's MoE router sums from the h it writes (kernels/router_partial.cuh),
  // so the fused MoE launch skips its own small sums launch. Only with mixer gdn_fused and moe fused.
  bool gdn_adds_router_sums = false;
  // Attention layers: o_proj (h += o_proj(attention)) runs as phase 0 of the fused MoE launch (which then adds
  // the router sums itself); false: o_proj is its own GEMV launch before the MoE block.
  bool moe_runs_o_proj = false;
  // Attention layers: q, k, v share format and width and go in one GEMV launch; false: one launch each.
  bool qkv_one_launch = false;
};

struct DecodePlan {
  std::vector<LayerPlan> layers;  // [n_layers]
  int attn_splits = 0;            // decode attention split blocks per KV head
  KernelOptions options;          // the options the plan was made with
};

// fused = false: the split paths everywhere (tests), whatever the options say.
DecodePlan make_decode_plan(const Config& c, const DeviceWeights& w, const MoeScratch& moe, const KernelOptions& o,
                            int sms, bool fused);
// One line per run of equal layers, e.g. "layers 0-2: gdn_fused + moe fused (gdn adds router sums)".
std::string describe(const DecodePlan& p);

}  // namespace lily::cuda
