// Weights on the GPU for the CUDA backend: upload of a loaded checkpoint (MLX affine words repacked on the
// GPU by kernels/qmat.h's upload_mlx; HF bf16 matrices either kept bf16 or quantized to MLX 4-bit on the GPU
// with from_bf16), and random full-size weights generated directly in GPU memory for benchmarks.
#include <cmath>
#include <cstdio>

#include "kernels/common.cuh"
#include "model/cuda_engine.h"
#include "util/bf16.h"

namespace lily::cuda {

namespace {

__device__ __host__ inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ inline float uniform01(uint64_t seed, size_t i) {
  return (mix64(seed ^ mix64(i)) >> 40) * (1.0f / 16777216.0f);
}

__global__ void fill_words_kernel(uint32_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = (uint32_t)mix64(seed ^ mix64(i));
}

// scale|bias<<16 words: |scale| in [0.5, 1.5) * base with a random sign, bias = -mid * scale (zero-mean weights).
__global__ void fill_sb_kernel(uint32_t* p, size_t n, uint64_t seed, float base, float mid) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float u = uniform01(seed, i);
    const float scale = (u < 0.5f ? -1.f : 1.f) * base * (0.5f + 2.f * fabsf(u - 0.5f));
    const float bias = -mid * scale;
    p[i] = (uint32_t)f32_to_bf16(scale) | ((uint32_t)f32_to_bf16(bias) << 16);
  }
}

__global__ void fill_f32_kernel(float* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = lo + (hi - lo) * uniform01(seed, i);
}

__global__ void fill_bf16_kernel(uint16_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = f32_to_bf16(2.f * uniform01(seed, i) - 1.f);
}

constexpr int kFillBlocks = 1024, kFillThreads = 256;

// ---- upload from a checkpoint ----
class Uploader {
 public:
  Uploader(DeviceWeights& w, bool quantize_bf16, bool progress, uint64_t total, cudaStream_t s)
      : w_(w), quantize_(quantize_bf16), progress_(progress), total_(total), s_(s) {}
  ~Uploader() {
    if (staging_) cudaFree(staging_);
  }

  // One matrix, or a stack of same-shape matrices (experts) into one QMat with n_mats = mats.size().
  QMat mat(const std::vector<const Mat*>& mats) {
    const Mat& m0 = *mats[0];
    QMat q;
    q.rows = (int)m0.rows;
    q.cols = (int)m0.cols;
    q.n_mats = (int)mats.size();
    if (m0.format == MatFormat::affine) {
      LILY_CHECK(m0.group_size == kGroupSize && (m0.bits == 4 || m0.bits == 8), "CUDA backend: affine matrix with ",
                 m0.bits, " bits / group ", m0.group_size, " is not supported (4 or 8 bits, group 64)");
      q.format = m0.bits == 4 ? QFormat::q4 : QFormat::q8;
    } else {
      q.format = quantize_ ? QFormat::q4 : QFormat::bf16;
    }
    qmat_alloc(q);
    w_.bytes += (double)q.bytes();
    for (size_t e = 0; e < mats.size(); ++e) {
      QMat one = q;
      one.n_mats = 1;
      one.w = q.w + e * q.mat_w_bytes();
      one.sb = q.sb ? q.sb + e * q.mat_groups() : nullptr;
      upload_one(one, *mats[e]);
    }
    return q;
  }
  QMat mat(const Mat& m) { return mat(std::vector<const Mat*>{&m}); }

