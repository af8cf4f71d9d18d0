// load_model: maps a checkpoint directory and fills Weights with views into the memory maps, for both
// layouts of docs/model.md §4 (HF bf16, MLX affine). Every expected tensor is checked for exact dtype and shape;
// unknown names are errors; vision / MTP tensors are skipped explicitly (docs/model.md §5).
#include "model/weights.h"

#include <filesystem>
#include <cstring>
#include <set>

#include "model/tensor_check.h"
#include "util/bf16.h"
#include "util/check.h"
#include "util/safetensors.h"

namespace lily {

size_t Mat::row_bytes() const {
  switch (format) {
    case MatFormat::bf16: return static_cast<size_t>(cols) * 2;
    case MatFormat::f32: return static_cast<size_t>(cols) * 4;
    case MatFormat::affine: return static_cast<size_t>(cols) * bits / 8;
  }
  return 0;
}

size_t Mat::bytes() const {
  size_t b = static_cast<size_t>(rows) * row_bytes();
  if (format == MatFormat::affine) b += 2 * static_cast<size_t>(rows) * (cols / group_size) * 2;
  return b;
}

Mat Mat::row_slice(int64_t first_row, int64_t n_rows) const {
  LILY_CHECK(first_row >= 0 && n_rows >= 0 && first_row + n_rows <= rows, "row_slice [", first_row, ", +", n_rows,
             ") outside ", rows, " rows");
  Mat m = *this;
  m.rows = n_rows;
  m.data = static_cast<const uint8_t*>(data) + first_row * row_bytes();
  if (format == MatFormat::affine) {
    int64_t groups = cols / group_size;
    m.scales = scales + first_row * groups;
    m.biases = biases + first_row * groups;
  }
  return m;
}

namespace {

// Owns the memory maps plus aligned copies of any tensor whose data is misaligned for its element type.
struct Storage {
  std::shared_ptr<const void> maps;
  std::vector<std::vector<uint64_t>> copies;
};

struct Expect {
  Dtype dtype;
  std::vector<int64_t> shape;
};

std::string expect_str(const std::vector<Dtype>& dtypes, const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < dtypes.size(); ++i) s += std::string(i ? " or " : "") + dtype_name(dtypes[i]);
  return s + " " + shape_str(shape);
}

class Loader {
 public:
  Loader(const TensorStore& store, const Config& c, std::string dir, Storage& storage)
      : store_(store), c_(c), dir_(std::move(dir)), storage_(storage) {}

  // The tensor `name` with one of `dtypes` and exactly `shape`; marks it used. Returns aligned data.
  const uint8_t* tensor(const std::string& name, const std::vector<Dtype>& dtypes, const std::vector<int64_t>& shape,
                        Dtype* got = nullptr) {
    const TensorView* v = store_.find(name);
    if (!v) fail(dir_, ": tensor ", name, " is missing (expected ", expect_str(dtypes, shape), ")");
    bool dtype_ok = false;
    for (Dtype d : dtypes) dtype_ok |= v->dtype == d;
    if (!dtype_ok || v->shape != shape)
      fail(v->file, ": tensor ", name, ": expected ", expect_str(dtypes, shape), ", got ", dtype_name(v->dtype), " ",
           shape_str(v->shape));
    used_.insert(name);
    if (got) *got = v->dtype;
    size_t align = dtype_size(v->dtype);
    if (reinterpret_cast<uintptr_t>(v->data) % align == 0) return v->data;
    auto& copy = storage_.copies.emplace_back((v->nbytes + 7) / 8);
    std::memcpy(copy.data(), v->data, v->nbytes);
    return reinterpret_cast<const uint8_t*>(copy.data());
  }

  // HF: a bf16 matrix [rows, cols] stored as `name`.
  Mat dense(const std::string& name, int64_t rows, int64_t cols) {
    Mat m;
    m.format = MatFormat::bf16;
    m.rows = rows;
    m.cols = cols;
    m.data = tensor(name, {Dtype::BF16}, {rows, cols});
    return m;
  }

