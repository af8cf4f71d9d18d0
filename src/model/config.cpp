// config.json / generation_config.json parsing and validation (docs/model.md §1, §4.2 quantization block).
// Every field the math needs must be present and consistent; nothing falls back to a class default.
#include "model/config.h"

#include <cmath>
#include <filesystem>

#include "util/check.h"
#include "util/safetensors.h"

namespace lily {

namespace {

using json = nlohmann::json;

// Upper bounds on the sizes a config may give: far above the real model (its value in the comment), low enough
// that every derived size (int products such as q_proj_rows, conv_dim; int64 tensor shapes) cannot overflow and
// that no absurd value reaches an allocation (a 1e9-layer schedule, a negative expected tensor size).
constexpr int64_t kMaxVocab = 1 << 24;       // 248320
constexpr int64_t kMaxLayers = 1024;         // 40
constexpr int64_t kMaxHidden = 1 << 16;      // 2048
constexpr int64_t kMaxHeads = 1024;          // 16 query, 2 kv, 16 / 32 linear
constexpr int64_t kMaxHeadDim = 4096;        // 256 attention, 128 linear
constexpr int64_t kMaxConvKernel = 64;       // 4
constexpr int64_t kMaxExperts = 4096;        // 256 (top-k 8)
constexpr int64_t kMaxFfn = 1 << 18;         // 512 (moe and shared expert)
constexpr int64_t kMaxContext = 1 << 24;     // 262144
constexpr size_t kMaxStopIds = 256;          // eos_token_id entries: 2

struct Reader {
  const json& j;
  std::string file;
  std::string prefix;  // "text_config." or ""

  const json* find(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  const json& need(const char* key) const {
    const json* v = find(key);
    if (!v) fail(file, ": missing field ", prefix, key);
    return *v;
  }
  // An integer in [lo, hi] (hi <= INT32_MAX); a value beyond int64 is reported as the text the file holds.
  int64_t integer(const char* key, int64_t lo, int64_t hi = INT32_MAX) const {
    const json& v = need(key);
    if (!v.is_number_integer()) fail(file, ": field ", prefix, key, " must be an integer, got ", v.dump());
    const bool big = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX);
    int64_t x = big ? INT64_MAX : v.get<int64_t>();
    if (x < lo || x > hi)
      fail(file, ": field ", prefix, key, " = ", v.dump(), " is out of range [", lo, ", ", hi, "]");
    return x;
  }
  int pos(const char* key, int64_t hi) const { return static_cast<int>(integer(key, 1, hi)); }
  double number(const char* key) const {
    const json& v = need(key);
    if (!v.is_number()) fail(file, ": field ", prefix, key, " must be a number, got ", v.dump());
    return v.get<double>();
  }
  bool boolean(const char* key) const {
    const json& v = need(key);
    if (!v.is_boolean()) fail(file, ": field ", prefix, key, " must be true or false, got ", v.dump());
    return v.get<bool>();
  }
  std::string string(const char* key) const {
    const json& v = need(key);
    if (!v.is_string()) fail(file, ": field ", prefix, key, " must be a string, got ", v.dump());
    return v.get<std::string>();
  }
};

std::vector<int> token_list(const json& v, const std::string& file, const std::string& field) {
  std::vector<int> out;
  auto one = [&](const json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
      fail(file, ": field ", field, " must hold non-negative integer token ids, got ", x.dump());
    out.push_back(static_cast<int>(x.get<int64_t>()));
  };
  if (v.is_array()) {
    if (v.size() > kMaxStopIds)
      fail(file, ": field ", field, " has ", v.size(), " entries (at most ", kMaxStopIds, ")");
    for (const auto& x : v) one(x);
  } else {
    one(v);
  }
  return out;
}

QuantSpec parse_spec(const json& v, const std::string& file, const std::string& where) {
  QuantSpec s;
  if (v.is_boolean()) {
    if (v.get<bool>()) fail(file, ": ", where, " = true is not a quantization spec (expected an object or false)");
    return s;
  }
  if (!v.is_object()) fail(file, ": ", where, " must be an object or false, got ", v.dump());
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.key() != "bits" && it.key() != "group_size" && it.key() != "mode")
      fail(file, ": ", where, ".", it.key(), " is not a known quantization field");
  }
  Reader r{v, file, where + "."};
  if (auto m = r.find("mode")) {
    if (!m->is_string() || m->get<std::string>() != "affine")
      fail(file, ": ", where, ".mode = ", m->dump(), " is not supported (only \"affine\")");
  }
  s.quantized = true;
  s.bits = r.pos("bits", 64);
  s.group_size = r.pos("group_size", 1 << 16);
  if (s.bits != 4 && s.bits != 8) fail(file, ": ", where, ".bits = ", s.bits, " is not supported (4 or 8)");
  if (s.group_size != 32 && s.group_size != 64 && s.group_size != 128)
    fail(file, ": ", where, ".group_size = ", s.group_size, " is not supported (32, 64 or 128)");
  return s;
}