  float* vec(const std::vector<float>& v) {
    float* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, v.size() * sizeof(float)));
    CUDA_CHECK(cudaMemcpyAsync(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, s_));
    w_.allocations.push_back(p);
    w_.bytes += (double)v.size() * sizeof(float);
    return p;
  }

 private:
  void* staging(size_t bytes) {
    if (bytes > staging_bytes_) {
      CUDA_CHECK(cudaStreamSynchronize(s_));
      if (staging_) CUDA_CHECK(cudaFree(staging_));
      CUDA_CHECK(cudaMalloc(&staging_, bytes));
      staging_bytes_ = bytes;
    }
    return staging_;
  }

  void upload_one(const QMat& q, const Mat& m) {
    if (m.format == MatFormat::affine) {
      upload_mlx(q, static_cast<const uint32_t*>(m.data), m.scales, m.biases, staging(upload_mlx_staging_bytes(q)),
                 s_);
    } else {
      const size_t n = (size_t)m.rows * m.cols;
      const uint16_t* src = static_cast<const uint16_t*>(m.data);
      std::vector<uint16_t> conv;
      if (m.format == MatFormat::f32) {  // note: f32 matrices are rounded to bf16 (none in the known releases)
        conv.resize(n);
        const float* f = static_cast<const float*>(m.data);
        for (size_t i = 0; i < n; ++i) conv[i] = f32_to_bf16(f[i]);
        src = conv.data();
      }
      if (q.format == QFormat::bf16) {
        CUDA_CHECK(cudaMemcpyAsync(q.w, src, n * 2, cudaMemcpyHostToDevice, s_));
      } else {
        void* st = staging(n * 2);
        CUDA_CHECK(cudaMemcpyAsync(st, src, n * 2, cudaMemcpyHostToDevice, s_));
        from_bf16(q, static_cast<const uint16_t*>(st), s_);
      }
      if (!conv.empty()) CUDA_CHECK(cudaStreamSynchronize(s_));
    }
    done_ += m.bytes();
    report();
  }

  void report() {
    if (!progress_ || total_ == 0) return;
    const int pct = (int)(100.0 * done_ / total_);
    if (pct == last_pct_) return;
    last_pct_ = pct;
    const int bar = pct / 4;
    std::fprintf(stderr, "\rloading weights to the GPU [%.*s%*s] %3d%% %.2f / %.2f GB", bar,
                 "#########################", 25 - bar, "", pct, done_ / 1e9, total_ / 1e9);
    if (pct == 100) std::fprintf(stderr, "\n");
  }

  DeviceWeights& w_;
  bool quantize_;
  bool progress_;
  uint64_t total_;
  uint64_t done_ = 0;
  int last_pct_ = -1;
  cudaStream_t s_;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
};

uint64_t matrix_bytes(const Weights& w) {
  uint64_t b = w.embed_tokens.bytes() + w.lm_head.bytes();
  for (const LayerWeights& l : w.layers) {
    for (const Mat* m : {&l.gdn.in_proj_qkv, &l.gdn.in_proj_z, &l.gdn.in_proj_b, &l.gdn.in_proj_a, &l.gdn.out_proj,
                         &l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj, &l.attn.o_proj, &l.moe.gate,
                         &l.moe.shared_gate, &l.moe.shared_up, &l.moe.shared_down, &l.moe.shared_expert_gate})
      if (m->data) b += m->bytes();
    for (const auto* v : {&l.moe.experts_gate, &l.moe.experts_up, &l.moe.experts_down})
      for (const Mat& m : *v) b += m.bytes();
  }
  return b;
}

std::vector<const Mat*> ptrs(const std::vector<Mat>& v) {
  std::vector<const Mat*> p;
  for (const Mat& m : v) p.push_back(&m);
  return p;
}

// ---- synthetic ----
struct Synth {
  DeviceWeights& w;
  uint64_t seed;
  cudaStream_t s;

