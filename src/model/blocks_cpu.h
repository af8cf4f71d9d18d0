// The per-token math blocks of the Qwen3.5/3.6 MoE forward pass (docs/model.md §2), in fp32 on raw
// pointers, so each can be unit-tested alone. The CPU backend (forward_cpu.cpp) strings them together.
#pragma once
#include <cmath>
#include <cstdint>

namespace lily {

// Dot product with eight partial sums in a fixed order (independent of the call site).
float dot_f32(const float* a, const float* b, int64_t n);

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }  // x * sigmoid(x)
float sigmoid_f32(float x);
float softplus_f32(float x);  // log(1 + e^x), = x above 20 (as PyTorch)

// RMSNorm with an effective multiplier w: y = x * rsqrt(mean(x^2) + eps) * w. For RMSNorm1p pass w = 1 + w_hf
// (Weights already stores it that way). x, y, w [n]; y may alias x.
void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y);

// The Gated DeltaNet output norm: y = w * (o * rsqrt(mean(o^2) + eps)) * silu(z), plain weight. o, z, w, y [n].
void rms_norm_gated(const float* o, const float* z, const float* w, int64_t n, float eps, float* y);

// x *= rsqrt(sum(x^2) + eps), in place; x [n].
void l2_normalize(float* x, int64_t n, float eps);

// Partial NeoX ("rotate half") RoPE in place on one head x [head_dim]: pairs (i, i + rope_dim/2) for
// i < rope_dim/2 rotate by pos * theta^(-2i/rope_dim) (computed in fp32 as HF does); dims >= rope_dim untouched.
void rope_neox(float* x, int rope_dim, int64_t pos, double theta);

// One Gated DeltaNet step on one value head's state S [dk][dv] (fp32, updated in place), in the fixed
// order decay -> read -> write -> output:
//   S *= decay;  mem = S^T k;  S += k (x) beta (v - mem);  out = S^T q.
// k, q [dk] (already l2-normalised, q scaled); v, out [dv].
void delta_rule_step(float* S, const float* k, const float* v, const float* q, float decay, float beta, int dk,
                     int dv, float* out);

// MoE routing: softmax over all n_experts logits (fp32), the top_k largest probabilities (ties: lower expert
// index first; output in descending order), renormalised to sum 1. idx, weight [top_k].
void route_top_k(const float* logits, int n_experts, int top_k, int* idx, float* weight);

// Causal softmax attention of one query head over n_ctx cached positions: out = sum_j p_j V_j with
// p = softmax(scale * q . K_j). K_j = k + j * stride, V_j = v + j * stride; q, out [d]; scratch [n_ctx].
void attend_head(const float* q, const float* k, const float* v, int64_t n_ctx, int64_t stride, int d, float scale,
                 float* scratch, float* out);

}  // namespace lily