  // MLX: module `module` ([stack,] rows, cols), quantized or bf16 as the quantization block says.
  std::vector<Mat> mlx(const std::string& module, int64_t stack, int64_t rows, int64_t cols) {
    QuantSpec q = c_.quant.for_module(module);
    std::vector<int64_t> lead;
    if (stack > 0) lead.push_back(stack);
    auto shape = [&](int64_t last) {
      auto s = lead;
      s.push_back(rows);
      s.push_back(last);
      return s;
    };
    Mat m;
    m.rows = rows;
    m.cols = cols;
    // MLX quantizes only modules whose input size is a multiple of the group size; the rest stay bf16.
    if (q.quantized && cols % q.group_size != 0) q.quantized = false;
    if (q.quantized) {
      m.format = MatFormat::affine;
      m.bits = q.bits;
      m.group_size = q.group_size;
      m.data = tensor(module + ".weight", {Dtype::U32}, shape(cols * q.bits / 32));
      m.scales = reinterpret_cast<const uint16_t*>(tensor(module + ".scales", {Dtype::BF16}, shape(cols / q.group_size)));
      m.biases = reinterpret_cast<const uint16_t*>(tensor(module + ".biases", {Dtype::BF16}, shape(cols / q.group_size)));
    } else {
      m.format = MatFormat::bf16;
      m.data = tensor(module + ".weight", {Dtype::BF16}, shape(cols));
    }
    if (stack == 0) return {m};
    std::vector<Mat> out;
    int64_t groups = q.quantized ? cols / q.group_size : 0;
    for (int64_t e = 0; e < stack; ++e) {
      Mat x = m;
      x.data = static_cast<const uint8_t*>(m.data) + e * rows * m.row_bytes();
      if (q.quantized) {
        x.scales = m.scales + e * rows * groups;
        x.biases = m.biases + e * rows * groups;
      }
      out.push_back(x);
    }
    return out;
  }

  // A small float vector of `n` elements stored with `shape`; `plus_one` adds 1 (HF zero-centred norms).
  std::vector<float> vec(const std::string& name, const std::vector<int64_t>& shape, bool allow_f32, bool plus_one) {
    std::vector<Dtype> dts{Dtype::BF16};
    if (allow_f32) dts.push_back(Dtype::F32);
    Dtype got;
    const uint8_t* p = tensor(name, dts, shape, &got);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> out(n);
    for (int64_t i = 0; i < n; ++i) {
      float x;
      if (got == Dtype::BF16) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        x = bf16_to_f32(h);
      } else {
        std::memcpy(&x, p + 4 * i, 4);
      }
      out[i] = plus_one ? 1.0f + x : x;
    }
    return out;
  }

  std::vector<std::string> used() const { return {used_.begin(), used_.end()}; }

  void check_unused(const std::vector<std::string>& ignored_prefixes) {
    for (const auto& name : store_.names()) {
      if (used_.count(name)) continue;
      bool ignored = false;
      for (const auto& p : ignored_prefixes) ignored |= name.rfind(p, 0) == 0;
      if (!ignored) fail(store_.get(name).file, ": unknown tensor ", name);
    }
  }

 private:
  const TensorStore& store_;
  const Config& c_;
  std::string dir_;
  Storage& storage_;
  std::set<std::string> used_;
};

CheckpointLayout detect_layout(const TensorStore& store, const Config& c, const std::string& dir) {
  std::string hf, mlx;
  for (const auto& n : store.names()) {
    if (hf.empty() && (n.rfind("model.language_model.", 0) == 0 || n == "lm_head.weight")) hf = n;
    if (mlx.empty() && n.rfind("language_model.", 0) == 0) mlx = n;
  }
  if (!hf.empty() && !mlx.empty())
    fail(dir, ": checkpoint mixes HF (", hf, ") and MLX (", mlx, ") tensor names");
  if (!hf.empty()) {
    if (c.quant.present) fail(dir, ": HF tensor names (", hf, ") with a quantization block in config.json");
    return CheckpointLayout::hf_bf16;
  }
  if (!mlx.empty()) return CheckpointLayout::mlx_affine;
  fail(dir, ": no language-model tensors (model.language_model.* or language_model.model.*)");
}