Quantization parse_quantization(const json& q, const std::string& file, const std::string& where) {
  if (!q.is_object()) fail(file, ": ", where, " must be an object");
  Quantization out;
  out.present = true;
  json top = json::object();
  for (auto it = q.begin(); it != q.end(); ++it) {
    const std::string& k = it.key();
    if (k == "bits" || k == "group_size" || k == "mode") {
      top[k] = it.value();
    } else if (it.value().is_object() || it.value().is_boolean()) {
      out.overrides[k] = parse_spec(it.value(), file, where + "." + k);
    } else {
      fail(file, ": ", where, ".", k, " is neither a known field nor a per-module spec");
    }
  }
  out.def = parse_spec(top, file, where);
  return out;
}

void parse_rope(const Reader& t, Config& c) {
  const json* rp = t.find("rope_parameters");
  double theta_top = 0, prf_top = 0;
  bool has_theta_top = t.find("rope_theta"), has_prf_top = t.find("partial_rotary_factor");
  if (has_theta_top) theta_top = t.number("rope_theta");
  if (has_prf_top) prf_top = t.number("partial_rotary_factor");
  if (rp) {
    if (!rp->is_object()) fail(t.file, ": field ", t.prefix, "rope_parameters must be an object");
    Reader r{*rp, t.file, t.prefix + "rope_parameters."};
    if (auto ty = r.find("rope_type")) {
      if (!ty->is_string() || (ty->get<std::string>() != "default" && ty->get<std::string>() != "mrope"))
        fail(t.file, ": field ", r.prefix, "rope_type = ", ty->dump(), " is not supported (\"default\")");
    }
    c.rope_theta = r.number("rope_theta");
    c.partial_rotary_factor = r.number("partial_rotary_factor");
    if (has_theta_top && theta_top != c.rope_theta)
      fail(t.file, ": field ", t.prefix, "rope_theta = ", theta_top, " disagrees with ", r.prefix, "rope_theta = ",
           c.rope_theta);
    if (has_prf_top && prf_top != c.partial_rotary_factor)
      fail(t.file, ": field ", t.prefix, "partial_rotary_factor = ", prf_top, " disagrees with ", r.prefix,
           "partial_rotary_factor = ", c.partial_rotary_factor);
  } else {
    c.rope_theta = t.number("rope_theta");
    c.partial_rotary_factor = t.number("partial_rotary_factor");
  }
  if (const json* rs = t.find("rope_scaling")) {
    const json* ty = rs->is_object() ? (rs->contains("rope_type") ? &(*rs)["rope_type"]
                                        : rs->contains("type") ? &(*rs)["type"] : nullptr)
                                     : nullptr;
    if (!ty || !ty->is_string() || (ty->get<std::string>() != "default" && ty->get<std::string>() != "mrope"))
      fail(t.file, ": field ", t.prefix, "rope_scaling = ", rs->dump(), " is not supported");
  }
  if (!(c.rope_theta > 1.0) || !std::isfinite(c.rope_theta))
    fail(t.file, ": field rope_theta = ", c.rope_theta, " must be a finite number > 1");
  if (!(c.partial_rotary_factor > 0.0 && c.partial_rotary_factor <= 1.0))
    fail(t.file, ": field partial_rotary_factor = ", c.partial_rotary_factor, " must be in (0, 1]");
  double rd = c.head_dim * c.partial_rotary_factor;
  c.rope_dim = static_cast<int>(rd);
  if (c.rope_dim != rd || c.rope_dim % 2 != 0 || c.rope_dim == 0)
    fail(t.file, ": field partial_rotary_factor: head_dim ", c.head_dim, " x ", c.partial_rotary_factor,
         " must be a positive even integer");
}

