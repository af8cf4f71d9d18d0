// The linear-attention mixer of a decoder layer in one persistent launch (kernels/gdn_fused.cu):
// h += out_proj(gated_rmsnorm(gdn_step(in_proj(RMSNorm(h) * input_norm)))).
#pragma once
#include <cuda_runtime_api.h>

#include "kernels/mixers.h"
#include "kernels/qmat.h"
#include "kernels/trace.h"

namespace lily::cuda {

struct GdnMixerDev {            // linear_attn.* on the device (field names as the CPU's GdnWeights)
  QMat in_proj_qkv;             // [conv_dim, H]
  QMat in_proj_z;               // [Hv*Dv, H]
  QMat in_proj_b, in_proj_a;    // [Hv, H] each
  QMat out_proj;                // [H, Hv*Dv]
  const float* conv1d = nullptr;   // [conv_dim][4]
  const float* A_log = nullptr;    // [Hv]
  const float* dt_bias = nullptr;  // [Hv]
  const float* norm = nullptr;     // [Dv] gated RMSNorm weight (plain)
};

// True for the real model's shapes (every projection q4, H = 2048, Hk 16, Hv 32, Dk = Dv = 128) on a GPU with
// enough SMs (>= 129) for the one-launch kernel.
bool gdn_mixer_fused_supported(const GdnMixerDev& m, GdnDims d);
size_t gdn_mixer_scratch_floats();  // floats of `scratch` below

// One launch; h [H] is read (norm) and updated (residual). proj: [conv_dim + Hv*Dv + 2*Hv] projection scratch;
// scratch: gdn_mixer_scratch_floats(); barrier: [kGridBarrierWords], zeroed once, shared by sequential launches;
// conv_ring / state as launch_gdn_step; pos on the device; x_out (may be null) receives RMSNorm(h) * input_norm.
// next_router (may be null, or its acc null): the launch also adds the next MoE block's router sums from the
// h it writes (qmat.h moe_router_sums; that moe_block is then told so). trace: phase stamps (benchmarks), or null.
void launch_gdn_mixer_fused(const GdnMixerDev& m, GdnDims d, float* h, const float* input_norm, float eps,
                            float* x_out, float* proj, float* scratch, unsigned* barrier, float* conv_ring,
                            float* state, const int* pos, cudaStream_t stream,
                            const RouterSums* next_router = nullptr, StepTrace* trace = nullptr);

}  // namespace lily::cuda