void load_hf(Loader& ld, const Config& c, Weights& w) {
  const std::string P = "model.language_model.";
  const int64_t H = c.hidden, V = c.vocab, E = c.n_experts, F = c.moe_ffn, Fs = c.shared_ffn;
  w.embed_tokens = ld.dense(P + "embed_tokens.weight", V, H);
  w.norm = ld.vec(P + "norm.weight", {H}, false, true);
  w.lm_head = c.tie_word_embeddings ? w.embed_tokens : ld.dense("lm_head.weight", V, H);
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string L = P + "layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[i];
    l.input_layernorm = ld.vec(L + "input_layernorm.weight", {H}, false, true);
    l.post_attention_layernorm = ld.vec(L + "post_attention_layernorm.weight", {H}, false, true);
    if (c.is_attention(i)) {
      const int64_t d = c.head_dim;
      l.attn.q_proj = ld.dense(L + "self_attn.q_proj.weight", c.q_proj_rows(), H);
      l.attn.k_proj = ld.dense(L + "self_attn.k_proj.weight", c.n_kv_heads * d, H);
      l.attn.v_proj = ld.dense(L + "self_attn.v_proj.weight", c.n_kv_heads * d, H);
      l.attn.o_proj = ld.dense(L + "self_attn.o_proj.weight", H, c.n_heads * d);
      l.attn.q_norm = ld.vec(L + "self_attn.q_norm.weight", {d}, false, true);
      l.attn.k_norm = ld.vec(L + "self_attn.k_norm.weight", {d}, false, true);
    } else {
      const std::string A = L + "linear_attn.";
      l.gdn.in_proj_qkv = ld.dense(A + "in_proj_qkv.weight", c.conv_dim(), H);
      l.gdn.in_proj_z = ld.dense(A + "in_proj_z.weight", c.value_dim(), H);
      l.gdn.in_proj_b = ld.dense(A + "in_proj_b.weight", c.lin_v_heads, H);
      l.gdn.in_proj_a = ld.dense(A + "in_proj_a.weight", c.lin_v_heads, H);
      l.gdn.conv1d = ld.vec(A + "conv1d.weight", {c.conv_dim(), 1, c.conv_kernel}, false, false);
      l.gdn.A_log = ld.vec(A + "A_log", {c.lin_v_heads}, true, false);
      l.gdn.dt_bias = ld.vec(A + "dt_bias", {c.lin_v_heads}, false, false);
      l.gdn.norm = ld.vec(A + "norm.weight", {c.lin_v_dim}, true, false);
      l.gdn.out_proj = ld.dense(A + "out_proj.weight", H, c.value_dim());
    }
    const std::string M = L + "mlp.";
    l.moe.gate = ld.dense(M + "gate.weight", E, H);
    Mat gu;
    gu.rows = 2 * F;
    gu.cols = H;
    gu.data = ld.tensor(M + "experts.gate_up_proj", {Dtype::BF16}, {E, 2 * F, H});
    Mat dn;
    dn.rows = H;
    dn.cols = F;
    dn.data = ld.tensor(M + "experts.down_proj", {Dtype::BF16}, {E, H, F});
    for (int64_t e = 0; e < E; ++e) {
      Mat g = gu;
      g.data = static_cast<const uint8_t*>(gu.data) + e * gu.bytes();
      l.moe.experts_gate.push_back(g.row_slice(0, F));
      l.moe.experts_up.push_back(g.row_slice(F, F));
      Mat d = dn;
      d.data = static_cast<const uint8_t*>(dn.data) + e * dn.bytes();
      l.moe.experts_down.push_back(d);
    }
    l.moe.shared_gate = ld.dense(M + "shared_expert.gate_proj.weight", Fs, H);
    l.moe.shared_up = ld.dense(M + "shared_expert.up_proj.weight", Fs, H);
    l.moe.shared_down = ld.dense(M + "shared_expert.down_proj.weight", H, Fs);
    l.moe.shared_expert_gate = ld.dense(M + "shared_expert_gate.weight", 1, H);
  }
  ld.check_unused({"model.visual.", "mtp."});
}

