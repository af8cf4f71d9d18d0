// The attention's q/k RMSNorm + partial rotate-half RoPE (docs/model.md §2.3) for a head held by one warp, as the
// decode attention's split kernel (attention.cu) computes it for its KV head's queries and the current key.
#pragma once
#include "kernels/mixers.h"

namespace lily::cuda::qk {

// A warp holds one head: lane l dims [l * EPL, l * EPL + EPL). LaneRope holds the lane's constants: the norm
// weights, requested before the K/V copies (constant data), and the angles' cosines and signed sines, computed
// while the copies are in flight (the position is known before the wait).
template <int EPL>
struct LaneRope {
  float wq[EPL], wk[EPL];  // q_norm, k_norm of the lane's dims
  float c[EPL], s[EPL];    // rotate-half: y_i = x_i c_i + x_partner s_i (dims past rope_dim: c = 1, s = 0)
  int src;                 // lane holding the partner dims i -+ rope_dim / 2
};
// key: this warp also normalises the key (k_norm's weights are loaded only then).
template <int EPL>
__device__ __forceinline__ void lane_rope_weights(const AttnIn& in, LaneRope<EPL>& r, bool key) {
  const int i0 = (threadIdx.x % 32) * EPL;
#pragma unroll
  for (int e = 0; e < EPL; ++e) r.wq[e] = __ldg(in.q_norm + i0 + e), r.wk[e] = key ? __ldg(in.k_norm + i0 + e) : 0.f;
}
template <int EPL>
__device__ __forceinline__ void lane_rope_angles(const AttnIn& in, int pos, LaneRope<EPL>& r) {
  const int lane = threadIdx.x % 32, i0 = lane * EPL, half = in.rope_dim / 2;
  r.src = i0 >= in.rope_dim ? lane : i0 < half ? lane + half / EPL : lane - half / EPL;
#pragma unroll
  for (int e = 0; e < EPL; ++e) {
    const int i = i0 + e;
    float sn = 0.f, cs = 1.f;
    if (i < in.rope_dim) {  // the fp32 angle; from 65536 rad on its sine and cosine in double
      const float ang = (float)pos * in.inv_freq[i % half];
      if (ang < 65536.f) {
        sincosf(ang, &sn, &cs);
      } else {  // sincosf's slow path is slow for large angles
        double sd, cd;
        sincos((double)ang, &sd, &cd);
        sn = (float)sd, cs = (float)cd;
      }
    }
    r.c[e] = cs;
    r.s[e] = i < half ? -sn : sn;
  }
}

// x: the lane's EPL dims of one head -> RoPE(RMSNorm(x; w)) (docs/model.md §2.3; the norm's sum over the warp). Every
// lane of the warp must call.
template <int EPL>
__device__ __forceinline__ void norm_rope_lane(float (&x)[EPL], const float (&w)[EPL], const LaneRope<EPL>& r,
                                               float eps) {
  constexpr int D = EPL * 32;
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < EPL; ++e) ss = fmaf(x[e], x[e], ss);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float rr = rsqrtf(ss / D + eps);
  float y[EPL], other[EPL];
#pragma unroll
  for (int e = 0; e < EPL; ++e) y[e] = x[e] * rr * w[e];
#pragma unroll
  for (int e = 0; e < EPL; ++e) other[e] = __shfl_sync(0xffffffffu, y[e], r.src);
#pragma unroll
  for (int e = 0; e < EPL; ++e) x[e] = y[e] * r.c[e] + other[e] * r.s[e];
}

// The lane's EPL raw values of a head (through L2: the previous launch wrote them).
template <int EPL>
__device__ __forceinline__ void load_lane(const float* src, float (&x)[EPL]) {
  if constexpr (EPL % 4 == 0) {
#pragma unroll
    for (int e = 0; e < EPL; e += 4) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(src + e));
      x[e] = v.x, x[e + 1] = v.y, x[e + 2] = v.z, x[e + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < EPL; ++e) x[e] = __ldcg(src + e);
  }
}

}  // namespace lily::cuda::qk