  QMat mat(QFormat f, int rows, int cols, int n_mats = 1) {
    QMat q;
    q.format = f;
    q.rows = rows;
    q.cols = cols;
    q.n_mats = n_mats;
    qmat_alloc(q);
    w.bytes += (double)q.bytes();
    fill_words_kernel<<<kFillBlocks, kFillThreads, 0, s>>>(reinterpret_cast<uint32_t*>(q.w), q.w_bytes() / 4,
                                                           ++seed);
    CUDA_CHECK_LAUNCH(s);
    const float levels = f == QFormat::q4 ? 15.f : 255.f;
    const float q_std = levels / std::sqrt(12.f) * std::sqrt(1.f + 2.f / levels);
    fill_sb_kernel<<<kFillBlocks, kFillThreads, 0, s>>>(q.sb, q.mat_groups() * n_mats, ++seed,
                                                        1.f / (std::sqrt((float)cols) * q_std), levels / 2);
    CUDA_CHECK_LAUNCH(s);
    return q;
  }
  float* vec(size_t n, float lo, float hi) {
    float* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
    w.allocations.push_back(p);
    w.bytes += (double)n * sizeof(float);
    fill_f32_kernel<<<kFillBlocks, kFillThreads, 0, s>>>(p, n, ++seed, lo, hi);
    CUDA_CHECK_LAUNCH(s);
    return p;
  }
};

}  // namespace

DeviceWeights upload_weights(const Model& model, bool quantize_bf16, bool progress, cudaStream_t s) {
  const Config& c = model.config;
  const Weights& src = model.weights;
  DeviceWeights w;
  Uploader up(w, quantize_bf16, progress, matrix_bytes(src), s);
  w.embed_tokens = up.mat(src.embed_tokens);
  w.norm = up.vec(src.norm);
  w.lm_head = up.mat(src.lm_head);
  w.layers.resize(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerWeights& l = src.layers[i];
    LayerDev& d = w.layers[i];
    d.input_layernorm = up.vec(l.input_layernorm);
    d.post_attention_layernorm = up.vec(l.post_attention_layernorm);
    if (c.is_attention(i)) {
      d.attn.q_proj = up.mat(l.attn.q_proj);
      d.attn.k_proj = up.mat(l.attn.k_proj);
      d.attn.v_proj = up.mat(l.attn.v_proj);
      d.attn.o_proj = up.mat(l.attn.o_proj);
      d.attn.q_norm = up.vec(l.attn.q_norm);
      d.attn.k_norm = up.vec(l.attn.k_norm);
    } else {
      d.gdn.in_proj_qkv = up.mat(l.gdn.in_proj_qkv);
      d.gdn.in_proj_z = up.mat(l.gdn.in_proj_z);
      d.gdn.in_proj_b = up.mat(l.gdn.in_proj_b);
      d.gdn.in_proj_a = up.mat(l.gdn.in_proj_a);
      d.gdn.out_proj = up.mat(l.gdn.out_proj);
      d.gdn.conv1d = up.vec(l.gdn.conv1d);
      d.gdn.A_log = up.vec(l.gdn.A_log);
      d.gdn.dt_bias = up.vec(l.gdn.dt_bias);
      d.gdn.norm = up.vec(l.gdn.norm);
    }
    MoeWeightsDev& m = d.moe;
    m.gate = up.mat(l.moe.gate);
    m.shared_expert_gate = up.mat(l.moe.shared_expert_gate);
    m.experts_gate = up.mat(ptrs(l.moe.experts_gate));
    m.experts_up = up.mat(ptrs(l.moe.experts_up));
    m.experts_down = up.mat(ptrs(l.moe.experts_down));
    m.shared_gate = up.mat(l.moe.shared_gate);
    m.shared_up = up.mat(l.moe.shared_up);
    m.shared_down = up.mat(l.moe.shared_down);
    moe_build_router_slices(m, s);  // the fused MoE block's copy of the router (kernels/router_partial.cuh)
    w.bytes += static_cast<double>(m.router_slices.bytes());
  }
  CUDA_CHECK(cudaStreamSynchronize(s));
  return w;
}

uint64_t checkpoint_matrix_bytes(const Model& model) { return matrix_bytes(model.weights); }

