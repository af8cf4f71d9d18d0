// fp32 reference implementations of the forward-pass blocks (see blocks_cpu.h and docs/model.md §2).
// note: sums of squares and softmax denominators accumulate in double; everything else is fp32.
#include "model/blocks_cpu.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace lily {

float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

float sigmoid_f32(float x) { return 1.0f / (1.0f + std::exp(-x)); }

float softplus_f32(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

namespace {
float inv_rms(const float* x, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
}
}  // namespace

void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y) {
  const float r = inv_rms(x, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

void rms_norm_gated(const float* o, const float* z, const float* w, int64_t n, float eps, float* y) {
  const float r = inv_rms(o, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (o[i] * r) * silu(z[i]);
}

void l2_normalize(float* x, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = static_cast<float>(1.0 / std::sqrt(ss + eps));
  for (int64_t i = 0; i < n; ++i) x[i] *= r;
}

void rope_neox(float* x, int rope_dim, int64_t pos, double theta) {
  const int half = rope_dim / 2;
  const float base = static_cast<float>(theta);
  for (int i = 0; i < half; ++i) {
    // As HF: inv_freq = 1 / base^(2i/dim) in fp32, angle = fp32(pos) * inv_freq rounded to fp32.
    const float inv_freq = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(rope_dim));
    const float ang = static_cast<float>(pos) * inv_freq;
    const float c = static_cast<float>(std::cos(static_cast<double>(ang)));
    const float s = static_cast<float>(std::sin(static_cast<double>(ang)));
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c - x2 * s;
    x[i + half] = x2 * c + x1 * s;
  }
}

void delta_rule_step(float* S, const float* k, const float* v, const float* q, float decay, float beta, int dk,
                     int dv, float* out) {
  std::vector<float> mem(dv, 0.0f);
  for (int i = 0; i < dk; ++i) {  // decay, then read mem = S^T k
    float* row = S + static_cast<int64_t>(i) * dv;
    const float ki = k[i];
    for (int j = 0; j < dv; ++j) {
      row[j] *= decay;
      mem[j] += row[j] * ki;
    }
  }
  for (int j = 0; j < dv; ++j) mem[j] = beta * (v[j] - mem[j]);  // mem now holds delta
  for (int j = 0; j < dv; ++j) out[j] = 0.0f;
  for (int i = 0; i < dk; ++i) {  // write S += k delta^T, then output out = S^T q
    float* row = S + static_cast<int64_t>(i) * dv;
    const float ki = k[i], qi = q[i];
    for (int j = 0; j < dv; ++j) {
      row[j] += ki * mem[j];
      out[j] += row[j] * qi;
    }
  }
}

void route_top_k(const float* logits, int n_experts, int top_k, int* idx, float* weight) {
  std::vector<float> p(n_experts);
  const float mx = *std::max_element(logits, logits + n_experts);
  double sum = 0;
  for (int e = 0; e < n_experts; ++e) {
    p[e] = std::exp(logits[e] - mx);
    sum += p[e];
  }
  for (int e = 0; e < n_experts; ++e) p[e] = static_cast<float>(p[e] / sum);
  std::vector<int> order(n_experts);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                    [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  double total = 0;
  for (int j = 0; j < top_k; ++j) total += p[order[j]];
  for (int j = 0; j < top_k; ++j) {
    idx[j] = order[j];
    weight[j] = static_cast<float>(p[order[j]] / total);
  }
}

void attend_head(const float* q, const float* k, const float* v, int64_t n_ctx, int64_t stride, int d, float scale,
                 float* scratch, float* out) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n_ctx; ++j) {
    scratch[j] = dot_f32(q, k + j * stride, d) * scale;
    mx = std::max(mx, scratch[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < n_ctx; ++j) {
    scratch[j] = std::exp(scratch[j] - mx);
    sum += scratch[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int i = 0; i < d; ++i) out[i] = 0.0f;
  for (int64_t j = 0; j < n_ctx; ++j) {
    const float p = scratch[j] * inv;
    const float* vj = v + j * stride;
    for (int i = 0; i < d; ++i) out[i] += p * vj[i];
  }
}

}  // namespace lily
