// Round trip: synth tiny checkpoints (HF bf16 and MLX 4-bit, single file and sharded) -> load_model ->
// shapes, formats and values. The two layouts of one seed hold the same numbers up to quantization.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "model/mlx_quant.h"
#include "model/synth.h"
#include "model/weights.h"
#include "util/bf16.h"
#include "util/safetensors.h"

namespace lily {
namespace {

namespace fs = std::filesystem;

std::string tmp_dir(const std::string& name) {
  fs::path p = fs::path(LILY_BINARY_DIR) / "test_tmp" / "synth_load" / name;
  fs::remove_all(p);
  return p.string();
}

float mat_at(const Mat& m, int64_t r, int64_t c) {
  if (m.format == MatFormat::bf16) return bf16_to_f32(static_cast<const uint16_t*>(m.data)[r * m.cols + c]);
  if (m.format == MatFormat::f32) return static_cast<const float*>(m.data)[r * m.cols + c];
  return mlx_affine_dequant(static_cast<const uint32_t*>(m.data), m.scales, m.biases, m.cols, m.bits, m.group_size,
                            r, c);
}

Model synth_and_load(const std::string& name, CheckpointLayout layout, uint64_t seed, uint64_t shard = 0,
                     bool tie = false) {
  SynthOptions o;
  o.layout = layout;
  o.seed = seed;
  o.shard_bytes = shard;
  o.tie_word_embeddings = tie;
  o.threads = 2;
  std::string dir = tmp_dir(name);
  synth_checkpoint(dir, o);
  return load_model(dir);
}

void expect_mat(const Mat& m, int64_t rows, int64_t cols, MatFormat f, const char* what) {
  EXPECT_EQ(m.rows, rows) << what;
  EXPECT_EQ(m.cols, cols) << what;
  EXPECT_EQ(m.format, f) << what;
  EXPECT_NE(m.data, nullptr) << what;
}

// Every sampled |hf - mlx| within the quantization error bound of its group: at most one step |scale| (half a
// step of rounding, or one step where the zero-preserving rescale clamps the top code) plus bf16 rounding.
void expect_close(const Mat& hf, const Mat& mlx, const char* what) {
  ASSERT_EQ(hf.rows, mlx.rows) << what;
  ASSERT_EQ(hf.cols, mlx.cols) << what;
  ASSERT_EQ(mlx.format, MatFormat::affine) << what;
  double worst_ratio = 0, ref_max = 0;
  int64_t wr = 0, wc = 0;
  const int64_t groups = mlx.cols / mlx.group_size;
  for (int64_t r = 0; r < hf.rows; r += 3) {
    for (int64_t c = 0; c < hf.cols; ++c) {
      double a = mat_at(hf, r, c), b = mat_at(mlx, r, c);
      int64_t g = r * groups + c / mlx.group_size;
      double bound = 1.05 * std::fabs(bf16_to_f32(mlx.scales[g])) + std::fabs(bf16_to_f32(mlx.biases[g])) / 256;
      ref_max = std::max(ref_max, std::fabs(a));
      double ratio = std::fabs(a - b) / bound;
      if (ratio > worst_ratio) { worst_ratio = ratio; wr = r; wc = c; }
    }
  }
  EXPECT_LE(worst_ratio, 1.0) << what << " worst at [" << wr << ", " << wc << "]: hf " << mat_at(hf, wr, wc)
                              << " mlx " << mat_at(mlx, wr, wc);
  EXPECT_GT(ref_max, 0) << what;
}

TEST(SynthLoad, TinyHfShapesAndValues) {
  Model m = synth_and_load("hf", CheckpointLayout::hf_bf16, 7);
  const Config& c = m.config;
  EXPECT_EQ(m.weights.layout, CheckpointLayout::hf_bf16);
  ASSERT_EQ(c.n_layers, 8);
  EXPECT_EQ(c.n_attention_layers(), 2);
  EXPECT_GT(c.n_heads / c.n_kv_heads, 1);
  EXPECT_GT(c.lin_v_heads, c.lin_k_heads);
  expect_mat(m.weights.embed_tokens, c.vocab, c.hidden, MatFormat::bf16, "embed");
  expect_mat(m.weights.lm_head, c.vocab, c.hidden, MatFormat::bf16, "lm_head");
  EXPECT_NE(m.weights.lm_head.data, m.weights.embed_tokens.data);
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerWeights& l = m.weights.layers[i];
    ASSERT_EQ(l.input_layernorm.size(), static_cast<size_t>(c.hidden));
    if (c.is_attention(i)) {
      expect_mat(l.attn.q_proj, c.q_proj_rows(), c.hidden, MatFormat::bf16, "q_proj");
      expect_mat(l.attn.o_proj, c.hidden, c.n_heads * c.head_dim, MatFormat::bf16, "o_proj");
      EXPECT_EQ(l.attn.q_norm.size(), static_cast<size_t>(c.head_dim));
    } else {
      expect_mat(l.gdn.in_proj_qkv, c.conv_dim(), c.hidden, MatFormat::bf16, "qkv");
      expect_mat(l.gdn.out_proj, c.hidden, c.value_dim(), MatFormat::bf16, "out_proj");
      EXPECT_EQ(l.gdn.conv1d.size(), static_cast<size_t>(c.conv_dim() * c.conv_kernel));
      for (float a : l.gdn.A_log) EXPECT_TRUE(a >= 0.0f && a <= std::log(16.0f) + 0.01f) << a;
    }
    ASSERT_EQ(l.moe.experts_gate.size(), static_cast<size_t>(c.n_experts));
    expect_mat(l.moe.experts_down[c.n_experts - 1], c.hidden, c.moe_ffn, MatFormat::bf16, "down");
    expect_mat(l.moe.shared_expert_gate, 1, c.hidden, MatFormat::bf16, "shared_expert_gate");
  }
  // Norms: HF stores w around 0; the loader returns 1 + w.
  double mean = 0;
  for (float x : m.weights.norm) mean += x;
  mean /= m.weights.norm.size();
  EXPECT_NEAR(mean, 1.0, 0.05);
  // Fused experts: gate rows come first, then up rows, per expert, in the raw tensor.
  TensorStore s = TensorStore::open_dir(m.dir);
  const TensorView& gu = s.get("model.language_model.layers.2.mlp.experts.gate_up_proj");
  const auto* raw = reinterpret_cast<const uint16_t*>(gu.data);
  const LayerWeights& l2 = m.weights.layers[2];
  int64_t H = c.hidden, F = c.moe_ffn;
  for (int64_t e : {int64_t{0}, int64_t{5}}) {
    EXPECT_EQ(mat_at(l2.moe.experts_gate[e], 3, 7), bf16_to_f32(raw[(e * 2 * F + 3) * H + 7]));
    EXPECT_EQ(mat_at(l2.moe.experts_up[e], 3, 7), bf16_to_f32(raw[(e * 2 * F + F + 3) * H + 7]));
  }
  EXPECT_GT(m.weights.bytes_on_disk, 0u);
}

TEST(SynthLoad, MlxMatchesHfOfSameSeed) {
  Model h = synth_and_load("same_hf", CheckpointLayout::hf_bf16, 11);
  Model q = synth_and_load("same_mlx", CheckpointLayout::mlx_affine, 11);
  const Config& c = q.config;
  EXPECT_EQ(q.weights.layout, CheckpointLayout::mlx_affine);
  ASSERT_TRUE(c.quant.present);
  EXPECT_EQ(q.weights.embed_tokens.format, MatFormat::affine);
  EXPECT_EQ(q.weights.embed_tokens.bits, 4);
  expect_close(h.weights.embed_tokens, q.weights.embed_tokens, "embed");
  expect_close(h.weights.lm_head, q.weights.lm_head, "lm_head");
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerWeights& a = h.weights.layers[i];
    const LayerWeights& b = q.weights.layers[i];
    EXPECT_EQ(b.moe.gate.bits, 8);
    EXPECT_EQ(b.moe.shared_expert_gate.bits, 8);
    EXPECT_EQ(b.moe.experts_up[1].bits, 4);
    expect_close(a.moe.gate, b.moe.gate, "router");
    expect_close(a.moe.shared_expert_gate, b.moe.shared_expert_gate, "shared_expert_gate");
    expect_close(a.moe.experts_gate[c.n_experts - 1], b.moe.experts_gate[c.n_experts - 1], "expert gate");
    expect_close(a.moe.experts_up[2], b.moe.experts_up[2], "expert up");
    expect_close(a.moe.experts_down[4], b.moe.experts_down[4], "expert down");
    expect_close(a.moe.shared_down, b.moe.shared_down, "shared down");
    for (int64_t k = 0; k < c.hidden; ++k) {
      // MLX stores bf16(1 + w); HF loads 1 + w in fp32.
      ASSERT_NEAR(a.input_layernorm[k], b.input_layernorm[k], 1.0 / 256) << "layer " << i << " k " << k;
    }
    if (c.is_attention(i)) {
      expect_close(a.attn.q_proj, b.attn.q_proj, "q_proj");
      expect_close(a.attn.o_proj, b.attn.o_proj, "o_proj");
      for (int64_t k = 0; k < c.head_dim; ++k) ASSERT_NEAR(a.attn.k_norm[k], b.attn.k_norm[k], 1.0 / 256);
    } else {
      expect_close(a.gdn.in_proj_qkv, b.gdn.in_proj_qkv, "qkv");
      expect_close(a.gdn.in_proj_a, b.gdn.in_proj_a, "in_proj_a");
      expect_close(a.gdn.out_proj, b.gdn.out_proj, "out_proj");
      EXPECT_EQ(a.gdn.conv1d, b.gdn.conv1d);    // [C,1,K] vs [C,K,1]: same numbers
      EXPECT_EQ(a.gdn.A_log, b.gdn.A_log);      // bf16 in HF, f32 (bf16 values) in MLX
      EXPECT_EQ(a.gdn.norm, b.gdn.norm);        // f32 in HF, bf16 in MLX; plain weight in both
      EXPECT_EQ(a.gdn.dt_bias, b.gdn.dt_bias);
    }
  }
}