DeviceWeights synthetic_weights(const Config& c, uint64_t seed, cudaStream_t s) {
  DeviceWeights w;
  Synth g{w, seed, s};
  const int H = c.hidden, V = c.vocab, d = c.head_dim, Hv = c.lin_v_heads, Dv = c.lin_v_dim;
  const QFormat q4 = QFormat::q4, q8 = QFormat::q8;
  w.embed_tokens = g.mat(q4, V, H);
  w.norm = g.vec(H, 0.9f, 1.1f);
  w.lm_head = g.mat(q4, V, H);
  w.layers.resize(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    LayerDev& l = w.layers[i];
    l.input_layernorm = g.vec(H, 0.9f, 1.1f);
    l.post_attention_layernorm = g.vec(H, 0.9f, 1.1f);
    if (c.is_attention(i)) {
      l.attn.q_proj = g.mat(q4, c.q_proj_rows(), H);
      l.attn.k_proj = g.mat(q4, c.n_kv_heads * d, H);
      l.attn.v_proj = g.mat(q4, c.n_kv_heads * d, H);
      l.attn.o_proj = g.mat(q4, H, c.n_heads * d);
      l.attn.q_norm = g.vec(d, 0.9f, 1.1f);
      l.attn.k_norm = g.vec(d, 0.9f, 1.1f);
    } else {
      l.gdn.in_proj_qkv = g.mat(q4, c.conv_dim(), H);
      l.gdn.in_proj_z = g.mat(q4, Hv * Dv, H);
      l.gdn.in_proj_b = g.mat(q4, Hv, H);
      l.gdn.in_proj_a = g.mat(q4, Hv, H);
      l.gdn.out_proj = g.mat(q4, H, Hv * Dv);
      l.gdn.conv1d = g.vec((size_t)c.conv_dim() * c.conv_kernel, -0.5f, 0.5f);
      l.gdn.A_log = g.vec(Hv, -1.f, 1.f);
      l.gdn.dt_bias = g.vec(Hv, -1.f, 1.f);
      l.gdn.norm = g.vec(Dv, 0.9f, 1.1f);
    }
    MoeWeightsDev& m = l.moe;
    m.gate = g.mat(q8, c.n_experts, H);
    m.shared_expert_gate = g.mat(q8, 1, H);
    m.experts_gate = g.mat(q4, c.moe_ffn, H, c.n_experts);
    m.experts_up = g.mat(q4, c.moe_ffn, H, c.n_experts);
    m.experts_down = g.mat(q4, H, c.moe_ffn, c.n_experts);
    m.shared_gate = g.mat(q4, c.shared_ffn, H);
    m.shared_up = g.mat(q4, c.shared_ffn, H);
    m.shared_down = g.mat(q4, H, c.shared_ffn);
    moe_build_router_slices(m, s);
    w.bytes += static_cast<double>(m.router_slices.bytes());
  }
  CUDA_CHECK(cudaStreamSynchronize(s));
  return w;
}

void free_weights(DeviceWeights& w) {
  auto f = [](QMat& q) {
    if (q.w) qmat_free(q);
  };
  f(w.embed_tokens);
  f(w.lm_head);
  for (LayerDev& l : w.layers) {
    for (QMat* q : {&l.gdn.in_proj_qkv, &l.gdn.in_proj_z, &l.gdn.in_proj_b, &l.gdn.in_proj_a, &l.gdn.out_proj,
                    &l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj, &l.attn.o_proj, &l.moe.gate,
                    &l.moe.shared_expert_gate, &l.moe.experts_gate, &l.moe.experts_up, &l.moe.experts_down,
                    &l.moe.shared_gate, &l.moe.shared_up, &l.moe.shared_down, &l.moe.router_slices})
      f(*q);
  }
  for (void* p : w.allocations) cudaFree(p);
  w = DeviceWeights{};
}

void fill_random_bf16(uint16_t* p, size_t n, uint64_t seed, cudaStream_t s) {
  fill_bf16_kernel<<<kFillBlocks, kFillThreads, 0, s>>>(p, n, seed);
  CUDA_CHECK_LAUNCH(s);
}

}  // namespace lily::cuda