void parse_layer_schedule(const Reader& t, Config& c) {
  const json* lt = t.find("layer_types");
  const json* fi = t.find("full_attention_interval");
  if (!lt && !fi) fail(t.file, ": missing field ", t.prefix, "layer_types (and ", t.prefix, "full_attention_interval)");
  if (fi) c.full_attention_interval = t.pos("full_attention_interval", INT32_MAX);
  if (lt) {
    if (!lt->is_array()) fail(t.file, ": field ", t.prefix, "layer_types must be an array");
    if (static_cast<int>(lt->size()) != c.n_layers)
      fail(t.file, ": field ", t.prefix, "layer_types has ", lt->size(), " entries but num_hidden_layers = ",
           c.n_layers);
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& v = (*lt)[i];
      std::string s = v.is_string() ? v.get<std::string>() : "";
      if (s == "linear_attention") c.layer_kinds.push_back(LayerKind::linear_attention);
      else if (s == "full_attention") c.layer_kinds.push_back(LayerKind::full_attention);
      else fail(t.file, ": field ", t.prefix, "layer_types[", i, "] = ", v.dump(), " is not a known layer type");
    }
    if (!fi) {  // infer the period from the first full-attention layer
      int first = -1;
      for (int i = 0; i < c.n_layers && first < 0; ++i)
        if (c.layer_kinds[i] == LayerKind::full_attention) first = i;
      c.full_attention_interval = first < 0 ? c.n_layers + 1 : first + 1;
    }
    for (int i = 0; i < c.n_layers; ++i) {
      bool full = (i + 1) % c.full_attention_interval == 0;
      if (full != (c.layer_kinds[i] == LayerKind::full_attention))
        fail(t.file, ": field ", t.prefix, "layer_types[", i, "] = ", (*lt)[i].dump(),
             " disagrees with full_attention_interval = ", c.full_attention_interval);
    }
  } else {
    for (int i = 0; i < c.n_layers; ++i)
      c.layer_kinds.push_back((i + 1) % c.full_attention_interval == 0 ? LayerKind::full_attention
                                                                        : LayerKind::linear_attention);
  }
}

}  // namespace

QuantSpec Quantization::for_module(const std::string& module_path) const {
  if (!present) return QuantSpec{};
  auto it = overrides.find(module_path);
  return it == overrides.end() ? def : it->second;
}

int Config::n_attention_layers() const {
  int n = 0;
  for (auto k : layer_kinds) n += k == LayerKind::full_attention;
  return n;
}

