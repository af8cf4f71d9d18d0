// Synthetic random-weight checkpoints (see synth.h). Values come from a counter-based hash of
// (seed, logical tensor, element index), so any block of rows can be generated independently and in
// parallel; the HF and MLX layouts of a seed draw identical numbers for the same logical weight.
#include "model/synth.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "model/mlx_quant.h"
#include "util/bf16.h"
#include "util/check.h"
#include "util/safetensors.h"

namespace lily {

namespace {

using json = nlohmann::json;

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t key_hash(uint64_t seed, const std::string& key) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : key) h = (h ^ ch) * 0x100000001b3ull;
  return splitmix(h ^ splitmix(seed));
}

float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

enum class Init { normal, uniform, log_uniform };

struct Part {  // a logical weight supplying `rows` consecutive rows of each stacked entry
  uint64_t key;
  int64_t rows;
};

// One stored module: a plain tensor, or (MLX, quantized) the triple .weight/.scales/.biases.
struct Module {
  std::string name;             // tensor name, or module path when quantized
  std::vector<int64_t> shape;   // stored shape when not quantized
  int64_t stack = 0;            // > 0: stacked experts [stack, rows, cols]
  int64_t rows = 0, cols = 0;   // generation view
  std::vector<Part> parts;
  Init init = Init::normal;
  float a = 0, b = 1;           // normal: mean a, std b; (log_)uniform: [a, b)
  bool plus_one = false;        // store bf16(1 + w) (MLX zero-centred norms)
  Dtype dtype = Dtype::BF16;
  QuantSpec q;

  int64_t total_rows() const { return std::max<int64_t>(stack, 1) * rows; }
  int64_t groups() const { return cols / q.group_size; }
  uint64_t bytes() const {
    if (!q.quantized) {
      uint64_t n = dtype_size(dtype);
      for (int64_t d : shape) n *= d;
      return n;
    }
    return total_rows() * (cols * q.bits / 8) + 4 * total_rows() * groups();
  }
  std::vector<int64_t> qshape(int64_t last) const {
    std::vector<int64_t> s;
    if (stack) s.push_back(stack);
    s.push_back(rows);
    s.push_back(last);
    return s;
  }
  void declare(SafetensorsWriter& w) const {
    if (!q.quantized) {
      w.add(name, dtype, shape);
      return;
    }
    w.add(name + ".weight", Dtype::U32, qshape(cols * q.bits / 32));
    w.add(name + ".scales", Dtype::BF16, qshape(groups()));
    w.add(name + ".biases", Dtype::BF16, qshape(groups()));
  }
  void add_to_index(json& wm, const std::string& file) const {
    if (!q.quantized) {
      wm[name] = file;
    } else {
      for (const char* s : {".weight", ".scales", ".biases"}) wm[name + s] = file;
    }
  }

