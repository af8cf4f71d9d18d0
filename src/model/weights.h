// Model weights as views into the memory-mapped checkpoint: matrices stay in their stored format (bf16,
// or MLX 4/8-bit affine) and are dequantized a group at a time by the kernels. Only the small per-channel
// vectors (norms, conv taps, A_log, dt_bias) are converted to fp32 at load.
// Loaders: HF bf16 release (model.language_model.*) and MLX 4-bit (language_model.model.*), see
// docs/model.md §4-5. Tensor names follow the checkpoint.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"

namespace lily {

enum class MatFormat { bf16, f32, affine };  // affine: MLX packed uint32 + bf16 scales/biases

// y = W x with W [rows, cols] (PyTorch [out, in]); rows are contiguous in memory.
struct Mat {
  MatFormat format = MatFormat::bf16;
  int64_t rows = 0;
  int64_t cols = 0;
  int bits = 0;                      // affine: 4 or 8
  int group_size = 0;                // affine: 64
  const void* data = nullptr;        // bf16/f32: [rows, cols]; affine: uint32 [rows, cols*bits/32]
  const uint16_t* scales = nullptr;  // affine: bf16 [rows, cols/group_size]
  const uint16_t* biases = nullptr;  // affine: bf16 [rows, cols/group_size]

  size_t row_bytes() const;          // bytes of one row of `data`
  size_t bytes() const;              // all bytes read by one full matrix-vector product
  Mat row_slice(int64_t first_row, int64_t n_rows) const;  // view of rows [first, first + n)
};

struct GdnWeights {  // linear_attn.*
  Mat in_proj_qkv;             // [conv_dim = 8192, H] rows [q 16x128 | k 16x128 | v 32x128]
  Mat in_proj_z;               // [Hv*Dv = 4096, H]
  Mat in_proj_b;               // [Hv = 32, H]
  Mat in_proj_a;               // [Hv = 32, H]
  std::vector<float> conv1d;   // [conv_dim][Kc = 4]; tap Kc-1 multiplies the current token
  std::vector<float> A_log;    // [Hv]
  std::vector<float> dt_bias;  // [Hv]
  std::vector<float> norm;     // [Dv = 128] plain weight of the gated RMSNorm (not 1+w)
  Mat out_proj;                // [H, Hv*Dv = 4096]
};

struct AttnWeights {  // self_attn.*
  Mat q_proj;                  // [Hq*2*d = 8192, H] per head [query 256 | gate 256]
  Mat k_proj;                  // [Hkv*d = 512, H]
  Mat v_proj;                  // [Hkv*d = 512, H]
  Mat o_proj;                  // [H, Hq*d = 4096]
  std::vector<float> q_norm;   // [d] effective multiplier (1 + w)
  std::vector<float> k_norm;   // [d] effective multiplier (1 + w)
};

struct MoeWeights {  // mlp.*
  Mat gate;                        // router [E = 256, H] (8-bit in MLX)
  std::vector<Mat> experts_gate;   // E x [F = 512, H]  (HF gate_up_proj[e, 0:F], MLX switch_mlp.gate_proj[e])
  std::vector<Mat> experts_up;     // E x [F, H]        (HF gate_up_proj[e, F:2F], MLX switch_mlp.up_proj[e])
  std::vector<Mat> experts_down;   // E x [H, F]
  Mat shared_gate;                 // shared_expert.gate_proj [Fs = 512, H]
  Mat shared_up;                   // shared_expert.up_proj   [Fs, H]
  Mat shared_down;                 // shared_expert.down_proj [H, Fs]
  Mat shared_expert_gate;          // [1, H] (8-bit in MLX)
};

struct LayerWeights {
  std::vector<float> input_layernorm;           // [H] effective multiplier (1 + w)
  std::vector<float> post_attention_layernorm;  // [H] effective multiplier (1 + w)
  GdnWeights gdn;                               // linear_attention layers only
  AttnWeights attn;                             // full_attention layers only
  MoeWeights moe;
};

enum class CheckpointLayout { hf_bf16, mlx_affine };

struct Weights {
  CheckpointLayout layout = CheckpointLayout::hf_bf16;
  Mat embed_tokens;                 // [V, H]; rows gathered (dequantized) per token
  std::vector<LayerWeights> layers; // [n_layers]
  std::vector<float> norm;          // [H] final norm, effective multiplier (1 + w)
  Mat lm_head;                      // [V, H] (embed_tokens when tied)
  std::shared_ptr<const void> storage;  // keeps the memory maps alive
  uint64_t bytes_on_disk = 0;       // sum of the safetensors files
};

struct Model {
  std::string dir;
  Config config;
  Weights weights;
};

struct LoadOptions {
  bool check_tensors = false;  // scan every tensor the model reads for NaN / Inf (model/tensor_check.h)
};

// Loads DIR (config.json, generation_config.json, model.safetensors or shards + index). Validates every
// file and tensor; throws lily::Error naming the file and tensor on any problem.
Model load_model(const std::string& model_dir, const LoadOptions& opt = {});

}  // namespace lily