Config parse_config(const json& root, const std::string& file) {
  if (!root.is_object()) fail(file, ": config is not a JSON object");
  Config c;
  Reader top{root, file, ""};
  std::string mt = top.string("model_type");
  const json* text = nullptr;
  std::string prefix;
  if (mt == "qwen3_5_moe") {
    text = top.find("text_config");
    if (!text || !text->is_object()) fail(file, ": missing field text_config (model_type qwen3_5_moe)");
    prefix = "text_config.";
    Reader tr{*text, file, prefix};
    std::string tmt = tr.string("model_type");
    if (tmt != "qwen3_5_moe_text")
      fail(file, ": field text_config.model_type = \"", tmt, "\" is not qwen3_5_moe_text");
  } else if (mt == "qwen3_5_moe_text") {
    text = &root;
  } else {
    fail(file, ": field model_type = \"", mt, "\" is not this architecture (qwen3_5_moe / qwen3_5_moe_text)");
  }
  c.model_type = mt;
  Reader t{*text, file, prefix};

  if (t.string("hidden_act") != "silu") fail(file, ": field ", prefix, "hidden_act must be \"silu\"");
  if (!t.boolean("attn_output_gate")) fail(file, ": field ", prefix, "attn_output_gate must be true");
  if (t.find("attention_bias") && t.boolean("attention_bias"))
    fail(file, ": field ", prefix, "attention_bias = true is not supported");
  if (auto m = t.find("mlp_only_layers"); m && !(m->is_array() && m->empty()))
    fail(file, ": field ", prefix, "mlp_only_layers must be empty (every layer is MoE)");
  if (t.find("decoder_sparse_step") && t.integer("decoder_sparse_step", 0, kMaxLayers) != 1)
    fail(file, ": field ", prefix, "decoder_sparse_step must be 1 (every layer is MoE)");

  c.hidden = t.pos("hidden_size", kMaxHidden);
  c.n_layers = t.pos("num_hidden_layers", kMaxLayers);
  c.vocab = t.pos("vocab_size", kMaxVocab);
  c.eps = static_cast<float>(t.number("rms_norm_eps"));
  if (!(c.eps > 0 && c.eps < 1)) fail(file, ": field ", prefix, "rms_norm_eps = ", c.eps, " must be in (0, 1)");
  c.max_position_embeddings = t.pos("max_position_embeddings", kMaxContext);
  c.n_heads = t.pos("num_attention_heads", kMaxHeads);
  c.n_kv_heads = t.pos("num_key_value_heads", kMaxHeads);
  c.head_dim = t.pos("head_dim", kMaxHeadDim);
  if (c.n_heads % c.n_kv_heads != 0)
    fail(file, ": field ", prefix, "num_attention_heads = ", c.n_heads, " is not a multiple of num_key_value_heads = ",
         c.n_kv_heads);
  c.lin_k_heads = t.pos("linear_num_key_heads", kMaxHeads);
  c.lin_v_heads = t.pos("linear_num_value_heads", kMaxHeads);
  c.lin_k_dim = t.pos("linear_key_head_dim", kMaxHeadDim);
  c.lin_v_dim = t.pos("linear_value_head_dim", kMaxHeadDim);
  c.conv_kernel = t.pos("linear_conv_kernel_dim", kMaxConvKernel);
  if (c.lin_v_heads % c.lin_k_heads != 0)
    fail(file, ": field ", prefix, "linear_num_value_heads = ", c.lin_v_heads,
         " is not a multiple of linear_num_key_heads = ", c.lin_k_heads);
  c.n_experts = t.pos("num_experts", kMaxExperts);
  c.top_k = t.pos("num_experts_per_tok", kMaxExperts);
  if (c.top_k > c.n_experts)
    fail(file, ": field ", prefix, "num_experts_per_tok = ", c.top_k, " exceeds num_experts = ", c.n_experts);
  c.moe_ffn = t.pos("moe_intermediate_size", kMaxFfn);
  c.shared_ffn = t.pos("shared_expert_intermediate_size", kMaxFfn);
  parse_rope(t, c);
  parse_layer_schedule(t, c);

  // tie_word_embeddings: text_config and top level must agree where both are given.
  const json* tie_text = t.find("tie_word_embeddings");
  const json* tie_top = text == &root ? nullptr : top.find("tie_word_embeddings");
  if (!tie_text && !tie_top) fail(file, ": missing field ", prefix, "tie_word_embeddings");
  if (tie_text) c.tie_word_embeddings = t.boolean("tie_word_embeddings");
  if (tie_top) {
    bool v = top.boolean("tie_word_embeddings");
    if (tie_text && v != c.tie_word_embeddings)
      fail(file, ": field tie_word_embeddings disagrees with ", prefix, "tie_word_embeddings");
    c.tie_word_embeddings = v;
  }

  if (t.find("bos_token_id")) c.bos_token_id = static_cast<int>(t.integer("bos_token_id", 0, kMaxVocab - 1));
  if (const json* e = t.find("eos_token_id")) c.eos_token_ids = token_list(*e, file, prefix + "eos_token_id");

  const json* q = top.find("quantization");
  const json* qc = top.find("quantization_config");
  if (q) c.quant = parse_quantization(*q, file, "quantization");
  if (qc) {
    Quantization other = parse_quantization(*qc, file, "quantization_config");
    if (!q) {
      c.quant = other;
    } else if (*q != *qc) {
      fail(file, ": field quantization_config differs from quantization");
    }
  }
  return c;
}

Config load_config(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::string path = (fs::path(model_dir) / "config.json").string();
  if (!fs::exists(path)) fail(path, ": not found");
  Config c = parse_config(read_json_file(path), path);
  std::string gpath = (fs::path(model_dir) / "generation_config.json").string();
  if (fs::exists(gpath)) {
    json g = read_json_file(gpath);
    if (!g.is_object()) fail(gpath, ": not a JSON object");
    Reader r{g, gpath, ""};
    if (r.find("bos_token_id")) c.bos_token_id = static_cast<int>(r.integer("bos_token_id", 0, kMaxVocab - 1));
    if (const json* e = r.find("eos_token_id")) c.eos_token_ids = token_list(*e, gpath, "eos_token_id");
    if (r.find("temperature")) {
      c.gen_temperature = static_cast<float>(r.number("temperature"));
      if (!(c.gen_temperature >= 0)) fail(gpath, ": field temperature must be >= 0");
    }
    if (r.find("top_k")) c.gen_top_k = static_cast<int>(r.integer("top_k", 0, kMaxVocab));
    if (r.find("top_p")) {
      c.gen_top_p = static_cast<float>(r.number("top_p"));
      if (!(c.gen_top_p > 0 && c.gen_top_p <= 1)) fail(gpath, ": field top_p must be in (0, 1]");
    }
  }
  if (c.eos_token_ids.empty()) fail(path, ": no eos_token_id in generation_config.json or the config");
  for (int id : c.eos_token_ids) {
    if (id >= c.vocab) fail(path, ": eos token id ", id, " is outside the vocabulary (", c.vocab, ")");
  }
  if (c.bos_token_id >= c.vocab) fail(path, ": bos_token_id ", c.bos_token_id, " is outside the vocabulary");
  return c;
}

}  // namespace lily