  float sample(uint64_t key, uint64_t idx) const {
    uint64_t r = splitmix(key + idx);
    float v;
    if (init == Init::normal) {
      // Irwin-Hall(4) of 16-bit uniforms: mean 2, variance 1/3.
      float s = static_cast<float>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
      v = a + b * (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
    } else {
      float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
      v = a + (b - a) * u;
      if (init == Init::log_uniform) v = std::log(v);
    }
    v = round_bf16(v);
    return plus_one ? round_bf16(1.0f + v) : v;
  }
  // Rows [r0, r0 + n) of the generation view into out[n][cols].
  void gen_rows(int64_t r0, int64_t n, float* out) const {
    for (int64_t r = r0; r < r0 + n; ++r) {
      int64_t e = r / rows, rr = r % rows, start = 0;
      size_t p = 0;
      while (rr >= start + parts[p].rows) start += parts[p++].rows;
      uint64_t base = static_cast<uint64_t>((e * parts[p].rows + (rr - start)) * cols);
      float* o = out + (r - r0) * cols;
      for (int64_t c = 0; c < cols; ++c) o[c] = sample(parts[p].key, base + c);
    }
  }
};

// Runs fn(i0, i1) on `threads` threads over [0, n).
template <typename Fn>
void parallel_for(int64_t n, int threads, Fn fn) {
  int t = static_cast<int>(std::min<int64_t>(threads, n));
  if (t <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  for (int i = 1; i < t; ++i) pool.emplace_back([&, i] { fn(n * i / t, n * (i + 1) / t); });
  fn(0, n / t);
  for (auto& th : pool) th.join();
}

void emit(const Module& m, SafetensorsWriter& w, int threads) {
  const int64_t R = m.total_rows(), C = m.cols;
  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 24) / C);  // ~16M elements per write
  const int64_t block = std::max<int64_t>(1, 16384 / C);               // rows per scratch block
  if (!m.q.quantized) {
    const size_t ds = dtype_size(m.dtype);
    std::vector<uint8_t> out(static_cast<size_t>(std::min(chunk, R) * C) * ds);
    for (int64_t r0 = 0; r0 < R; r0 += chunk) {
      int64_t n = std::min(chunk, R - r0);
      parallel_for(n, threads, [&](int64_t i0, int64_t i1) {
        std::vector<float> f(block * C);
        for (int64_t i = i0; i < i1; i += block) {
          int64_t k = std::min(block, i1 - i);
          m.gen_rows(r0 + i, k, f.data());
          uint8_t* o = out.data() + i * C * ds;
          if (m.dtype == Dtype::F32) {
            std::memcpy(o, f.data(), k * C * 4);
          } else {
            for (int64_t j = 0; j < k * C; ++j) {
              uint16_t h = f32_to_bf16(f[j]);
              std::memcpy(o + 2 * j, &h, 2);
            }
          }
        }
      });
      w.write(out.data(), n * C * ds);
    }
    return;
  }
  const int bits = m.q.bits, gs = m.q.group_size;
  const int64_t words = C * bits / 32, G = m.groups();
  std::vector<uint16_t> scales(R * G), biases(R * G);
  std::vector<uint32_t> packed(std::min(chunk, R) * words);
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    int64_t n = std::min(chunk, R - r0);
    parallel_for(n, threads, [&](int64_t i0, int64_t i1) {
      std::vector<float> f(block * C);
      for (int64_t i = i0; i < i1; i += block) {
        int64_t k = std::min(block, i1 - i);
        m.gen_rows(r0 + i, k, f.data());
        mlx_affine_quantize(f.data(), k, C, bits, gs, packed.data() + i * words, scales.data() + (r0 + i) * G,
                            biases.data() + (r0 + i) * G);
      }
    });
    w.write(packed.data(), n * words * 4);
  }
  w.write(scales.data(), scales.size() * 2);
  w.write(biases.data(), biases.size() * 2);
}

struct Dims {
  int hidden, layers, interval, heads, kv_heads, head_dim, lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, conv,
      experts, top_k, moe_ffn, shared_ffn, vocab, max_pos, bos;
  std::vector<int> eos_text, eos_gen;
};

Dims preset_dims(const SynthOptions& o) {
  Dims d;
  if (o.preset == "full") {
    d = {2048, 40, 4, 16, 2, 256, 16, 32, 128, 128, 4, 256, 8, 512, 512, 248320, 262144, 248044, {248044},
         {248046, 248044}};
  } else if (o.preset == "tiny") {
    d = {128, 8, 4, 4, 2, 32, 2, 4, 32, 32, 4, 8, 3, 64, 128, 512, 4096, 0, {}, {}};
  } else {
    fail("synth: unknown preset \"", o.preset, "\" (tiny or full)");
  }
  if (o.layers > 0) d.layers = o.layers;
  if (o.vocab > 0) d.vocab = o.vocab;
  if (o.preset == "tiny") {
    LILY_CHECK(d.vocab >= 8, "synth: vocab ", d.vocab, " too small");
    d.bos = d.vocab - 3;
    d.eos_text = {d.bos};
    d.eos_gen = {d.vocab - 1, d.bos};
  }
  return d;
}