void load_mlx(Loader& ld, const Config& c, Weights& w) {
  const std::string P = "language_model.model.";
  const int64_t H = c.hidden, V = c.vocab, E = c.n_experts, F = c.moe_ffn, Fs = c.shared_ffn;
  w.embed_tokens = ld.mlx(P + "embed_tokens", 0, V, H)[0];
  w.norm = ld.vec(P + "norm.weight", {H}, false, false);
  w.lm_head = c.tie_word_embeddings ? w.embed_tokens : ld.mlx("language_model.lm_head", 0, V, H)[0];
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string L = P + "layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[i];
    l.input_layernorm = ld.vec(L + "input_layernorm.weight", {H}, false, false);
    l.post_attention_layernorm = ld.vec(L + "post_attention_layernorm.weight", {H}, false, false);
    if (c.is_attention(i)) {
      const int64_t d = c.head_dim;
      l.attn.q_proj = ld.mlx(L + "self_attn.q_proj", 0, c.q_proj_rows(), H)[0];
      l.attn.k_proj = ld.mlx(L + "self_attn.k_proj", 0, c.n_kv_heads * d, H)[0];
      l.attn.v_proj = ld.mlx(L + "self_attn.v_proj", 0, c.n_kv_heads * d, H)[0];
      l.attn.o_proj = ld.mlx(L + "self_attn.o_proj", 0, H, c.n_heads * d)[0];
      l.attn.q_norm = ld.vec(L + "self_attn.q_norm.weight", {d}, false, false);
      l.attn.k_norm = ld.vec(L + "self_attn.k_norm.weight", {d}, false, false);
    } else {
      const std::string A = L + "linear_attn.";
      l.gdn.in_proj_qkv = ld.mlx(A + "in_proj_qkv", 0, c.conv_dim(), H)[0];
      l.gdn.in_proj_z = ld.mlx(A + "in_proj_z", 0, c.value_dim(), H)[0];
      l.gdn.in_proj_b = ld.mlx(A + "in_proj_b", 0, c.lin_v_heads, H)[0];
      l.gdn.in_proj_a = ld.mlx(A + "in_proj_a", 0, c.lin_v_heads, H)[0];
      l.gdn.conv1d = ld.vec(A + "conv1d.weight", {c.conv_dim(), c.conv_kernel, 1}, false, false);
      l.gdn.A_log = ld.vec(A + "A_log", {c.lin_v_heads}, true, false);
      l.gdn.dt_bias = ld.vec(A + "dt_bias", {c.lin_v_heads}, false, false);
      l.gdn.norm = ld.vec(A + "norm.weight", {c.lin_v_dim}, true, false);
      l.gdn.out_proj = ld.mlx(A + "out_proj", 0, H, c.value_dim())[0];
    }
    const std::string M = L + "mlp.";
    l.moe.gate = ld.mlx(M + "gate", 0, E, H)[0];
    l.moe.experts_gate = ld.mlx(M + "switch_mlp.gate_proj", E, F, H);
    l.moe.experts_up = ld.mlx(M + "switch_mlp.up_proj", E, F, H);
    l.moe.experts_down = ld.mlx(M + "switch_mlp.down_proj", E, H, F);
    l.moe.shared_gate = ld.mlx(M + "shared_expert.gate_proj", 0, Fs, H)[0];
    l.moe.shared_up = ld.mlx(M + "shared_expert.up_proj", 0, Fs, H)[0];
    l.moe.shared_down = ld.mlx(M + "shared_expert.down_proj", 0, H, Fs)[0];
    l.moe.shared_expert_gate = ld.mlx(M + "shared_expert_gate", 0, 1, H)[0];
  }
  ld.check_unused({"vision_tower.", "mtp."});
}

}  // namespace

Model load_model(const std::string& model_dir, const LoadOptions& opt) {
  Model m;
  m.dir = model_dir;
  m.config = load_config(model_dir);
  auto store = TensorStore::open_dir(model_dir);
  auto storage = std::make_shared<Storage>();
  storage->maps = store.keepalive();
  Weights& w = m.weights;
  w.layout = detect_layout(store, m.config, model_dir);
  w.layers.resize(m.config.n_layers);
  w.bytes_on_disk = store.bytes_on_disk();
  Loader ld(store, m.config, model_dir, *storage);
  if (w.layout == CheckpointLayout::hf_bf16) load_hf(ld, m.config, w);
  else load_mlx(ld, m.config, w);
  if (opt.check_tensors) check_finite_tensors(store, ld.used());
  w.storage = storage;
  return m;
}

}  // namespace lily
