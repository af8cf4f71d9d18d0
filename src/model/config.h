// The model configuration, resolved from a checkpoint directory's config.json (Qwen wrapper with
// text_config, an mlx-community conversion with a quantization block, or a bare text config) plus
// generation_config.json. Every size comes from the file; the CPU path hard-codes none of the 35B sizes.
// Shapes in comments are the published Qwen3.6-35B-A3B values.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lily {

enum class LayerKind { linear_attention, full_attention };

// How one module's weight is stored in an MLX affine checkpoint (absent block: bf16, quantized = false).
struct QuantSpec {
  bool quantized = false;  // false: stored as a plain float tensor
  int bits = 0;            // 4 or 8
  int group_size = 0;      // 64
};

struct Quantization {
  bool present = false;                          // the config has a quantization block
  QuantSpec def;                                 // the block's top-level bits / group_size
  std::map<std::string, QuantSpec> overrides;    // module path -> spec, e.g. "...layers.0.mlp.gate" -> 8 bit
  // The spec for a module path such as "language_model.model.layers.3.mlp.gate".
  QuantSpec for_module(const std::string& module_path) const;
};

struct Config {
  std::string model_type;            // "qwen3_5_moe" (wrapper) or "qwen3_5_moe_text"
  // trunk
  int hidden = 0;                    // H = 2048
  int n_layers = 0;                  // 40
  int vocab = 0;                     // 248320 (model vocab incl. padding rows)
  float eps = 0;                     // rms_norm_eps, 1e-6
  std::vector<LayerKind> layer_kinds;  // [n_layers]; full attention where (i+1) % interval == 0
  int full_attention_interval = 0;   // 4
  bool tie_word_embeddings = false;  // false for the real model (lm_head is its own tensor)
  int max_position_embeddings = 0;   // 262144
  // gated full attention
  int n_heads = 0;                   // Hq = 16
  int n_kv_heads = 0;                // Hkv = 2
  int head_dim = 0;                  // d = 256
  int rope_dim = 0;                  // int(head_dim * partial_rotary_factor) = 64
  double rope_theta = 0;             // 1e7, from rope_parameters
  double partial_rotary_factor = 0;  // 0.25
  // Gated DeltaNet
  int lin_k_heads = 0;               // Hk = 16
  int lin_v_heads = 0;               // Hv = 32
  int lin_k_dim = 0;                 // Dk = 128
  int lin_v_dim = 0;                 // Dv = 128
  int conv_kernel = 0;               // Kc = 4
  // MoE
  int n_experts = 0;                 // E = 256
  int top_k = 0;                     // 8
  int moe_ffn = 0;                   // moe_intermediate_size = 512
  int shared_ffn = 0;                // shared_expert_intermediate_size = 512
  // tokens (generation_config.json when present, else text_config)
  int bos_token_id = -1;             // 248044
  std::vector<int> eos_token_ids;    // [248046, 248044]
  // sampling defaults from generation_config.json (absent -> neutral)
  float gen_temperature = 1.0f;
  int gen_top_k = 0;
  float gen_top_p = 1.0f;
  // storage
  Quantization quant;                // mlx-community conversions only

  // derived sizes
  int key_dim() const { return lin_k_heads * lin_k_dim; }             // 2048
  int value_dim() const { return lin_v_heads * lin_v_dim; }           // 4096
  int conv_dim() const { return 2 * key_dim() + value_dim(); }        // 8192
  int q_proj_rows() const { return n_heads * head_dim * 2; }          // 8192 ([query | gate] per head)
  bool is_attention(int layer) const { return layer_kinds[layer] == LayerKind::full_attention; }
  int n_attention_layers() const;
};

// Parse and validate; `file` names the source in error messages. Throws lily::Error naming the field.
Config parse_config(const nlohmann::json& config, const std::string& file);
// Reads DIR/config.json and, if present, DIR/generation_config.json.
Config load_config(const std::string& model_dir);

}  // namespace lily