// The modules of the checkpoint in file order.
std::vector<Module> plan(const Config& c, const SynthOptions& o) {
  const bool hf = o.layout == CheckpointLayout::hf_bf16;
  const std::string P = hf ? "model.language_model." : "language_model.model.";
  std::vector<Module> out;
  auto key = [&](const std::string& k) { return key_hash(o.seed, k); };
  // A matrix [rows, cols] (or stacked [stack, rows, cols]) with N(0, 1/sqrt(cols)) entries by default.
  auto matrix = [&](const std::string& module, std::vector<Part> parts, int64_t stack, int64_t cols, float std,
                    const std::string& hf_name) {
    Module m;
    m.stack = stack;
    m.cols = cols;
    m.parts = std::move(parts);
    for (const auto& p : m.parts) m.rows += p.rows;
    m.b = std != 0 ? std : 1.0f / std::sqrt(static_cast<float>(cols));
    m.q = hf ? QuantSpec{} : c.quant.for_module(module);
    if (m.q.quantized && cols % m.q.group_size != 0) m.q.quantized = false;  // MLX skips such modules
    m.name = hf ? hf_name : (m.q.quantized ? module : module + ".weight");
    m.shape = m.qshape(cols);
    out.push_back(std::move(m));
  };
  auto mat = [&](const std::string& path, const std::string& k, int64_t rows, int64_t cols, float std = 0) {
    matrix(P + path, {{key(k), rows}}, 0, cols, std, P + path + ".weight");
  };
  // A vector stored with `shape` (numel n); norm1p: zero-centred norm (HF stores w, MLX 1+w).
  auto vec = [&](const std::string& name, const std::string& k, std::vector<int64_t> shape, Init init, float a,
                 float b, bool norm1p, Dtype dtype) {
    Module m;
    m.name = name;
    m.shape = std::move(shape);
    m.rows = 1;
    m.cols = 1;
    for (int64_t d : m.shape) m.cols *= d;
    m.parts = {{key(k), 1}};
    m.init = init;
    m.a = a;
    m.b = b;
    m.plus_one = norm1p && !hf;
    m.dtype = dtype;
    out.push_back(std::move(m));
  };
  const int64_t H = c.hidden, E = c.n_experts, F = c.moe_ffn, Fs = c.shared_ffn;
  mat("embed_tokens", "embed_tokens", c.vocab, H, 1.0f);
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string L = "layers." + std::to_string(i) + ".";
    vec(P + L + "input_layernorm.weight", L + "input_layernorm", {H}, Init::normal, 0, 0.1f, true, Dtype::BF16);
    vec(P + L + "post_attention_layernorm.weight", L + "post_attention_layernorm", {H}, Init::normal, 0, 0.1f, true,
        Dtype::BF16);
    if (c.is_attention(i)) {
      const std::string A = L + "self_attn.";
      const int64_t d = c.head_dim;
      mat(A + "q_proj", A + "q_proj", c.q_proj_rows(), H);
      mat(A + "k_proj", A + "k_proj", c.n_kv_heads * d, H);
      mat(A + "v_proj", A + "v_proj", c.n_kv_heads * d, H);
      mat(A + "o_proj", A + "o_proj", H, c.n_heads * d);
      vec(P + A + "q_norm.weight", A + "q_norm", {d}, Init::normal, 0, 0.1f, true, Dtype::BF16);
      vec(P + A + "k_norm.weight", A + "k_norm", {d}, Init::normal, 0, 0.1f, true, Dtype::BF16);
    } else {
      const std::string A = L + "linear_attn.";
      mat(A + "in_proj_qkv", A + "in_proj_qkv", c.conv_dim(), H);
      mat(A + "in_proj_z", A + "in_proj_z", c.value_dim(), H);
      mat(A + "in_proj_b", A + "in_proj_b", c.lin_v_heads, H);
      mat(A + "in_proj_a", A + "in_proj_a", c.lin_v_heads, H);
      std::vector<int64_t> conv_shape = hf ? std::vector<int64_t>{c.conv_dim(), 1, c.conv_kernel}
                                           : std::vector<int64_t>{c.conv_dim(), c.conv_kernel, 1};
      vec(P + A + "conv1d.weight", A + "conv1d", conv_shape, Init::normal, 0,
          1.0f / std::sqrt(static_cast<float>(c.conv_kernel)), false, Dtype::BF16);
      // A_log / norm dtypes alternate between layouts so both accepted dtypes are exercised.
      vec(P + A + "A_log", A + "A_log", {c.lin_v_heads}, Init::log_uniform, 1, 16, false,
          hf ? Dtype::BF16 : Dtype::F32);
      vec(P + A + "dt_bias", A + "dt_bias", {c.lin_v_heads}, Init::uniform, -0.5f, 0.5f, false, Dtype::BF16);
      vec(P + A + "norm.weight", A + "norm", {c.lin_v_dim}, Init::normal, 1, 0.1f, false,
          hf ? Dtype::F32 : Dtype::BF16);
      mat(A + "out_proj", A + "out_proj", H, c.value_dim());
    }
    const std::string M = L + "mlp.";
    mat(M + "gate", M + "gate", E, H);
    uint64_t kg = key(M + "experts.gate"), ku = key(M + "experts.up"), kd = key(M + "experts.down");
    if (hf) {
      matrix("", {{kg, F}, {ku, F}}, E, H, 0, P + M + "experts.gate_up_proj");
      matrix("", {{kd, H}}, E, F, 0, P + M + "experts.down_proj");
    } else {
      matrix(P + M + "switch_mlp.gate_proj", {{kg, F}}, E, H, 0, "");
      matrix(P + M + "switch_mlp.up_proj", {{ku, F}}, E, H, 0, "");
      matrix(P + M + "switch_mlp.down_proj", {{kd, H}}, E, F, 0, "");
    }
    mat(M + "shared_expert.gate_proj", M + "shared_expert.gate_proj", Fs, H);
    mat(M + "shared_expert.up_proj", M + "shared_expert.up_proj", Fs, H);
    mat(M + "shared_expert.down_proj", M + "shared_expert.down_proj", H, Fs);
    mat(M + "shared_expert_gate", M + "shared_expert_gate", 1, H);
  }
  vec(P + "norm.weight", "norm", {H}, Init::normal, 0, 0.1f, true, Dtype::BF16);
  if (!c.tie_word_embeddings) {
    const std::string head = hf ? "lm_head" : "language_model.lm_head";
    matrix(head, {{key("lm_head"), c.vocab}}, 0, H, 0, "lm_head.weight");
  }
  return out;
}

}  // namespace