TEST(SynthLoad, ShardedEqualsSingleFile) {
  Model one = synth_and_load("single", CheckpointLayout::mlx_affine, 3);
  Model many = synth_and_load("sharded", CheckpointLayout::mlx_affine, 3, 200'000);
  EXPECT_TRUE(fs::exists(fs::path(many.dir) / "model.safetensors.index.json"));
  int shards = 0;
  for (const auto& e : fs::directory_iterator(many.dir)) shards += e.path().extension() == ".safetensors";
  EXPECT_GT(shards, 3);
  const Mat& a = one.weights.layers[5].moe.experts_down[3];
  const Mat& b = many.weights.layers[5].moe.experts_down[3];
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.cols; ++c) ASSERT_EQ(mat_at(a, r, c), mat_at(b, r, c)) << r << "," << c;
  EXPECT_EQ(one.weights.norm, many.weights.norm);
}

TEST(SynthLoad, TiedEmbeddingsShareTheTable) {
  Model m = synth_and_load("tied", CheckpointLayout::hf_bf16, 5, 0, true);
  EXPECT_TRUE(m.config.tie_word_embeddings);
  EXPECT_EQ(m.weights.lm_head.data, m.weights.embed_tokens.data);
  TensorStore s = TensorStore::open_dir(m.dir);
  EXPECT_EQ(s.find("lm_head.weight"), nullptr);
}

TEST(SynthLoad, SeedsDiffer) {
  Model a = synth_and_load("seed_a", CheckpointLayout::hf_bf16, 1);
  Model b = synth_and_load("seed_b", CheckpointLayout::hf_bf16, 2);
  int same = 0;
  for (int64_t c = 0; c < a.config.hidden; ++c)
    same += mat_at(a.weights.embed_tokens, 9, c) == mat_at(b.weights.embed_tokens, 9, c);
  EXPECT_LT(same, 8);
}

}  // namespace
}  // namespace lily