json synth_config_json(const SynthOptions& o) {
  Dims d = preset_dims(o);
  json layer_types = json::array();
  for (int i = 0; i < d.layers; ++i)
    layer_types.push_back((i + 1) % d.interval == 0 ? "full_attention" : "linear_attention");
  const double prf = 0.25;
  int half = static_cast<int>(d.head_dim * prf) / 2;
  json text = {
      {"model_type", "qwen3_5_moe_text"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"attn_output_gate", true},
      {"bos_token_id", d.bos},
      {"eos_token_id", d.eos_text.size() == 1 ? json(d.eos_text[0]) : json(d.eos_text)},
      {"pad_token_id", nullptr},
      {"dtype", "bfloat16"},
      {"full_attention_interval", d.interval},
      {"layer_types", layer_types},
      {"head_dim", d.head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", d.hidden},
      {"initializer_range", 0.02},
      {"linear_conv_kernel_dim", d.conv},
      {"linear_key_head_dim", d.lin_k_dim},
      {"linear_num_key_heads", d.lin_k_heads},
      {"linear_num_value_heads", d.lin_v_heads},
      {"linear_value_head_dim", d.lin_v_dim},
      {"mamba_ssm_dtype", "float32"},
      {"max_position_embeddings", d.max_pos},
      {"moe_intermediate_size", d.moe_ffn},
      {"shared_expert_intermediate_size", d.shared_ffn},
      {"mtp_num_hidden_layers", 0},
      {"mtp_use_dedicated_embeddings", false},
      {"num_attention_heads", d.heads},
      {"num_key_value_heads", d.kv_heads},
      {"num_experts", d.experts},
      {"num_experts_per_tok", d.top_k},
      {"num_hidden_layers", d.layers},
      {"output_router_logits", false},
      {"router_aux_loss_coef", 0.001},
      {"partial_rotary_factor", prf},
      {"rms_norm_eps", 1e-6},
      {"rope_parameters",
       {{"mrope_interleaved", true},
        {"mrope_section", {(half + 2) / 3, (half + 1) / 3, half / 3}},
        {"partial_rotary_factor", prf},
        {"rope_theta", 10000000},
        {"rope_type", "default"}}},
      {"tie_word_embeddings", o.tie_word_embeddings},
      {"use_cache", true},
      {"vocab_size", d.vocab},
  };
  json cfg = {
      {"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
      {"model_type", "qwen3_5_moe"},
      {"tie_word_embeddings", o.tie_word_embeddings},
      {"transformers_version", "4.57.1"},
      {"text_config", text},
  };
  if (o.layout == CheckpointLayout::mlx_affine) {
    json q = {{"group_size", 64}, {"bits", 4}, {"mode", "affine"}};
    for (int i = 0; i < d.layers; ++i) {
      std::string L = "language_model.model.layers." + std::to_string(i) + ".mlp.";
      q[L + "gate"] = {{"group_size", 64}, {"bits", 8}};
      q[L + "shared_expert_gate"] = {{"group_size", 64}, {"bits", 8}};
    }
    cfg["quantization"] = q;
    cfg["quantization_config"] = q;
  }
  return cfg;
}

json synth_generation_config_json(const SynthOptions& o) {
  Dims d = preset_dims(o);
  return {{"bos_token_id", d.bos}, {"eos_token_id", d.eos_gen}, {"pad_token_id", d.bos}, {"do_sample", true},
          {"temperature", 1.0},    {"top_k", 20},               {"top_p", 0.95}};
}

Config synth_config(const SynthOptions& o) { return parse_config(synth_config_json(o), "synth config"); }

uint64_t synth_checkpoint(const std::string& dir, const SynthOptions& o) {
  namespace fs = std::filesystem;
  Config c = synth_config(o);
  std::vector<Module> modules = plan(c, o);
  int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  uint64_t shard_bytes = o.shard_bytes ? o.shard_bytes : (o.preset == "full" ? 4'000'000'000ull : UINT64_MAX);
  std::vector<std::vector<const Module*>> shards(1);
  uint64_t cur = 0;
  for (const auto& m : modules) {
    if (!shards.back().empty() && cur + m.bytes() > shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(&m);
    cur += m.bytes();
  }
  fs::create_directories(dir);
  auto write_json = [&](const std::string& name, const json& j) {
    std::string path = (fs::path(dir) / name).string();
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) fail(path, ": cannot create");
    std::string s = j.dump(2) + "\n";
    bool ok = std::fwrite(s.data(), 1, s.size(), f) == s.size();
    if (std::fclose(f) != 0 || !ok) fail(path, ": write failed");
  };
  write_json("config.json", synth_config_json(o));
  write_json("generation_config.json", synth_generation_config_json(o));
  std::error_code ec;
  fs::remove(fs::path(dir) / "model.safetensors.index.json", ec);
  fs::remove(fs::path(dir) / "model.safetensors", ec);
  uint64_t total = 0;
  json weight_map = json::object();
  const size_t ns = shards.size();
  for (size_t s = 0; s < ns; ++s) {
    char name[64];
    if (ns == 1) std::snprintf(name, sizeof name, "model.safetensors");
    else std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, ns);
    SafetensorsWriter w((fs::path(dir) / name).string());
    w.set_metadata("format", "pt");
    for (const Module* m : shards[s]) {
      m->declare(w);
      m->add_to_index(weight_map, name);
    }
    w.write_header();
    for (const Module* m : shards[s]) emit(*m, w, threads);
    w.finish();
    total += w.data_bytes();
  }
  if (ns > 1) write_json("model.safetensors.index.json", {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
  return total;
}

}  // namespace lily
